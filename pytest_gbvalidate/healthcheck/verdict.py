"""A health check run's verdict, from what the run left: pytest's exit code, whether the deadline killed it, and
its JSON report (read and checked against the report's records by level_run.py). Pure: no I/O, no pytest.

In this order, the first that applies:

1. FAIL: a check failed (any test record whose outcome is `failed`), even where the run then timed out or
   stopped: what it found stands.
2. TIMEOUT: the run did not finish before the deadline and was killed.
3. UNKNOWN: no verdict could be made: no report, or one that does not read as a report (the file and the field
   are named); a run the report says did not finish; checks that failed only for figures too noisy to judge
   (unresolved: run again on an idle node); pytest's exit status not 0 without a failed check (an internal or
   usage error, nothing collected, an output it could not write, a crash); or not a single check passed (all
   skipped). What a finished report says about its node is report/node_verdict.py's rule, as the fleet's.
4. OK: the run finished, exit status 0, at least one check passed and none failed.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_gbvalidate.fleet.text import category_parts, drain_reason, one_line, shorten
from pytest_gbvalidate.labels import printable
from pytest_gbvalidate.node.preconditions import PRECONDITIONS_TEST_ID
from pytest_gbvalidate.report import node_verdict
from pytest_gbvalidate.report.node_verdict import EXIT_UNRESOLVED
from pytest_gbvalidate.report.records import ReasonClass, RunReportRecord

OK, FAIL, TIMEOUT, UNKNOWN = "ok", "fail", "timeout", "unknown"
# What pytest's exit statuses mean (pytest.ExitCode), for a line that says why there is no verdict.
EXIT_MEANINGS = {
    0: "tests passed",
    1: "tests failed",
    2: "interrupted",
    3: "internal error",
    4: "usage error",
    5: "no tests collected",
    EXIT_UNRESOLVED: "too noisy to judge",
}
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
class Failure:
    test_id: str
    category: str  # the fault table's; `unclassified` where the record has no fault
    disposition: str | None
    action: str | None
    reason_class: ReasonClass = "hardware"  # whose problem it is (faults.yaml); a report without one: hardware
    repair: str | None = None  # what brings the node back (faults.yaml); None in a report from before repairs

    @property
    def name(self) -> str:
        return self.test_id.rsplit("::", 1)[-1]


@dataclass(frozen=True)
class Verdict:
    state: str  # OK, FAIL, TIMEOUT or UNKNOWN
    level: str
    failures: tuple[Failure, ...]
    passed: int  # checks (test ids) that passed
    skipped: int
    duration_s: float
    deadline_s: float
    detail: str  # one line: why, for TIMEOUT and UNKNOWN; for FAIL, how the run ended where it did not finish
    # For FAIL where the node's GPUs cannot be used at all (node/preconditions.py): that cause, one line, named
    # before anything else (its dependents were not run); else empty.
    cause: str = ""
    passed_checks: frozenset[str] = frozenset()  # the test ids of `passed`
    # Where the failures were run once more (confirm.py): True, they failed again (the only ones `failures` keeps);
    # `flapping`, the checks that failed, then passed on the second run. False: not run again.
    confirmed: bool = False
    flapping: tuple[str, ...] = ()

    def findings(self) -> list[str]:
        """What the run found, without the leader: `gpu_hardware (rma): test_gpu_count` per fault category with its
        repair (its checks comma-joined, as the fleet summary's reasons), or the timeout; empty for OK and UNKNOWN."""
        if self.state == TIMEOUT:
            return [f"timeout: the {self.level} checks did not finish within {self.deadline_s:g} s"]
        return category_parts((f.category, f.repair, f.name) for f in self.failures)

    def confirmation(self) -> str:
        """What the line says of the second run (confirm.py): the failures it confirmed, the checks that flapped."""
        confirmed = "confirmed: failed again on a second run" if self.confirmed else ""
        flapped = f"flapping (failed, then passed; not drained): {', '.join(self.flapping)}" if self.flapping else ""
        return "; ".join(part for part in (confirmed, flapped) if part)

    def categories(self) -> str:
        """The failed checks' fault categories with their counts, most first: `link (2 checks), gpu_hardware (1
        check)`; empty where none failed."""
        counts: dict[str, int] = {}
        for f in self.failures:
            counts[f.category] = counts.get(f.category, 0) + 1
        ranked = sorted(counts.items(), key=lambda kv: -kv[1])
        return ", ".join(f"{category} ({n} check{'' if n == 1 else 's'})" for category, n in ranked)

    def actions(self) -> list[str]:
        """What the operator does, per fault category of the failed checks (the fault table's), each once."""
        return list(dict.fromkeys(f"{f.category}: {f.action}" for f in self.failures if f.action))

    def drain_reason(self, limit: int) -> str | None:
        """The reason for a node taken out of service (FAIL and TIMEOUT), within `limit` characters; None where
        the node stays in (OK) or nothing is known of it (UNKNOWN)."""
        if self.state not in (FAIL, TIMEOUT):
            return None
        return drain_reason((f.reason_class for f in self.failures), self.findings(), limit)


def judge(run: Run) -> Verdict:
    report = run.report
    failures: dict[str, Failure] = {}
    unresolved: set[str] = set()
    passed: set[str] = set()
    skipped: set[str] = set()
    cause = ""
    for test in [] if report is None else report["tests"]:
        test_id = printable(one_line(test["test_id"]))
        if test["outcome"] == "failed" and test["test_id"] == PRECONDITIONS_TEST_ID:
            cause = shorten(escaped(one_line(test["message"] or "")), PROBLEM_MAX_CHARS)
        if test["outcome"] == "failed" and node_verdict.is_unresolved(test):
            unresolved.add(test_id)
        elif test["outcome"] == "failed" and test_id not in failures:
            fault = test.get("fault")
            failures[test_id] = Failure(
                test_id,
                printable(fault["category"]) if fault else "unclassified",
                printable(fault["disposition"]) if fault else None,
                printable(fault["action"]) if fault else None,
                fault.get("reason_class", "hardware") if fault else "hardware",
                printable(fault["repair"]) if fault and "repair" in fault else None,
            )
        elif test["outcome"] == "passed" and test["when"] == "call":
            passed.add(test_id)
        elif test["outcome"] == "skipped":
            skipped.add(test_id)
    passed -= failures.keys() | unresolved
    unresolved -= failures.keys()

    level = run.level if report is None else report.get("level", run.level)  # pytest's last --gb-level wins

    def verdict(state: str, detail: str = "") -> Verdict:
        detail = shorten(escaped(detail), PROBLEM_MAX_CHARS)  # our own words: their values escaped already
        counts = (len(passed), len(skipped), run.duration_s, run.deadline_s)
        found = tuple(failures.values())
        return Verdict(state, level, found, *counts, detail, cause if state == FAIL else "", frozenset(passed))

    if failures:
        return verdict(FAIL, _cut_short(run) or "")
    if run.timed_out:
        return verdict(TIMEOUT, f"killed at the {run.deadline_s:g} s deadline")
    if report is None:
        return verdict(UNKNOWN, run.problem or "no report")
    cut_short = _cut_short(run)
    if cut_short is not None:
        return verdict(UNKNOWN, cut_short)
    if unresolved:
        shown = ", ".join(sorted(t.rsplit("::", 1)[-1] for t in unresolved))
        return verdict(UNKNOWN, f"unresolved: too noisy to judge ({shown}); run again on an idle node")
    status = report["exit_status"] if report["exit_status"] not in (0, None) else run.returncode
    if status != 0:
        return verdict(UNKNOWN, f"pytest exit status {status} ({_meaning(status)}) without a failed check")
    if not passed:
        return verdict(UNKNOWN, f"no check passed ({len(skipped)} skipped): nothing shows the node healthy")
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
    """`text` with every character that is not printable ASCII escaped (`\\n`, `\\xf6`), for the one line. A
    backslash stays as it is: the values in the line were escaped where they were put in (labels.printable, `!a`),
    and escaping them again would show `n\\\\xf6` for `nö`."""
    return "".join(c if c.isascii() and c.isprintable() else ascii(c)[1:-1] for c in text)
