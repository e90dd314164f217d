"""--gb-history, --gb-compare=last and --gb-prometheus end to end: real runs of the cpu suites' host copy check keep
their reports, each compares with the one before, and the Prometheus file they write is read back with
prometheus-client's own parser. Bad paths, an unsafe hostname and a corrupt newest report stop a run before it
measures; a file that cannot be written at the end fails the run. (The pure parts: unit/test_report_history.py,
unit/test_prometheus.py, unit/test_fleet_history.py.)"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch  # noqa: F401 -- in-process pytester runs drop modules they imported, and torch cannot load twice
from prometheus_client.parser import text_string_to_metric_families

from pytest_gbvalidate.report import history, prometheus
from tests.helpers.reports import minimal_report
from tests.helpers.runs import CPU_HOST_COPY_BASELINE, HOST_COPY, LAB, assert_usage_error, lab_project

METRIC = "host_copy_bandwidth_gbps"
KEEP = ("--gb-history=h", "--gb-prometheus=metrics/node.prom")


def cpu_project(pytester: pytest.Pytester) -> Path:
    (pytester.path / "b").mkdir()
    (pytester.path / "b" / "cpu.yaml").write_text(CPU_HOST_COPY_BASELINE)
    return pytester.path / "h" / socket.gethostname()


def series(path: Path) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """The file's samples, as prometheus-client's parser reads them: (name, labels) -> value."""
    return series_of(path.read_text())


def series_of(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def unix_seconds(stamp: str) -> float:
    return dt.datetime.fromisoformat(stamp).timestamp()


def test_each_run_is_kept_exported_and_compared_with_the_one_before(pytester: pytest.Pytester) -> None:
    node_dir = cpu_project(pytester)
    # 1000% (a log ratio): a busy machine's scattered host copy is judged, never unresolved (test_compare_runs.py)
    args = [*HOST_COPY, "--gb-sku=cpu", "--gb-baselines=b", *KEEP, "--gb-compare=last", "--gb-compare-fail=1000%"]
    first = pytester.runpytest(*args, "--gb-report=first.json")
    assert first.ret == pytest.ExitCode.OK, first.stdout.str()
    first.stdout.fnmatch_lines(
        [
            f"gbvalidate: --gb-compare on the command line: no earlier report of this node and SKU in {node_dir} yet: "
            "nothing compared",
            f"report kept in the history: {node_dir}/*Z.json",
            f"Prometheus file: {pytester.path}/metrics/node.prom",
        ]
    )
    report: dict[str, Any] = json.loads((pytester.path / "first.json").read_text())
    (kept,) = node_dir.iterdir()
    assert kept.read_text() == (pytester.path / "first.json").read_text()  # the same report as --gb-report's
    assert kept.name == history.file_name(dt.datetime.fromisoformat(report["start_time"]))
    assert "compare" not in report and report["settings"]["compare"]["value"] == "last"

    # The Prometheus file, as node_exporter's textfile collector would read it.
    (measured,) = report["measurements"]
    samples = series(pytester.path / "metrics" / "node.prom")
    copy = frozenset(
        {"metric": METRIC, "scope": "node", "placement": "", "tool": "", "unit": "bytes_per_second"}.items()
    )
    assert samples[("gbvalidate_measurement_value", copy)] == pytest.approx(measured["value"] * 1e9)
    assert samples[("gbvalidate_measurement_expected", copy)] == pytest.approx(0.5e9)
    assert samples[("gbvalidate_measurement_fail_limit", copy)] == pytest.approx(measured["limit"] * 1e9)
    verdict = {"metric": METRIC, "scope": "node", "placement": "", "tool": ""}
    assert samples[("gbvalidate_measurement_verdict", frozenset({**verdict, "verdict": "pass"}.items()))] == 1.0
    assert samples[("gbvalidate_measurement_verdict", frozenset({**verdict, "verdict": "fail"}.items()))] == 0.0
    (test_id,) = {t["test_id"] for t in report["tests"]}
    assert samples[("gbvalidate_test_outcome", frozenset({"test": test_id, "outcome": "passed"}.items()))] == 1.0
    assert samples[("gbvalidate_run_status", frozenset({"status": "finished"}.items()))] == 1.0
    assert samples[("gbvalidate_run_exit_code", frozenset())] == 0.0
    assert samples[("gbvalidate_run_end_timestamp_seconds", frozenset())] == unix_seconds(report["end_time"])
    info = {"sku": "cpu", "level": "full", "hostname": socket.gethostname(), "nvlink_domain": ""}  # the default level
    assert samples[("gbvalidate_run_info", frozenset(info.items()))] == 1.0

    second = pytester.runpytest(*args, "--gb-report=second.json")
    assert second.ret == pytest.ExitCode.OK, second.stdout.str()
    again: dict[str, Any] = json.loads((pytester.path / "second.json").read_text())
    assert again["compare"]["path"] == str(kept)  # the run before, never its own
    second.stdout.fnmatch_lines([f"gbvalidate: comparing with {kept} (--gb-compare on the command line): same node*"])
    (compared,) = again["measurements"]
    assert compared["compare"]["earlier_value"] == measured["value"]
    newer = [e.path for e in history.entries(node_dir)]
    assert newer[0] == kept and len(newer) == 2 and newer[1].read_text() == (pytester.path / "second.json").read_text()
    samples = series(pytester.path / "metrics" / "node.prom")  # replaced by the latest run's
    assert samples[("gbvalidate_measurement_value", copy)] == pytest.approx(compared["value"] * 1e9)


def test_a_corrupt_newest_report_stops_the_run_naming_it(pytester: pytest.Pytester) -> None:
    node_dir = cpu_project(pytester)
    node_dir.mkdir(parents=True)
    older: Any = minimal_report() | {"sku": {"name": "cpu", "source": "default", "baseline_file": None}}
    older["node"]["hostname"] = socket.gethostname()
    (node_dir / "20261120T000000Z.json").write_text(json.dumps(older))
    newest = node_dir / "20261121T000000Z.json"
    newest.write_text('{"report_version": 2, "status": "fin')  # a disk filled up as it was written
    result = pytester.runpytest(*HOST_COPY, "--gb-sku=cpu", "--gb-baselines=b", *KEEP, "--gb-compare=last")
    # Not the older one instead: the node's last evidence is unreadable, and the operator has to say what it means.
    assert_usage_error(result, f"ERROR: --gb-compare on the command line: {newest}: not JSON: *")
    assert sorted(p.name for p in node_dir.iterdir()) == ["20261120T000000Z.json", newest.name]
    assert not (pytester.path / "metrics").exists()


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--gb-prometheus=metrics"], "*--gb-prometheus on the command line: 'metrics': is a directory: *metrics"),
        (["--gb-prometheus=/dev/null"], "*'/dev/null': /dev/null is a character device, not a regular file*"),
        (["--gb-prometheus=link.prom"], "*'link.prom': *link.prom is a symbolic link (to *node.prom): name the file*"),
        (["--gb-prometheus=r.json", "--gb-report=r.json"], "*--gb-report *r.json is also --gb-prometheus*"),
        (["--gb-history=notes.txt"], "*--gb-history on the command line: 'notes.txt': is not a directory: *"),
        (["--gb-compare=last"], "*--gb-compare on the command line: 'last' compares with this node's latest report*"),
        (
            ["--gb-history=h", "--gb-report=h/HOST/20261120T000000Z.json"],
            "*--gb-report on the command line: *20261120T000000Z.json is also the history's *",
        ),
    ],
)
def test_bad_outputs_are_usage_errors_before_anything_runs(
    pytester: pytest.Pytester, args: list[str], error: str
) -> None:
    cpu_project(pytester)
    (pytester.path / "metrics").mkdir()
    (pytester.path / "notes.txt").write_text("")
    (pytester.path / "node.prom").write_text("")
    (pytester.path / "link.prom").symlink_to(pytester.path / "node.prom")
    kept = pytester.path / "h" / socket.gethostname() / "20261120T000000Z.json"
    kept.parent.mkdir(parents=True)
    kept.write_text("{}")
    args = [a.replace("HOST", socket.gethostname()) for a in args]
    assert_usage_error(pytester.runpytest(*HOST_COPY, "--gb-sku=cpu", "--gb-baselines=b", *args), error)
    assert kept.read_text() == "{}" and (pytester.path / "node.prom").read_text() == ""


def test_an_unsafe_hostname_or_a_missing_extra_is_one_line(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    cpu_project(pytester)
    monkeypatch.setattr(socket, "gethostname", lambda: "../../etc")
    result = pytester.runpytest(*HOST_COPY, "--gb-sku=cpu", "--gb-baselines=b", "--gb-history=h")
    assert_usage_error(
        result, "ERROR: --gb-history on the command line: this node's hostname '../../etc' cannot name its history *"
    )
    assert not (pytester.path / "h").exists()
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # as where the extra is not installed
    result = pytester.runpytest(*HOST_COPY, "--gb-sku=cpu", "--gb-prometheus=node.prom")
    assert_usage_error(
        result, "ERROR: *'node.prom': needs prometheus-client: pip install 'pytest-gbvalidate[[]prometheus[]]'"
    )


CHECKS = """\
import os, shutil, socket

