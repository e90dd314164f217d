"""What a run's report says about its node: the one rule the fleet summary and the health check both read. Pure:
no I/O, no pytest.

In this order, the first that applies:
0. no verdict: the report still says `running`: the run is being written (a summary taken while the nodes' runs
   go on, as a job array's first task to end did) or was killed outright. Neither is a finding about the node
   (`fleet offenders` counts a killed run, once a later one of the node is kept).
1. partial: the run was stopped (`interrupted`); what it showed is not the node's whole story.
2. fail: a check failed on the node (a failed test whose fault is not `unresolved`).
3. unresolved: every failed test failed only because its figures were too noisy to judge (rules/resolution.py): neither
   a pass nor a fault of the node; run again on an idle node. pytest exits EXIT_UNRESOLVED, not 1.
4. no verdict: pytest's exit status is not 0 without a failed test (its own usage or internal error, nothing
   collected, an output it could not write), or no check passed (only collected, or every test skipped).
5. pass: the run finished, exit status 0, at least one check passed and none failed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Literal

from pytest_gbvalidate.report.records import RunReportRecord, TestRecord

NodeVerdict = Literal["pass", "fail", "unresolved", "partial", "no verdict"]
NO_VERDICT: Final = "no verdict"
UNRESOLVED: Final = "unresolved"
# The fault category of a test that failed only for figures too noisy to judge (faults.yaml).
UNRESOLVED_CATEGORY: Final = "unresolved"
# pytest's exit status for a run whose every failed test was too noisy to judge: "this run could not tell", apart
# from 1, "a check failed on the node"; the health check's "not run, no verdict" is 10 too (healthcheck/slurm.py).
EXIT_UNRESOLVED: Final = 10


def of_report(report: RunReportRecord) -> NodeVerdict:
    if report["status"] == "running":
        return NO_VERDICT
    if report["status"] != "finished":
        return "partial"
    if failed_tests(report["tests"]):
        return UNRESOLVED if only_unresolved(report["tests"]) else "fail"
    if report["exit_status"] != 0:
        return NO_VERDICT
    return "pass" if checked(report) else NO_VERDICT


# A measurement's verdicts that judged it (against a baseline, or by recording it), where its test may not say so:
# a check that hands its figures over and is then skipped for a reason of its own still judged them.
JUDGED: Final = frozenset({"pass", "warn", "fail", "unresolved", "recorded"})


def checked(report: RunReportRecord) -> bool:
    """Whether the run checked anything: a test passed, or a measurement was judged. A run whose every test was
    skipped and that judged nothing (a baseline that gates none of its checks, a -k that matched only checks the
    node cannot run) measured nothing, and passes nothing."""
    return any(t["outcome"] == "passed" for t in report["tests"]) or any(
        m["verdict"] in JUDGED for m in report["measurements"]
    )


def failed_tests(tests: Sequence[TestRecord]) -> list[TestRecord]:
    return [t for t in tests if t["outcome"] == "failed"]


def only_unresolved(tests: Sequence[TestRecord]) -> bool:
    """Whether some test failed and every failed one failed only for figures too noisy to judge."""
    failed = failed_tests(tests)
    return bool(failed) and all(is_unresolved(t) for t in failed)


def is_unresolved(test: TestRecord) -> bool:
    """Whether a failed test failed only for figures too noisy to judge."""
    fault = test.get("fault")
    return fault is not None and fault["category"] == UNRESOLVED_CATEGORY
