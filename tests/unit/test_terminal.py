"""The end-of-run terminal summary (report/terminal.py): the verdict last, the per-size tables behind -v, skips
grouped by reason, the level times, and a line about hidden measurements only when some are hidden."""

from __future__ import annotations

from typing import Any

from pytest_gbvalidate.report import terminal
from pytest_gbvalidate.report.records import RunReportRecord
from tests.helpers.reports import minimal_report

FAULT = {
    "category": "gpu_hardware",
    "title": "GPU hardware",
    "action": "replace the GPU",
    "disposition": "ISOLATE",
    "why": "rule",
}


def phase(name: str, outcome: str, duration_s: float, **more: Any) -> dict[str, Any]:
    message = more.pop("message", None)
    return {"test_id": f"t.py::{name}", "when": "call", "outcome": outcome, "duration_s": duration_s} | {
        "message": message,
        "text": message,
        **more,
    }


def sweep(scope: str, size_bytes: int, verdict: str = "info") -> dict[str, Any]:
    details = {"placement": "in_place", "size_bytes": size_bytes, "count": size_bytes // 4, "dtype": "float"}
    details |= {"time_us": 10.0, "algbw_gbps": 1.0, "wrong": 0}
    return {
        "test_id": "t.py::test_sweep",
        "metric": "all_reduce_busbw_gbps",
        "scope": scope,
        "scope_kind": "message_size",
        "value": 1.0,
        "unit": "GB/s",
        "direction": "higher",
        "details": details,
        "verdict": verdict,
        "message": "",
    }


def run_report(**fields: Any) -> RunReportRecord:
    report: Any = minimal_report() | fields
    return report  # type: ignore[no-any-return]


def given(verbose: bool = False, json_report: str | None = None, notes: list[str] | None = None) -> Any:
    return terminal.SummaryInput(verbose=verbose, json_report=json_report, notes=notes or [])


def test_skipped_checks_are_counted_by_reason_the_most_common_first() -> None:
    tests: Any = [
        phase("a", "skipped", 0, message="Skipped: pairs of nodes need a world"),
        phase("b", "skipped", 0, message="Skipped: needs NVIDIA GPUs; this run checks the cpu SKU"),
        phase("c", "passed", 1),
        phase("d", "skipped", 0, message="Skipped: needs NVIDIA GPUs; this run checks the cpu SKU"),
        phase("e", "skipped", 0, message=None),
    ]
    assert terminal.skipped_lines(tests) == [
        "skipped: 2 checks: needs NVIDIA GPUs; this run checks the cpu SKU",
        "skipped: 1 check: pairs of nodes need a world",
        "skipped: 1 check: no reason given",
    ]


def test_the_level_line_gives_each_levels_time_against_the_runs_budget() -> None:
    times = {"standard": {"tests": 9, "duration_s": 38.21}, "quick": {"tests": 3, "duration_s": 4.06}}
    report = run_report(level="standard", level_budget_s=600.0, level_times=times)
    assert terminal.level_lines(report) == ["level standard: quick 4.1 s, standard 38.2 s (42.3 s of its 600 s budget)"]
    over = run_report(level="quick", level_budget_s=60.0, level_times={"quick": {"tests": 1, "duration_s": 61.0}})
    assert terminal.level_lines(over) == ["level quick: quick 61.0 s (61.0 s over its 60 s budget)"]
    assert terminal.level_lines(run_report(level="full")) == ["level full: no checks ran"]
    assert terminal.level_lines(run_report(level_times=times)) == []  # a report without a level


def test_the_verdict_comes_last_the_run_first() -> None:
    tests = [
        phase("test_x", "passed", 0.5),
        phase("test_bad", "failed", 0.1, message="gpu3: <lost>", fault=FAULT),
        phase("test_gpu", "skipped", 0.0, message="Skipped: needs NVIDIA GPUs"),
    ]
    report = run_report(
        tests=tests,
        gang={
            "kind": "local",
            "world_size": 2,
            "device_type": "cpu",
            "nodes": 1,
            "hosts": [],
            "failed_starts": ["rank 1 died: port in use"],
        },
    )
    report["plots"] = [{"metric": "busbw_gbps", "path": "r.busbw.png"}]
    sections = terminal.verdict_sections(
        "cpu", report, given(json_report="r.json", notes=["recorded baseline: b.yaml"])
    )
    assert [title for title, _ in sections] == [
        "gbvalidate: cpu run",
        "gbvalidate: cpu measured vs baseline",
        "gbvalidate: failures by fault category, with the operator's action",
        "gbvalidate: node verdict",
    ]
    assert sections[0][1] == [
        "skipped: 1 check: needs NVIDIA GPUs",
        "JSON report: r.json",
        "busbw plot: r.busbw.png",
        "recorded baseline: b.yaml",
        "the ranks' start-up failed 1 time(s) and was tried again:",
        "  rank 1 died: port in use",
    ]
    table = sections[1][1]
    assert table[0].split() == [
        "test",
        "metric",
        "scope",
        "measured",
        "expected",
        "limit",
        "unit",
        "delta",
        "resolution",
        "verdict",
    ]
    assert table[1].split() == ["test_x", "host_copy_bandwidth_gbps", "node", "12.5", "10", "-", "GB/s", "PASS"]
    assert len(table) == 2  # every measurement is gated: no line about hidden ones
    assert sections[2][1] == ["gpu_hardware (ISOLATE): replace the GPU", "  t.py::test_bad: gpu3: <lost>"]


def test_a_quiet_run_says_nothing_of_outputs_it_did_not_write() -> None:
    sections = terminal.verdict_sections("cpu", run_report(), given())
    assert [title for title, _ in sections] == ["gbvalidate: cpu measured vs baseline", "gbvalidate: node verdict"]
    assert not any("JSON" in line or "plot" in line for _, lines in sections for line in lines)


def test_the_per_size_tables_show_with_verbose_else_one_line_says_where() -> None:
    report = run_report()
    report["measurements"] += [sweep("1KiB", 1024), sweep("1MiB", 2**20, "pass")]  # type: ignore[list-item]
    assert terminal.detail_sections(report, verbose=False) == []
    ((title, tables),) = terminal.detail_sections(report, verbose=True)
    assert title == "gbvalidate: collectives, per message size (nccl-tests columns)"
    assert tables[0] == "all_reduce_busbw_gbps (pytest-gbvalidate; GB/s with GB = 1e9 bytes)"
    assert [line.split()[0] for line in tables[2:]] == ["1KiB", "1MiB"]

    quiet = terminal.verdict_sections("cpu", report, given(json_report="r.json"))[-2][1]
    assert quiet[-1] == (
        "(not shown: 1 measurement no baseline gates; -v shows the collectives' per-size tables; "
        "all are in the JSON report)"
    )
    assert "1KiB" not in "\n".join(quiet)
    no_report = terminal.verdict_sections("cpu", report, given())[-2][1]
    assert no_report[-1] == "(not shown: 1 measurement no baseline gates; -v shows the collectives' per-size tables)"
    verbose = terminal.verdict_sections("cpu", report, given(verbose=True))[-2][1]
    assert not verbose[-1].startswith("(")  # shown above: nothing hidden
    report["measurements"].append(report["measurements"][0] | {"verdict": "info"})  # in no table
    verbose = terminal.verdict_sections("cpu", report, given(verbose=True, json_report="r.json"))[-2][1]
    assert verbose[-1] == "(not shown: 1 measurement no baseline gates; all are in the JSON report)"


def test_no_measurements_says_so() -> None:
    report = run_report(measurements=[])
    assert terminal.verdict_sections("cpu", report, given())[-2] == (
        "gbvalidate: cpu measured vs baseline",
        ["no measurements a baseline gates"],
    )


def test_a_row_says_what_failed_its_test_the_baseline_or_the_earlier_report() -> None:
    compared = {"earlier_value": 12.0, "earlier_date": "then", "date": "now", "delta_pct": -30.0, "allowed_pct": 5.0}
    passed: Any = minimal_report()["measurements"][0]
    regressed = passed | {"compare": compared | {"verdict": "regressed", "message": "-> REGRESSED"}}
    within = passed | {"compare": compared | {"verdict": "within_noise", "message": "-> WITHIN_NOISE"}}
    ungated: Any = sweep("1MiB", 2**20) | {"compare": compared | {"verdict": "regressed", "message": "-> REGRESSED"}}
    rows = terminal.measured_rows([regressed, within, ungated])
    assert rows[0][-2:] == ("verdict", "vs earlier")
    assert rows[1][-2:] == ("REGRESSED (PASS vs baseline)", "-30.0% REGRESSED")  # what failed the test
    assert rows[2][-2:] == ("PASS", "-30.0% WITHIN_NOISE")
    assert rows[3][-2:] == ("INFO", "-30.0% REGRESSED")  # gated by nothing: reported, never failing


def test_an_mfu_in_the_table_says_what_it_divides_by() -> None:
    mfu: Any = minimal_report()["measurements"][0] | {"metric": "llama3_8b_mfu_pct", "scope": "l", "unit": "%"}
    mfu["details"] = {"peak_tflops_per_gpu": 2450.0, "peak_tflops_source": "dense bf16, dgxc-benchmarking"}
    assert terminal.mfu_peak_lines([mfu, minimal_report()["measurements"][0]]) == [
        "MFU (llama3_8b_mfu_pct [l]) against 2450 TFLOPS per GPU (dense bf16, dgxc-benchmarking)"
    ]


def test_the_last_line_says_what_the_run_says_of_its_node_a_fault_apart_from_a_run_that_could_not_tell() -> None:
    report: Any = minimal_report()
    assert terminal.verdict_line(report) == "PASS: the node passed every check it ran"
    noisy = {"category": "unresolved", "title": "t", "action": "a", "disposition": "MONITOR", "why": None}
    slow = noisy | {"category": "performance"}
    report["tests"] = [
        {
            **report["tests"][0],
            "test_id": "t.py::test_a",
            "outcome": "failed",
            "message": "UNRESOLVED: x",
            "fault": noisy,
        }
    ]
    report["exit_status"] = 1
    assert terminal.verdict_line(report).startswith("UNRESOLVED: this run could not tell: 1 check(s) too noisy")
    report["tests"].append({**report["tests"][0], "test_id": "t.py::test_b", "message": "slow", "fault": slow})
    assert terminal.verdict_line(report) == "FAIL: 1 check(s) failed on the node; and 1 too noisy to judge"
    report["status"] = "interrupted"  # a check that failed before the stop stands
    assert terminal.verdict_line(report) == (
        "FAIL: 1 check(s) failed on the node; and 1 too noisy to judge; the run was interrupted"
    )
    report["tests"] = report["tests"][:1]
    assert terminal.verdict_line(report).startswith("PARTIAL: the run was interrupted")
