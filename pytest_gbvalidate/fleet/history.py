"""One node over time, from the reports `--gb-history` kept (`fleet history`: cli.py's HISTORY_HELP says what it
prints), and the nodes of a history that fail again and again (`fleet offenders`). No pytest. Every report is read
as the fleet summary reads one (reports.read); a trend compares like with like (one SKU's runs), and a measurement
is the same one across runs, a run that measured it twice counting its later value, as --gb-compare has it.
"""

from __future__ import annotations

import datetime as dt
import itertools
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_gbvalidate.fleet import drain
from pytest_gbvalidate.fleet.findings import MetricKey, failed_checks, metric_key
from pytest_gbvalidate.fleet.markup import columns, num
from pytest_gbvalidate.fleet.reports import NotMerged, Report, natural_key, read
from pytest_gbvalidate.fleet.summary import FLAPPING
from pytest_gbvalidate.labels import parse_size_label, printable_exactly
from pytest_gbvalidate.report import history as kept
from pytest_gbvalidate.report.records import MeasurementRecord
from pytest_gbvalidate.rules.outliers import is_number

PARTIAL, OTHER_NODE, OTHER_SKU = "partial", "another node's", "another SKU's"


@dataclass(frozen=True)
class Point:
    """One run's measurement of a metric at a scope."""

    start: dt.datetime
    value: float | None  # None: no number (not run, or kept as "nan")
    shown: str  # the value as the report has it
    verdict: str
    expected: float | None


@dataclass
class Trend:
    """A measurement across the node's runs, oldest first."""

    key: MetricKey
    unit: str
    direction: str
    points: list[Point] = field(default_factory=list)

    @property
    def median(self) -> float | None:
        values = [p.value for p in self.points if p.value is not None]
        return statistics.median(values) if values else None

    def deltas(self) -> list[tuple[float | None, float | None]]:
        """For each point: its change from the run before that measured a number, and from the median, in percent
        (None where there is nothing to compare with, or that is 0)."""
        median, previous, found = self.median, None, []
        for point in self.points:
            found.append((_pct(point.value, previous), _pct(point.value, median)))
            previous = point.value if point.value is not None else previous
        return found


@dataclass(frozen=True)
class NodeHistory:
    directory: Path
    hostname: str  # the directory's name
    runs: list[Report]  # finished, oldest first
    left_out: list[NotMerged]  # corrupt, another node's, or partial: with why
    trends: list[Trend]
    stopped: list[Report] = field(default_factory=list)  # the partial ones (interrupted, or never finished)

    @property
    def exit_code(self) -> int:
        """1 where a report could not be read or is another node's, or there is none: the history is not whole."""
        bad = any(r.kind not in (PARTIAL, OTHER_SKU) for r in self.left_out)
        return 1 if bad or not self.runs else 0


def read_history(directory: Path) -> NodeHistory:
    """The node's reports in `directory`, read, checked and turned into trends (HistoryError: it cannot be listed)."""
    hostname = directory.name
    runs: list[Report] = []
    stopped: list[Report] = []
    left_out: list[NotMerged] = []
    for order, entry in enumerate(kept.entries(directory)):
        report = read(entry.path, order)
        if isinstance(report, NotMerged):
            left_out.append(report)
        elif report.hostname != printable_exactly(hostname):  # the report's texts are escaped as read
            reason = f"the report of node '{report.hostname}', not of '{printable_exactly(hostname)}'"
            left_out.append(NotMerged(entry.path, OTHER_NODE, reason, report.hostname))
        elif not report.finished:
            left_out.append(NotMerged(entry.path, PARTIAL, f"status {report.status}: left out", report.hostname))
            stopped.append(report)
        else:
            runs.append(report)
    runs.sort(key=lambda r: (r.start_time, r.order))
    if runs:  # one SKU's figures make a trend: the node's latest SKU (a node checked as another SKU is not merged)
        sku = runs[-1].sku
        left_out += [
            NotMerged(r.path, OTHER_SKU, f"checked the {r.sku} SKU; the node's latest run checked {sku}", r.hostname)
            for r in runs
            if r.sku != sku
        ]
        runs = [r for r in runs if r.sku == sku]
        stopped = [r for r in stopped if r.sku in (None, sku)]  # one stopped before it knew its SKU counts
    return NodeHistory(directory, hostname, runs, left_out, _trends(runs), stopped)


