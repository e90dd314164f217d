"""The files a run writes replace only regular files of their own and fail in one line, the files it reads are
checked before they are believed, and a SIGTERM ends a run as Ctrl-C does: unit tests of files.py and end-to-end
runs through pytester. The node assumed: any Linux machine (a FIFO, /dev/null
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

from pytest_gbvalidate import files
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
    assert files.unwritable(tmp_path / "new.json") is None
    assert files.unwritable(tmp_path / "target.json") is None
    assert files.unwritable(fifo) == "is a FIFO, not a regular file: it is not replaced"
    assert files.unwritable(directory) == "is a directory, not a regular file: it is not replaced"
    assert files.unwritable(Path("/dev/null")) == "is a character device, not a regular file: it is not replaced"
    assert files.unwritable(link) == f"is a symbolic link (to {tmp_path / 'target.json'}): name the file itself"
    assert files.unwritable(module) == "is a Python file (the suites' and tests' modules are inputs of a run)"
    with pytest.raises(files.OutputError, match=r"fifo: is a FIFO"):
        files.atomic_write_text(fifo, "x")
    assert (tmp_path / "target.json").read_text() == "{}"  # nothing written through the link either


def test_a_failed_write_is_one_line_and_leaves_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "r.json"
    path.write_text("old\n")

    def disk_full(_fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(files.OutputError) as info:
        files.atomic_write_text(path, "new\n")
    assert str(info.value) == f"cannot write {path}: No space left on device"
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary file left


def test_paths_the_kernel_refuses_and_names_at_the_limit(tmp_path: Path) -> None:
    with pytest.raises(files.OutputError, match=r"^cannot write /proc/gbvalidate\.json: "):
        files.atomic_write_text(Path("/proc/gbvalidate.json"), "{}")
    longest = tmp_path / ("r" * 250 + ".json")  # 255 bytes, the usual limit: its temporary twin must be shorter
    files.atomic_write_text(longest, "{}")
    assert longest.read_text() == "{}"


def test_an_output_that_is_an_input_or_another_output_clashes(tmp_path: Path) -> None:
    earlier, report = tmp_path / "before.json", tmp_path / "before.json"
    earlier.write_text("{}")
    found = files.clashes(
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
    # As a login or batch shell has them; `nohup` (a CI runner may start us so) ignores SIGHUP, and an ignored
    # signal is the caller's choice, which the plugin leaves alone.
    lab.makeconftest(f"import signal\nsignal.signal(signal.{signal_name}, signal.SIG_DFL)\n")
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
    with pytest.raises(files.OutputError, match=r"LAB.yaml: not written, the loader would refuse it: .*metrics"):
        recording.write_recorded_baseline(path, None, [], {"hostname": "n1"}, None)
    assert path.read_text() == LAB
    assert [p.name for p in tmp_path.iterdir()] == ["LAB.yaml"]


# --- inputs: only a regular file of a bounded size, only JSON a report can be --------------------------------------


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ('{"a": NaN}', "not JSON: NaN is no JSON number"),
        ('{"a": -Infinity}', "not JSON: -Infinity is no JSON number"),
        ('{"a": ' + "1" * 5000 + "}", "not JSON: Exceeds the limit"),
        ('{"a": "\\ud800"}', "the document.a holds a lone surrogate"),
        ("[" * 100 + "]" * 100, "nested deeper than 64 levels"),
        ("[" * 100_000 + "]" * 100_000, "nested too deep"),
        (b"\xff\xfe{}", "not UTF-8 text (at byte 0)"),
    ],
    ids=["nan", "infinity", "huge-int", "surrogate", "deep", "deeper-than-the-stack", "not-utf8"],
)
def test_json_no_report_holds_is_one_line_naming_the_file(tmp_path: Path, content: str | bytes, problem: str) -> None:
    path = tmp_path / "r.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(files.InputError) as info:
        files.read_json(path)
    assert str(info.value).startswith(f"{path}: ") and problem in str(info.value)


def test_an_input_is_a_regular_file_of_a_bounded_size(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # reading it would block forever
    with pytest.raises(files.InputError, match=r"fifo: is a FIFO, not a regular file"):
        files.read_input(fifo)
    with pytest.raises(files.InputError, match=r": is a directory, not a regular file"):
        files.read_input(tmp_path)
    with pytest.raises(files.InputError, match=r"/dev/zero: is a character device"):
        files.read_input(Path("/dev/zero"))  # it never ends
    (tmp_path / "big").write_bytes(b"x" * 101)
    with pytest.raises(files.InputError, match=r"big: larger than 100 bytes"):
        files.read_input(tmp_path / "big", max_bytes=100)


@pytest.mark.parametrize(
    ("earlier", "problem"),
    [
        ('{"schema": "pytest-gbvalidate/report/1", "gpus": [1]}', "`gpus` is a list, not a dict"),
        ('{"schema": "pytest-gbvalidate/report/1", "sku": "LAB"}', "`sku` is a str, not a dict"),
        ('{"schema": "pytest-gbvalidate/report/1", "measurements": [{"value": 1}]}', "measurements[0] is not a"),
        ('{"schema": "pytest-gbvalidate/report/1", "measurements": {}}', "`measurements` is a dict, not a list"),
    ],
)
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
