"""Each test's outcome as the report keeps it: its record, its fault from the fault table, and the run's own checks
that fail as tests do, reported through pytest's own hook so every output shows them as the suites' checks."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

import pytest

from pytest_gbvalidate.run import junit_hooks
from pytest_gbvalidate.run.payload import Payload

if TYPE_CHECKING:
    from pytest_gbvalidate.levels import Level
    from pytest_gbvalidate.report.records import FaultRecord, LevelTimeRecord, MeasurementRecord, Phase, TestRecord

# A test's phases and outcomes as the report's records have them (TestRecord). pytest-xdist reports a worker that
# died under a test with the phase "???"; pytest-rerunfailures an attempt it runs again with the outcome "rerun".
PHASES, OUTCOMES = ("setup", "call", "teardown"), ("passed", "failed", "skipped")
# A phase as a record keeps it (pytest before 9 types a report's `when` as any text).
RECORDED_PHASES: dict[str, Phase] = {"setup": "setup", "call": "call", "teardown": "teardown"}


def recorded(report: pytest.TestReport) -> bool:
    """Whether the JSON report keeps it: a call, or a phase that did not pass; not a pytest-rerunfailures attempt."""
    replaced = report.outcome not in OUTCOMES and report.when in PHASES
    return (report.when == "call" or report.outcome != "passed") and not replaced


def test_record(
    config: pytest.Config, report: pytest.TestReport, fault: FaultRecord | None, level: Level | None
) -> TestRecord:
    """The report's record of one phase of a test; a failure's fault goes to the JUnit suite's properties too."""
    message, text = (None, None) if report.passed else junit_hooks.failure_text(report)
    outcome = report.outcome
    when = RECORDED_PHASES.get(report.when or "")
    if when is None:
        # pytest-xdist's report of a worker that died under a test says when "???": the test failed by crashing.
        when, outcome = "call", "failed"
        said = [line for line in report.longreprtext.splitlines() if "crashed" in line]  # xdist's own line
        message = f"crashed: {said[-1].strip() if said else 'the process running the test ended without a report'}"
        text = text or message
        fault = fault or classify(report.nodeid, message)
    test: TestRecord = {
        "test_id": report.nodeid,
        "when": when,
        "outcome": outcome,
        "duration_s": round(report.duration, 6) if math.isfinite(report.duration) else 0.0,
        "message": message,
        "text": text,
    }
    if level is not None:
        test["level"] = level
    if fault is not None:
        summary = f"{fault['category']} ({fault['disposition']}): {fault['action']}"
        junit_hooks.add_suite_properties(config, {f"fault[{report.nodeid}]": summary})
        test["fault"] = fault
    return test


def classify(test_id: str, message: str | None, verdicts: Iterable[str] = ()) -> FaultRecord:
    from pytest_gbvalidate import faults

    return faults.load().classify(test_id, message, set(verdicts)).as_dict()


def fault_of(item: pytest.Item, report: pytest.TestReport, records: list[MeasurementRecord]) -> FaultRecord:
    """The failed test's fault category and the operator's action, from the fault table: for the JSON report
    and the testcase's JUnit properties (xunit1; the controller adds them to the suite's for xunit2)."""
    message, _ = junit_hooks.failure_text(report)
    verdicts = {r["verdict"] for r in records} | {r["compare"]["verdict"] for r in records if "compare" in r}
    fault = classify(report.nodeid, message, {v for v in verdicts if v})
    item.user_properties += [("gb_fault_category", fault["category"]), ("gb_fault_action", fault["action"])]
    item.user_properties += [("gb_fault_repair", fault["repair"])] if "repair" in fault else []
    return fault


def count_level_time(times: dict[Level, LevelTimeRecord], level: Level, report: pytest.TestReport) -> None:
    """What the level's checks took: each test once (its setup), every phase's time."""
    spent = times.setdefault(level, {"tests": 0, "duration_s": 0.0})
    if report.when == "setup":
        spent["tests"] += 1
    spent["duration_s"] = round(spent["duration_s"] + report.duration, 6)


def fail_run_check(
    config: pytest.Config, session: pytest.Session, test_id: str, message: str, verdicts: set[str]
) -> int:
    """A check of the run itself (`gbvalidate::node_pace`) fails as the suites' checks do, with its fault: its call
    then its teardown through pytest's report hook (pytest-html adds a row once its teardown is reported). The run's
    exit status from now: tests failed."""
    location = (test_id.split("::")[0], None, test_id.split("::")[1])
    failed = pytest.TestReport(test_id, location, {}, "failed", message, "call")
    Payload(fault=classify(test_id, message, verdicts)).attach(failed)
    config.hook.pytest_runtest_logreport(report=failed)
    config.hook.pytest_runtest_logreport(report=pytest.TestReport(test_id, location, {}, "passed", None, "teardown"))
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
    return session.exitstatus
