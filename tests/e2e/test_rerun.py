"""pytest_gbvalidate/run/rerun.py end to end: `--gb-rerun-failed REPORT` runs only the checks that failed in an
earlier report (with the cache off), says so in the new report's `narrowed_by`, and refuses a report it cannot
read in one line naming the file and the field."""

from __future__ import annotations

import json

import pytest

from tests.helpers.reports import FIXED_TIMES, minimal_report
from tests.helpers.runs import XUNIT1, assert_usage_error, junit_cases

CHECKS = """\
import pytest

def test_fan(gb_target):
    assert False, 'fan 3 stopped'

@pytest.mark.parametrize("gpu", [0, 1])
def test_link(gb_target, gpu):
    assert gpu == 0, 'gen 3, not 5'

def test_clock(gb_target):
    pass
"""


def test_a_second_run_takes_the_failed_checks_only(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_node=CHECKS)
    first = pytester.runpytest("--gb-sku=cpu", "--gb-report=first.json", "-p", "no:cacheprovider")
    first.assert_outcomes(passed=2, failed=2)

    again = pytester.runpytest(
        "--gb-sku=cpu", "--gb-rerun-failed=first.json", "--gb-report=again.json", *XUNIT1, "-p", "no:cacheprovider"
    )
    again.assert_outcomes(failed=2, deselected=2)
    assert set(junit_cases(pytester.path / "r.xml")) == {"test_fan", "test_link[1]"}
    report = json.loads((pytester.path / "again.json").read_text())
    assert report["narrowed_by"] == ["--gb-rerun-failed first.json"]
    assert {t["test_id"] for t in report["tests"]} == {"test_node.py::test_fan", "test_node.py::test_link[1]"}


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ('{"tests": []}', "*--gb-rerun-failed *earlier.json: report_version is missing*"),
        ("[1]", "*--gb-rerun-failed *earlier.json: not a JSON object*"),
        (json.dumps(minimal_report() | FIXED_TIMES), "*--gb-rerun-failed *earlier.json: no check failed in that run*"),
    ],
    ids=["not-a-report", "not-an-object", "nothing-failed"],
)
def test_an_earlier_report_that_does_not_read_is_a_usage_error(
    pytester: pytest.Pytester, content: str, said: str
) -> None:
    pytester.makepyfile(test_node=CHECKS)
    (pytester.path / "earlier.json").write_text(content)
    result = pytester.runpytest("--gb-sku=cpu", "--gb-rerun-failed=earlier.json", "-p", "no:cacheprovider")
    assert_usage_error(result, said)


def _failed(*test_ids: str) -> str:
    tests = [
        {"test_id": t, "when": "call", "outcome": "failed", "duration_s": 0.1, "message": "x", "text": None}
        for t in test_ids
    ]
    return json.dumps(minimal_report() | FIXED_TIMES | {"tests": tests, "exit_status": 1})


def test_a_failed_check_no_longer_collected_is_a_usage_error_naming_it(pytester: pytest.Pytester) -> None:
    """Never an empty run (exit 5, naming nothing) nor the others alone: a confirmation that ran without the check
    that failed would clear a node on nothing."""
    pytester.makepyfile(test_node=CHECKS)
    (pytester.path / "earlier.json").write_text(_failed("test_node.py::test_fan", "test_node.py::test_fan_speed"))
    result = pytester.runpytest("--gb-sku=cpu", "--gb-rerun-failed=earlier.json", "-p", "no:cacheprovider")
    assert_usage_error(
        result,
        "*--gb-rerun-failed: 1 failed check(s) of that run not collected here: test_node.py::test_fan_speed (renamed "
        "or removed since, or not under the paths given: give the same paths and rootdir as that run)",
    )


def test_a_failed_check_of_the_run_as_a_whole_runs_every_check_again(pytester: pytest.Pytester) -> None:
    from pytest_gbvalidate.run import ending, rerun

    assert ending.PACE_TEST_ID.startswith(rerun.RUN_CHECKS)
    pytester.makepyfile(test_node=CHECKS)
    (pytester.path / "earlier.json").write_text(_failed(ending.PACE_TEST_ID))
    result = pytester.runpytest("--gb-sku=cpu", "--gb-rerun-failed=earlier.json", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=2)
