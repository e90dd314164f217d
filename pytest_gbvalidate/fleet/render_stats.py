"""The summary's sections of numbers across the nodes, one function per section and format: the outliers
(summary.md, terminal), the per-metric statistics (summary.md, metrics.csv), and the multi-node runs with their weak
scaling (summary.md, terminal). render.py puts them in its documents."""

from __future__ import annotations

from pytest_gbvalidate.fleet.findings import MetricStats, NodeOutlier, failed_checks
from pytest_gbvalidate.fleet.markup import checks_cell, md, md_table, num
from pytest_gbvalidate.fleet.reports import Report
from pytest_gbvalidate.fleet.scaling import WeakScaling
from pytest_gbvalidate.fleet.summary import Summary
from pytest_gbvalidate.labels import number
from pytest_gbvalidate.rules import noise, outliers


def rules_text(summary: Summary) -> str:
    floor = f" and by more than {summary.noise_floor_pct:g}% of the median" if summary.noise_floor_pct else ""
    cut_off = (
        f"{summary.mad_k:g} scaled MADs"
        if summary.mad_k is not None
        else "the family-wise number of scaled MADs (each metric's: what a healthy node's worst figure stays within "
        f"in {1 - noise.FAMILY_LEVEL:.0%} of fleets of as many nodes and figures, at least {outliers.DEFAULT_MAD_K:g})"
    )
    return (
        f"worse than the fleet median by more than {cut_off} (modified z-score "
        f"0.6745*(x-median)/MAD), and by more than {margin_text(summary)}{floor}, and by more than the "
        f"fleet's noise allows ({noise.NOISE_K:g} times the fleet's typical spread, the median of the other "
        f"nodes' where the reports give it, for the node and for the median combined: never the node's own); where "
        f"MAD is 0 any deviation is far in robust terms; at least {outliers.MIN_NODES} nodes"
    )


def margin_text(summary: Summary) -> str:
    if summary.pct is not None:
        return f"{summary.pct:g}% as a log ratio"
    return (
        "the resolution its metric needs (as its reports give it, a log ratio; "
        f"{outliers.DEFAULT_PCT:g}% where they give none, a log ratio too)"
    )


def noisy_rule_text(summary: Summary) -> str:
    cut_off = "K" if summary.mad_k is not None else "the family-wise number of"
    return (
        f"a node whose own spread for a figure is more than {cut_off} scaled MADs (at least "
        f"{outliers.DEFAULT_MAD_K:g}) of the other nodes' spreads beyond their median, and more than "
        f"{outliers.TOO_NOISY_RATIO:g} times it, and that is no outlier of that figure, is too noisy to judge on it: "
        "neither drained nor passed (run it again on an idle node)"
    )


def outliers_md(summary: Summary) -> list[str]:
    lines = ["", "## Outliers", "", f"Rule: {rules_text(summary)}.", ""]
    if not summary.outliers:
        return [*lines, summary.statistics_note or "None.", *_unjudged_md(summary)]
    rows = [_outlier_cells(n.hostname, o) for n, o in summary.outliers]
    header = ["node", "metric", "value", "fleet median", "vs median", "modified z", "flagged by"]
    return lines + md_table(header, rows) + _unjudged_md(summary)


def _outlier_cells(host: str, o: NodeOutlier) -> list[str]:
    delta = "-" if (pct := o.metric.delta_pct(o.outlier.value)) is None else f"{pct:+.1f}%"
    z = "-" if o.outlier.z is None else f"{o.outlier.z:+.2f}"
    return [host, o.metric.key.label, *_value_cells(o.metric, o.outlier.value), delta, z, "; ".join(o.outlier.rules)]


def _value_cells(m: MetricStats, value: float) -> list[str]:
    return [f"{number(value)} {m.unit}", f"{number(m.spread.median)} {m.unit}"]


def _unjudged_md(summary: Summary) -> list[str]:
    """The figures too noisy to judge, where there are any."""
    if not summary.unjudged:
        return []
    lines = ["", "### Too noisy to judge", "", f"Rule: {noisy_rule_text(summary)}.", ""]
    rows = [
        [n.hostname, u.metric.key.label, *_value_cells(u.metric, u.unjudged.value), u.unjudged.describe()]
        for n, u in summary.unjudged
    ]
    return lines + md_table(["node", "metric", "value", "fleet median", "no verdict"], rows)


def outliers_terminal(summary: Summary) -> list[str]:
    """Why there are no outlier statistics, where none; each outlier, how far out; each figure too noisy to judge."""
    lines = [summary.statistics_note] if summary.statistics_note else []
    if summary.outliers:
        lines.append(f"outliers ({rules_text(summary)}):")
        lines += [f"  {n.hostname}  {o.describe()}" for n, o in summary.outliers]
    if summary.unjudged:
        lines.append(f"no verdict ({noisy_rule_text(summary)}):")
        lines += [f"  {n.hostname}  {u.describe()}" for n, u in summary.unjudged]
    return lines


METRIC_COLUMNS = (
    *("metric", "scope", "placement", "tool", "unit", "direction", "nodes", "median", "min", "max", "mad"),
    *("spread_pct", "expected", "outliers"),
)


