"""The files a run writes replace only regular files of their own, fail in one line, and survive a SIGTERM: unit
tests of outputs.py and end-to-end runs through pytester. The node assumed: any Linux machine (a FIFO, /dev/null
and /proc are there); no GPU."""

from __future__ import annotations

import errno
import json
import os
import signal
import textwrap
from pathlib import Path
from typing import Any

import pytest

from pytest_gbvalidate import outputs
from pytest_gbvalidate.fleet.cli import main as fleet_main

LAB = """\
schema_version: 1
sku: LAB
description: a lab SKU for the outputs' tests
metrics:
  host_copy_bandwidth_gbps:
    unit: GB/s
    direction: higher
    scope: node
    status: measured
    expected: 100
    fail: 50%
    provenance: the plugin's tests
"""
CHECK = """
def test_copy(gb_expect):
    gb_expect("host_copy_bandwidth_gbps", 101.0)
"""


@pytest.fixture
def lab(pytester: pytest.Pytester) -> pytest.Pytester:
    (pytester.path / "baselines").mkdir()
    (pytester.path / "baselines" / "LAB.yaml").write_text(LAB)
    pytester.makepyfile(test_checks=CHECK)
    return pytester


ARGS = ("--gb-sku=LAB", "--gb-baselines=baselines")


# --- what an output may replace ---------------------------------------------------------------------------------


def test_only_a_regular_file_or_nothing_may_be_replaced(tmp_path: Path) -> None:
    fifo, directory, link, module = tmp_path / "fifo", tmp_path / "dir", tmp_path / "link", tmp_path / "test_x.py"
    os.mkfifo(fifo)
    directory.mkdir()
    (tmp_path / "target.json").write_text("{}")
    link.symlink_to(tmp_path / "target.json")
    module.write_text("")
    assert outputs.unwritable(tmp_path / "new.json") is None
    assert outputs.unwritable(tmp_path / "target.json") is None
    assert outputs.unwritable(fifo) == "is a FIFO, not a regular file: it is not replaced"
    assert outputs.unwritable(directory) == "is a directory, not a regular file: it is not replaced"
    assert outputs.unwritable(Path("/dev/null")) == "is a character device, not a regular file: it is not replaced"
    assert outputs.unwritable(link) == f"is a symbolic link (to {tmp_path / 'target.json'}): name the file itself"
    assert outputs.unwritable(module) == "is a Python file (the suites' and tests' modules are inputs of a run)"
    with pytest.raises(outputs.OutputError, match=r"fifo: is a FIFO"):
        outputs.atomic_write_text(fifo, "x")
    assert (tmp_path / "target.json").read_text() == "{}"  # nothing written through the link either


