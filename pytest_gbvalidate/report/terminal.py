"""The end-of-run terminal summary, verdict last: what a person reads at the end of a run. The HTML page
(html_fragments.py) shows the same rows, made by the functions here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pytest_gbvalidate.levels import LEVELS
from pytest_gbvalidate.report.collective_tables import number, sweep_records, sweep_tables
from pytest_gbvalidate.report.records import MeasurementCompareRecord, MeasurementRecord, RunReportRecord, TestRecord
from pytest_gbvalidate.rules.resolution import worse_pct

Section = tuple[str, list[str]]  # a section's title, and its lines
SKIPPED_PREFIX = "Skipped: "  # pytest's words before a skip's reason


@dataclass(frozen=True)
class SummaryInput:
    """What the summary shows besides the report: the session knows these, the report does not hold them."""

    verbose: bool  # -v: the per-size tables too
    json_report: str | None  # its path, where the JSON report was written
    notes: list[str]  # what else to tell: an output not written, the recorded baseline


def measured_rows(records: Sequence[MeasurementRecord]) -> list[tuple[str, ...]]:
    """Measured vs baseline: a header, then a row per measurement (as text), for the terminal and the HTML page."""
    header: tuple[str, ...] = ("test", "metric", "scope", "measured", "expected", "limit", "unit", "delta")
    header += ("resolution", "verdict")
    compared = any("compare" in r for r in records)
    if compared:
        header += ("vs earlier",)
    rows = [header]
    for r in records:
        delta = "" if r.get("delta_pct") is None else f"{r['delta_pct']:+.1f}%"
        shown = (number(r["value"]), number(r.get("expected")), number(r.get("limit")), r["unit"], delta)
        row = (r["test_id"].rsplit("::", 1)[-1], r["metric"], r["scope"], *shown, _resolution(r), _verdict(r))
        rows.append(row + ((_versus_earlier(r.get("compare")),) if compared else ()))
    return rows


def terminal_table(records: Sequence[MeasurementRecord]) -> list[str]:
    """Measured vs baseline, one row per measurement, columns sized to their content."""
    rows = measured_rows(records)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def gated(records: Sequence[MeasurementRecord]) -> list[MeasurementRecord]:
    """The measurements a baseline gates (not `info`): the ones the verdict rests on."""
    from pytest_gbvalidate.report.records import INFO

    return [m for m in records if m["verdict"] != INFO]


def detail_sections(report: RunReportRecord, verbose: bool) -> list[Section]:
    """What comes before pytest's short test summary: the collectives' per-size tables, with -v."""
    tables = sweep_tables(report["measurements"]) if verbose else []
    return [("gbvalidate: collectives, per message size (nccl-tests columns)", tables)] if tables else []


def verdict_sections(sku: str, report: RunReportRecord, given: SummaryInput) -> list[Section]:
    """After pytest's short test summary: the run, measured vs baseline, failures by fault category, the verdict."""
    run = [*level_lines(report), *skipped_lines(report["tests"])]
    run += [] if given.json_report is None else [f"JSON report: {given.json_report}"]
    run += [f"busbw plot: {plot['path']}" for plot in report.get("plots", [])]
    run += given.notes
    gang = report.get("gang")
    failed_starts = [] if gang is None else gang["failed_starts"]
    if failed_starts:
        run.append(f"the ranks' start-up failed {len(failed_starts)} time(s) and was tried again:")
        run += [f"  {reason}" for reason in failed_starts]
    sections = [(f"gbvalidate: {sku} run", run)] if run else []
    measurements = report["measurements"]
    shown = gated(measurements)
    table = terminal_table(shown) if shown else ["no measurements a baseline gates"]
    table += mfu_peak_lines(shown)
    table += why_lines(measurements)
    hidden = _hidden_line(report, len(measurements) - len(shown), given)
    sections.append((f"gbvalidate: {sku} measured vs baseline", table + ([hidden] if hidden else [])))
    faults = fault_lines(report["tests"])
    if faults:
        sections.append(("gbvalidate: failures by fault category, with the operator's action", faults))
    sections.append(("gbvalidate: node verdict", [verdict_line(report)]))
    return sections


def verdict_line(report: RunReportRecord) -> str:
    """What the run says about its node (node_verdict.py's rule, the fleet's and the health check's), in one line."""
    from pytest_gbvalidate.report import node_verdict

    judged = node_verdict.judge(report)
    verdict, unresolved = judged.verdict, len(judged.unresolved)
    said = {
        "pass": "the node passed every check it ran",
        "fail": f"{len(judged.faults)} check(s) failed on the node",
        "unresolved": f"this run could not tell: {unresolved} check(s) too noisy to judge and none failed; not a fault "
        "of the node: run again on an idle node",
        "partial": f"the run was {report['status']}: what it showed is not the node's whole story",
        "no verdict": "no verdict: the run checked nothing, or its own failure (the lines above say which)",
    }[verdict]
    also = f"; and {unresolved} too noisy to judge" if verdict == "fail" and unresolved else ""
    stopped = f"; the run was {report['status']}" if verdict == "fail" and report["status"] != "finished" else ""
    return f"{verdict.upper()}: {said}{also}{stopped}"


