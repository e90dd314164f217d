"""What the reports found, as records: each node report's failed checks (with their fault), the gated metrics
across the finished node reports (with their statistics and outliers), and the nodes the multi-node runs found at
fault. The summary (summary.py) gathers them per node."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_gbvalidate.fleet.drain import category_label
from pytest_gbvalidate.fleet.reports import Report
from pytest_gbvalidate.fleet.text import one_line
from pytest_gbvalidate.labels import number
from pytest_gbvalidate.report import node_verdict
from pytest_gbvalidate.report.node_verdict import UNCLASSIFIED
from pytest_gbvalidate.report.node_verdict import FailedCheck as FailedCheck  # where the fleet's modules take it
from pytest_gbvalidate.rules import noise, outliers
from pytest_gbvalidate.rules import resolution as rs
from pytest_gbvalidate.rules.outliers import Outlier, Spread, Unjudged


@dataclass(frozen=True)
class MetricKey:
    """What one number across the nodes is: the metric at a scope, and for sweeps the placement (in place or out of
    place) and the reference tool that measured it (our own measurement where None)."""

    metric: str
    scope: str
    placement: str | None = None
    tool: str | None = None

    @property
    def label(self) -> str:
        extra = "".join(f", {part}" for part in (self.placement, self.tool) if part)
        return f"{self.metric} [{self.scope}{extra}]"

    @property
    def compact(self) -> str:
        """Without spaces, for a drain reason."""
        parts = [p.replace(" ", "_") for p in (self.scope, self.placement, self.tool) if p]
        return f"{self.metric}[{','.join(parts)}]"


@dataclass
class MetricStats:
    key: MetricKey
    unit: str
    direction: str
    values: dict[str, float]  # host -> value, in the order of the nodes
    expected: float | None  # the baseline's expected value (the most common one, should baselines differ)
    spread: Spread
    outliers: list[Outlier]
    unjudged: list[Unjudged] = field(default_factory=list)  # nodes too noisy to judge on this metric
    # The practical margin, where it is the resolution the metric's reports say it needs (a log ratio, percent);
    # None where it is the summary's percent of the median (Summary.pct or outliers.DEFAULT_PCT).
    needed_pct: float | None = None

    def delta_pct(self, value: float) -> float | None:
        """`value` relative to the fleet median, in percent (signed: + above the median)."""
        median = self.spread.median
        return None if median == 0 else (value - median) / abs(median) * 100.0


@dataclass(frozen=True)
class NodeOutlier:
    metric: MetricStats
    outlier: outliers.Outlier

    def describe(self) -> str:
        s, o = self.metric, self.outlier
        delta = s.delta_pct(o.value)
        versus = "" if delta is None else f" ({delta:+.1f}%)"
        z = "" if o.z is None else f", modified z {o.z:+.1f}"
        return (
            f"{s.key.label}: {number(o.value)} {s.unit} vs fleet median {number(s.spread.median)} {s.unit}{versus}, "
            f"{s.direction} is better{z}; flagged: {'; '.join(o.rules)}"
        )

    def short(self, compact: bool = False) -> str:
        delta = self.metric.delta_pct(self.outlier.value)
        key = self.metric.key
        return (key.compact if compact else key.label) + ("" if delta is None else f" {delta:+.0f}%")


@dataclass(frozen=True)
class NodeUnjudged:
    """A node too noisy to judge on a metric: no verdict on that figure, neither drained for it nor passed."""

    metric: MetricStats
    unjudged: outliers.Unjudged

    def describe(self) -> str:
        s, u = self.metric, self.unjudged
        return (
            f"{s.key.label}: {number(u.value)} {s.unit} vs fleet median {number(s.spread.median)} {s.unit}, "
            f"{u.describe()}"
        )


@dataclass(frozen=True)
class Suspect:
    """A node that a check of a multi-node run found at fault (the report's `suspects`: the node slow or wrong in
    every pair of the pairwise all_reduce), though its own report may show nothing."""

    host: str
    test_id: str
    why: str
    category: str | None
    run: Path  # the multi-node run's report
    repair: str | None = None  # what brings the node back (faults.yaml); None in a report from before repairs

    @property
    def short(self) -> str:
        """For a drain reason: the category with its repair and the check, marked as a multi-node finding."""
        label = category_label(self.category or UNCLASSIFIED, self.repair)
        return f"{label}: {self.test_id.rsplit('::', 1)[-1]} (multi-node)"


def suspects(runs: Sequence[Report]) -> list[Suspect]:
    """The nodes the multi-node runs found at fault, in the order of the runs (malformed records left out: the
    run's own verdict still fails the fleet)."""
    found = []
    for run in runs:
        records = run.data.get("suspects")
        for record in records if isinstance(records, list) else []:
            if not isinstance(record, dict) or not isinstance(record.get("host"), str):
                continue
            fault = record.get("fault")
            category, repair = (fault.get("category"), fault.get("repair")) if isinstance(fault, dict) else (None, None)
            test_id, why = str(record.get("test_id")), str(record.get("why"))
            found.append(Suspect(record["host"], test_id, why, _text(category), run.path, _text(repair)))
    return found


# The check of a finished run that exited non-zero without a failed test: pytest's own error, or a file it lost.
SESSION_CHECK = "(session)"


def failed_checks(report: Report) -> list[FailedCheck]:
    """The report's failed tests, once each (report/node_verdict.py); a finished run that exited non-zero without a
    failed test (an internal or usage error, no tests collected) gets a check of its own."""
    checks = list(node_verdict.judge(report.data).failed)
    exit_status = report.data.get("exit_status")
    if report.finished and exit_status != 0 and not checks:
        message = f"pytest exited with status {exit_status} and no failed test"
        if lost := report.data.get("outputs_lost") or []:  # a file it could not write: evidence missing, not a fault
            message += f": {one_line(lost[0])}{f' (and {len(lost) - 1} more)' if len(lost) > 1 else ''}"
        checks.append(FailedCheck(SESSION_CHECK, message, None, None, None))
    return checks


def metric_stats(
    reports: Sequence[Report], mad_k: float | None, pct: float | None, noise_floor_pct: float = 0.0
) -> list[MetricStats]:
    """Per metric key across `reports`: the gated measurements (verdict not `info`) with a numeric value. Where a
    report has the same key twice, its worse value counts (with that measurement's noise and run-to-run spread).
    `mad_k` None: each metric's cut-off is the family-wise one for its nodes and the fleet's figures
    (noise.family_z). `pct` None: each metric's practical margin is the resolution its reports say it needs
    (needed_pct), else outliers.DEFAULT_PCT. Each node is judged against the fleet's noise and run-to-run spread
    without its own (outliers.judge): its outliers, and the nodes too noisy to judge on it."""
    g = _gathered(reports)
    found = []
    for key, by_host in g.values.items():
        direction = g.meta[key]["direction"]
        common = g.expected.get(key)
        needed_pct = statistics.median(g.needed[key]) if pct is None and key in g.needed else None
        judged = outliers.judge(
            by_host,
            direction,
            noise.family_z(len(by_host), len(g.values)) if mad_k is None else mad_k,
            outliers.DEFAULT_PCT if pct is None else pct,
            noise_floor_pct,
            g.noises.get(key),
            run_to_runs=g.run_to_run.get(key),
            needed_pct=needed_pct,
        )
        found.append(
            MetricStats(
                key,
                g.meta[key]["unit"],
                direction,
                by_host,
                common.most_common(1)[0][0] if common else None,
                outliers.spread(list(by_host.values())),
                judged.outliers,
                judged.unjudged,
                needed_pct,
            )
        )
    return found


@dataclass
class _Gathered:
    """The gated figures of the reports by metric key and host, with what judging them needs."""

    values: dict[MetricKey, dict[str, float]] = field(default_factory=dict)
    noises: dict[MetricKey, dict[str, noise.Noise | None]] = field(default_factory=dict)
    run_to_run: dict[MetricKey, dict[str, float]] = field(default_factory=dict)  # a host's figure over its own runs
    needed: dict[MetricKey, list[float]] = field(default_factory=dict)  # the resolution each report says it needs
    meta: dict[MetricKey, dict[str, Any]] = field(default_factory=dict)
    expected: dict[MetricKey, Counter[float]] = field(default_factory=dict)


def _gathered(reports: Sequence[Report]) -> _Gathered:
    g = _Gathered()
    for report in reports:
        host = report.hostname
        for m in report.measurements:
            value = m["value"]
            if m.get("verdict") == "info" or not isinstance(value, (int, float)) or not outliers.is_number(value):
                continue
            key = metric_key(m)
            first = g.meta.setdefault(key, {"unit": str(m.get("unit", "")), "direction": str(m.get("direction"))})
            by_host = g.values.setdefault(key, {})
            if (needed_pct := _needed_pct(m)) is not None:
                g.needed.setdefault(key, []).append(needed_pct)
            if host not in by_host or rs.is_worse(value, by_host[host], first["direction"]):
                by_host[host] = value
                g.noises.setdefault(key, {})[host] = noise.from_record(m.get("noise"))
                g.run_to_run.setdefault(key, {}).pop(host, None)  # the worse figure's, or none
                if (spread := _run_to_run_pct(m)) is not None:
                    g.run_to_run[key][host] = spread
            if (reference := m.get("expected")) is not None and outliers.is_number(reference):
                g.expected.setdefault(key, Counter())[float(reference)] += 1
    return g


def _needed_pct(measurement: Mapping[str, Any]) -> float | None:
    """The resolution (percent) the measurement's report says its metric needs (`resolution.needed_pct`), where it
    gives a finite one within the baselines' bounds; else None."""
    found = measurement.get("resolution")
    needed = noise.finite(found.get("needed_pct")) if isinstance(found, dict) else None
    return needed if needed is not None and rs.MIN_NEEDED_PCT <= needed <= rs.MAX_NEEDED_PCT else None


def _run_to_run_pct(measurement: Mapping[str, Any]) -> float | None:
    """The robust spread (percent) of the figure over the node's own earlier runs, where its report's comparison
    gives one (`compare.run_to_run.spread_pct`); None where it gives none or no finite one above 0."""
    compared = measurement.get("compare")
    record = compared.get("run_to_run") if isinstance(compared, dict) else None
    spread = noise.finite(record.get("spread_pct")) if isinstance(record, dict) else None
    return spread if spread is not None and spread > 0 else None


def metric_key(measurement: Mapping[str, Any]) -> MetricKey:
    details = measurement.get("details")
    details = details if isinstance(details, dict) else {}
    placement, tool = _text(details.get("placement")), _text(details.get("tool"))
    return MetricKey(str(measurement.get("metric")), str(measurement.get("scope")), placement, tool)


def _text(value: object) -> str | None:
    return None if value is None else str(value)
