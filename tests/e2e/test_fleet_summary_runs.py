"""The fleet summary (`python -m pytest_gbvalidate.fleet summary`) end to end: one real node report from the
cpu suites, copied for the other nodes (hostname changed, one node slower, one with a failed test and its fault,
one partial, a corrupt file, another SKU's, an earlier one of the same host). (The statistics on their own:
unit/test_fleet_summary.py.)"""

from __future__ import annotations

import copy
import csv
import importlib.util
import shlex
import struct
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from pytest_gbvalidate.fleet import commands, junit, render
from pytest_gbvalidate.fleet.cli import main
from pytest_gbvalidate.fleet.reports import (
    CORRUPT,
    LESSER_LEVEL,
    NARROWED,
    OTHER_SKU,
    SUPERSEDED,
    UNFINISHED,
    Report,
    read,
)
from pytest_gbvalidate.fleet.summary import Summary, summarize
from pytest_gbvalidate.rules.breaker import Breaker
from tests.helpers.cpu_run import CpuRun
from tests.helpers.fleet_reports import write
from tests.helpers.runs import schema_errors

HOST_COPY = "host_copy_bandwidth_gbps"
# Each node's values scaled alike: spread a little, none far from the others (the worst is 1 scaled MAD out).
HEALTHY = {"node-01": 1.0, "node-02": 0.995, "node-03": 1.005, "node-04": 1.01}
FAULT: dict[str, Any] = {"category": "performance", "title": "slow", "action": "investigate performance"}
FAULT |= {"disposition": "MONITOR", "why": None}


@pytest.fixture(scope="module")
def real_report(cpu_suites_run: CpuRun) -> dict[str, Any]:
    """The session's real run of the cpu suites (tests/helpers/cpu_run.py), cut down to the host copy and the
    all-reduce checks: their tests and measurements, as a run narrowed to them by -k reports them (the run they
    came from is shared; a run of their own took about 10 s)."""

    def kept(test_id: str) -> bool:  # as `-k "host_copy or all_reduce_busbw"` selects
        return any(word in test_id.split("::")[-1] for word in ("host_copy", "all_reduce_busbw"))

    report = copy.deepcopy(cpu_suites_run.report)
    assert report["status"] == "finished", cpu_suites_run.stdout
    report["tests"] = [t for t in report["tests"] if kept(t["test_id"])]
    report["measurements"] = [m for m in report["measurements"] if kept(m["test_id"])]
    assert all(t["outcome"] != "failed" for t in report["tests"]), cpu_suites_run.stdout
    report["exit_status"] = 0  # as the narrowed run's, whatever the session's run said of its other checks
    assert any(m["metric"] == HOST_COPY for m in report["measurements"])
    return report


def node(real: dict[str, Any], host: str, factor: float = 1.0, **changes: Any) -> dict[str, Any]:
    """A copy of `real` as `host`'s report, every numeric value scaled by `factor`, each with a spread of 1% (this
    machine's own spread would make the outlier rule's noise margin depend on how busy it was)."""
    report = copy.deepcopy(real)
    report["node"]["hostname"] = host
    for m in report["measurements"]:
        if isinstance(m["value"], float):
            m["value"] *= factor
            m["noise"] = {"summary": "median", "count": 20, "spread_pct": 1.0}
    report.update(changes)
    return report


def failing(real: dict[str, Any], host: str, **changes: Any) -> dict[str, Any]:
    """`host`'s report (node()) with its first test failed, as a node that failed a check."""
    report = node(real, host, exit_status=1, **changes)
    report["tests"][0] |= {"outcome": "failed", "message": "boom", "text": "boom"}
    return report


def hosts(*hostnames: str) -> list[dict[str, Any]]:
    """A multi-node run's `gang.hosts`, by node rank."""
    return [{"node_rank": rank, "hostname": hostname} for rank, hostname in enumerate(hostnames)]


def healthy_fleet(real: dict[str, Any], directory: Path) -> list[Path]:
    return [write(directory, f"{host}.json", node(real, host, factor)) for host, factor in HEALTHY.items()]


def troubled_fleet(real: dict[str, Any], directory: Path) -> list[Path]:
    """The healthy nodes, and: node-05 whose host copy is half the others' (an outlier that still passes its
    baseline), node-06 with a failed test and its fault, node-07 partial, a corrupt file, another SKU's report,
    and an earlier report of node-01."""
    paths = healthy_fleet(real, directory)
    slow = node(real, "node-05")
    for m in slow["measurements"]:
        if m["metric"] == HOST_COPY:
            m["value"] *= 0.5
    failed = node(real, "node-06", exit_status=1)
    test = next(t for t in failed["tests"] if t["outcome"] == "passed")
    test |= {
        "outcome": "failed",
        "message": "host copy: measured 0.1 GB/s -> FAIL",
        "text": "trace\x1b[31m",
        "fault": FAULT,
    }
    other_sku = node(real, "node-08", sku=real["sku"] | {"name": "ND_H100_v5"})
    earlier = node(real, "node-01", start_time="2020-01-01T00:00:00+00:00", exit_status=1)
    paths += [write(directory, "node-05.json", slow), write(directory, "node-06.json", failed)]
    paths += [write(directory, "node-07.json", node(real, "node-07", status="interrupted", exit_status=2))]
    paths += [write(directory, "broken.json", '{"schema": "pytest-gbvalidate/report/1", "stat')]
    paths += [write(directory, "node-08.json", other_sku), write(directory, "node-01-old.json", earlier)]
    return paths


def run_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "pytest_gbvalidate.fleet", "summary", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def suites(path: Path) -> dict[str, ET.Element]:
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites"
    return {suite.get("name", ""): suite for suite in root.iter("testsuite")}


def read_csv(path: Path) -> list[dict[str, str]]:
    return read_csv_text(path.read_text())


def read_csv_text(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(text.splitlines()))


def outcome(case: ET.Element) -> str:
    return next((tag for tag in ("failure", "error", "skipped") if case.find(tag) is not None), "passed")