def _trends(runs: Sequence[Report]) -> list[Trend]:
    trends: dict[MetricKey, Trend] = {}
    for run in runs:
        start = run.start_time
        assert start is not None  # reports.read refuses a report without one
        latest = {metric_key(m): m for m in run.measurements}  # the later of two, as --gb-compare
        for key, m in latest.items():
            trend = trends.setdefault(key, Trend(key, m["unit"], m["direction"]))
            value, expected = m["value"], m.get("expected")
            shown = "-" if value is None else (num(value) if is_number(value) else str(value))
            number = value if is_number(value) else None
            trend.points.append(Point(start, number, shown, _run_verdict(m), expected))
    return sorted(trends.values(), key=lambda t: _order(t.key))


def _run_verdict(m: MeasurementRecord) -> str:
    """The measurement's verdict as its run had it: `regressed` where it passed its baseline but failed its test
    against the earlier report (report/terminal.py's rows say the same)."""
    compared = m.get("compare")
    regressed = compared is not None and compared["verdict"] == "regressed"
    return "regressed" if regressed and m["verdict"] in ("pass", "warn") else m["verdict"]


def _order(key: MetricKey) -> tuple[Any, ...]:
    """Metric, then scope in numeric order (message sizes by bytes, gpu2 before gpu10), placement, tool."""
    try:
        scope: tuple[Any, ...] = (0, parse_size_label(key.scope))
    except ValueError:
        scope = (1, natural_key(key.scope))
    return (key.metric, scope, key.placement or "", key.tool or "")


def _pct(value: float | None, reference: float | None) -> float | None:
    if value is None or reference is None or reference == 0:
        return None
    return (value - reference) / abs(reference) * 100.0


def _signed(pct: float | None) -> str:
    return "-" if pct is None else f"{pct:+.1f}%"


# What a run's verdicts gate: a trend with none of them (only `info`, `skip`, `recorded`) is shown with --all.
GATED = frozenset({"pass", "warn", "fail", "regressed"})
# How many of the figures that moved most, from the median of their runs, the headline names.
MOVED_MOST = 5


def render(history: NodeHistory, everything: bool = False) -> list[str]:
    """The terminal text: a headline and the gated figures that moved most in the latest run, then per gated
    measurement a table of its runs (with `everything`, every measurement's), then the reports left out."""
    shown = printable_exactly(history.hostname)
    lines = [f"node {shown}: {len(history.runs)} finished run(s) in {history.directory}"]
    gated = [t for t in history.trends if any(p.verdict in GATED for p in t.points)]
    moved = [(abs(last), t.key.label, last) for t in gated if (last := t.deltas()[-1][1])]  # None or 0: not moved
    if moved:
        moves = ", ".join(f"{label} {_signed(pct)}" for _, label, pct in sorted(moved, reverse=True)[:MOVED_MOST])
        lines.append(f"moved most in the latest run, from their median: {moves}")
    hidden = len(history.trends) - len(gated)
    if hidden and not everything:
        lines.append(f"{hidden} measurement(s) no baseline gates not shown (--all shows them)")
    for trend in history.trends if everything else gated:
        measured = sum(p.value is not None for p in trend.points)
        about = f"{trend.unit}, {trend.direction} is better; median {num(trend.median)} over {measured} run(s)"
        lines += ["", f"{trend.key.label}  {about}"]
        rows = [["time", "value", "verdict", "vs previous", "vs median"]]
        for point, (vs_previous, vs_median) in zip(trend.points, trend.deltas(), strict=True):
            when = point.start.astimezone(dt.timezone.utc).isoformat(timespec="seconds")
            rows.append([when, point.shown, point.verdict, _signed(vs_previous), _signed(vs_median)])
        lines += ["  " + line for line in columns(rows)]
    if history.left_out:
        lines += ["", "reports left out:"]
        lines += [f"  {r.path}: {r.kind}: {r.reason}" for r in history.left_out]
    if not history.runs:
        lines.append(f"no finished report of node {shown} in {history.directory}")
    return lines


# --- repeat offenders: the nodes of a history root that fail again and again ------------------------------------

# Nodes that failed in at least this many of their last OF runs (defaults of `fleet offenders`): a node that fails
# twice in five runs is back in service only to fail again. A choice of ours, not a published figure: the public
# data say that few nodes cause most exclusions (3 of 63 nodes, more than half of them, on one B200 cluster), not
# where to draw the line.
DEFAULT_FAILED, DEFAULT_OF = 2, 5
# The runs that count against a node: failed, and unresolved -- figures scattering run after run are a symptom (a
# link that retrains, a throttling GPU) even where no single run can call them a fault. Their checks' categories
# say which (`unresolved`).
COUNTED = frozenset({"fail", "unresolved"})


