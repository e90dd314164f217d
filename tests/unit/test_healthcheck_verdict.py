"""pytest_gbvalidate/healthcheck/verdict.py: a run's report -> OK, FAIL, TIMEOUT or UNKNOWN, on reports made here
(a real run's: e2e/test_healthcheck.py)."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_gbvalidate.fleet import drain
from pytest_gbvalidate.healthcheck.verdict import FAIL, OK, TIMEOUT, UNKNOWN, Run, escaped, exit_meaning, judge
from pytest_gbvalidate.report.schema import problem
from tests.helpers.healthcheck import FAULT, record, report_with

LINK: dict[str, Any] = FAULT | {"category": "link", "action": "check the cable or port", "disposition": "ISOLATE"}
HEALTHY = [record("s/test_health.py::test_gpu_count", "passed"), record("s/test_bw.py::test_gemm", "skipped", "setup")]


def run(report: Any = None, returncode: int = 0, timed_out: bool = False, why: str | None = None) -> Run:
    if report is not None:
        assert problem(report) is None, problem(report)  # every report here is one a run could write
    return Run("quick", returncode, timed_out, 90.0, 12.3, report, why)


def test_a_finished_run_with_a_passed_check_is_ok() -> None:
    verdict = judge(run(report_with(HEALTHY)))
    assert (verdict.state, verdict.passed, verdict.skipped, verdict.failures) == (OK, 1, 1, ())
    assert verdict.drain_reason() is None and verdict.findings() == []


def test_failed_checks_are_grouped_by_fault_category_in_the_reason() -> None:
    tests = [
        *HEALTHY,
        record("s/test_health.py::test_gpu_count", "failed", fault=FAULT),
        record("s/test_topology.py::test_ib_ports[mlx5_0]", "failed", fault=LINK),
        record("s/test_topology.py::test_ib_ports[mlx5_1]", "failed", fault=LINK),
        record("s/test_topology.py::test_ib_ports[mlx5_1]", "failed", "teardown", fault=LINK),  # counted once
        record("s/test_bw.py::test_copy", "failed", "setup"),  # no fault: the fault table's default
    ]
    verdict = judge(run(report_with(tests, exit_status=1), returncode=1))
    assert verdict.state == FAIL and verdict.passed == 0  # test_gpu_count's pass does not hide its failure
    assert verdict.findings() == [
        "gpu_hardware: test_gpu_count",
        "link: test_ib_ports[mlx5_0],test_ib_ports[mlx5_1]",
        "unclassified: test_copy",
    ]
    assert len("gbvalidate: [hardware] " + "; ".join(verdict.findings())) > drain.REASON_MAX_CHARS
    assert verdict.drain_reason() == (
        "gbvalidate: [hardware] gpu_hardware: test_gpu_count; link: test_ib_ports[mlx5_0],test_ib_ports[mlx5_1]; "
        "+1 more"
    )
    assert verdict.actions() == [f"gpu_hardware: {FAULT['action']}", "link: check the cable or port"]
    assert verdict.detail == ""


@pytest.mark.parametrize(
    ("classes", "leader"),
    [
        (["job_leftovers"], "gbvalidate: [job_leftovers] "),
        (["job_leftovers", "configuration"], "gbvalidate: [configuration] "),
        (["configuration", "hardware", "job_leftovers"], "gbvalidate: [hardware] "),
        ([None], "gbvalidate: [hardware] "),  # a report from before classes: the node's hardware
    ],
)
def test_a_drain_reason_starts_with_the_most_pressing_class_of_its_failures(
    classes: list[str | None], leader: str
) -> None:
    """A reason that starts with [job_leftovers] has nothing else in it: the health check resumes such a node."""
    tests = [
        record(
            f"s/t.py::test_{i}",
            "failed",
            fault=FAULT | ({} if cls is None else {"reason_class": cls, "category": cls}),
        )
        for i, cls in enumerate(classes)
    ]
    verdict = judge(run(report_with(tests, exit_status=1), returncode=1))
    reason = verdict.drain_reason()
    assert reason is not None and reason.startswith(leader), reason


def test_a_failure_stands_when_the_run_then_timed_out_or_stopped() -> None:
    failed = [record("s/test_health.py::test_gpu_count", "failed", fault=FAULT)]
    killed = judge(run(report_with(failed, status="interrupted", exit_status=2), returncode=-15, timed_out=True))
    assert killed.state == FAIL and killed.detail == "then killed at the 90 s deadline"
    stopped = judge(run(report_with(failed, status="interrupted", exit_status=2), returncode=2))
    assert stopped.state == FAIL and stopped.detail == "the report says the run is interrupted (pytest exit status 2)"


def test_a_run_past_its_deadline_without_a_failure_is_a_timeout() -> None:
    for report in (None, report_with(HEALTHY, status="interrupted", exit_status=2)):
        verdict = judge(run(report, returncode=-15, timed_out=True, why="no report"))
        assert verdict.state == TIMEOUT
        assert verdict.findings() == ["timeout: the quick checks did not finish within 90 s"]
        timeout = "gbvalidate: [hardware] timeout: the quick checks did not finish within 90 s"
        assert verdict.drain_reason() == timeout


@pytest.mark.parametrize(
    ("report", "returncode", "detail"),
    [
        (None, 4, "pytest wrote no report (exit status 4, usage error): error: unrecognized arguments"),
        (report_with(HEALTHY, status="interrupted", exit_status=2), 2, "the report says the run is interrupted"),
        (report_with(HEALTHY, status="running", exit_status=None), -9, "pytest was killed by signal 9"),
        (report_with(HEALTHY, exit_status=3), 3, "pytest exit status 3 (internal error) without a failed check"),
        (report_with(HEALTHY), 1, "pytest exit status 1 (tests failed) without a failed check"),
        (report_with([], exit_status=5), 5, "pytest exit status 5 (no tests collected) without a failed check"),
        (report_with(HEALTHY[1:], measurements=[]), 0, "no check passed (1 skipped): nothing shows the node healthy"),
        (report_with(HEALTHY, status="running", exit_status=None), 1, "pytest ended (exit status 1, tests failed)"),
    ],
)
def test_no_verdict_is_unknown_and_says_why(report: Any, returncode: int, detail: str) -> None:
    why = "pytest wrote no report (exit status 4, usage error): error: unrecognized arguments"
    if report is not None and report["status"] == "running" and returncode >= 0:  # level_run's line: a full disk
        why = "pytest ended (exit status 1, tests failed) with its report left running: JSON report NOT written: ..."
    verdict = judge(run(report, returncode=returncode, why=why if report is None or "ended" in why else None))
    assert verdict.state == UNKNOWN and verdict.detail.startswith(detail), verdict.detail
    assert verdict.drain_reason() is None


def test_every_exit_status_of_pytest_has_its_meaning() -> None:
    assert exit_meaning(1) == "exit status 1, tests failed" and exit_meaning(-9) == "killed by signal 9"
    assert exit_meaning(77) == "exit status 77, unknown"
    # Said of a run that left no report (`-- --version` exits 0): nothing says any test ran, let alone passed.
    assert exit_meaning(0) == "exit status 0"


def test_a_problem_already_escaped_is_not_escaped_again() -> None:
    """The node's name `nöde1`, escaped once where it was put in the message, reaches the line as `n\\xf6de1`."""
    verdict = judge(run(None, returncode=4, why="--node 'n\\xf6de1' \x1b"))
    assert verdict.detail == "--node 'n\\xf6de1' \\x1b"
    assert escaped("n\u00f6de1\n") == "n\\xf6de1\\n" and escaped("a\\b") == "a\\b"


