"""The fleet summary as data: one row per node (verdict, failed checks with their fault, outlier metrics,
software stack), per-metric statistics across the nodes, multi-node runs with their weak scaling, the reports not
merged, the nodes to take out of service, and the exit code. Rendering is elsewhere (render.py, junit.py,
plots.py).

Exit code 1 when a node fails its checks, is an outlier of a metric, or has a partial report; when a report is
corrupt; when a multi-node run fails or is partial; or when no node report of the fleet's SKU is given. Another
SKU's reports and superseded ones do not count. Otherwise 0.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_gbvalidate.fleet import stats
from pytest_gbvalidate.fleet.reports import CORRUPT, NotMerged, Report, Sorted, sort_reports
from pytest_gbvalidate.fleet.scaling import WeakScaling, weak_scaling
from pytest_gbvalidate.labels import printable

# The software stack, as the report's `node` section names it, in the order shown.
SOFTWARE = ("torch", "nccl", "driver", "cuda_driver", "cuda_runtime", "pytest_gbvalidate", "python")
# A drain reason is for `sinfo -R` and the Slurm log: the categories and metrics, the details are in summary.md.
REASON_MAX_CHARS = 120


@dataclass(frozen=True)
class FailedCheck:
    """A failed test of a node's report, with its fault (absent in reports from before fault categories)."""

    test_id: str
    message: str
    category: str | None
    action: str | None
    disposition: str | None

    @property
    def name(self) -> str:
        return self.test_id.rsplit("::", 1)[-1]


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
    spread: stats.Spread
    outliers: list[stats.Outlier]

    def delta_pct(self, value: float) -> float | None:
        """`value` relative to the fleet median, in percent (signed: + above the median)."""
        median = self.spread.median
        return None if median == 0 else (value - median) / abs(median) * 100.0


@dataclass(frozen=True)
class NodeOutlier:
    metric: MetricStats
    outlier: stats.Outlier

    def describe(self) -> str:
        s, o = self.metric, self.outlier
        delta = s.delta_pct(o.value)
        versus = "" if delta is None else f" ({delta:+.1f}%)"
        z = "" if o.z is None else f", modified z {o.z:+.1f}"
        better = f"{s.direction} is better"
        return (
            f"{s.key.label}: {o.value:.4g} {s.unit} vs fleet median {s.spread.median:.4g} {s.unit}{versus}, "
            f"{better}{z}; flagged: {'; '.join(o.rules)}"
        )

    def short(self, compact: bool = False) -> str:
        delta = self.metric.delta_pct(self.outlier.value)
        key = self.metric.key
        return (key.compact if compact else key.label) + ("" if delta is None else f" {delta:+.0f}%")


@dataclass(frozen=True)
class Suspect:
    """A node that a check of a multi-node run found at fault (the report's `suspects`: the node slow or wrong in
    every pair of the pairwise all_reduce), though its own report may show nothing."""

    host: str
    test_id: str
    why: str
    category: str | None
    run: Path  # the multi-node run's report

    @property
    def short(self) -> str:
        """For a drain reason: the category and the check, marked as a multi-node finding."""
        return f"{self.category or 'failed'}: {self.test_id.rsplit('::', 1)[-1]} (multi-node)"


@dataclass
class Node:
    report: Report
    failed: list[FailedCheck]
    outliers: list[NodeOutlier] = field(default_factory=list)
    suspected: list[Suspect] = field(default_factory=list)
    lacks: list[str] = field(default_factory=list)  # checks most of its peers ran and it did not (`coverage`)

    @property
    def hostname(self) -> str:
        return self.report.hostname

    @property
    def verdict(self) -> str:
        return self.report.verdict

    @property
    def software(self) -> dict[str, str]:
        node = self.report.data["node"]
        return {name: str(node[name]) for name in SOFTWARE if node.get(name) is not None}

    @property
    def drain(self) -> bool:
        """Out of service until fixed: failed, partial (not shown healthy), an outlier, found at fault by a
        multi-node run, or short of checks its peers ran (it has not shown what they showed)."""
        return self.verdict != "pass" or bool(self.outliers) or bool(self.suspected) or bool(self.lacks)

    def drain_reason(self) -> str:
        """Short, one line: the partial report, the failed checks by fault category, the outlier metrics, what
        multi-node runs found."""
        parts = []
        if self.verdict == "partial":
            parts.append(f"report {self.report.status}")
        by_category: dict[str, list[str]] = {}
        for check in self.failed:
            by_category.setdefault(check.category or "failed", []).append(check.name)
        parts += [f"{category}: {','.join(names)}" for category, names in by_category.items()]
        parts += [f"outlier {o.short(compact=True)}" for o in self.outliers]
        parts += suspect_parts(self.suspected)
        if self.lacks:
            parts.append(f"ran less than its peers: {','.join(self.lacks)}")
        return join_within("gbvalidate: ", parts, REASON_MAX_CHARS)