@dataclass(frozen=True)
class Offender:
    """A node that failed in `failed` of its last `runs` finished runs (of its latest SKU)."""

    hostname: str
    failed: int
    runs: int
    last_failed: dt.datetime
    categories: dict[str, int]  # the failed checks' fault categories over those runs, most first
    stopped: int = 0  # how many of the failed runs never finished (hung and stopped, or interrupted)
    # The time between its incidents (failed runs, by their start), oldest first: NVSentinel's time between incidents
    between_s: tuple[float, ...] = ()
    repeat: int | None = None  # its failures in fleet/drain.py's repeat window, where that makes a repeat offender

    def describe(self) -> str:
        found = ", ".join(f"{category} {n}" for category, n in self.categories.items()) or "no category"
        when = self.last_failed.astimezone(dt.timezone.utc).isoformat(timespec="seconds")
        stopped = f", {self.stopped} of them stopped before the end" if self.stopped else ""
        between = f"; time between incidents: {', '.join(map(span, self.between_s))}" if self.between_s else ""
        days = f"{drain.REPEAT_DAYS:g} days"
        repeat = f"; a repeat offender ({self.repeat} in {days}): for a person, not to resume" if self.repeat else ""
        return (
            f"{printable_exactly(self.hostname)}: failed {self.failed} of its last {self.runs} runs{stopped} "
            f"(the latest at {when}): {found}{between}{repeat}"
        )


def span(seconds: float) -> str:
    """A time between incidents as a person reads it: minutes, hours or days."""
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h" if seconds < 86400 else f"{seconds / 86400:.1f} d"


def repeat_offenders(root: Path, failed: int = DEFAULT_FAILED, of: int = DEFAULT_OF) -> tuple[list[Offender], int]:
    """The nodes under the history root `root` (`root/<hostname>/`) that failed in at least `failed` of their last
    `of` runs, the largest share of failed runs first (then the most failures); and how many node directories were
    read. A run that never finished counts as failed (a node that hangs run after run is the worst offender), but
    for the node's latest, which may still be running. Raises history.HistoryError where `root` cannot be listed."""
    try:
        directories = sorted(d for d in root.iterdir() if d.is_dir())
    except OSError as exc:
        raise kept.HistoryError(f"{root}: cannot list it: {exc.strerror or exc}") from None
    found = []
    for directory in directories:
        node = read_history(directory)
        every = sorted([*node.runs, *node.stopped], key=lambda r: (r.start_time, r.order))
        if every and every[-1].status == "running":  # perhaps running now
            every.pop()
        # A second run of a run's failed checks (--gb-rerun-failed: the health check's confirmation) is no run of
        # its own: it says whether that run's failures stood, or flapped.
        again = [r for r in every if r.reruns_failed]
        every = [r for r in every if not r.reruns_failed]
        last = every[-of:]
        failing = [r for r in last if not r.finished or r.verdict in COUNTED]
        if len(failing) >= failed:
            categories = Counter(c.category or "unclassified" for r in failing for c in failed_checks(r))
            if flapped := sum(1 for r in failing if _flapped(r, again)):
                categories[FLAPPING] = flapped
            if stopped := sum(1 for r in failing if not r.finished):
                statuses = ", ".join(sorted({str(r.status) for r in failing if not r.finished}))
                categories[f"stopped ({statuses})"] = stopped
            starts = [r.start_time for r in failing if r.start_time is not None]  # reports.read refuses none
            between = tuple((b - a).total_seconds() for a, b in itertools.pairwise(starts))
            repeat = drain.repeats([t.timestamp() for t in starts[:-1]], starts[-1].timestamp())
            counts = dict(categories.most_common())
            found.append(
                Offender(directory.name, len(failing), len(last), starts[-1], counts, stopped, between, repeat)
            )
    found.sort(key=lambda o: (-o.failed / o.runs, -o.failed, o.hostname))
    return found, len(directories)


def _flapped(run: Report, again: Sequence[Report]) -> bool:
    """Whether the first second run after `run` passed every check `run` failed (none of them failed again)."""
    later = [r for r in again if (r.start_time, r.order) > (run.start_time, run.order)]
    if not later:
        return False
    second = later[0].tests
    passed = {t["test_id"] for t in second if t["outcome"] == "passed" and t["when"] == "call"}
    failed_again = {t["test_id"] for t in second if t["outcome"] == "failed"}
    checks = {c.test_id for c in failed_checks(run)}
    return bool(checks) and checks <= passed and not checks & failed_again


def render_offenders(root: Path, offenders: Sequence[Offender], nodes: int, failed: int, of: int) -> list[str]:
    lines = [f"{len(offenders)} of {nodes} node(s) in {root} failed in at least {failed} of their last {of} runs"]
    return lines + [f"  {o.describe()}" for o in offenders]
