"""Unit tests of fleet/history.py and its command line (`python -m pytest_gbvalidate.fleet history DIR/<hostname>`,
with history_plots.py for --plots): a node's trend over the reports --gb-history kept, and the reports that cannot
count, each named in one line. (Reports kept by real runs: e2e/test_history_runs.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from pytest_gbvalidate.fleet.cli import main as fleet_main
from pytest_gbvalidate.fleet.history import read_history, render, repeat_offenders, span
from pytest_gbvalidate.report import history
from pytest_gbvalidate.report.records import RunReportRecord
from tests.helpers.reports import minimal_report


def keep(directory: Path, start: str, value: Any, **changes: Any) -> Path:
    """A report of node7 starting at `start` whose host copy measured `value`, kept in `directory`."""
    report: Any = minimal_report() | changes
    report["start_time"] = start
    report["measurements"][0] |= {"value": value, "verdict": "pass" if value != 5.0 else "fail"}
    if value == 5.0:  # its test failed with it, and the run: a report that says both ways is believed in neither
        report["tests"][0] |= {"outcome": "failed", "message": "host copy: measured 5 GB/s -> FAIL"}
        report["exit_status"] = changes.get("exit_status", 1)
    return history.keep(directory, cast(RunReportRecord, report))


@pytest.fixture
def node7(tmp_path: Path) -> Path:
    """Three finished runs of node7, the host copy at 10, 12.5 and 5 GB/s, kept out of order (dates in the past: a
    report from the future is one the fleet's reader refuses)."""
    directory = tmp_path / "h" / "node7"
    keep(directory, "2026-11-22T12:00:00+00:00", 5.0)
    keep(directory, "2026-11-20T12:00:00+00:00", 10.0)
    keep(directory, "2026-11-21T12:00:00+00:00", 12.5)
    return directory


def test_a_measurement_s_trend_against_the_run_before_and_the_median(node7: Path) -> None:
    node = read_history(node7)
    assert node.exit_code == 0 and node.left_out == []
    (trend,) = node.trends
    assert trend.key.label == "host_copy_bandwidth_gbps [node]" and trend.median == 10.0
    assert [p.value for p in trend.points] == [10.0, 12.5, 5.0]  # in run order
    assert trend.deltas() == [(None, 0.0), (25.0, 25.0), (-60.0, -50.0)]
    lines = render(node)
    assert lines[0] == f"node node7: 3 finished run(s) in {node7}"
    assert "host_copy_bandwidth_gbps [node]  GB/s, higher is better; median 10 over 3 run(s)" in lines
    table = lines[lines.index("  time                       value  verdict  vs previous  vs median") :]
    assert table[1:4] == [
        "  2026-11-20T12:00:00+00:00  10     pass     -            +0.0%",
        "  2026-11-21T12:00:00+00:00  12.5   pass     +25.0%       +25.0%",
        "  2026-11-22T12:00:00+00:00  5      fail     -60.0%       -50.0%",
    ]


def test_a_bad_report_is_named_in_one_line_and_left_out(node7: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corrupt = node7 / "20261123T000000Z.json"
    corrupt.write_text("{not json")
    other = keep(node7, "2026-11-23T01:00:00+00:00", 99.0, node={"hostname": "node8"})
    partial = keep(node7, "2026-11-23T02:00:00+00:00", 98.0, status="interrupted")
    (node7 / "notes.txt").write_text("not a report: not the history's")

    node = read_history(node7)
    assert [(r.path, r.kind) for r in node.left_out] == [
        (corrupt, "corrupt"),
        (other, "another node's"),
        (partial, "partial"),
    ]
    assert [p.value for p in node.trends[0].points] == [10.0, 12.5, 5.0]  # none of theirs
    assert node.exit_code == 1  # the history is not whole

    assert fleet_main(["history", str(node7)]) == 1
    out = capsys.readouterr().out
    assert f"  {corrupt}: corrupt: not JSON: Expecting property name enclosed in double quotes" in out
    assert f"  {other}: another node's: the report of node 'node8', not of 'node7'" in out
    assert f"  {partial}: partial: status interrupted: left out" in out
    assert "Traceback" not in out


def test_a_run_of_another_sku_is_listed_and_left_out_of_the_trends(node7: Path) -> None:
    other = keep(
        node7, "2026-11-21T18:00:00+00:00", 99.0, sku={"name": "LAB", "source": "default", "baseline_file": None}
    )
    node = read_history(node7)
    assert [(r.path, r.kind) for r in node.left_out] == [(other, "another SKU's")]
    assert [p.value for p in node.trends[0].points] == [10.0, 12.5, 5.0]
    assert "checked the LAB SKU; the node's latest run checked" in node.left_out[0].reason
    assert node.exit_code == 0  # not a broken history: the node was checked as something else once


def test_a_partial_run_alone_does_not_fail_and_an_empty_history_does(tmp_path: Path) -> None:
    directory = tmp_path / "node7"
    keep(directory, "2026-11-24T12:00:00+00:00", 10.0)
    keep(directory, "2026-11-24T13:00:00+00:00", 11.0, status="interrupted")
    assert read_history(directory).exit_code == 0
    empty = tmp_path / "node9"
    empty.mkdir()
    node = read_history(empty)
    assert node.exit_code == 1 and render(node)[-1] == f"no finished report of node node9 in {empty}"


def test_plots_one_png_per_metric(node7: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plots"
    assert fleet_main(["history", str(node7), "--plots", str(out)]) == 0
    png = out / "host_copy_bandwidth_gbps.png"
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n") and [p.name for p in out.iterdir()] == [png.name]
    assert f"plot: {png}" in capsys.readouterr().out


def test_a_path_that_is_no_node_directory_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file").write_text("")
    for argv in (["history", str(tmp_path / "absent")], ["history", str(tmp_path), "--plots", str(tmp_path / "file")]):
        with pytest.raises(SystemExit) as info:
            fleet_main(argv)
        assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"error: {tmp_path / 'absent'}: not a directory (a node's, DIR/<hostname>, in --gb-history DIR)" in err
    assert f"error: --plots {tmp_path / 'file'}: not a directory" in err


def test_the_history_s_root_is_named_for_a_node_s_directory(node7: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        fleet_main(["history", str(node7.parent)])
    assert info.value.code == 2
    assert f"error: {node7.parent}: no reports here; name a node's directory: {node7}, ..." in capsys.readouterr().err


def failing(directory: Path, start: str, category: str, hostname: str) -> Path:
    """A finished run of `hostname` whose one check failed with a fault of `category`."""
    fault = {"category": category, "title": category, "action": "act", "disposition": "ISOLATE", "why": "w"}
    test = {"test_id": "t.py::test_x", "when": "call", "outcome": "failed", "duration_s": 0.5}
    test |= {"message": "boom", "text": "boom", "fault": fault}
    return keep(directory, start, 10.0, tests=[test], exit_status=1, node={"hostname": hostname})


def test_repeat_offenders_are_the_nodes_that_failed_in_k_of_their_last_n_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "h"
    for day, category in ((20, "link"), (21, None), (22, "link"), (23, "gpu_hardware")):  # 3 of its last 4
        start = f"2026-11-{day}T12:00:00+00:00"
        if category is None:
            keep(root / "node7", start, 10.0)
        else:
            failing(root / "node7", start, category, "node7")
    failing(root / "node8", "2026-11-10T12:00:00+00:00", "link", "node8")  # once, long ago
    for day in range(20, 26):
        keep(root / "node8", f"2026-11-{day}T12:00:00+00:00", 10.0, node={"hostname": "node8"})
    failing(root / "node9", "2026-11-24T12:00:00+00:00", "link", "node9")  # once: not a repeat

    found, nodes = repeat_offenders(root, failed=2, of=5)
    assert nodes == 3 and [o.describe() for o in found] == [
        "node7: failed 3 of its last 4 runs (the latest at 2026-11-23T12:00:00+00:00): link 2, gpu_hardware 1; "
        "time between incidents: 2.0 d, 1.0 d; "
        "a repeat offender (3 in 7 days): for a person, not to resume"
    ]
    assert [o.hostname for o in repeat_offenders(root, failed=1, of=5)[0]] == ["node9", "node7"]  # by rate

    assert fleet_main(["offenders", str(root)]) == 1
    assert capsys.readouterr().out.splitlines() == [
        f"1 of 3 node(s) in {root} failed in at least 2 of their last 5 runs",
        "  node7: failed 3 of its last 4 runs (the latest at 2026-11-23T12:00:00+00:00): link 2, gpu_hardware 1; "
        "time between incidents: 2.0 d, 1.0 d; "
        "a repeat offender (3 in 7 days): for a person, not to resume",
    ]
    assert fleet_main(["offenders", str(root), "--failed", "4"]) == 0
    with pytest.raises(SystemExit):
        fleet_main(["offenders", str(root), "--failed", "6", "--of", "5"])
    assert "--failed 6 is more than --of 5" in capsys.readouterr().err


def test_a_second_run_of_failed_checks_is_no_run_of_its_own_and_a_failure_that_passed_it_counts_as_flapping(
    tmp_path: Path,
) -> None:
    """The health check runs its failed checks once more (--gb-rerun-failed) and keeps both reports in the history:
    counted as runs, a confirmed failure counted twice and a flapping one as a pass beside its failure."""
    root = tmp_path / "h"
    passed = {"test_id": "t.py::test_x", "when": "call", "outcome": "passed", "duration_s": 0.5, "text": None}
    passed |= {"message": None}
    for day, second in ((20, "passed"), (21, "failed"), (22, "passed")):
        first = failing(root / "node7", f"2026-11-{day}T12:00:00+00:00", "link", "node7")
        again: dict[str, Any] = {"narrowed_by": [f"--gb-rerun-failed {first}"], "node": {"hostname": "node7"}}
        if second == "passed":
            keep(root / "node7", f"2026-11-{day}T12:01:00+00:00", 10.0, tests=[passed], **again)
        else:
            test = passed | {"outcome": "failed", "message": "boom", "text": "boom"}
            keep(root / "node7", f"2026-11-{day}T12:01:00+00:00", 10.0, tests=[test], exit_status=1, **again)
    keep(root / "node7", "2026-11-23T12:00:00+00:00", 10.0)

    found, _ = repeat_offenders(root, failed=2, of=5)
    assert [o.describe() for o in found] == [
        "node7: failed 3 of its last 4 runs (the latest at 2026-11-22T12:00:00+00:00): link 3, flapping 2; "
        "time between incidents: 1.0 d, 1.0 d; "
        "a repeat offender (3 in 7 days): for a person, not to resume"
    ]


def test_a_node_stopped_run_after_run_is_an_offender_and_a_run_perhaps_running_now_is_not_counted(
    tmp_path: Path,
) -> None:
    """A node whose runs hang until the job's limit stops them (kept as `interrupted`) was never named: only
    finished runs counted. A report still `running`, the node's latest, may be a run in progress."""
    root = tmp_path / "h"
    for day in (20, 21, 22):
        keep(root / "node7", f"2026-11-{day}T12:00:00+00:00", 10.0, status="interrupted", exit_status=2)
    keep(root / "node8", "2026-11-20T12:00:00+00:00", 10.0, node={"hostname": "node8"})
    keep(
        root / "node8",
        "2026-11-21T12:00:00+00:00",
        10.0,
        node={"hostname": "node8"},
        status="interrupted",
        exit_status=2,
    )
    keep(
        root / "node8",
        "2026-11-22T12:00:00+00:00",
        10.0,
        node={"hostname": "node8"},
        status="running",
        exit_status=None,
    )
    other_sku = minimal_report()["sku"] | {"name": "ND_H100_v5"}
    keep(root / "node8", "2026-11-19T12:00:00+00:00", 10.0, node={"hostname": "node8"}, sku=other_sku)
    for day in (16, 17, 18):  # stopped while it was checked as another SKU: not this SKU's offender
        changes = {"node": {"hostname": "node8"}, "sku": other_sku, "status": "interrupted", "exit_status": 2}
        keep(root / "node8", f"2026-11-{day}T12:00:00+00:00", 10.0, **changes)
    found, nodes = repeat_offenders(root, failed=2, of=5)
    assert nodes == 2 and [o.describe() for o in found] == [
        "node7: failed 3 of its last 3 runs, 3 of them stopped before the end (the latest at "
        "2026-11-22T12:00:00+00:00): stopped (interrupted) 3; time between incidents: 1.0 d, 1.0 d; "
        "a repeat offender (3 in 7 days): for a person, not to resume"
    ]
    assert [o.describe() for o in repeat_offenders(root, failed=1, of=5)[0]][1] == (
        "node8: failed 1 of its last 2 runs, 1 of them stopped before the end (the latest at "
        "2026-11-21T12:00:00+00:00): stopped (interrupted) 1"
    )


def test_a_node_unresolved_again_and_again_is_an_offender_named_so(tmp_path: Path) -> None:
    """Figures too noisy to judge run after run drain nothing, one run at a time; repeated, they are a symptom."""
    root = tmp_path / "h"
    for day in (20, 21, 22):
        failing(root / "node7", f"2026-11-{day}T12:00:00+00:00", "unresolved", "node7")
    (found,), _ = repeat_offenders(root, failed=2, of=5)
    assert (
        found.describe()
        == "node7: failed 3 of its last 3 runs (the latest at 2026-11-22T12:00:00+00:00): unresolved 3; "
        "time between incidents: 1.0 d, 1.0 d; "
        "a repeat offender (3 in 7 days): for a person, not to resume"
    )


def test_the_trends_show_the_gated_figures_in_numeric_order_the_run_s_verdicts_and_what_moved_most(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "h" / "node7"
    sizes = ["2MiB", "16B", "1GiB", "128KiB"]
    for day, factor in ((20, 1.0), (21, 1.0), (22, 0.5)):
        report: Any = minimal_report()
        report["start_time"] = f"2026-11-{day}T12:00:00+00:00"
        copy = report["measurements"][0]
        copy |= {"value": 10.0 * factor, "verdict": "pass"}
        if factor != 1.0:  # the latest run: passed its baseline, failed against the run before
            copy["compare"] = {"earlier_value": 10.0, "earlier_date": "then", "date": "now", "delta_pct": -50.0}
            copy["compare"] |= {"allowed_pct": 5.0, "verdict": "regressed", "message": "-> REGRESSED"}
        sweep = {"metric": "all_reduce_busbw_gbps", "scope_kind": "message_size", "unit": "GB/s"}
        sweep |= {"direction": "higher", "verdict": "info", "message": "", "test_id": "t.py::test_sweep"}
        report["measurements"] += [sweep | {"scope": s, "value": 1.0, "details": {"size_bytes": 1}} for s in sizes]
        history.keep(directory, cast(RunReportRecord, report))
    node = read_history(directory)
    (copy_trend,) = [t for t in node.trends if t.key.metric == "host_copy_bandwidth_gbps"]
    assert [p.verdict for p in copy_trend.points] == ["pass", "pass", "regressed"]  # as its runs had them
    swept = [t.key.scope for t in node.trends if t.key.metric == "all_reduce_busbw_gbps"]
    assert swept == ["16B", "128KiB", "2MiB", "1GiB"]  # by bytes, not as text
    lines = render(node)
    assert lines[1] == "moved most in the latest run, from their median: host_copy_bandwidth_gbps [node] -50.0%"
    assert lines[2] == "4 measurement(s) no baseline gates not shown (--all shows them)"
    assert not any(line.startswith("all_reduce_busbw_gbps [") for line in lines)
    assert sum(line.startswith("all_reduce_busbw_gbps [") for line in render(node, everything=True)) == 4
    assert "  2026-11-22T12:00:00+00:00  5      regressed  -50.0%       -50.0%" in lines


def test_a_time_between_incidents_reads_in_minutes_hours_or_days() -> None:
    assert [span(s) for s in (90.0, 3 * 3600.0, 3.5 * 86400)] == ["2 min", "3.0 h", "3.5 d"]