def test_copy(gb_expect):
    gb_expect("host_copy_bandwidth_gbps", 101.0)
    if os.environ.get("LOSE") == "history":  # something takes the node's directory's place
        shutil.rmtree(os.path.join("h", socket.gethostname()))  # with the record kept as the run started
        open(os.path.join("h", socket.gethostname()), "w").close()
    if os.environ.get("LOSE") == "prometheus":  # the last run's file replaced by a directory
        os.remove("node.prom")
        os.mkdir("node.prom")
"""


def test_a_file_that_cannot_be_written_fails_the_run_and_says_so(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    lab_project(pytester, LAB, CHECKS)
    args = ["--gb-sku=LAB", "--gb-baselines=baselines", "--gb-history=h", "--gb-prometheus=node.prom"]
    monkeypatch.setenv("LOSE", "history")
    result = pytester.runpytest(*args, "--gb-report=r.json", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["Prometheus file: *node.prom", "report NOT kept in the history: *h/*"])
    assert result.stdout.str().count("the run fails") == 1
    assert json.loads((pytester.path / "r.json").read_text())["exit_status"] == 1
    assert series(pytester.path / "node.prom")[("gbvalidate_run_exit_code", frozenset())] == 1.0  # it says so too

    monkeypatch.setenv("LOSE", "prometheus")
    (pytester.path / "h" / socket.gethostname()).unlink()
    result = pytester.runpytest(*args, "--gb-report=r.json", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["Prometheus file NOT written: *node.prom: is a directory*the run fails"])
    assert json.loads((pytester.path / "r.json").read_text())["exit_status"] == 1
    assert len(list((pytester.path / "h" / socket.gethostname()).iterdir())) == 1  # the history was kept


@pytest.mark.parametrize("rank", ["0", "1"])
def test_only_global_rank_0_of_a_torchrun_world_keeps_and_exports(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, rank: str
) -> None:
    lab_project(pytester, LAB, CHECKS)
    for name, value in {"WORLD_SIZE": "2", "RANK": rank, "LOCAL_RANK": rank}.items():  # as torchrun sets them
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    result = pytester.runpytest("--gb-sku=LAB", "--gb-baselines=baselines", *KEEP, "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    written = (pytester.path / "metrics" / "node.prom").exists(), (pytester.path / "h").exists()
    assert written == ((True, True) if rank == "0" else (False, False))
    assert os.environ["RANK"] == rank  # the run left the world as it was


NODE_EXPORTER = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")


@pytest.mark.outside
@pytest.mark.skipif(
    NODE_EXPORTER is None, reason="node_exporter not installed (apt-get install prometheus-node-exporter)"
)
def test_node_exporter_s_textfile_collector_reads_the_file(tmp_path: Path) -> None:
    """The real reader: node_exporter's textfile collector takes the file without a scrape error, NaN and an escaped
    hostname included."""
    report: Any = minimal_report()
    report["measurements"][0] |= {"value": "nan", "verdict": "fail", "limit": 5.0}
    report["node"]["hostname"] = 'node"7\\\n'
    prometheus.write(tmp_path / "gbvalidate.prom", report)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [str(NODE_EXPORTER), "--collector.disable-defaults", "--collector.textfile"]
    command += [f"--collector.textfile.directory={tmp_path}", f"--web.listen-address=127.0.0.1:{port}"]
    exporter = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        text = ""
        for _ in range(100):  # up to 10 s for it to listen
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                    text = response.read().decode("utf-8")
                break
            except OSError:
                time.sleep(0.1)
    finally:
        exporter.terminate()
        _, log = exporter.communicate(timeout=10)
    scraped = series_of(text)
    assert scraped[("node_textfile_scrape_error", frozenset())] == 0.0, log
    assert "level=error" not in log
    value = {"metric": METRIC, "scope": "node", "placement": "", "tool": "", "unit": "bytes_per_second"}
    assert str(scraped[("gbvalidate_measurement_value", frozenset(value.items()))]) == "nan"
    info = {"sku": "cpu", "level": "", "hostname": 'node"7\\\n', "nvlink_domain": ""}
    assert scraped[("gbvalidate_run_info", frozenset(info.items()))] == 1.0


KILLED = """\
import os, signal