def test_a_failed_write_is_one_line_and_leaves_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "r.json"
    path.write_text("old\n")

    def disk_full(_fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(outputs.OutputError) as info:
        outputs.atomic_write_text(path, "new\n")
    assert str(info.value) == f"cannot write {path}: No space left on device"
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary file left


def test_paths_the_kernel_refuses_and_names_at_the_limit(tmp_path: Path) -> None:
    with pytest.raises(outputs.OutputError, match=r"^cannot write /proc/gbvalidate\.json: "):
        outputs.atomic_write_text(Path("/proc/gbvalidate.json"), "{}")
    longest = tmp_path / ("r" * 250 + ".json")  # 255 bytes, the usual limit: its temporary twin must be shorter
    outputs.atomic_write_text(longest, "{}")
    assert longest.read_text() == "{}"


def test_an_output_that_is_an_input_or_another_output_clashes(tmp_path: Path) -> None:
    earlier, report = tmp_path / "before.json", tmp_path / "before.json"
    earlier.write_text("{}")
    found = outputs.clashes(
        {"--gb-report on the command line": report, "--junitxml on the command line": tmp_path / "x" / ".." / "j.xml"},
        {"--gb-compare on the command line": earlier, "the test path j.xml": tmp_path / "j.xml"},
    )
    assert found == [
        f"--gb-report on the command line: {report} is also --gb-compare on the command line: an output must be a "
        "file of its own",
        f"--junitxml on the command line: {tmp_path / 'x' / '..' / 'j.xml'} is also the test path j.xml: an output "
        "must be a file of its own",
    ]


# --- end to end -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "refused"),
    [
        (["--gb-report=/dev/null"], "--gb-report on the command line: '/dev/null': /dev/null is a character device"),
        (["--gb-report=test_checks.py"], "is a Python file (the suites' and tests' modules are inputs of a run)"),
        (["--gb-report=r.json", "--junitxml=r.json"], "r.json is also --junitxml on the command line"),
        (["--gb-report=before.json", "--gb-compare=before.json"], "is also --gb-compare on the command line"),
        (["--gb-report=baselines/LAB.yaml"], "is also the baseline"),
    ],
    ids=["device", "test-module", "junit", "compare-input", "baseline"],
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


@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGHUP"])
def test_sigterm_ends_the_run_as_ctrl_c_does(lab: pytest.Pytester, signal_name: str) -> None:
    """Slurm's scancel and Kubernetes' pod deletion send SIGTERM before SIGKILL; a closed terminal SIGHUP."""
    lab.makepyfile(
        test_checks=CHECK
        + textwrap.dedent(
            f"""
            import os, signal
            def test_stopped(gb_expect):
                os.kill(os.getpid(), signal.{signal_name})
            def test_never_run(gb_expect):
                gb_expect("host_copy_bandwidth_gbps", 99.0)
            """
        )
    )
    (lab.path / "baselines" / "REC.yaml").write_text("kept\n")
    result = lab.runpytest_subprocess(*ARGS, "--gb-report=r.json", "--gb-record=baselines/REC.yaml")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    report: dict[str, Any] = json.loads((lab.path / "r.json").read_text())
    assert (report["status"], report["exit_status"]) == ("interrupted", 2)
    assert [m["value"] for m in report["measurements"]] == [101.0]  # what was measured before it stays
    assert report["record"]["written"] is False
    assert (lab.path / "baselines" / "REC.yaml").read_text() == "kept\n"
    result.stdout.fnmatch_lines([f"*KeyboardInterrupt*stopped by {signal_name}*"])


def test_the_handlers_are_put_back_when_the_session_ends(lab: pytest.Pytester) -> None:
    before = signal.getsignal(signal.SIGTERM)
    assert lab.runpytest_inprocess(*ARGS).ret == pytest.ExitCode.OK
    assert signal.getsignal(signal.SIGTERM) is before


def test_the_fleet_summary_writes_only_its_own_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / "nodes.csv")
    report = out / "summary.md"  # a report given as input where the summary would go
    report.write_text("{}")
    with pytest.raises(SystemExit) as exit_:
        fleet_main(["summary", str(report), "--out", str(out)])
    assert exit_.value.code == 2
    error = capsys.readouterr().err
    assert f"{out / 'nodes.csv'}: is a FIFO, not a regular file: it is not replaced" in error
    assert f"--out's summary.md: {report} is also the report {report}: an output must be a file of its own" in error
    assert report.read_text() == "{}" and (out / "nodes.csv").is_fifo()


# --- the recorder writes only what the loader accepts ------------------------------------------------------------


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


def test_a_recording_the_loader_would_refuse_is_not_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_gbvalidate.baselines import recording

    path = tmp_path / "LAB.yaml"
    path.write_text(LAB)
    monkeypatch.setattr(recording, "dump_baseline", lambda _doc: "schema_version: 1\nsku: LAB\nmetrics: 3\n")
    with pytest.raises(outputs.OutputError, match=r"LAB.yaml: not written, the loader would refuse it: .*metrics"):
        recording.write_recorded_baseline(path, None, [], {"hostname": "n1"}, None)
    assert path.read_text() == LAB
    assert [p.name for p in tmp_path.iterdir()] == ["LAB.yaml"]
