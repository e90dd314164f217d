"""The files a run writes replace only regular files of their own and fail in one line, the files it reads are
checked before they are believed, and a SIGTERM ends a run as Ctrl-C does: end-to-end runs through pytester.
(files.py itself: unit/test_files.py.) The node assumed: any Linux machine (a FIFO, /dev/null and /proc are
there); no GPU."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from pytest_gbvalidate.fleet.cli import main as fleet_main
from pytest_gbvalidate.report import node_verdict
from tests.helpers.full_disk import on_full_disk
from tests.helpers.namespaces import with_hostname
from tests.helpers.reports import report_text
from tests.helpers.runs import LAB, assert_usage_error, lab_project

CHECK = """
def test_copy(gb_expect):
    gb_expect("host_copy_bandwidth_gbps", 101.0)
"""


@pytest.fixture
def lab(pytester: pytest.Pytester) -> pytest.Pytester:
    """A project with the one-metric LAB baseline and a check against it."""
    return lab_project(pytester, LAB, CHECK)


ARGS = ("--gb-sku=LAB", "--gb-baselines=baselines")


@pytest.mark.parametrize(
    ("args", "refused"),
    [
        (["--gb-report=/dev/null"], "--gb-report on the command line: '/dev/null': /dev/null is a character device"),
        (["--gb-report=test_checks.py"], "is a Python file (the suites' and tests' modules are inputs of a run)"),
        (["--gb-report=r.json", "--junitxml=r.json"], "r.json is also --junitxml on the command line"),
        (["--gb-report=before.json", "--gb-compare=before.json"], "is also --gb-compare on the command line"),
        (["--gb-report=baselines/LAB.yaml"], "is also the baseline"),
        # pytest's and pytest-html's files: a traceback after every check had run
        (["--junitxml=test_checks.py/r.xml"], "--junitxml on the command line: is under a file, not a directory"),
        (["--html=baselines", "--self-contained-html"], "--html on the command line: is a directory"),
    ],
    ids=["device", "test-module", "junit", "compare-input", "baseline", "junit-under-a-file", "html-directory"],
)
def test_an_output_that_is_not_its_own_is_a_usage_error_and_nothing_is_touched(
    lab: pytest.Pytester, args: list[str], refused: str
) -> None:
    before = {"test_checks.py": (lab.path / "test_checks.py").read_text(), "baselines/LAB.yaml": LAB}
    (lab.path / "before.json").write_text('{"status": "finished"}')
    result = lab.runpytest_inprocess(*ARGS, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert refused in result.stderr.str()
    assert "Traceback" not in result.stderr.str() + result.stdout.str()
    assert {name: (lab.path / name).read_text() for name in before} == before
    assert (lab.path / "before.json").read_text() == '{"status": "finished"}'
    assert Path("/dev/null").is_char_device()


@pytest.mark.parametrize(
    ("recorded", "error"),
    [
        ("baselines/OTHER.yaml", "*baselines/OTHER.yaml is the baseline of SKU 'OTHER', and this run checks 'LAB'*"),
        ("copy/X.yaml", "*copy/X.yaml is the baseline of SKU 'OTHER', and this run checks 'LAB'*"),  # its `sku`
    ],
    ids=["baselines-directory", "declared-sku"],
)
def test_another_sku_s_baseline_is_never_recorded_over(lab: pytest.Pytester, recorded: str, error: str) -> None:
    """A --gb-sku=cpu run with --gb-record=<baselines>/ND_H100_v5.yaml replaced the H100's baseline with CPU
    figures. (A new file of another name is how a new SKU is brought up: that stays allowed.)"""
    other = LAB.replace("sku: LAB", "sku: OTHER")
    (lab.path / "baselines" / "OTHER.yaml").write_text(other)
    (lab.path / "copy").mkdir()
    (lab.path / "copy" / "X.yaml").write_text(other)
    result = lab.runpytest_inprocess(*ARGS, "--gb-level=full", f"--gb-record={recorded}")
    assert_usage_error(result, f"ERROR: --gb-record on the command line: {error}")
    assert (lab.path / recorded).read_text() == other


@pytest.mark.parametrize("output", ["--gb-report=hist/node7/20990101T000000Z.json", "--junitxml=hist/j.json"])
def test_no_output_of_the_run_goes_into_the_history(lab: pytest.Pytester, output: str) -> None:
    """A file there under a report's name was the next --gb-compare=last's "earlier report": not JSON, the run
    stopped."""
    result = lab.runpytest_inprocess(*ARGS, "--gb-history=hist", output)
    assert_usage_error(result, "ERROR: * is inside the history directory *hist (--gb-history on the command line)*")
    assert not (lab.path / "hist").exists()


def test_a_report_that_cannot_be_written_fails_the_run_in_one_line(lab: pytest.Pytester) -> None:
    lab.makepyfile(
        test_checks=CHECK
        + textwrap.dedent(
            """
            import shutil
            from pathlib import Path
            def test_the_directory_goes(gb_expect):  # the report's directory replaced by a file mid-run
                shutil.rmtree("out")
                Path("out").write_text("")
            """
        )
    )
    result = lab.runpytest_subprocess(*ARGS, "--gb-report=out/r.json")
    assert result.ret == pytest.ExitCode.TESTS_FAILED  # every test passed: the lost report fails the run
    result.stdout.fnmatch_lines(
        ["JSON report NOT written: */out/r.json: cannot look at it: Not a directory; the run fails"]
    )
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    assert sorted(p.name for p in lab.path.iterdir() if p.name.startswith(".gbvalidate")) == []


def test_pytest_s_writers_on_a_full_disk_leave_the_last_good_files_and_the_report_says_so(
    lab: pytest.Pytester,
) -> None:
    """pytest's JUnit XML and pytest-html's page emptied the last good file and ended in a traceback, and the JSON
    report said the run passed; a lost Prometheus file drained the node in the fleet summary."""
    full = lab.path / "full"
    full.mkdir()
    pytest_run = [sys.executable, "-m", "pytest", *ARGS, "--gb-report=r.json", "-p", "no:cacheprovider"]
    pytest_run += [
        "--junitxml=full/j.xml",
        "--html=full/p.html",
        "--self-contained-html",
        "--gb-prometheus=full/n.prom",
    ]
    command = on_full_disk(full, {"j.xml": "last good XML", "p.html": "last good page"}, pytest_run)
    if command is None:
        pytest.skip("a full disk of its own needs a mount namespace (unshare), which this machine does not allow")
    done = subprocess.run(command, cwd=lab.path, capture_output=True, text=True, timeout=120)
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, done.stdout + done.stderr  # the check passed
    assert "Traceback" not in done.stdout + done.stderr and "INTERNALERROR" not in done.stdout
    after = lab.path / "full.after"
    assert sorted(p.name for p in after.iterdir()) == ["j.xml", "p.html"]  # no temporary file left
    assert (after / "j.xml").read_text() == "last good XML" and (after / "p.html").read_text() == "last good page"
    report = json.loads((lab.path / "r.json").read_text())
    lost = report["outputs_lost"]
    assert [line.split(":")[0] for line in lost] == [
        "JUnit XML NOT written",
        "HTML page NOT written",
        "Prometheus file NOT written",
    ]
    assert all("No space left on device" in line for line in lost), lost
    assert report["exit_status"] == 1 and node_verdict.of_report(report) == node_verdict.NO_VERDICT
    for line in lost:
        assert f"{line}; the run fails" in done.stdout
    fleet_main(["summary", "--out", str(lab.path / "fleet"), str(lab.path / "r.json")])
    summary = (lab.path / "fleet" / "summary.md").read_text()
    host = report["node"]["hostname"]
    said = f"- **{host}** (no verdict): pytest exited with status 1 and no failed test: JUnit XML NOT written"
    assert said in summary
    assert "## Take out of service\n\nNone." in summary


def stopped_checks(signal_name: str) -> str:
    """A check that measures, one that sends this process `signal_name`, and one that never runs."""
    stopped = f"""
