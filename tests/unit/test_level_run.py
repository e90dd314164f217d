"""pytest_gbvalidate/healthcheck/level_run.py without a run: the pytest command, the report read (a bad one is one line
naming the file and the field), pytest's words when it wrote none, what keeps a run from starting (CannotRun, with
nothing left behind), the run's environment. (Real runs: e2e/test_healthcheck.py.)"""

from __future__ import annotations

import errno
import json
import os
import sys
import tempfile
from pathlib import Path

import pytest

from pytest_gbvalidate.healthcheck import level_run
from pytest_gbvalidate.healthcheck.level_run import (
    CannotRun,
    checks_environment,
    dropped_note,
    last_line,
    pytest_command,
    read_report,
    run_checks,
)
from tests.helpers.reports import minimal_report, report_text


def test_the_command_runs_the_shipped_suites_at_the_level_into_the_report(tmp_path: Path) -> None:
    command = pytest_command(tmp_path / "r.json", "quick", ["--gb-sku=cpu", "-k", "copy"])
    assert command == [
        sys.executable,
        *("-m", "pytest", "--pyargs", "pytest_gbvalidate.suites", "--gb-level=quick"),
        *(f"--gb-report={tmp_path / 'r.json'}", "-p", "no:cacheprovider", "-q", "--gb-sku=cpu", "-k", "copy"),
    ]
    # A second run of what failed in the first (healthcheck/confirm.py): the same arguments, so the same test ids.
    again = pytest_command(tmp_path / "r.json", "quick", ["--gb-sku=cpu", "-k", "copy"], tmp_path / "earlier.json")
    assert again == [*command[:7], f"--gb-rerun-failed={tmp_path / 'earlier.json'}", *command[7:]]


def test_a_good_report_reads(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps(minimal_report()))
    report, problem = read_report(path)
    assert problem is None and report is not None and report["status"] == "finished"


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (None, "cannot read: No such file or directory"),
        ("{not json", "not JSON: "),
        ('{"a": NaN}', "not JSON: NaN is no JSON number"),
        ("[1]", "not a JSON object but a list"),
        (report_text({"report_version": 1}), "report_version is 1, not 2"),
        (report_text({"tests": [{"test_id": "t", "when": "call"}]}), "tests[0].duration_s is missing"),
        (report_text({"status": "odd\n\x1b[2J"}), "status is 'odd\\n\\x1b[2J', not one of"),
    ],
)
@pytest.mark.broken_reports
def test_a_report_that_does_not_read_says_which_file_and_field(tmp_path: Path, content: str | None, why: str) -> None:
    path = tmp_path / "r.json"
    if content is not None:
        path.write_text(content)
    report, problem = read_report(path)
    assert report is None and problem is not None
    assert problem.startswith(f"{path}: ") and why in problem and "\n" not in problem and "\x1b" not in problem


@pytest.mark.broken_reports  # the schema check of every report a test makes would open the FIFO and wait
def test_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    os.mkfifo(path)
    assert read_report(path) == (None, f"{path}: is a FIFO, not a regular file")


def test_pytests_words_are_its_error_line_not_its_rootdir(tmp_path: Path) -> None:
    output = tmp_path / "output.log"
    output.write_text(
        "ERROR: usage: python -m pytest [options] [file_or_dir] [file_or_dir] [...]\n"
        "python -m pytest: error: unrecognized arguments: --gb-level=quick\n  inifile: None\n  rootdir: /tmp\n"
    )
    assert last_line(output) == "python -m pytest: error: unrecognized arguments: --gb-level=quick"
    output.write_text("E   ModuleNotFoundError: No module named 'torch'\n\n1 error in 0.12s\n")
    assert last_line(output) == "E ModuleNotFoundError: No module named 'torch'"
    output.write_text("x" * 200_000 + "\nsegfault \x1b[2J\n")
    assert last_line(output) == "segfault \\x1b[2J"
    output.write_text("")
    assert last_line(output) == "no output"