def test_a_reader_that_stops_reading_gets_no_traceback_and_the_verdict_stands(
    real_report: dict[str, Any], tmp_path: Path
) -> None:
    """`fleet summary ... | head -1`: the reader is gone before the summary is printed (its end of the pipe closed
    first); no BrokenPipeError traceback, the files are written, the exit status is the fleet's verdict."""
    paths = healthy_fleet(real_report, tmp_path)
    command = [sys.executable, "-m", "pytest_gbvalidate.fleet", "summary", *map(str, paths), "--out", "out"]
    with subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as reader:
        assert reader.stdout is not None and reader.stderr is not None
        reader.stdout.close()
        said = reader.stderr.read()
        assert reader.wait(timeout=120) == 0, said
    assert "Traceback" not in said and "BrokenPipeError" not in said, said
    assert (tmp_path / "out" / "summary.md").is_file()


def test_a_healthy_fleet_passes_with_every_output_written(real_report: dict[str, Any], tmp_path: Path) -> None:
    paths = healthy_fleet(real_report, tmp_path)
    out = tmp_path / "out"
    done = run_cli(*paths, "--out", out, "--plots")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 nodes (4 pass), 0 outlier node(s): PASS (exit 0)" in done.stdout
    assert "scontrol" not in done.stdout
    for name in ("summary.md", "nodes.csv", "metrics.csv", "fleet.xml"):
        assert (out / name).stat().st_size > 0
    if importlib.util.find_spec("matplotlib") is not None:
        png = (out / "plots" / "fleet.png").read_bytes()
        assert png.startswith(b"\x89PNG")
        # readable as it stands: each metric's band at least 30 pixels high (the IHDR chunk gives the size)
        width, height = struct.unpack(">II", png[16:24])
        bands = len(read_csv(out / "metrics.csv"))
        assert height >= 30 * bands and width >= 360, (width, height, bands)

    by_suite = suites(out / "fleet.xml")
    assert sorted(by_suite) == list(HEALTHY)
    test_ids = {t["test_id"] for t in real_report["tests"]}
    for suite in by_suite.values():
        assert len(suite.findall("testcase")) == len(test_ids) == int(suite.get("tests", ""))
        assert suite.get("failures") == "0" and suite.get("errors") == "0"
    rows = read_csv(out / "nodes.csv")
    assert [(r["hostname"], r["verdict"], r["drain"]) for r in rows] == [(h, "pass", "no") for h in HEALTHY]
    assert all(r["torch"] == real_report["node"]["torch"] for r in rows)
    metrics = read_csv(out / "metrics.csv")
    gated = {(m["metric"], m["scope"]) for m in real_report["measurements"] if m["verdict"] != "info"}
    assert {(m["metric"], m["scope"]) for m in metrics} == gated
    assert all(m["nodes"] == "4" and m["outliers"] == "" for m in metrics)