import os, signal
def test_stopped(gb_expect):
    os.kill(os.getpid(), signal.{signal_name})
def test_never_run(gb_expect):
    gb_expect("host_copy_bandwidth_gbps", 99.0)
"""
    return CHECK + stopped


@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGHUP"])
def test_sigterm_ends_the_run_as_ctrl_c_does(lab: pytest.Pytester, signal_name: str) -> None:
    """Slurm's scancel and Kubernetes' pod deletion send SIGTERM before SIGKILL; a closed terminal SIGHUP."""
    lab.makepyfile(test_checks=stopped_checks(signal_name))
    # As a login or batch shell has them; `nohup` (a CI runner may start us so) ignores SIGHUP, and an ignored
    # signal is the caller's choice, which the plugin leaves alone.
    lab.makeconftest(f"import signal\nsignal.signal(signal.{signal_name}, signal.SIG_DFL)\n")
    (lab.path / "recorded").mkdir()
    (lab.path / "recorded" / "LAB.yaml").write_text("kept\n")
    result = lab.runpytest_subprocess(*ARGS, "--gb-report=r.json", "--gb-record=recorded/LAB.yaml")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    report: dict[str, Any] = json.loads((lab.path / "r.json").read_text())
    assert (report["status"], report["exit_status"]) == ("interrupted", 2)
    assert [m["value"] for m in report["measurements"]] == [101.0]  # what was measured before it stays
    assert report["record"]["written"] is False
    assert (lab.path / "recorded" / "LAB.yaml").read_text() == "kept\n"
    result.stdout.fnmatch_lines([f"*KeyboardInterrupt*stopped by {signal_name}*"])


@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGINT"])
def test_a_second_signal_never_makes_part_of_a_run_a_finished_one(lab: pytest.Pytester, signal_name: str) -> None:
    """Ctrl-C pressed twice, or scancel's SIGTERM then slurmd's: the second landed in pytest's own interrupted path,
    which then never set the exit status: the report said `finished`, exit status 0, over part of the checks, and
    --gb-record wrote a baseline from that part."""
    lab.makepyfile(test_checks=stopped_checks(signal_name))
    lab.makeconftest(
        textwrap.dedent(
            f"""
            import os, signal
            # As an interactive shell has them: a job started in the background (`cmd &`) ignores SIGINT, and an
            # ignored signal is the caller's choice, which the plugin leaves alone.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            def pytest_keyboard_interrupt(excinfo):  # the second signal, while pytest handles the first
                os.kill(os.getpid(), signal.{signal_name})
            """
        )
    )
    (lab.path / "recorded").mkdir()
    (lab.path / "recorded" / "LAB.yaml").write_text("kept\n")
    result = lab.runpytest_subprocess(*ARGS, "--gb-report=r.json", "--gb-record=recorded/LAB.yaml")
    report: dict[str, Any] = json.loads((lab.path / "r.json").read_text())
    assert (report["status"], report["exit_status"]) == ("interrupted", 2), result.stdout.str()
    assert result.ret == pytest.ExitCode.INTERRUPTED
    assert report["record"]["written"] is False
    assert (lab.path / "recorded" / "LAB.yaml").read_text() == "kept\n"


def test_a_signal_while_the_outputs_are_written_cuts_none_short(lab: pytest.Pytester) -> None:
    """Every check had run when SIGTERM came: the report stayed `running`, and the JUnit, Prometheus and history
    files were lost. The outputs are written, and the run's verdict stands."""
    pytest.importorskip("prometheus_client")
    lab.makepyfile(test_checks=CHECK)
    lab.makeconftest(
        textwrap.dedent(
            """
            import os, signal
            from pytest_gbvalidate.run import sections
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            keep_report = sections.keep_report
            def stopped_while_keeping(*args, **kwargs):
                os.kill(os.getpid(), signal.SIGTERM)
                return keep_report(*args, **kwargs)
            sections.keep_report = stopped_while_keeping
            """
        )
    )
    args = ("--gb-report=r.json", "--gb-prometheus=r.prom", "--gb-history=history", "--junitxml=r.xml")
    result = lab.runpytest_subprocess(*ARGS, *args)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    report: dict[str, Any] = json.loads((lab.path / "r.json").read_text())
    assert (report["status"], report["exit_status"]) == ("finished", 0)
    assert (lab.path / "r.prom").stat().st_size > 0 and (lab.path / "r.xml").stat().st_size > 0
    assert len(list((lab.path / "history").glob("*/*.json"))) == 1
    result.stdout.fnmatch_lines(["*SIGTERM came once every check had run: the outputs were written first*"])


