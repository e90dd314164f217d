"""A health check run's verdict, from pytest's exit code, whether the deadline killed it, and its JSON report (what a
report says of its node is report/node_verdict.py's rule, as the fleet's). Pure: no I/O, no pytest. The first that
applies, in this order:

1. FAIL: a check failed, even where the run then timed out or stopped: what it found stands.
2. TIMEOUT: the run did not finish before the deadline and was killed.
3. UNKNOWN: no verdict: no report, or one that does not read as one (the file and field named); a run that did not
   finish; checks that failed only for figures too noisy to judge; pytest's exit status not 0 without a failed check
   (an internal or usage error, nothing collected, an output it could not write, a crash); no check passed.
4. OK: the run finished, exit status 0, at least one check passed and none failed."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from pytest_gbvalidate.fleet import drain
from pytest_gbvalidate.fleet.text import shorten
from pytest_gbvalidate.report import node_verdict
from pytest_gbvalidate.report.node_verdict import EXIT_UNRESOLVED, UNCLASSIFIED, FailedCheck
from pytest_gbvalidate.report.records import RunReportRecord

OK, FAIL, TIMEOUT, UNKNOWN = "ok", "fail", "timeout", "unknown"
# What pytest's exit statuses mean (pytest.ExitCode, from 0), for a line that says why there is no verdict.
_PYTEST_EXITS = ("tests passed", "tests failed", "interrupted", "internal error", "usage error", "no tests collected")
EXIT_MEANINGS = {**dict(enumerate(_PYTEST_EXITS)), EXIT_UNRESOLVED: "too noisy to judge"}
PROBLEM_MAX_CHARS = 300


@dataclass(frozen=True)
class Run:
    """What a health check run left."""

    level: str  # the level asked for
    returncode: int  # pytest's exit code; negative: killed by that signal
    timed_out: bool  # killed at the deadline
    deadline_s: float
    duration_s: float
    report: RunReportRecord | None  # None where there is none to read
    problem: str | None = None  # why `report` is None: the file and field, or pytest's last words


@dataclass(frozen=True)
class Verdict:
    state: str  # OK, FAIL, TIMEOUT or UNKNOWN
    level: str
    failures: tuple[FailedCheck, ...]  # the node's: none too noisy to judge (report/node_verdict.py)
    passed: int  # checks (test ids) that passed
    skipped: int
    duration_s: float
    deadline_s: float
    detail: str  # one line: why, for TIMEOUT and UNKNOWN; for FAIL, how the run ended where it did not finish
    cause: str = ""  # for FAIL where the node's GPUs cannot be used at all (node/preconditions.py): that cause
    passed_checks: frozenset[str] = frozenset()  # the test ids of `passed`
    confirmed: bool = False  # the failures failed again on a second run (confirm.py); False: not run again
    flapping: tuple[str, ...] = ()  # the checks that failed, then passed on the second run

    def causes(self) -> list[drain.Cause]:
        """What takes the node out of service (fleet/drain.py): the failed checks, or the deadline."""
        if self.state == TIMEOUT:
            part = f"timeout: the {self.level} checks did not finish within {self.deadline_s:g} s"
            return [drain.Cause("timeout", part, "timeout")]
        return drain.failed(self.failures) if self.state == FAIL else []

    def findings(self) -> list[str]:
        """What the run found, as a drain reason's parts (`gpu_hardware (rma): test_gpu_count`), or the timeout."""
        return [c.part for c in self.causes()]

    def confirmation(self) -> str:
        """What the line says of the second run (confirm.py): the failures it confirmed, the checks that flapped."""
        confirmed = "confirmed: failed again on a second run" if self.confirmed else ""
        flapped = f"flapping (failed, then passed; not drained): {', '.join(self.flapping)}" if self.flapping else ""
        return "; ".join(part for part in (confirmed, flapped) if part)

    def categories(self) -> str:
        """The failed checks' fault categories and counts, most first: `link (2 checks), gpu_hardware (1 check)`."""
        counts = Counter(f.category or UNCLASSIFIED for f in self.failures)
        return ", ".join(f"{category} ({n} check{'' if n == 1 else 's'})" for category, n in counts.most_common())

    def actions(self) -> list[str]:
        """What the operator does, per fault category of the failed checks (the fault table's), each once."""
        return list(dict.fromkeys(f"{f.category or UNCLASSIFIED}: {f.action}" for f in self.failures if f.action))

    def drain_reason(self) -> str | None:
        """The reason for a node taken out of service (FAIL and TIMEOUT: fleet/drain.py); else None."""
        return drain.reason(self.causes())


