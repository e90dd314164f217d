"""What a run's report says about its node: the one rule the fleet summary and the health check both read. Pure:
no I/O, no pytest.

In this order, the first that applies:
0. no verdict: the report still says `running`: the run is being written or was killed outright. Neither is a
   finding about the node (`fleet offenders` counts a killed run, once a later one of the node is kept).
1. partial: the run was stopped (`interrupted`); what it showed is not the node's whole story.
2. fail: a check failed on the node (a failed test whose fault is not `unresolved`).
3. unresolved: every failed test failed only because its figures were too noisy to judge (rules/resolution.py): neither
   a pass nor a fault of the node; run again on an idle node. pytest exits EXIT_UNRESOLVED, not 1.
4. no verdict: pytest's exit status is not 0 without a failed test (its own usage or internal error, nothing
   collected, an output it could not write), or no check passed (only collected, or every test skipped).
5. pass: the run finished, exit status 0, at least one check passed and none failed.

A failed check stands however the run ended: a run stopped after a check failed is `fail`, not `partial`. An
interrupted run without one is `partial`: not shown healthy, and not drained -- being stopped is no finding about the
node; a run the deadline killed is the health check's own finding (healthcheck/verdict.py TIMEOUT). `judge` gives
the verdict with what it rests on; fleet/drain.py says what takes a node out of service.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

from pytest_gbvalidate.labels import printable
from pytest_gbvalidate.node.preconditions import PRECONDITIONS_TEST_ID
from pytest_gbvalidate.report.records import ReasonClass, RunReportRecord, TestRecord

NodeVerdict = Literal["pass", "fail", "unresolved", "partial", "no verdict"]
NO_VERDICT: Final = "no verdict"
UNRESOLVED: Final = "unresolved"
# The fault category of a test that failed only for figures too noisy to judge (faults.yaml).
UNRESOLVED_CATEGORY: Final = "unresolved"
# The fault table's category where no rule matches (faults.yaml), and a failed check's in a report without one.
UNCLASSIFIED: Final = "unclassified"
# pytest's exit status for a run whose every failed test was too noisy to judge: "this run could not tell", apart
# from 1; the health check's "not run, no verdict" is 10 too (healthcheck/slurm.py).
EXIT_UNRESOLVED: Final = 10


@dataclass(frozen=True)
class FailedCheck:
    """A failed test of a run's report with its fault (None where the report has none), its texts printable."""

    test_id: str
    message: str
    category: str | None
    action: str | None
    disposition: str | None
    reason_class: ReasonClass = "hardware"  # whose problem it is (faults.yaml)
    repair: str | None = None  # what brings the node back (faults.yaml)

    @property
    def name(self) -> str:
        return self.test_id.rsplit("::", 1)[-1]

    @property
    def unresolved(self) -> bool:
        """Whether it failed only for figures too noisy to judge: no fault of the node."""
        return self.category == UNRESOLVED_CATEGORY


@dataclass(frozen=True)
class Judgement:
    """What a report says about its node, and what that rests on."""

    verdict: NodeVerdict
    failed: tuple[FailedCheck, ...]  # every failed test once, in the report's order
    passed: frozenset[str]  # the test ids whose call passed and that failed in no phase
    skipped: frozenset[str]
    cause: str  # the failure of PRECONDITIONS_TEST_ID (the node's GPUs cannot be used at all), one line; else ""

    @property
    def faults(self) -> tuple[FailedCheck, ...]:
        """The failed checks that are the node's: all but those too noisy to judge."""
        return tuple(c for c in self.failed if not c.unresolved)

    @property
    def unresolved(self) -> tuple[FailedCheck, ...]:
        return tuple(c for c in self.failed if c.unresolved)


def judge(report: RunReportRecord) -> Judgement:
    failed: dict[str, FailedCheck] = {}
    passed, skipped, cause = set(), set(), ""
    for test in report["tests"]:
        test_id = _shown(test["test_id"])
        if test["outcome"] == "failed" and test_id not in failed:
            failed[test_id] = _failed_check(test_id, test)
            if test["test_id"] == PRECONDITIONS_TEST_ID:
                cause = failed[test_id].message
        elif test["outcome"] == "passed" and test["when"] == "call":
            passed.add(test_id)
        elif test["outcome"] == "skipped":
            skipped.add(test_id)
    checks = tuple(failed.values())
    return Judgement(_verdict(report, checks), checks, frozenset(passed - failed.keys()), frozenset(skipped), cause)


def _verdict(report: RunReportRecord, failed: Sequence[FailedCheck]) -> NodeVerdict:
    if any(not c.unresolved for c in failed):
        return "fail"  # what it found stands, however the run ended
    if report["status"] == "running":
        return NO_VERDICT
    if report["status"] != "finished":
        return "partial"
    if failed:
        return UNRESOLVED
    if report["exit_status"] != 0:
        return NO_VERDICT
    return "pass" if checked(report) else NO_VERDICT


def _failed_check(test_id: str, test: TestRecord) -> FailedCheck:
    fault = test.get("fault")
    message = _shown(test["message"] or f"failed at {test['when']}")
    if fault is None:
        return FailedCheck(test_id, message, None, None, None)
    repair = fault.get("repair")
    return FailedCheck(
        test_id,
        message,
        printable(fault["category"]),
        printable(fault["action"]),
        printable(fault["disposition"]),
        fault.get("reason_class", "hardware"),
        None if repair is None else printable(repair),
    )


def _shown(text: str) -> str:
    """A test id or message on one line, printable (a category is a name: its line breaks are shown, not folded)."""
    return printable(re.sub(r"\s+", " ", text).strip())


def of_report(report: RunReportRecord) -> NodeVerdict:
    return judge(report).verdict


# A measurement's verdicts that judged it (against a baseline, or by recording it), where its test may not say so:
# a check that hands its figures over and is then skipped for a reason of its own still judged them.
JUDGED: Final = frozenset({"pass", "warn", "fail", "unresolved", "recorded"})


def checked(report: RunReportRecord) -> bool:
    """Whether the run checked anything: a test passed, or a measurement was judged (else it passes nothing)."""
    return any(t["outcome"] == "passed" for t in report["tests"]) or any(
        m["verdict"] in JUDGED for m in report["measurements"]
    )


def is_unresolved(test: TestRecord) -> bool:
    """Whether a failed test failed only for figures too noisy to judge."""
    fault = test.get("fault")
    return fault is not None and fault["category"] == UNRESOLVED_CATEGORY
