"""Confirm before drain: a health check's failed checks run once more, within what is left of its deadline, and only
what fails again stands, as Azure's runbook drains only what still fails after a second run (AzNHC: "a single pass
might fail and drain the node"). Of each check that failed the first run, the second says: failed again, confirmed;
passed, flapping (said, counted by `fleet offenders`, never drained); anything else (skipped, too noisy, not run, no
time), not confirmed: where no failure is confirmed, no verdict and no drain. A run that hung past the deadline is
not run again: no time is left, and a hang is the node's (slurm.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from pytest_gbvalidate.healthcheck.level_run import CannotRun
from pytest_gbvalidate.healthcheck.verdict import FAIL, OK, UNKNOWN, Run, Verdict, judge
from pytest_gbvalidate.report.records import RunReportRecord

# (the first run's report, whose failed checks run again; the seconds they may take) -> what the run left
Rerun = Callable[[RunReportRecord, float], Run]


def confirm(first: Run, rerun: Rerun, min_s: float) -> Verdict:
    """The first run's verdict, its failures run once more where at least `min_s` of its deadline is left."""
    verdict = judge(first)
    if verdict.state != FAIL or first.timed_out:
        return verdict
    left_s = first.deadline_s - first.duration_s
    if left_s < min_s:
        return unconfirmed(verdict, f"{left_s:.0f} s of the {first.deadline_s:g} s deadline left, {min_s:g} needed")
    assert first.report is not None  # judge() finds a failure in a report only
    try:
        second = judge(rerun(first.report, left_s))
    except CannotRun as exc:
        return unconfirmed(verdict, str(exc))
    return combined(verdict, second)


def combined(first: Verdict, second: Verdict) -> Verdict:
    """`first`'s failures as `second` (their second run) judges them. Pure."""
    again = {f.test_id for f in second.failures}
    kept = tuple(f for f in first.failures if f.test_id in again)
    flapping = tuple(f.name for f in first.failures if f.test_id in second.passed_checks and f.test_id not in again)
    both = dataclasses.replace(first, flapping=flapping, duration_s=first.duration_s + second.duration_s)
    if kept:
        return dataclasses.replace(both, failures=kept, confirmed=True)
    if left := [f.name for f in first.failures if f.name not in flapping]:
        return unconfirmed(both, second.detail or f"the second run was {second.state}", left)
    return dataclasses.replace(both, state=OK, failures=(), cause="", detail="", passed=first.passed + len(flapping))


def unconfirmed(verdict: Verdict, why: str, names: Sequence[str] | None = None) -> Verdict:
    """No verdict: checks failed once and the second run could not say whether they fail again."""
    shown = ", ".join(names if names is not None else [f.name for f in verdict.failures])
    detail = f"failed once, not confirmed ({shown}): {why}; run it again"
    return dataclasses.replace(verdict, state=UNKNOWN, failures=(), cause="", detail=detail)