# --- what keeps the checks from running at all: no verdict, one line, nothing left behind ------------------------


@pytest.fixture
def run_parent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temporary directory the run's own directory is made in."""
    parent = tmp_path / "tmp"
    parent.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(parent))
    return parent


@pytest.mark.parametrize(
    ("executable", "why"),
    [
        ("", "this Python cannot tell its own path (sys.executable is empty): no interpreter for the checks"),
        ("{tmp}/gone/python", "cannot start the checks' interpreter '{tmp}/gone/python': No such file or directory"),
        ("{tmp}", "cannot start the checks' interpreter '{tmp}': Permission denied"),  # a directory
    ],
)
def test_an_interpreter_that_cannot_start_is_cannot_run(
    executable: str, why: str, tmp_path: Path, run_parent: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sys.executable empty (Python cannot tell its path), gone (a venv replaced under a running check), or a
    directory: Popen's OSError was a traceback and exit 1, a failed check to Slurm and NPD."""
    monkeypatch.setattr(sys, "executable", executable.format(tmp=tmp_path))
    with pytest.raises(CannotRun) as info:
        run_checks("quick", 60.0, [], None)
    assert str(info.value) == why.format(tmp=tmp_path)
    assert list(run_parent.iterdir()) == []


def test_a_full_temporary_directory_is_cannot_run_and_leaves_nothing(
    run_parent: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TMPDIR out of space or inodes once the run's directory is made: its lock cannot be created (ENOSPC)."""

    def full(directory: Path) -> int:
        raise OSError(errno.ENOSPC, "No space left on device", str(directory / ".held"))

    monkeypatch.setattr(level_run, "_hold", full)
    with pytest.raises(CannotRun) as info:
        run_checks("quick", 60.0, [], None)
    assert str(info.value).startswith(f"cannot lock the run's directory: {run_parent}/gbvalidate-healthcheck-")
    assert str(info.value).endswith("/.held: No space left on device")
    assert list(run_parent.iterdir()) == []


def test_output_that_cannot_be_written_is_cannot_run_and_leaves_nothing(
    run_parent: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pytest's output file cannot be made (a full TMPDIR; here, as root too, a directory in its place)."""
    make_directory = tempfile.mkdtemp

    def with_obstacle(prefix: str) -> str:
        directory = make_directory(prefix=prefix)
        os.mkdir(os.path.join(directory, "output.log"))
        return directory

    monkeypatch.setattr(tempfile, "mkdtemp", with_obstacle)
    with pytest.raises(CannotRun) as info:
        run_checks("quick", 60.0, [], None)
    assert str(info.value).startswith(f"cannot write pytest's output: {run_parent}/gbvalidate-healthcheck-")
    assert str(info.value).endswith("/output.log: Is a directory")
    assert list(run_parent.iterdir()) == []


def test_no_usable_temporary_directory_is_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    def none_usable(prefix: str) -> str:
        raise FileNotFoundError(errno.ENOENT, "No usable temporary directory found in ['/tmp']")

    monkeypatch.setattr(tempfile, "mkdtemp", none_usable)
    with pytest.raises(CannotRun, match=r"^cannot make the run's directory: No usable temporary directory found in"):
        run_checks("quick", 60.0, [], None)


def test_the_run_gets_no_pytest_addopts() -> None:
    """An inherited PYTEST_ADDOPTS (`-k numa`) would narrow the level's checks: the run's environment lacks it, and
    the line says so (dropped_note)."""
    env = {"PATH": "/usr/bin", "PYTEST_ADDOPTS": "-k numa", "GBVALIDATE_SKU": "cpu"}
    assert checks_environment(env) == {"PATH": "/usr/bin", "GBVALIDATE_SKU": "cpu"}
    assert dropped_note(env) == (
        "PYTEST_ADDOPTS='-k numa' not passed on: the level's checks run as given (pytest options go after --)"
    )
    assert dropped_note({"PYTEST_ADDOPTS": ""}) is None and dropped_note({}) is None
