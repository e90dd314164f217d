"""One judgement of a report (report/node_verdict.py) and one drain table (fleet/drain.py): the fleet summary and
the health check read any report alike -- the same verdict, the same drain or none, the same reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_gbvalidate.fleet import drain
from pytest_gbvalidate.fleet.summary import summarize
from pytest_gbvalidate.healthcheck import verdict as hc
from pytest_gbvalidate.report import node_verdict
from tests.helpers.fleet_reports import write
from tests.helpers.healthcheck import FAULT, record, report_with

CATEGORIES = (None, "gpu_hardware", "xid", node_verdict.UNRESOLVED_CATEGORY)
TESTS = ("t.py::test_a", "t.py::test_b", "t.py::test_c")


@st.composite
def reports(draw: st.DrawFn) -> Any:
    """A report as a run writes one: some test records (any phase, outcome and fault), then a status and an exit
    status that agree with them."""
    records = []
    for _ in range(draw(st.integers(0, 5))):
        test_id, when = draw(st.sampled_from(TESTS)), draw(st.sampled_from(["call", "setup", "teardown"]))
        outcome = draw(st.sampled_from(["passed", "failed", "skipped"]))
        category = draw(st.sampled_from(CATEGORIES)) if outcome == "failed" else None
        records.append(record(test_id, outcome, when, None if category is None else FAULT | {"category": category}))
    status = draw(st.sampled_from(["finished", "interrupted", "running"]))
    failed = [r for r in records if r["outcome"] == "failed"]
    if status == "running":
        exit_status = None
    elif status == "interrupted":
        exit_status = 2
    elif failed:
        unresolved = all(r.get("fault", {}).get("category") == node_verdict.UNRESOLVED_CATEGORY for r in failed)
        exit_status = node_verdict.EXIT_UNRESOLVED if unresolved else 1
    else:
        exit_status = draw(st.sampled_from([0, 3, 4, 5]))
    ended = {"end_time": None} if status == "running" else {}
    return report_with([record("t.py::test_x", "passed"), *records], status=status, exit_status=exit_status, **ended)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(report=reports())
def test_the_fleet_and_the_health_check_read_a_report_alike(report: Any, tmp_path: Path) -> None:
    summary = summarize([write(tmp_path, "node.json", report)])
    assert summary.not_merged == []  # a report as a run writes one
    node = summary.nodes[0]
    returncode = -9 if report["exit_status"] is None else report["exit_status"]  # `running`: pytest was killed
    judged = hc.judge(hc.Run("standard", returncode, False, 60.0, 1.0, report))
    word = {"pass": hc.OK, "fail": hc.FAIL}.get(node.verdict, hc.UNKNOWN)
    assert judged.state == word, (node.verdict, judged.detail)
    assert node.verdict == node_verdict.of_report(report)
    # the same drain, for the same reason (a node alone: no outlier, peer or domain of the fleet's own)
    assert (judged.drain_reason() or "") == node.drain_reason()
    assert node.drain == (node.verdict == "fail")


def test_a_failed_check_stands_however_the_run_ended_and_a_stop_alone_drains_nothing() -> None:
    """The decision: an interrupted run drains only for a check that failed before the stop."""
    failed = record("t.py::test_gpu_count", "failed", fault=FAULT)
    stopped_after = node_verdict.judge(report_with([failed], status="interrupted", exit_status=2))
    assert stopped_after.verdict == "fail" and [c.name for c in stopped_after.faults] == ["test_gpu_count"]
    stopped = node_verdict.judge(report_with([record("t.py::test_x", "passed")], status="interrupted", exit_status=2))
    assert stopped.verdict == "partial" and stopped.faults == ()
    killed = node_verdict.judge(report_with([failed], status="running", exit_status=None, end_time=None))
    assert killed.verdict == "fail"
    noisy = record("t.py::test_copy", "failed", fault=FAULT | {"category": node_verdict.UNRESOLVED_CATEGORY})
    both = node_verdict.judge(report_with([noisy, failed], exit_status=1))
    assert both.verdict == "fail" and [c.name for c in both.unresolved] == ["test_copy"]
    assert [c.name for c in both.faults] == ["test_gpu_count"]


def test_the_drain_table_orders_the_parts_and_names_the_first_cause_s_category() -> None:
    causes = [
        drain.Cause("coverage", "ran less than its peers: test_a", "coverage"),
        drain.Cause("outlier", "outlier copy[node] -50%", "outlier"),
        *drain.failed(
            [
                node_verdict.FailedCheck("t::test_b", "m", "link", "a", "ISOLATE", "configuration", "rma"),
                node_verdict.FailedCheck("t::test_c", "m", None, None, None, "job_leftovers"),
            ]
        ),
    ]
    assert drain.category(causes) == "link" and drain.category([]) is None and drain.reason([]) is None
    assert drain.reason(causes) == (  # the parts in the table's order, as many as fit
        "gbvalidate: [hardware] link (rma): test_b; unclassified: test_c; outlier copy[node] -50%; +1 more"
    )
    # the most pressing class of the causes: an outlier is the hardware's, the failed checks' own classes here
    assert drain.reason(causes[2:]) == "gbvalidate: [configuration] link (rma): test_b; unclassified: test_c"
    quoted = [drain.Cause("failed", "x: \"a'b`\\c", "x")]  # scontrol strips a quote at either end
    assert drain.reason(quoted) == "gbvalidate: [hardware] x: abc"
    long = [drain.Cause("outlier", f"outlier metric{i}[node] -50%", "outlier") for i in range(9)]
    reason = drain.reason(long)
    assert reason is not None and len(reason) <= drain.REASON_MAX_CHARS and reason.endswith("more")