def metrics_md(summary: Summary) -> list[str]:
    header = ["metric", "unit", "better", "nodes", "median", "min", "max", "MAD", "(max-min)/median", "expected"]
    rows = [_metric_cells(m) for m in summary.metrics]
    return ["", "## Metrics across nodes", "", *md_table([*header, "outliers"], rows)]


def _metric_cells(m: MetricStats) -> list[str]:
    s = m.spread
    numbers = [num(x) for x in (s.median, s.minimum, s.maximum, s.mad)]
    spread = "-" if s.spread_pct is None else f"{s.spread_pct:.1f}%"
    flagged = ", ".join(o.host for o in m.outliers) or ("-" if s.nodes >= outliers.MIN_NODES else "- (too few nodes)")
    return [m.key.label, m.unit, m.direction, str(s.nodes), *numbers, spread, num(m.expected), flagged]


def metrics_rows(summary: Summary) -> list[dict[str, object]]:
    """metrics.csv's rows (METRIC_COLUMNS): the numbers unrounded but the spread, the key in its parts."""
    return [
        {"metric": m.key.metric, "scope": m.key.scope, "placement": m.key.placement or "", "tool": m.key.tool or ""}
        | {"unit": m.unit, "direction": m.direction, "nodes": m.spread.nodes, "median": m.spread.median}
        | {"min": m.spread.minimum, "max": m.spread.maximum, "mad": m.spread.mad}
        | {"spread_pct": "" if m.spread.spread_pct is None else round(m.spread.spread_pct, 3)}
        | {"expected": "" if m.expected is None else m.expected, "outliers": " ".join(o.host for o in m.outliers)}
        for m in summary.metrics
    ]


def multi_node_md(summary: Summary) -> list[str]:
    lines = ["", "## Multi-node runs", ""]
    if not summary.multi_node:
        return [*lines, "None."]
    header = ["report", "rank 0 host", "nodes", "hosts", "verdict", "failed checks"]
    lines += md_table(header, [_run_cells(r) for r in summary.multi_node])
    lines += ["", "### Weak scaling", ""]
    if not summary.scaling:
        return [*lines, "No multi-node run has a pretraining step time with its layout."]
    lines += [
        "Efficiency = single-node step time (median of the finished single-node runs) / N-node step time; "
        "1.0 is ideal.",
        "",
    ]
    lines += md_table(
        ["model", "nodes", "N-node layout", "N-node step", "1-node layout", "1-node step", "efficiency"],
        [_scaling_cells(w) for w in summary.scaling],
    )
    for w in summary.scaling:
        if w.per_node_s:
            straggler = w.straggler
            lines += ["", f"Per-node {w.per_node_what} of {md(str(w.run.path))} ({w.step.metric}):", ""]
            lines += md_table(["node", f"{w.per_node_what} (s)"], [[h, number(s)] for h, s in w.per_node_s.items()])
            if straggler is not None:
                lines += ["", f"Straggler: {md(straggler.host)}, {_straggler_text(w)}."]
    return lines


def _run_cells(r: Report) -> list[str]:
    hosts = ", ".join(f"node{h['node_rank']} ({h['hostname']})" for h in r.hosts) or "-"
    return [str(r.path), r.hostname, str(r.nodes), hosts, r.verdict.upper(), checks_cell(failed_checks(r))]


def multi_node_terminal(summary: Summary) -> list[str]:
    lines = [
        f"multi-node run {r.path}: {r.nodes} nodes, rank 0 on {r.hostname}: {r.verdict.upper()}"
        for r in summary.multi_node
    ]
    for w in summary.scaling:
        efficiency = w.note if w.efficiency is None else f"efficiency {w.efficiency:.3f}"
        reference = "" if w.reference_s is None else f" vs 1 node {number(w.reference_s)} s"
        step = f"step {number(w.step.value_s)} s{reference}"
        line = f"  weak scaling {w.step.model} on {w.nodes} nodes: {step}: {efficiency}"
        if w.straggler is not None:
            line += f"; straggler {w.straggler.host} ({_straggler_text(w)})"
        lines.append(line)
    return lines


def _scaling_cells(w: WeakScaling) -> list[str]:
    layouts = ", ".join(sorted({r.layout for r in w.references})) or "-"
    reference = "-" if w.reference_s is None else f"{number(w.reference_s)} s (median of {len(w.references)})"
    efficiency = w.note if w.efficiency is None else f"{w.efficiency:.3f}"
    return [w.step.model, str(w.nodes), w.step.layout, f"{number(w.step.value_s)} s", layouts, reference, efficiency]


def _straggler_text(w: WeakScaling) -> str:
    s = w.straggler
    ranks = "" if w.rank_spread_pct is None else f"; ranks' spread {w.rank_spread_pct:.1f}%"
    if s is None:
        return ranks.removeprefix("; ")
    return (
        f"{w.per_node_what}: slowest {number(s.slowest_s)} s, fastest {number(s.fastest_s)} s, median "
        f"{number(s.median_s)} s: spread (max-min)/median {s.spread_pct:.1f}%{ranks}"
    )