def judge(run: Run) -> Verdict:
    """What the report says of the node, with what only this run knows: the deadline, the signal, the exit status."""
    found = None if run.report is None else node_verdict.judge(run.report)
    failures = () if found is None else found.faults
    passed = frozenset() if found is None else found.passed
    skipped = 0 if found is None else len(found.skipped)
    level = run.level if run.report is None else run.report.get("level", run.level)  # pytest's last --gb-level wins

    def verdict(state: str, detail: str = "") -> Verdict:
        detail = shorten(escaped(detail), PROBLEM_MAX_CHARS)  # our own words: their values escaped already
        cause = shorten(found.cause, PROBLEM_MAX_CHARS) if found is not None and state == FAIL else ""
        counts = (len(passed), skipped, run.duration_s, run.deadline_s)
        return Verdict(state, level, failures, *counts, detail, cause, passed)

    if failures:
        return verdict(FAIL, _cut_short(run) or "")
    if run.timed_out:
        return verdict(TIMEOUT, f"killed at the {run.deadline_s:g} s deadline")
    if found is None or run.report is None:
        return verdict(UNKNOWN, run.problem or "no report")
    if (cut_short := _cut_short(run)) is not None:
        return verdict(UNKNOWN, cut_short)
    if found.unresolved:
        shown = ", ".join(sorted(c.name for c in found.unresolved))
        return verdict(UNKNOWN, f"unresolved: too noisy to judge ({shown}); run again on an idle node")
    status = run.report["exit_status"] if run.report["exit_status"] not in (0, None) else run.returncode
    if status != 0:
        return verdict(UNKNOWN, f"pytest exit status {status} ({_meaning(status)}) without a failed check")
    if found.verdict != "pass":
        return verdict(UNKNOWN, f"no check passed ({skipped} skipped): nothing shows the node healthy")
    return verdict(OK)


def _cut_short(run: Run) -> str | None:
    """How a run ended that did not finish: the deadline, a signal, the report's status; None if it finished."""
    if run.timed_out:
        return f"then killed at the {run.deadline_s:g} s deadline"
    if run.returncode < 0:
        return f"pytest was killed by signal {-run.returncode}"
    if run.report is not None and run.report["status"] != "finished":
        # run.problem: pytest's own line where it ended by itself, yet its report stayed unfinished (a full disk)
        return run.problem or f"the report says the run is {run.report['status']} (pytest exit status {run.returncode})"
    return None


def _meaning(status: int) -> str:
    return EXIT_MEANINGS.get(status, "unknown")


def exit_meaning(returncode: int) -> str:
    """pytest's exit code in words, for a line that says why there is no report. 0 is not "tests passed" there:
    without the report nothing says any test ran (`pytest --version` exits 0 too)."""
    if returncode < 0:
        return f"killed by signal {-returncode}"
    return f"exit status {returncode}" + (f", {_meaning(returncode)}" if returncode != 0 else "")


def escaped(text: str) -> str:
    """`text` with every character that is not printable ASCII escaped (`\\n`, `\\xf6`), for the one line. Not a
    backslash: the line's values were escaped as they were put in (labels.printable, `!a`), and would show twice."""
    return "".join(c if c.isascii() and c.isprintable() else ascii(c)[1:-1] for c in text)