def test_copy(gb_expect):
    gb_expect("host_copy_bandwidth_gbps", 101.0)
    os.kill(os.getpid(), signal.SIGKILL)  # as slurmd ends a run that hung past its grace
"""


def test_a_run_killed_outright_stays_in_the_history_as_running_and_is_an_offender(pytester: pytest.Pytester) -> None:
    """The history kept a run only as it ended: a node whose runs hung until SIGKILL left nothing there, and `fleet
    offenders` could not name it."""
    lab_project(pytester, LAB, KILLED)
    args = ["--gb-sku=LAB", "--gb-baselines=baselines", "--gb-history=h", "-p", "no:cacheprovider"]
    for _ in range(3):
        result = pytester.runpytest_subprocess(*args)
        assert result.ret == -9
        time.sleep(1.1)  # kept by start time, to the second
    directory = pytester.path / "h" / socket.gethostname()
    kept = [json.loads(p.read_text()) for p in sorted(directory.iterdir())]
    assert [(r["status"], r["sku"]["name"]) for r in kept] == [("running", "LAB")] * 3
    done = subprocess.run(
        [sys.executable, "-m", "pytest_gbvalidate.fleet", "offenders", "h", "--failed", "2"],
        cwd=pytester.path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"{socket.gethostname()}: failed 2 of its last 2 runs, 2 of them stopped before the end" in done.stdout