def test_what_a_report_says_reaches_a_line_printable_and_bounded() -> None:
    hostile = "s/t.py::test_x[\n\x1b[2J]"
    verdict = judge(run(report_with([record(hostile, "failed", fault=FAULT | {"category": "a\nb"})])))
    (finding,) = verdict.findings()
    assert finding == "a\\nb: test_x[ \\x1b[2J]" and finding.isprintable()
    long = judge(run(None, returncode=4, why="x" * 1000))
    assert len(long.detail) == 300 and long.detail.endswith("...")


def test_a_node_whose_gpus_cannot_be_used_is_named_by_the_cause_first() -> None:
    """The one root failure of a node whose driver did not load, its dependents not run: the Slurm and NPD lines
    give the cause itself, not only its category and the check's name."""
    from pytest_gbvalidate.healthcheck import npd, slurm
    from pytest_gbvalidate.node.preconditions import PRECONDITIONS_TEST_ID

    cause = "the node's GPUs cannot be used: NVML does not load: Driver Not Loaded"
    reboot = FAULT | {"category": "reboot", "action": "reboot the node", "disposition": "REBOOT"}
    root = record(PRECONDITIONS_TEST_ID, "failed", fault=reboot) | {"message": cause}
    skipped = record("s/test_health.py::test_gpu_count", "skipped", "setup")
    verdict = judge(run(report_with([root, skipped], exit_status=1), returncode=1))
    assert (verdict.state, verdict.cause, verdict.findings()) == (FAIL, cause, ["reboot: node_gpus_usable"])
    assert slurm.line(verdict).startswith(f"ERROR:  gbvalidate:  Health check failed:  reboot (1 check); {cause}; ")
    shown = npd.line(verdict, 80)
    assert len(shown) <= 80 and shown.startswith("reboot (1 check); the node's GPUs cannot be used: NVML does not load")
    assert judge(run(report_with(HEALTHY))).cause == ""