@dataclass
class Summary:
    sorted: Sorted
    nodes: list[Node]
    metrics: list[MetricStats]
    scaling: list[WeakScaling]
    mad_k: float
    pct: float
    noise_floor_pct: float
    unreported_suspects: dict[str, list[Suspect]]  # host -> findings, for hosts without a node report here

    @property
    def sku(self) -> str | None:
        return self.sorted.sku

    @property
    def not_merged(self) -> list[NotMerged]:
        return self.sorted.not_merged

    @property
    def multi_node(self) -> list[Report]:
        return self.sorted.multi_node

    @property
    def drained(self) -> list[Node]:
        return [n for n in self.nodes if n.drain]

    def drain_list(self) -> list[tuple[str, str]]:
        """(host, reason) of every node to take out of service: the drained nodes, then the hosts a multi-node run
        found at fault that have no report of their own here."""
        found = [(n.hostname, n.drain_reason()) for n in self.drained]
        for host, findings in self.unreported_suspects.items():
            found.append((host, join_within("gbvalidate: ", suspect_parts(findings), REASON_MAX_CHARS)))
        return found

    @property
    def outliers(self) -> list[tuple[Node, NodeOutlier]]:
        return [(n, o) for n in self.nodes for o in n.outliers]

    @property
    def statistics_note(self) -> str | None:
        """Why there are no outlier statistics, where there are none."""
        counted = sum(1 for n in self.nodes if n.report.finished)
        if counted < stats.MIN_NODES:
            return (
                f"outlier statistics need at least {stats.MIN_NODES} nodes with a finished report; "
                f"{counted} given: medians and spreads only"
            )
        return None

    def failures(self) -> list[str]:
        """Why the exit code is 1; empty when it is 0."""
        why = []
        counts = Counter(n.verdict for n in self.nodes)
        if counts["fail"]:
            why.append(f"{counts['fail']} node(s) fail their checks")
        outlying = sum(1 for n in self.nodes if n.outliers)
        if outlying:
            why.append(f"{outlying} node(s) are outliers")
        short = sum(1 for n in self.nodes if n.lacks)
        if short:
            why.append(f"{short} node(s) ran less than their peers")
        if counts["partial"]:
            why.append(f"{counts['partial']} node(s) have a partial report (the run did not finish)")
        corrupt = sum(1 for r in self.not_merged if r.kind == CORRUPT)
        if corrupt:
            why.append(f"{corrupt} report(s) are corrupt")
        bad_runs = sum(1 for r in self.multi_node if r.verdict != "pass")
        if bad_runs:
            why.append(f"{bad_runs} multi-node run(s) fail or are partial")
        if not self.nodes:
            why.append(f"no node report of SKU {self.sku}")
        return why

    @property
    def exit_code(self) -> int:
        return 1 if self.failures() else 0


def summarize(
    paths: Sequence[Path],
    sku: str | None = None,
    mad_k: float = stats.DEFAULT_MAD_K,
    pct: float = stats.DEFAULT_PCT,
    noise_floor_pct: float = 0.0,
) -> Summary:
    sorted_reports = sort_reports(paths, sku)
    nodes = [Node(r, failed_checks(r)) for r in sorted_reports.nodes]
    coverage(nodes)
    metrics = metric_stats([n.report for n in nodes if n.report.finished], mad_k, pct, noise_floor_pct)
    by_host = {n.hostname: n for n in nodes}
    for m in metrics:
        for outlier in m.outliers:
            by_host[outlier.host].outliers.append(NodeOutlier(m, outlier))
    unreported: dict[str, list[Suspect]] = {}
    for suspect in suspects(sorted_reports.multi_node):
        node = by_host.get(suspect.host)
        (node.suspected if node is not None else unreported.setdefault(suspect.host, [])).append(suspect)
    scaling = weak_scaling(sorted_reports.multi_node, sorted_reports.nodes)
    return Summary(sorted_reports, nodes, metrics, scaling, mad_k, pct, noise_floor_pct, unreported)