def test_failed_outlier_partial_and_unusable_reports_are_listed_and_fail_the_fleet(
    real_report: dict[str, Any], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    done = run_cli(*troubled_fleet(real_report, tmp_path), "--out", out)
    assert done.returncode == 1, done.stdout + done.stderr

    rows = {(r["hostname"], r["verdict"]): r for r in read_csv(out / "nodes.csv")}
    assert sorted(rows) == sorted(
        [(h, "pass") for h in HEALTHY]
        + [("node-05", "pass"), ("node-06", "fail"), ("node-07", "partial")]
        + [("", CORRUPT), ("node-08", OTHER_SKU), ("node-01", SUPERSEDED)]
    )
    assert rows[("node-05", "pass")]["outlier_metrics"] == f"{HOST_COPY} [node] -50%"
    assert rows[("node-06", "fail")]["fault_actions"] == "performance: investigate performance"
    assert "not JSON" in rows[("", CORRUPT)]["reason"]
    assert rows[("node-08", OTHER_SKU)]["reason"] == "SKU ND_H100_v5, the fleet's is cpu"
    # node-07 was stopped without a failed check: not shown healthy (the fleet fails), and not drained
    assert [h for (h, _), r in rows.items() if r["drain"] == "yes"] == ["node-05", "node-06"]

    # the drain commands: printed, one per node out of service, each parses back to its host and reason
    commands = [shlex.split(line) for line in done.stdout.splitlines() if line.strip().startswith("scontrol")]
    assert [c[:4] for c in commands] == [
        ["scontrol", "update", f"nodename={host}", "state=drain"] for host in ("node-05", "node-06")
    ]
    reasons = [c[4] for c in commands]
    assert reasons[0] == f"reason=gbvalidate: [hardware] outlier {HOST_COPY}[node] -50%"
    assert reasons[1].startswith("reason=gbvalidate: [hardware] performance: test_")
    # and Kubernetes': cordon, taint and label each node with what took it out, printed, never run
    kubectl = [shlex.split(line) for line in done.stdout.splitlines() if line.strip().startswith("kubectl")]
    assert kubectl == [
        line
        for host, category in (("node-05", "outlier"), ("node-06", "performance"))
        for line in (
            ["kubectl", "cordon", host],
            ["kubectl", "taint", "nodes", host, f"gbvalidate/fault={category}:NoSchedule", "--overwrite"],
            ["kubectl", "label", "nodes", host, f"gbvalidate/fault={category}", "--overwrite"],
        )
    ]
    summary_md = (out / "summary.md").read_text()
    assert "Kubernetes (printed, not run):" in summary_md and "kubectl taint nodes node-06 " in summary_md

    by_suite = suites(out / "fleet.xml")
    assert sorted(by_suite) == [*HEALTHY, "node-05", "node-06", "node-07", "reports not merged"]
    slow = {case.get("name"): case for case in by_suite["node-05"].iter("testcase")}
    assert outcome(slow[f"{HOST_COPY} [node]"]) == "failure"
    failed = [case for case in by_suite["node-06"].iter("testcase") if outcome(case) == "failure"]
    assert len(failed) == 1
    assert failed[0].find("failure").get("type") == "performance"  # type: ignore[union-attr]
    properties = {p.get("name"): p.get("value") for p in by_suite["node-06"].iterfind("properties/property")}
    faults = {name: value for name, value in properties.items() if str(name).startswith("fault[")}
    assert list(faults.values()) == ["performance (MONITOR): investigate performance"]
    assert schema_errors(out / "fleet.xml") == []
    assert failed[0].find("failure") is not None and "\x1b" not in (failed[0].findtext("failure") or "")
    partial = {case.get("name"): outcome(case) for case in by_suite["node-07"].iter("testcase")}
    assert partial["report finished"] == "failure"
    unusable = [outcome(case) for case in by_suite["reports not merged"].iter("testcase")]
    assert sorted(unusable) == ["error", "skipped", "skipped"]

    markdown = (out / "summary.md").read_text()
    for heading in ("## Nodes", "## Take out of service", "## Outliers", "## Metrics across nodes"):
        assert heading in markdown
    assert f"| {tmp_path / 'broken.json'} | corrupt |" in markdown
    assert "plots not drawn (--plots draws them)" in markdown


def test_a_report_still_running_gives_no_verdict_and_no_drain_line(real_report: dict[str, Any], tmp_path: Path) -> None:
    """A summary taken while some nodes' runs go on (the per-node recipe as a job array, its first job to end) named
    those healthy nodes for draining: a report still `running` is being written, or was killed outright."""
    paths = healthy_fleet(real_report, tmp_path)
    paths.append(write(tmp_path, "node-05.json", node(real_report, "node-05", status="running", exit_status=None)))
    out = tmp_path / "out"
    done = run_cli(*paths, "--out", out)
    assert done.returncode == 1, done.stdout + done.stderr
    rows = {r["hostname"]: r for r in read_csv(out / "nodes.csv")}
    assert (rows["node-05"]["verdict"], rows["node-05"]["drain"]) == ("no verdict", "no")
    assert "scontrol" not in done.stdout and "kubectl" not in done.stdout
    assert all(rows[host]["verdict"] == "pass" for host in HEALTHY)


def test_another_sku_is_left_out_without_failing_and_sku_picks_the_fleet(
    real_report: dict[str, Any], tmp_path: Path
) -> None:
    paths = healthy_fleet(real_report, tmp_path)
    other = node(real_report, "h100-01", sku=real_report["sku"] | {"name": "ND_H100_v5"})
    paths.append(write(tmp_path, "h100-01.json", other))
    summary = summarize(paths)
    assert summary.sku == "cpu" and summary.exit_code == 0
    assert [(r.kind, r.hostname) for r in summary.not_merged] == [(OTHER_SKU, "h100-01")]

    only = summarize(paths, sku="ND_H100_v5")
    assert [n.hostname for n in only.nodes] == ["h100-01"] and only.exit_code == 0
    assert only.statistics_note is not None and "at least 3 nodes" in only.statistics_note
    assert only.metrics and not only.outliers  # medians and spreads, no outliers


def test_the_latest_report_of_a_host_speaks_for_it_even_when_partial(
    real_report: dict[str, Any], tmp_path: Path
) -> None:
    old = write(tmp_path, "old.json", node(real_report, "node-01", start_time="2020-01-01T00:00:00+00:00"))
    new = write(tmp_path, "new.json", node(real_report, "node-01", status="interrupted", exit_status=2))
    summary = summarize([new, old])
    assert [(n.hostname, n.verdict) for n in summary.nodes] == [("node-01", "partial")]
    assert [(r.path, r.kind) for r in summary.not_merged] == [(old, SUPERSEDED)]
    assert summary.exit_code == 1 and not summary.nodes[0].drain  # stopped, nothing failed: no finding
    assert summary.metrics == []  # a partial report's measurements stay out of the statistics


def test_a_run_that_never_finished_or_checked_less_does_not_speak_over_a_failed_whole_run(
    real_report: dict[str, Any], tmp_path: Path
) -> None:
    """A failed full run, then a run killed outright (`running`, no test) or a quick run that passed: the failure
    still speaks for the node (drained), the later one is listed with why; the node's row says its level."""
    failed = failing(real_report, "node-01") | {"start_time": "2026-11-01T00:00:00+00:00"}
    killed = node(real_report, "node-01", status="running", exit_status=None) | {"tests": [], "end_time": None}
    quick = node(real_report, "node-02", level="quick")
    paths = [write(tmp_path, "failed.json", failed), write(tmp_path, "killed.json", killed)]
    paths += [write(tmp_path, "failed2.json", failing(real_report, "node-02") | {"start_time": failed["start_time"]})]
    paths.append(write(tmp_path, "quick.json", quick))
    summary = summarize(paths, breaker=Breaker(max_pct=100))
    assert [(n.hostname, n.verdict, n.drain) for n in summary.nodes] == [
        ("node-01", "fail", True),
        ("node-02", "fail", True),
    ]
    kinds = {r.path.name: r.kind for r in summary.not_merged}
    assert kinds == {"killed.json": UNFINISHED, "quick.json": LESSER_LEVEL}
    assert render.node_row(summary.nodes[0]).csv()["level"] == "full"


def test_a_non_zero_exit_status_without_a_failed_test_gives_no_verdict(
    real_report: dict[str, Any], tmp_path: Path
) -> None:
    """Exit status 1 without a failed test (an output the run could not write, evidence it lost) and the run's own
    failure (3 internal error, 4 usage error, 5 nothing collected) say nothing of the node: listed, not drained, and
    the summary does not pass -- as the health check reads the same report (report/node_verdict.py)."""
    paths = healthy_fleet(real_report, tmp_path)
    paths.append(write(tmp_path, "lost.json", node(real_report, "node-08", exit_status=1)))
    paths += [write(tmp_path, f"own{s}.json", node(real_report, f"node-{s + 6:02d}", exit_status=s)) for s in (3, 4, 5)]
    summary = summarize(paths)
    assert not [n for n in summary.nodes if n.verdict == "fail"] and not summary.drained
    own = [n.hostname for n in summary.nodes if n.verdict == "no verdict"]
    assert own == ["node-08", "node-09", "node-10", "node-11"]
    assert "4 node(s) gave no verdict (pytest's own error, or no check ran: see their reports)" in summary.failures()
    assert summary.exit_code == 1


@pytest.mark.parametrize(
    "lie", ["passed-with-a-failure", "pass-past-its-limit", "fail-within-its-limit", "fail-in-a-pass"]
)
def test_a_report_that_contradicts_itself_is_believed_in_neither_direction(
    real_report: dict[str, Any], tmp_path: Path, lie: str
) -> None:
    """A run that says it passed with a failed test, a measurement whose verdict its own value and fail limit deny,
    a measurement that failed in a test that passed: edited, or written by something else than a run. The node
    was passed (or drained) on it; it is corrupt now, the field named, and the fleet does not pass."""
    report = node(real_report, "node-09")
    gated = next(m for m in report["measurements"] if m.get("limit") and isinstance(m["value"], float))
    if lie == "passed-with-a-failure":
        report["tests"][0] |= {"outcome": "failed", "message": "boom", "text": "boom"}
        why = "exit_status 0 of a finished run with 1 failed test(s)"
    elif lie == "pass-past-its-limit":
        gated["value"] = gated["limit"] * (0.5 if gated["direction"] == "higher" else 2.0)
        why = "verdict pass, though its value"
    elif lie == "fail-within-its-limit":
        gated["verdict"] = "fail"
        report["exit_status"] = 1
        test = next(t for t in report["tests"] if t["test_id"] == gated["test_id"] and t["when"] == "call")
        test |= {"outcome": "failed", "message": "boom", "text": "boom"}
        why = "verdict fail, though its value"
    else:
        gated["verdict"] = "fail"
        why = f"verdict fail in the test {gated['test_id']}, which passed"
    paths = [*healthy_fleet(real_report, tmp_path), write(tmp_path, "lie.json", report)]
    summary = summarize(paths)
    (corrupt,) = [r for r in summary.not_merged if r.kind == CORRUPT]
    assert corrupt.path.name == "lie.json" and why in corrupt.reason, corrupt.reason
    assert summary.exit_code == 1 and not summary.drained


def test_a_narrowed_rerun_does_not_speak_for_a_node_a_whole_run_failed(
    real_report: dict[str, Any], tmp_path: Path
) -> None:
    """node-06 failed a check; run again with `-k` that check alone, it passed, and superseded the whole run: the
    fleet passed. The whole run still speaks for it; a later whole run does."""
    paths = healthy_fleet(real_report, tmp_path)
    whole = failing(real_report, "node-06", start_time="2026-11-28T10:00:00+00:00", narrowed_by=[])
    rerun = node(real_report, "node-06", start_time="2026-11-28T11:00:00+00:00", narrowed_by=["-k 'host_copy'"])
    paths += [write(tmp_path, "whole.json", whole), write(tmp_path, "rerun.json", rerun)]
    summary = summarize(paths)
    assert [n.hostname for n in summary.drained] == ["node-06"] and summary.exit_code == 1
    (narrowed,) = [r for r in summary.not_merged if r.kind == NARROWED]
    assert narrowed.path.name == "rerun.json"
    assert narrowed.reason.startswith("checked a subset (-k 'host_copy'): ") and "whole.json" in narrowed.reason
    again = node(real_report, "node-06", start_time="2026-11-28T12:00:00+00:00", narrowed_by=[])
    summary = summarize([*paths, write(tmp_path, "again.json", again)])
    assert summary.drained == [] and summary.exit_code == 0


def test_a_missing_report_is_corrupt_and_fails_the_fleet(real_report: dict[str, Any], tmp_path: Path) -> None:
    summary = summarize([*healthy_fleet(real_report, tmp_path), tmp_path / "absent.json"])
    assert [(r.kind, r.reason) for r in summary.not_merged] == [(CORRUPT, "cannot read: No such file or directory")]
    assert summary.failures() == ["1 report(s) are corrupt"]


def step_time(value_s: float, gbs: int, **details: Any) -> dict[str, Any]:
    """A pretraining step time measurement as test_pretrain.py records it."""
    layout = f"native-bf16-mbs2-gbs{gbs}-tp1-pp2-cp1-dp1-seq64"
    return {
        "test_id": "suites/test_pretrain.py::test_pretrain",
        "metric": "llama3_tiny_step_time_s",
        "scope": layout,
        "scope_kind": "layout",
        "value": value_s,
        "unit": "s",
        "direction": "lower",
        "details": {"model": "llama3_tiny", "layout": layout, "engine": "native", "precision": "bf16", "mbs": 2}
        | {"gbs": gbs, "dp": 1, "seq_len": 64, "tp": 1, "pp": 2, "cp": 1}
        | details,
        "verdict": "info",
        "message": "measured; not gated at this scope",
    }


def test_weak_scaling_pairs_a_multi_node_run_with_the_single_node_runs_of_its_per_node_batch(
    real_report: dict[str, Any], tmp_path: Path
) -> None:
    paths = []
    for host, seconds in (("node-01", 0.40), ("node-02", 0.42), ("node-03", 0.44)):
        report = node(real_report, host)
        report["measurements"].append(step_time(seconds, gbs=16))
        paths.append(write(tmp_path, f"{host}.json", report))
    gang = real_report["gang"] | {"nodes": 2, "hosts": hosts("node-01", "node-02")}
    run = node(real_report, "node-01", gang=gang)
    per_node = {"node-01": 0.48, "node-02": 0.5}
    compute = {"node-01": 0.3, "node-02": 0.45}  # before the gradient sync, where node-02 shows as the straggler
    weak_scaled = step_time(0.5, gbs=32, per_node_step_time_s=per_node, per_node_compute_s=compute, rank_spread_pct=4.2)
    run["measurements"] += [weak_scaled, step_time(0.6, gbs=48)]
    paths.append(write(tmp_path, "two-nodes.json", run))
    other_layout = node(real_report, "node-04")
    other_layout["measurements"].append(step_time(0.1, gbs=16, pp=1))  # not the same per-node work: left out
    paths.append(write(tmp_path, "node-04.json", other_layout))

    summary = summarize(paths)
    assert [n.hostname for n in summary.nodes] == ["node-01", "node-02", "node-03", "node-04"]  # the run: no row
    assert [r.path.name for r in summary.multi_node] == ["two-nodes.json"] and summary.exit_code == 0
    paired, unpaired = summary.scaling
    assert paired.reference_s == pytest.approx(0.42) and paired.efficiency == pytest.approx(0.42 / 0.5)
    straggler = paired.straggler
    assert straggler is not None and straggler.host == "node-02"
    assert straggler.spread_pct == pytest.approx((0.45 - 0.3) / 0.375 * 100)
    assert unpaired.efficiency is None and "gbs 24 (the per-node batch)" in unpaired.note

    markdown = render.markdown(summary, [], None, tmp_path)
    assert "### Weak scaling" in markdown and "| 0.840 |" in markdown
    assert "Straggler: node-02, work before the gradient sync: slowest 0.45 s, fastest 0.3 s" in markdown
    assert "ranks' spread 4.2%" in markdown and "| node | work before the gradient sync (s) |" in markdown


def test_a_later_multi_node_run_over_the_same_nodes_supersedes_the_earlier(
    real_report: dict[str, Any], tmp_path: Path
) -> None:
    # the rendezvous numbered the nodes the other way round the second time
    gang = real_report["gang"] | {"nodes": 2, "hosts": hosts("node-02", "node-01")}
    failed = node(real_report, "node-01", gang=gang, exit_status=1, start_time="2020-01-01T00:00:00+00:00")
    failed["tests"][0] |= {"outcome": "failed", "message": "x"}
    passed = node(real_report, "node-01", gang=gang | {"hosts": hosts("node-01", "node-02")})
    paths = [
        *healthy_fleet(real_report, tmp_path),
        write(tmp_path, "old.json", failed),
        write(tmp_path, "new.json", passed),
    ]
    summary = summarize(paths)
    assert [r.path.name for r in summary.multi_node] == ["new.json"] and summary.exit_code == 0
    (superseded,) = summary.not_merged
    assert superseded.kind == SUPERSEDED and superseded.reason.startswith("a later run over the same 2 nodes: ")


def test_a_node_a_multi_node_run_found_at_fault_is_drained_with_or_without_its_own_report(
    real_report: dict[str, Any], tmp_path: Path
) -> None:
    """The pairwise check of a multi-node run blames node-02 (which passed alone) and node-99 (no report here)."""
    paths = healthy_fleet(real_report, tmp_path)
    gang = real_report["gang"] | {
        "nodes": 4,
        "hosts": hosts("node-01", "node-02", "node-03", "node-99"),
    }
    test_id = "suites/test_collectives.py::test_pairwise_all_reduce_busbw"
    suspects = [
        {
            "test_id": test_id,
            "host": "node-02",
            "why": "slow in all 2 of its pairs",
            "fault": FAULT | {"category": "link"},
        },
        {
            "test_id": test_id,
            "host": "node-99",
            "why": "its ranks returned wrong data",
            "fault": FAULT | {"category": "x"},
        },
    ]
    paths.append(write(tmp_path, "four.json", node(real_report, "node-01", gang=gang, suspects=suspects)))
    summary = summarize(paths)
    assert [n.hostname for n in summary.drained] == ["node-02"]
    assert [(n.host, n.reason, n.category) for n in summary.drain_list()] == [
        ("node-02", "gbvalidate: [hardware] link: test_pairwise_all_reduce_busbw (multi-node)", "link"),
        ("node-99", "gbvalidate: [hardware] x: test_pairwise_all_reduce_busbw (multi-node)", "x"),
    ]
    assert [shlex.split(c)[2] for c in commands.drain_commands(summary)] == ["nodename=node-02", "nodename=node-99"]
    rows = {r["hostname"]: r for r in read_csv_text(render.nodes_csv(summary))}
    assert (rows["node-02"]["verdict"], rows["node-02"]["drain"]) == ("pass", "yes")
    assert (rows["node-99"]["verdict"], rows["node-99"]["drain"]) == ("multi-node finding", "yes")
    assert rows["node-99"]["failed_checks"] == f"{test_id} [x]"
    (tmp_path / "fleet.xml").write_text(junit.fleet_junit(summary))
    assert schema_errors(tmp_path / "fleet.xml") == []
    by_suite = suites(tmp_path / "fleet.xml")
    for host, category in (("node-02", "link"), ("node-99", "x")):
        (case,) = [c for c in by_suite[host].iter("testcase") if c.get("classname") == "fleet.multi_node"]
        assert case.find("failure").get("type") == category  # type: ignore[union-attr]
    markdown = render.markdown(summary, [], None, tmp_path)
    assert "- **node-99** (no report of its own here)" in markdown
    assert f"link: test_pairwise_all_reduce_busbw (multi-node) in {tmp_path / 'four.json'}: slow in all 2" in markdown


def test_drain_reasons_are_short_and_survive_the_shell(real_report: dict[str, Any], tmp_path: Path) -> None:
    paths = healthy_fleet(real_report, tmp_path)
    bad = node(real_report, "node-09", exit_status=1)
    for i, test in enumerate(bad["tests"]):
        test |= {"outcome": "failed", "test_id": f"suites/x.py::test_it's_{i}", "fault": FAULT}
    paths.append(write(tmp_path, "node-09.json", bad))
    summary = summarize(paths)
    (line,) = commands.drain_commands(summary)
    *_, reason = shlex.split(line)
    # scontrol strips a quote at either end, a shell or a log parser reads the rest: the reason holds none
    assert reason.startswith("reason=gbvalidate: [hardware] performance: test_its_0,test_its_1,")
    assert len(reason) - len("reason=") <= 120 and "\n" not in reason


def test_without_matplotlib_the_plots_are_skipped_with_a_note(
    real_report: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    out = tmp_path / "out"
    assert main(["summary", *map(str, healthy_fleet(real_report, tmp_path)), "--out", str(out), "--plots"]) == 0
    note = "plots skipped: matplotlib is not installed"
    assert note in capsys.readouterr().out and note in (out / "summary.md").read_text()
    assert not (out / "plots").exists()


def test_the_summary_flags_an_outlier_that_passed_its_baseline(real_report: dict[str, Any], tmp_path: Path) -> None:
    """On the cpu SKU, whose reports say its figures need a resolution of 60%: a node 15% below the rest is
    within what the metric needs to tell (the fixed 10% of the median drains it); one 60% below is drained."""

    def fleet_with(factor: float) -> list[Path]:
        directory = tmp_path / str(factor)
        directory.mkdir()
        paths = healthy_fleet(real_report, directory)
        slow = node(real_report, "node-05")
        for m in slow["measurements"]:
            if m["metric"] == HOST_COPY:
                m["value"] *= factor  # within the baseline's limits (a floor at a twentieth)
        return [*paths, write(directory, "node-05.json", slow)]

    fine = fleet_with(0.85)
    assert summarize(fine).outliers == [] and summarize(fine).exit_code == 0
    assert [n.hostname for n in summarize(fine, pct=10).drained] == ["node-05"]
    paths = fleet_with(0.4)
    summary: Summary = summarize(paths)
    ((flagged, outlier),) = summary.outliers
    assert flagged.hostname == "node-05" and flagged.verdict == "pass" and flagged.drain
    assert outlier.metric.key.metric == HOST_COPY and outlier.outlier.worse_pct == pytest.approx(60, abs=1)
    assert outlier.metric.needed_pct == 60.0 and "the 60% its metric needs to tell" in outlier.outlier.rules[1]
    assert summary.failures() == ["1 node(s) are outliers"]
    relaxed = summarize(paths, mad_k=float("inf"), pct=20)
    assert relaxed.outliers == [] and relaxed.exit_code == 0


def test_a_report_from_the_future_or_undated_never_hides_a_later_one(
    real_report: dict[str, Any], tmp_path: Path
) -> None:
    paths = healthy_fleet(real_report, tmp_path)
    stopped = write(tmp_path, "now.json", node(real_report, "node-01", status="interrupted", exit_status=2))
    future = write(tmp_path, "future.json", node(real_report, "node-01", start_time="2099-01-01T00:00:00+00:00"))
    undated = write(tmp_path, "undated.json", node(real_report, "node-02", start_time="yesterday"))
    summary = summarize([*paths, stopped, future, undated])
    by_host = {n.hostname: n for n in summary.nodes}
    assert by_host["node-01"].report.path == stopped and by_host["node-01"].verdict == "partial"
    reasons = {r.path.name: (r.kind, r.reason) for r in summary.not_merged}
    assert reasons["future.json"][0] == CORRUPT
    assert reasons["future.json"][1].startswith("start_time 2099-01-01T00:00:00+00:00 is in the future (now 20")
    assert reasons["undated.json"] == (CORRUPT, "start_time 'yesterday' is not an ISO 8601 time: undated")
    assert summary.exit_code == 1


def test_only_a_hostname_that_names_one_node_gets_a_drain_line(real_report: dict[str, Any], tmp_path: Path) -> None:
    """Slurm reads ALL, lists and ranges as many nodes; a newline or an escape sequence must not reach a terminal."""
    odd = ["ALL", "n1,n2", "node[01-99]", "evil\n\x1b[2J", "n\u043e\u0434e-1", "n1.cluster.local"]
    failed = [write(tmp_path, f"odd{i}.json", failing(real_report, host)) for i, host in enumerate(odd)]
    fleet = [*healthy_fleet(real_report, tmp_path), *failed]
    summary = summarize(fleet, breaker=Breaker(max_pct=100))  # the lines are tested here, not the breaker
    drains = commands.drain_commands(summary)
    assert [c.split()[2] for c in drains] == ["nodename=n1"]
    assert commands.not_drained(summary) == ["ALL", "evil\\n\\x1b[2J", "n1,n2", "n\\u043e\\u0434e-1", "node[01-99]"]
    # Kubernetes names whole hostnames, lowercased: `all` is one node there, an FQDN is its own name
    cordoned = [line.split()[2] for line in commands.kubectl_commands(summary) if line.startswith("kubectl cordon")]
    assert cordoned == ["all", "n1.cluster.local"]
    notes = commands.kubectl_notes(summary)
    assert [note.split(": ", 1)[0] for note in notes] == [
        "evil\\n\\x1b[2J",
        "n1,n2",
        "n\\u043e\\u0434e-1",
        "node[01-99]",
    ]
    text = "\n".join(render.terminal(summary, [], None))
    assert "\x1b" not in text and "\u043e" not in text
    assert "evil\\n\\x1b[2J: no drain line: the hostname does not name exactly one node" in text
    assert "n1,n2: no kubectl lines: the hostname is no Kubernetes node name (RFC 1123)" in text
    markdown = render.markdown(summary, [], None, tmp_path)
    assert "\x1b" not in markdown and "nodename=ALL" not in markdown and "cordon n1,n2" not in markdown


def test_a_node_that_ran_less_than_its_peers_is_drained_with_what_it_lacks(
    real_report: dict[str, Any], tmp_path: Path
) -> None:
    paths = healthy_fleet(real_report, tmp_path)
    short = node(real_report, "node-09")  # its run was cut to the host copy (-k, a wrapper's wrong list)
    short["tests"] = [t for t in short["tests"] if "host_copy" in t["test_id"] or t["when"] != "call"]
    short["measurements"] = [m for m in short["measurements"] if m["metric"] == HOST_COPY]
    summary = summarize([*paths, write(tmp_path, "node-09.json", short)])
    lacking = {n.hostname: n.lacks for n in summary.nodes if n.lacks}
    assert list(lacking) == ["node-09"] and lacking["node-09"]
    assert all(name.startswith("test_all_reduce") for name in lacking["node-09"]), lacking
    assert summary.exit_code == 1 and "1 node(s) ran less than their peers" in summary.failures()
    ((host, reason, _),) = [(n.host, n.reason, n.category) for n in summary.drain_list()]
    assert host == "node-09" and "ran less than its peers: test_all_reduce" in reason


def test_a_report_that_says_what_its_writer_never_does_is_corrupt_and_drains_nobody(
    real_report: dict[str, Any], tmp_path: Path
) -> None:
    """A gang of no nodes, or of more than it names, vanished from every list; a finished run without one of pytest's
    exit statuses was drained as failed, and a start time UTC cannot hold stopped the summary with a traceback."""
    gang = real_report["gang"]
    odd = {
        "zero.json": node(real_report, "node-05", gang=gang | {"nodes": 0, "hosts": []}, exit_status=1),
        "negative.json": node(real_report, "node-06", gang=gang | {"nodes": -1}),
        "more.json": node(real_report, "node-07", gang=gang | {"nodes": 10**18, "hosts": hosts("node-07", "node-17")}),
        "null.json": node(real_report, "node-08", exit_status=None),
        "huge.json": node(real_report, "node-09", exit_status=999),
        "year1.json": node(real_report, "node-10", start_time="0001-01-01T00:00:00+14:00"),
    }
    paths = [*healthy_fleet(real_report, tmp_path), *(write(tmp_path, name, r) for name, r in odd.items())]
    summary = summarize(paths)
    reasons = {r.path.name: r.reason for r in summary.not_merged if r.kind == CORRUPT}
    assert reasons == {
        "zero.json": "gang.nodes is 0 and gang.hosts names 0: a gang has 1 node or more",
        "negative.json": "gang.nodes is -1 and gang.hosts names 1: a gang has 1 node or more",
        "more.json": f"gang.nodes is {10**18} and gang.hosts names 2: a gang has 1 node or more",
        "null.json": "exit_status None of a finished run: pytest's and ours are 0, 1, 2, 3, 4, 5, 10",
        "huge.json": "exit_status 999 of a finished run: pytest's and ours are 0, 1, 2, 3, 4, 5, 10",
        "year1.json": "start_time '0001-01-01T00:00:00+14:00' is not an ISO 8601 time: undated",
    }
    assert summary.drain_list() == [] and summary.failures() == ["6 report(s) are corrupt"]


def test_a_run_in_which_no_check_ran_gives_no_verdict(real_report: dict[str, Any], tmp_path: Path) -> None:
    """`--collect-only` writes a finished report with exit status 0 and no test: it passed, alone or as a fleet."""
    collected = node(real_report, "node-05", tests=[], measurements=[])
    skipped = node(real_report, "node-06", measurements=[])
    skipped["tests"] = [t | {"when": "setup", "outcome": "skipped"} for t in skipped["tests"]]
    alone = summarize([write(tmp_path, "collected.json", collected)])
    assert [n.verdict for n in alone.nodes] == ["no verdict"] and alone.exit_code == 1
    summary = summarize([*healthy_fleet(real_report, tmp_path), write(tmp_path, "skipped.json", skipped)])
    assert [(n.hostname, n.verdict) for n in summary.nodes if n.verdict != "pass"] == [("node-06", "no verdict")]
    assert summary.drain_list() == []  # what it lacks beside its peers is no verdict either
    assert summary.failures() == ["1 node(s) gave no verdict (pytest's own error, or no check ran: see their reports)"]


def test_another_skus_report_that_did_not_pass_fails_the_summary(real_report: dict[str, Any], tmp_path: Path) -> None:
    """Left out of the fleet's statistics, a failing node of another SKU (a tie of SKUs decided by the order of
    the command line, a SKU spelt otherwise) still failed its own checks."""
    failed = failing(real_report, "node-09", sku=real_report["sku"] | {"name": "CPU"})
    paths = [*healthy_fleet(real_report, tmp_path), write(tmp_path, "node-09.json", failed)]
    summary = summarize(paths)
    ((other,),) = [[r for r in summary.not_merged if r.kind == OTHER_SKU]]
    assert other.reason == "SKU CPU, the fleet's is cpu; its own verdict: fail (summarise its SKU with --sku CPU)"
    assert summary.failures() == ["1 report(s) of another SKU did not pass their own checks"]
    tie = summarize([paths[0], paths[-1]])
    assert tie.sku == "cpu" and tie.exit_code == 1
    assert summarize([paths[-1], paths[0]]).nodes[0].verdict == "fail"  # the other order: the fleet is CPU


def test_every_node_to_drain_fails_the_summary(real_report: dict[str, Any], tmp_path: Path) -> None:
    """A multi-node run that passed while naming a suspect printed drain lines and exit status 0."""
    gang = real_report["gang"] | {"nodes": 2, "hosts": hosts("node-01", "node-99")}
    suspect = {"test_id": "suites/t.py::test_pairwise", "host": "node-99", "why": "slow", "fault": FAULT}
    run = node(real_report, "node-01", gang=gang, suspects=[suspect])
    summary = summarize([*healthy_fleet(real_report, tmp_path), write(tmp_path, "run.json", run)])
    assert [n.host for n in summary.drain_list()] == ["node-99"]
    assert summary.failures() == ["1 node(s) found at fault by a multi-node run"]


def test_report_texts_are_shown_escaped_and_two_hostnames_stay_two_nodes(
    real_report: dict[str, Any], tmp_path: Path
) -> None:
    """`né` shown as `n\\xe9` was one node with the host literally named `n\\xe9`, which hid its failure; a report's
    escape sequences, newlines and HTML reached the terminal, the drain reason, summary.md and nodes.csv."""
    failing = node(real_report, "n\u00e9", exit_status=1, sku=real_report["sku"] | {"name": "cpu"})
    test = next(t for t in failing["tests"] if t["outcome"] == "passed")
    fault = FAULT | {"category": "x\x1b]0;owned\x07", "action": "<script>alert(1)</script>"}
    test |= {"outcome": "failed", "test_id": "t.py::test_\x1b[2J\nrow", "message": "bad\r\nline", "fault": fault}
    paths = [*healthy_fleet(real_report, tmp_path), write(tmp_path, "ne.json", failing)]
    paths.append(write(tmp_path, "literal.json", node(real_report, "n\\xe9")))
    out = tmp_path / "out"
    assert main(["summary", *map(str, paths), "--out", str(out)]) == 1
    summary = summarize(paths)
    assert [(n.hostname, n.verdict) for n in summary.nodes if n.hostname.startswith("n\\")] == [
        ("n\\\\xe9", "pass"),
        ("n\\xe9", "fail"),
    ]
    texts = {
        "terminal": "\n".join(render.terminal(summary, [], None)),
        "drain": "\n".join(commands.drain_commands(summary) + commands.kubectl_notes(summary)),
        **{name: (out / name).read_text() for name in ("summary.md", "nodes.csv", "fleet.xml")},
    }
    for name, text in texts.items():
        assert not any(c in text for c in "\x1b\x07\r\u00e9"), name
        assert "test_\\x1b[2J\\nrow" in text or name == "drain", name
    assert "<script>" not in texts["summary.md"] and "&lt;script&gt;" in texts["summary.md"]
    assert len(read_csv(out / "nodes.csv")) == len(summary.nodes)


def test_a_report_whose_noise_overflows_is_still_judged(real_report: dict[str, Any], tmp_path: Path) -> None:
    noisy = node(real_report, "node-05")
    for m in noisy["measurements"]:
        if "noise" in m:
            m["noise"]["spread_pct"] = 1e200
    summary = summarize([*healthy_fleet(real_report, tmp_path), write(tmp_path, "noisy.json", noisy)])
    # judged without a traceback: too noisy to judge on its figures (no verdict, nothing drained), the rest passes
    assert summary.exit_code == 1 and summary.metrics and not summary.drained
    assert summary.unjudged and {n.hostname for n, _ in summary.unjudged} == {"node-05"}


def test_usage_errors_name_the_argument_and_lose_no_report(
    real_report: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--plots` replaced a report kept in --out/plots with a PNG; an empty --out wrote into the working directory."""
    paths = healthy_fleet(real_report, tmp_path)
    plots = tmp_path / "out" / "plots"
    plots.mkdir(parents=True)
    kept = write(plots, "fleet.png", node(real_report, "node-05"))
    before = kept.read_bytes()
    for args, said in [
        ([str(kept), *map(str, paths), "--out", str(tmp_path / "out"), "--plots"], "where the plots go"),
        ([*map(str, paths), str(tmp_path / "absent.json"), "--out", str(tmp_path / "o")], "no such report: "),
        ([*map(str, paths), "--out", ""], "argument --out: an empty path"),
        ([*map(str, paths), "--out", str(tmp_path / "o"), "--sku", ""], "argument --sku: '': a SKU's name is"),
        (
            [*map(str, paths), "--out", str(tmp_path / "o"), "--history", str(tmp_path), "--failed", "5", "--of", "2"],
            "--failed 5 is more than --of 2",
        ),
    ]:
        with pytest.raises(SystemExit) as exited:
            main(["summary", *args])
        assert exited.value.code == 2
        assert said in capsys.readouterr().err
    assert kept.read_bytes() == before and not (tmp_path / "o").exists()


def test_a_report_named_twice_through_a_link_is_one_report(real_report: dict[str, Any], tmp_path: Path) -> None:
    paths = healthy_fleet(real_report, tmp_path)
    link = tmp_path / "link.json"
    link.symlink_to(paths[0])
    summary = summarize([*paths, link])
    assert summary.not_merged == [] and len(summary.nodes) == len(paths) and summary.exit_code == 0


def test_plots_show_a_reports_dollar_signs_as_text(real_report: dict[str, Any], tmp_path: Path) -> None:
    """matplotlib read `$\\undefined{$` in a hostname as a formula and stopped the summary with a traceback."""
    pytest.importorskip("matplotlib")
    paths = [*healthy_fleet(real_report, tmp_path), write(tmp_path, "odd.json", node(real_report, "n$\\bad{$"))]
    out = tmp_path / "out"
    assert main(["summary", *map(str, paths), "--out", str(out), "--plots"]) == 0
    assert (out / "plots" / "fleet.png").stat().st_size > 0


def heavy(report: dict[str, Any]) -> dict[str, Any]:
    """`report` with more of what the summary never reads: long telemetry series, each figure's samples a hundred
    times over, a GPU inventory, a longer provenance and message of each measurement."""
    report = copy.deepcopy(report)
    samples = 5000
    sampler = {"test_id": report["tests"][0]["test_id"], "label": "", "interval_s": 0.1, "duration_s": samples / 10}
    sampler |= {"sample_count": samples, "sources": ["cpu"], "errors": [], "summary": {}}
    sampler |= {"t_s": [i / 10 for i in range(samples)], "series": {"cpu.freq_mhz": [2596.152] * samples}}
    report["telemetry"] = [sampler]
    report["gpus"] = {f"gpu{i}": {"serial": str(i) * 40} for i in range(8)}
    for m in report["measurements"]:
        m["provenance"] = m.get("provenance", "") + " (measured here)" * 50
        m["message"] += " (again)" * 50
        for name, value in m["details"].items():
            if name.startswith("samples_") and isinstance(value, list):
                value *= 100
    return report


def test_what_the_summary_never_reads_is_dropped_as_each_report_is_read_and_changes_nothing(
    real_report: dict[str, Any], tmp_path: Path
) -> None:
    """Every report given was held whole until the end: three of 45 MiB took 717 MiB (benchmarks/fleet_memory.py
    measures the bound at 1,000 nodes)."""
    reports = {host: node(real_report, host, factor) for host, factor in HEALTHY.items()}
    reports["node-05"] = failing(real_report, "node-05")
    outputs: list[dict[str, str]] = []
    for made in (lambda r: r, heavy):
        paths = [write(tmp_path, f"{host}.json", made(report)) for host, report in reports.items()]
        out = tmp_path / f"out-{len(outputs)}"
        main(["summary", *map(str, paths), "--out", str(out)])
        outputs.append({name: (out / name).read_text() for name in ("summary.md", "nodes.csv", "metrics.csv")})
        outputs[-1]["fleet.xml"] = ET.tostring(ET.parse(out / "fleet.xml").getroot(), encoding="unicode")
    assert outputs[0] == outputs[1]
    kept = read(tmp_path / "node-05.json", 0)
    assert isinstance(kept, Report) and "telemetry" not in kept.data and "gpus" not in kept.data
    for m in kept.data["measurements"]:
        assert "provenance" not in m and not any(isinstance(v, list) for v in m["details"].values())


def test_the_breaker_prints_no_drain_line_past_half_the_fleet_or_the_number_given(
    real_report: dict[str, Any], tmp_path: Path
) -> None:
    """A wrong baseline, image or fabric fails every node alike: the summary printed a drain line for each."""
    paths = [write(tmp_path, f"{host}.json", failing(real_report, host)) for host in ("node-01", "node-02", "node-03")]
    paths.append(write(tmp_path, "node-04.json", node(real_report, "node-04")))
    out = tmp_path / "out"
    done = run_cli(*paths, "--out", out)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "breaker tripped: 3 of 4 nodes to take out, more than the 2 allowed at once" in done.stdout
    assert "scontrol" not in done.stdout and "kubectl" not in done.stdout
    rows = {r["hostname"]: (r["verdict"], r["drain"]) for r in read_csv(out / "nodes.csv")}
    assert rows == {f"node-0{i}": ("fail", "held") for i in (1, 2, 3)} | {"node-04": ("pass", "no")}
    assert "Held: node-01, node-02, node-03." in (out / "summary.md").read_text()

    done = run_cli(*paths[2:], "--out", tmp_path / "two")  # one of two: within half
    assert "scontrol update nodename=node-03 state=drain" in done.stdout
    done = run_cli(*paths, "--out", tmp_path / "most", "--max-drain-pct", "75")
    assert [line.split()[2] for line in done.stdout.splitlines() if line.strip().startswith("scontrol")] == [
        f"nodename=node-0{i}" for i in (1, 2, 3)
    ]
    done = run_cli(*paths, "--out", tmp_path / "number", "--max-drain-pct", "75", "--max-drain", "2")
    assert "breaker tripped: 3 of 4 nodes to take out, more than the 2 allowed" in done.stdout
