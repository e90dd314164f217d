"""The end-of-run terminal summary: measured against baseline, the sweeps' tables, and the failures by fault
category with the operator's action."""

from __future__ import annotations

from pytest_gbvalidate.report.records import MeasurementCompareRecord, MeasurementRecord, RunReportRecord, TestRecord
from pytest_gbvalidate.report.sweeps import number, sweep_tables


def terminal_table(records: list[MeasurementRecord]) -> list[str]:
    """Measured vs baseline, one row per measurement, columns sized to their content."""
    header: tuple[str, ...] = ("test", "metric", "scope", "measured", "expected", "limit", "unit", "delta", "verdict")
    compared = any("compare" in r for r in records)
    if compared:
        header += ("vs earlier",)
    rows = [header]
    for r in records:
        row = (
            r["test_id"].rsplit("::", 1)[-1],
            r["metric"],
            r["scope"],
            number(r["value"]),
            number(r.get("expected")),
            number(r.get("limit")),
            r["unit"],
            "" if r.get("delta_pct") is None else f"{r['delta_pct']:+.1f}%",
            r["verdict"].upper(),
        )
        rows.append(row + ((_versus_earlier(r.get("compare")),) if compared else ()))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(header))]
    return ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def terminal_summary(sku: str, report: RunReportRecord, notes: list[str]) -> list[tuple[str, list[str]]]:
    """The end-of-run summary as (section title, lines): measured vs baseline, the sweeps' tables, then the
    plots, `notes` (where the reports and the recorded baseline went) and failed start-ups of the ranks."""
    from pytest_gbvalidate.baselines.verdicts import INFO

    measurements = report["measurements"]
    gated = [m for m in measurements if m["verdict"] != INFO]
    lines = terminal_table(gated) if gated else ["no measurements"]
    if len(gated) < len(measurements):
        ungated = len(measurements) - len(gated)
        lines.append(f"(and {ungated} measurements no baseline gates: in the tables below and the JSON report)")
    sections = [(f"gbvalidate: {sku} measured vs baseline", lines)]
    tables = sweep_tables(measurements)
    if tables:
        sections.append(("gbvalidate: collectives, per message size (nccl-tests columns)", tables))
    last = sections[-1][1]
    last += [f"busbw plot: {plot['path']}" for plot in report.get("plots", [])]
    last += notes
    gang = report.get("gang")
    failed_starts = [] if gang is None else gang["failed_starts"]
    if failed_starts:
        last.append(f"the ranks' start-up failed {len(failed_starts)} time(s) and was tried again:")
        last += [f"  {reason}" for reason in failed_starts]
    faults = fault_lines(report["tests"])
    if faults:
        sections.append(("gbvalidate: failures by fault category, with the operator's action", faults))
    return sections


def fault_lines(tests: list[TestRecord]) -> list[str]:
    """The failed tests grouped by fault category: the category's disposition and action, then its tests."""
    by_category: dict[str, list[TestRecord]] = {}
    for test in tests:
        if "fault" in test:
            by_category.setdefault(test["fault"]["category"], []).append(test)
    lines = []
    for category, failed in by_category.items():
        fault = failed[0]["fault"]
        lines.append(f"{category} ({fault['disposition']}): {fault['action']}")
        lines += [f"  {t['test_id']}: {t['message']}" for t in failed]
    return lines


def _versus_earlier(section: MeasurementCompareRecord | None) -> str:
    if section is None:
        return "-"
    if not isinstance(section.get("delta_pct"), (int, float)):
        return str(section["verdict"]).upper()
    return f"{section['delta_pct']:+.1f}% {str(section['verdict']).upper()}"