def why_lines(records: Sequence[MeasurementRecord]) -> list[str]:
    """Under the table, each verdict a row cannot explain in its cells, with its message: a WARN, an UNRESOLVED
    figure, a PASS past its warn limit, and against the earlier report what was not plainly OK or REGRESSED."""
    lines = []
    for m in records:
        past_warn = m["verdict"] == "pass" and _past(m, m.get("warn_limit"))
        if m["verdict"] in ("warn", "unresolved") or past_warn:
            lines.append(f"{m['verdict'].upper()} {m['test_id']}: {m['message']}")
        compared = m.get("compare")
        if compared is not None and compared["verdict"] in ("within_noise", "unresolved"):
            lines.append(f"{compared['verdict'].upper()} vs earlier {m['test_id']}: {compared['message']}")
    return lines


def _past(record: MeasurementRecord, limit: float | None) -> bool:
    value = record["value"]
    if limit is None or not isinstance(value, (int, float)):
        return False
    return worse_pct(float(value), limit, record["direction"]) > 0


def _resolution(record: MeasurementRecord) -> str:
    """`4.1% of 6%`: what the figure's evidence can tell, of what its metric needs; blank where not judged."""
    r = record.get("resolution")
    return "" if r is None else f"{r['pct']:.1f}% of {r['needed_pct']:g}%"


def mfu_peak_lines(records: Sequence[MeasurementRecord]) -> list[str]:
    """Under the table, what each MFU in it divides by: public peaks differ, so an MFU says against what."""
    lines = []
    for r in records:
        peak, source = r["details"].get("peak_tflops_per_gpu"), r["details"].get("peak_tflops_source")
        if r["metric"].endswith("_mfu_pct") and isinstance(peak, (int, float)) and isinstance(source, str):
            lines.append(f"MFU ({r['metric']} [{r['scope']}]) against {peak:g} TFLOPS per GPU ({source})")
    return list(dict.fromkeys(lines))


def _hidden_line(report: RunReportRecord, ungated: int, given: SummaryInput) -> str | None:
    """One line saying where the measurements no baseline gates are, when some are not on the screen."""
    swept = sweep_records(report["measurements"])
    sweeps = len(swept) - len(gated(swept))  # the sizes no baseline gates: in the per-size tables only
    hidden = ungated - (sweeps if given.verbose else 0)
    if hidden <= 0:
        return None
    where = [] if given.verbose or not sweeps else ["-v shows the collectives' per-size tables"]
    where += [] if given.json_report is None else ["all are in the JSON report"]
    what = f"{hidden} measurement{'' if hidden == 1 else 's'} no baseline gates"
    return f"(not shown: {what}{'; ' if where else ''}{'; '.join(where)})"


def level_lines(report: RunReportRecord) -> list[str]:
    """`level standard: quick 4.1 s, standard 38.2 s (42.3 s of its 600 s budget)`: the run's level and what its
    checks of each level took (the report's `level_times`: every phase, set-up included). None without a level."""
    level = report.get("level")
    if level is None:
        return []
    times = report.get("level_times", {})
    parts = ", ".join(f"{name} {times[name]['duration_s']:.1f} s" for name in LEVELS if name in times)
    line = f"level {level}: {parts or 'no checks ran'}"
    budget_s = report.get("level_budget_s")
    if budget_s is None:
        return [line]
    total_s = sum(t["duration_s"] for t in times.values())
    return [f"{line} ({total_s:.1f} s {'of' if total_s <= budget_s else 'over'} its {budget_s:g} s budget)"]


def skipped_lines(tests: Sequence[TestRecord]) -> list[str]:
    """The skipped checks grouped by reason, the most common first: `skipped: 23 checks: needs NVIDIA GPUs; ...`."""
    by_reason: dict[str, int] = {}
    for test in tests:
        if test["outcome"] == "skipped":
            reason = (test["message"] or "no reason given").removeprefix(SKIPPED_PREFIX)
            by_reason[reason] = by_reason.get(reason, 0) + 1
    ordered = sorted(by_reason.items(), key=lambda item: -item[1])  # stable: ties keep the run's order
    return [f"skipped: {count} check{'' if count == 1 else 's'}: {reason}" for reason, count in ordered]


def faults_by_category(tests: Sequence[TestRecord]) -> dict[str, list[TestRecord]]:
    """The failed tests by fault category, in the order the run met the categories."""
    by_category: dict[str, list[TestRecord]] = {}
    for test in tests:
        if "fault" in test:
            by_category.setdefault(test["fault"]["category"], []).append(test)
    return by_category


def fault_lines(tests: Sequence[TestRecord]) -> list[str]:
    """The failed tests grouped by fault category: the category's disposition and action, then its tests."""
    lines = []
    for category, failed in faults_by_category(tests).items():
        fault = failed[0]["fault"]
        repair = f" (repair: {fault['repair']})" if "repair" in fault else ""
        lines.append(f"{category} ({fault['disposition']}): {fault['action']}{repair}")
        lines += [f"  {t['test_id']}: {t['message']}" for t in failed]
    return lines


def _verdict(record: MeasurementRecord) -> str:
    """The row's verdict: its baseline's, or REGRESSED where it passed that but failed against the earlier report."""
    compared = record.get("compare")
    if compared is not None and compared["verdict"] == "regressed" and record["verdict"] in ("pass", "warn"):
        return f"REGRESSED ({record['verdict'].upper()} vs baseline)"
    return record["verdict"].upper()


def _versus_earlier(section: MeasurementCompareRecord | None) -> str:
    if section is None:
        return "-"
    if not isinstance(section.get("delta_pct"), (int, float)):
        return str(section["verdict"]).upper()
    return f"{section['delta_pct']:+.1f}% {str(section['verdict']).upper()}"