def test_the_handlers_are_put_back_when_the_session_ends(lab: pytest.Pytester) -> None:
    before = signal.getsignal(signal.SIGTERM)
    assert lab.runpytest_inprocess(*ARGS).ret == pytest.ExitCode.OK
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_recording_leaves_out_what_was_not_measured_validly(lab: pytest.Pytester) -> None:
    lab.makepyfile(
        test_checks="""
        def test_copy(gb_expect):
            gb_expect("host_copy_bandwidth_gbps", 0.0)  # a broken measurement: never an expected value
        def test_other(gb_expect):
            gb_expect("host_copy_bandwidth_gbps", 101.0, scope="node")
        """
    )
    result = lab.runpytest_inprocess(*ARGS, "--gb-record=baselines/NEW.yaml")
    assert result.ret == pytest.ExitCode.TESTS_FAILED  # 0 is below the limit: that test fails, the run completes
    result.stdout.fnmatch_lines(
        ["*recorded baseline: *NEW.yaml; left out, not measured validly: host_copy_bandwidth_gbps [[]node[]]: 0.0*"]
    )
    from pytest_gbvalidate.baselines import load_baseline

    recorded = load_baseline(lab.path / "baselines" / "NEW.yaml")  # the loader accepts what was written
    assert recorded.metrics["host_copy_bandwidth_gbps"].default.expected == 101.0