def coverage(nodes: Sequence[Node]) -> None:
    """Set each finished node's `lacks`: the checks (test ids that ran, passed or failed) that more than half of the
    finished nodes ran and it did not. A node whose run was cut to a subset, or whose GPUs made every check skip,
    must not pass beside nodes that showed more; a subset the whole fleet ran is nobody's lack."""
    ran = {
        n.hostname: {t["test_id"] for t in n.report.tests if t.get("when") == "call" and t["outcome"] != "skipped"}
        for n in nodes
        if n.report.finished
    }
    counts = Counter(test for tests in ran.values() for test in tests)
    usual = {test for test, count in counts.items() if count > len(ran) / 2}
    for n in nodes:
        if n.hostname in ran:
            n.lacks = sorted(test.rsplit("::", 1)[-1] for test in usual - ran[n.hostname])


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
            category = fault.get("category") if isinstance(fault, dict) else None
            found.append(
                Suspect(
                    printable(record["host"]),
                    str(record.get("test_id")),
                    str(record.get("why")),
                    _text(category),
                    run.path,
                )
            )
    return found


def suspect_parts(suspects: Sequence[Suspect]) -> list[str]:
    """A drain reason's parts for what multi-node runs found, each once."""
    return list(dict.fromkeys(s.short for s in suspects))


def failed_checks(report: Report) -> list[FailedCheck]:
    """The report's failed tests, once each; a finished run that exited non-zero without a failed test (an
    internal or usage error, no tests collected) gets a check of its own."""
    checks: dict[str, FailedCheck] = {}
    for test in report.tests:
        test_id = str(test.get("test_id"))
        if test.get("outcome") != "failed" or test_id in checks:
            continue
        fault = test.get("fault")
        fault = fault if isinstance(fault, dict) else {}
        checks[test_id] = FailedCheck(
            test_id,
            one_line(test.get("message") or f"failed at {test.get('when')}"),
            _text(fault.get("category")),
            _text(fault.get("action")),
            _text(fault.get("disposition")),
        )
    exit_status = report.data.get("exit_status")
    if report.finished and exit_status != 0 and not checks:
        message = f"pytest exited with status {exit_status} and no failed test"
        checks["(session)"] = FailedCheck("(session)", message, None, None, None)
    return list(checks.values())


def metric_stats(
    reports: Sequence[Report], mad_k: float, pct: float, noise_floor_pct: float = 0.0
) -> list[MetricStats]:
    """Per metric key across `reports`: the gated measurements (verdict not `info`) with a numeric value. Where a
    report has the same key twice, its worse value counts."""
    values: dict[MetricKey, dict[str, float]] = {}
    meta: dict[MetricKey, dict[str, Any]] = {}
    expected: dict[MetricKey, Counter[float]] = {}
    for report in reports:
        host = report.hostname
        for m in report.measurements:
            if m.get("verdict") == "info" or not stats.is_number(m.get("value")):
                continue
            key = metric_key(m)
            first = meta.setdefault(key, {"unit": str(m.get("unit", "")), "direction": str(m.get("direction"))})
            value = float(m["value"])
            by_host = values.setdefault(key, {})
            if host not in by_host or stats.worse_by(value, by_host[host], first["direction"]) > 0:
                by_host[host] = value
            if stats.is_number(m.get("expected")):
                expected.setdefault(key, Counter())[float(m["expected"])] += 1
    found = []
    for key, by_host in values.items():
        direction = meta[key]["direction"]
        common = expected.get(key)
        found.append(
            MetricStats(
                key,
                meta[key]["unit"],
                direction,
                by_host,
                common.most_common(1)[0][0] if common else None,
                stats.spread(list(by_host.values())),
                stats.outliers(by_host, direction, mad_k, pct, noise_floor_pct),
            )
        )
    return found


def metric_key(measurement: dict[str, Any]) -> MetricKey:
    details = measurement.get("details")
    details = details if isinstance(details, dict) else {}
    placement, tool = details.get("placement"), details.get("tool")
    return MetricKey(
        str(measurement.get("metric")),
        str(measurement.get("scope")),
        None if placement is None else str(placement),
        None if tool is None else str(tool),
    )


def one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def join_within(prefix: str, parts: Sequence[str], limit: int) -> str:
    """`prefix` and as many of `parts` as fit in `limit` characters, joined by "; ", then "+N more" for the rest
    (the first part cut short where even it does not fit)."""
    parts = [one_line(p) for p in parts]
    kept: list[str] = []
    for i, part in enumerate(parts):
        dropped_after = len(parts) - i - 1
        tail = f"; +{dropped_after} more" if dropped_after else ""
        if len(prefix + "; ".join([*kept, part]) + tail) > limit:
            break
        kept.append(part)
    if len(kept) == len(parts):
        return prefix + "; ".join(kept)
    tail = f"; +{len(parts) - max(len(kept), 1)} more" if len(parts) > max(len(kept), 1) else ""
    if not kept:
        return shorten(prefix + parts[0], limit - len(tail)) + tail
    return prefix + "; ".join(kept) + tail


def shorten(text: str, limit: int) -> str:
    text = one_line(text)
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def _text(value: object) -> str | None:
    return None if value is None else str(value)
