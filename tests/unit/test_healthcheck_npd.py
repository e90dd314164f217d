"""pytest_gbvalidate/healthcheck/npd.py: node-problem-detector's plugin protocol, exit code and one line."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_gbvalidate.healthcheck import npd
from pytest_gbvalidate.healthcheck.verdict import Run, Verdict, judge
from tests.helpers.healthcheck import FAULT, record, report_with


def verdict_of(report: Any, returncode: int = 0, timed_out: bool = False, why: str | None = None) -> Verdict:
    return judge(Run("quick", returncode, timed_out, 100.0, 31.0, report, why))


PASSED = verdict_of(report_with([record("s/t.py::test_gpu_count", "passed")]))
FAILED = verdict_of(report_with([record("s/t.py::test_gpu_count", "failed", fault=FAULT)], exit_status=1), 1)
TIMED_OUT = verdict_of(None, -15, timed_out=True, why="no report")
BROKEN = verdict_of(None, 0, why="/tmp/x/report.json: tests[0].outcome is 'odd', not one of 'passed', 'failed'")


def test_exit_codes_are_the_protocols() -> None:
    """OK 0, NonOK 1, Unknown 2 (pkg/custompluginmonitor/types/types.go); a timeout is Unknown, as NPD's own."""
    assert [npd.exit_code(v) for v in (PASSED, FAILED, TIMED_OUT, BROKEN)] == [0, 1, 2, 2]


def test_lines_say_the_verdict_without_what_changes_between_runs() -> None:
    assert npd.line(PASSED, 80) == "quick GPU node checks pass"
    assert npd.line(FAILED, 80) == "gpu_hardware (1 check); gpu_hardware: test_gpu_count"
    assert npd.line(TIMED_OUT, 80) == "unknown: timeout: the quick checks did not finish within 100 s"
    assert npd.line(BROKEN, 80) == "unknown: /tmp/x/report.json: tests[0].outcome is 'odd', not one of 'passed',..."
    assert npd.line(PASSED, 80, "report not kept: /x: is a directory") == (
        "quick GPU node checks pass; report not kept: /x: is a directory"
    )


@pytest.mark.parametrize("max_chars", [20, 80, 200])
def test_a_line_fits_max_output_length_in_bytes(max_chars: int) -> None:
    hostile = record("s/t.py::test_\u00e9\n" + "x" * 300, "failed", fault=FAULT)
    verdict = verdict_of(report_with([hostile], exit_status=1), 1)
    line = npd.line(verdict, max_chars)
    assert len(line.encode()) <= max_chars and "\n" not in line and line.isascii() and line.isprintable()