@pytest.mark.parametrize(
    ("earlier", "problem"),
    [
        (report_text({"gpus": [1]}), "gpus is a list, not an object"),
        (report_text({"sku": "LAB"}), "sku is text, not an object or null"),
        (report_text({"measurements": [{"value": 1}]}), "measurements[0].details is missing"),
        (report_text({"measurements": {}}), "measurements is an object, not a list"),
    ],
)
@pytest.mark.broken_reports
def test_an_earlier_report_of_the_wrong_shape_is_a_usage_error_naming_the_field(
    lab: pytest.Pytester, earlier: str, problem: str
) -> None:
    (lab.path / "before.json").write_text(earlier)
    result = lab.runpytest_inprocess(*ARGS, "--gb-compare=before.json", "--gb-report=r.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert problem in result.stderr.str()
    assert "Traceback" not in result.stderr.str() + result.stdout.str()


def test_a_baseline_that_is_not_a_file_says_so_not_unknown_sku(lab: pytest.Pytester) -> None:
    (lab.path / "baselines" / "LAB.yaml").unlink()
    os.mkfifo(lab.path / "baselines" / "LAB.yaml")
    result = lab.runpytest_inprocess(*ARGS)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*bad baseline: */baselines/LAB.yaml: is a FIFO, not a regular file*"])


CRASHING = """
import os
import signal


def test_copy(gb_expect):
    gb_expect("host_copy_bandwidth_gbps", 101.0)


def test_killed(gb_expect):
    gb_expect("host_copy_bandwidth_gbps", 99.0)
    os.kill(os.getpid(), signal.SIGKILL)  # the OOM killer, as the worker meets it
"""


def test_a_worker_killed_under_a_check_is_a_failed_test_that_says_it_crashed_and_drains_the_node(
    lab: pytest.Pytester,
) -> None:
    from pytest_gbvalidate.fleet.summary import summarize
    from pytest_gbvalidate.report import schema

    lab.makepyfile(test_checks=CRASHING)
    result = lab.runpytest_subprocess(*ARGS, "-n", "1", "--gb-report=r.json", "--junitxml=r.xml", "-p", "no:randomly")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    report: dict[str, Any] = json.loads((lab.path / "r.json").read_text())
    assert schema.problem(report) is None  # every reader takes it
    (crashed,) = [t for t in report["tests"] if t["outcome"] == "failed"]
    assert crashed["test_id"] == "test_checks.py::test_killed" and crashed["when"] == "call"
    assert crashed["message"].startswith("crashed: worker 'gw0' crashed while running 'test_checks.py::test_killed'")
    assert crashed["fault"]["category"] == "crashed" and crashed["fault"]["disposition"] == "REBOOT"
    (node,) = summarize([lab.path / "r.json"]).drained
    assert "crashed (reboot): test_killed" in node.drain_reason()


def test_a_hostname_that_is_not_utf8_is_written_escaped_in_every_file(
    lab: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel allows any bytes in a hostname; Python hands those that are not UTF-8 over as lone surrogates,
    which no UTF-8 writer can encode. Every file is written, with the bytes as escapes, and read back."""
    from pytest_gbvalidate.files import read_json

    monkeypatch.setattr("socket.gethostname", lambda: "node\udcff7")
    outputs = ["--gb-report=r.json", "--junitxml=r.xml", "--gb-prometheus=node.prom"]
    lab.runpytest(*ARGS, *outputs).assert_outcomes(passed=1)
    assert read_json(lab.path / "r.json")["node"]["hostname"] == "node\\xff7"
    assert 'gb_hostname" value="node\\xff7"' in (lab.path / "r.xml").read_text(encoding="utf-8")
    assert 'hostname="node\\\\xff7"' in (lab.path / "node.prom").read_text(encoding="utf-8")


def test_a_hostname_with_control_characters_leaves_the_junit_xml_well_formed(lab: pytest.Pytester) -> None:
    """pytest writes the suite's `hostname` raw: a control character (a terminal's escape, here) made the file no
    XML at all, and the CI system reading it saw no tests."""
    run = [sys.executable, "-m", "pytest", *ARGS, "--junitxml=r.xml", "--gb-report=r.json", "-p", "no:cacheprovider"]
    command = with_hostname("node\x01\x1b[31m7", run)
    if command is None:
        pytest.skip("a hostname of our own needs a UTS namespace (unshare), which this machine does not allow")
    done = subprocess.run(command, cwd=lab.path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    suite = ET.parse(lab.path / "r.xml").getroot().find("testsuite")
    assert suite is not None and suite.get("hostname") == "node#x01#x1B[31m7"  # as pytest escapes a text
    assert suite.get("tests") == "1" and suite.get("failures") == "0"


def test_a_baseline_others_could_have_written_is_used_and_the_report_says_who(lab: pytest.Pytester) -> None:
    """A shared baselines directory is common: its limits are used (refusing it would stop the gate), and the
    header and the report say who besides root and this user could have set them."""
    (lab.path / "baselines").chmod(0o777)
    result = lab.runpytest(*ARGS, "--gb-report=r.json")
    result.assert_outcomes(passed=1)
    baseline = lab.path / "baselines" / "LAB.yaml"
    result.stdout.fnmatch_lines(
        [f"gbvalidate: the baseline {baseline} decides verdicts, and others could have written it: *(mode 0777)"]
    )
    report: dict[str, Any] = json.loads((lab.path / "r.json").read_text())
    (found,) = report["writable_inputs"]
    assert found["input"] == "the baseline" and found["path"] == str(baseline)
    assert found["problem"].startswith(f"{baseline.parent} is writable by")
