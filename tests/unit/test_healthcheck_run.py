"""pytest_gbvalidate/healthcheck/level_run.py without a run: the pytest command, the report read (a bad one is one line
naming the file and the field), pytest's words when it wrote none. (Real runs: e2e/test_healthcheck.py.)"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from pytest_gbvalidate.healthcheck.level_run import last_line, pytest_command, read_report
from tests.helpers.reports import minimal_report, report_text


def test_the_command_runs_the_shipped_suites_at_the_level_into_the_report(tmp_path: Path) -> None:
    command = pytest_command(tmp_path / "r.json", "quick", ["--gb-sku=cpu", "-k", "copy"])
    assert command == [
        sys.executable,
        *("-m", "pytest", "--pyargs", "pytest_gbvalidate.suites", "--gb-level=quick"),
        *(f"--gb-report={tmp_path / 'r.json'}", "-p", "no:cacheprovider", "-q", "--gb-sku=cpu", "-k", "copy"),
    ]


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
