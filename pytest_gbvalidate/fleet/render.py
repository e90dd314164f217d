"""The fleet summary as text: Markdown (summary.md), CSV (nodes.csv, metrics.csv), the compact terminal summary,
and the Slurm drain commands (printed for the operator, never run)."""

from __future__ import annotations

import csv
import io
import ipaddress
import re
import shlex
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

from pytest_gbvalidate.fleet import stats
from pytest_gbvalidate.fleet.reports import CORRUPT, NotMerged
from pytest_gbvalidate.fleet.scaling import WeakScaling
from pytest_gbvalidate.fleet.summary import (
    SOFTWARE,
    MetricStats,
    Node,
    Summary,
    Suspect,
    failed_checks,
    one_line,
    shorten,
)

# Long failure messages are cut in tables: the whole message is in the node's own report.
MESSAGE_MAX_CHARS = 160


def drain_commands(summary: Summary) -> list[str]:
    """One `scontrol update ... state=drain` per node to take out of service whose hostname names exactly one
    node (`not_drained` lists the others); host and reason shell-quoted."""
    return [
        f"scontrol update nodename={shlex.quote(name)} state=drain reason={shlex.quote(reason)}"
        for host, reason in summary.drain_list()
        if (name := slurm_node_name(host)) is not None
    ]


def not_drained(summary: Summary) -> list[str]:
    """The nodes to take out of service whose hostname is no single node's name: for a person to look at."""
    return [host for host, _ in summary.drain_list() if slurm_node_name(host) is None]


NOT_DRAINED = "no drain line: the hostname does not name exactly one node; look at it yourself"
# One DNS label (RFC 1123): letters, digits and inner hyphens, at most 63. Slurm reads `,`, `[1-9]`, spaces and the
# word ALL as several nodes, and a hostname from a report is untrusted: nothing else goes into a command.
_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def slurm_node_name(hostname: str) -> str | None:
    """The Slurm node name of a hostname, as `hostname -s` gives it (Slurm's NodeName convention: up to the first
    dot; an IP address whole); None where it would not name exactly one node."""
    try:
        return str(ipaddress.ip_address(hostname))
    except ValueError:
        pass
    if len(hostname) > 253 or not all(_LABEL.fullmatch(label) for label in hostname.split(".")):
        return None
    short = hostname.split(".", 1)[0]
    return None if short.upper() == "ALL" else short


def rules_text(summary: Summary) -> str:
    floor = f" and by more than {summary.noise_floor_pct:g}% of the median" if summary.noise_floor_pct else ""
    return (
        f"worse than the fleet median by more than {summary.mad_k:g} scaled MADs (modified z-score "
        f"0.6745*(x-median)/MAD){floor} or by more than {summary.pct:g}% of the median; where MAD is 0 only the "
        f"percent rule applies; at least {stats.MIN_NODES} nodes"
    )


def headline(summary: Summary) -> str:
    counts = Counter(n.verdict for n in summary.nodes)
    verdicts = ", ".join(f"{counts[v]} {v}" for v in ("pass", "fail", "partial") if counts[v])
    outlying = sum(1 for n in summary.nodes if n.outliers)
    failures = summary.failures()
    outcome = "FAIL (exit 1): " + "; ".join(failures) if failures else "PASS (exit 0)"
    nodes = f"{len(summary.nodes)} nodes" + (f" ({verdicts})" if verdicts else "")
    return f"SKU {summary.sku}, {nodes}, {outlying} outlier node(s): {outcome}"


def software_differences(nodes: Sequence[Node]) -> list[str]:
    """`torch: 2.13.0 (4 node(s)), 2.12.0 (1 node(s): node-3)` for each part of the stack that differs."""
    lines = []
    for name in SOFTWARE:
        by_version: dict[str, list[str]] = {}
        for n in nodes:
            by_version.setdefault(n.software.get(name, "(none)"), []).append(n.hostname)
        if len(by_version) > 1:
            ranked = sorted(by_version.items(), key=lambda item: -len(item[1]))
            parts = [
                f"{version} ({len(hosts)} node(s)" + (f": {', '.join(hosts)})" if len(hosts) <= 3 else ")")
                for version, hosts in ranked
            ]
            lines.append(f"{name}: {', '.join(parts)}")
    return lines


# --- Markdown ----------------------------------------------------------------------------------------------------


def markdown(summary: Summary, plots: Sequence[Path], plot_note: str | None, out: Path) -> str:
    lines = [f"# Fleet summary: SKU {summary.sku}", "", f"**{_md(headline(summary))}**", ""]
    lines += [
        f"- reports given: {_count_reports(summary)}",
        f"- fleet SKU: {summary.sku} ({summary.sorted.sku_note})",
        f"- outliers: {rules_text(summary)}",
    ]
    if summary.statistics_note:
        lines.append(f"- {summary.statistics_note}")
    lines += [f"- software differs across nodes: {_md(d)}" for d in software_differences(summary.nodes)]
    lines += ["", "## Nodes", ""]
    software = [name for name in SOFTWARE if any(name in n.software for n in summary.nodes)]
    rows = [
        [
            n.hostname,
            n.verdict.upper(),
            ", ".join(f"{c.name} ({c.category or '-'})" for c in n.failed) or "-",
            ", ".join(o.short() for o in n.outliers) or "-",
            "yes" if n.drain else "no",
            *(n.software.get(name, "-") for name in software),
        ]
        for n in summary.nodes
    ]
    lines += _md_table(["node", "verdict", "failed checks", "outlier metrics", "drain", *software], rows)

    lines += ["", "## Take out of service", ""]
    if summary.drain_list():
        for n in summary.drained:
            lines.append(f"- **{_md(n.hostname)}** ({n.verdict}): {_md(n.drain_reason())}")
            lines += [
                f"  - {_md(c.name)}: {_md(c.category or 'no fault category')}"
                + (f" ({c.disposition})" if c.disposition else "")
                + (f", action: {_md(c.action)}" if c.action else "")
                + f"; {_md(shorten(c.message, MESSAGE_MAX_CHARS))}"
                for c in n.failed
            ]
            lines += [f"  - outlier {_md(o.describe())}" for o in n.outliers]
            lines += [_suspect_md(s) for s in n.suspected]
        for host, found in summary.unreported_suspects.items():
            lines.append(f"- **{_md(host)}** (no report of its own here)")
            lines += [_suspect_md(s) for s in found]
        lines += ["", "Slurm (printed, not run):", "", "```sh", *drain_commands(summary), "```"]
        lines += [f"- **{_md(host)}**: {NOT_DRAINED}" for host in not_drained(summary)]
    else:
        lines.append("None.")

    lines += ["", "## Outliers", "", f"Rule: {rules_text(summary)}.", ""]
    if summary.outliers:
        rows = []
        for n, o in summary.outliers:
            s, out_ = o.metric, o.outlier
            delta = s.delta_pct(out_.value)
            rows.append(
                [
                    n.hostname,
                    s.key.label,
                    f"{out_.value:.4g} {s.unit}",
                    f"{s.spread.median:.4g} {s.unit}",
                    "-" if delta is None else f"{delta:+.1f}%",
                    "-" if out_.z is None else f"{out_.z:+.2f}",
                    "; ".join(out_.rules),
                ]
            )
        lines += _md_table(["node", "metric", "value", "fleet median", "vs median", "modified z", "flagged by"], rows)
    else:
        lines.append(summary.statistics_note or "None.")

    lines += ["", "## Metrics across nodes", ""]
    header = ["metric", "unit", "better", "nodes", "median", "min", "max", "MAD", "(max-min)/median", "expected"]
    lines += _md_table([*header, "outliers"], [_metric_row(m) for m in summary.metrics])

    lines += ["", "## Multi-node runs", ""]
    lines += _multi_node_md(summary)

    lines += ["", "## Reports not merged", ""]
    if summary.not_merged:
        header = ["report", "kind", "hostname", "reason", "fails the summary"]
        rows = [[str(r.path), r.kind, r.hostname or "-", r.reason, _yes(r.fails_fleet)] for r in _nm(summary)]
        lines += _md_table(header, rows)
    else:
        lines.append("None: every report given is in the tables above.")

    lines += ["", "## Plots", ""]
    if plot_note:
        lines.append(plot_note)
    for plot in plots:
        rel = plot.relative_to(out) if plot.is_relative_to(out) else plot
        lines += [f"![{rel.stem}]({rel.as_posix()})", ""]
    return "\n".join(lines).rstrip() + "\n"


def _multi_node_md(summary: Summary) -> list[str]:
    if not summary.multi_node:
        return ["None."]
    lines = _md_table(
        ["report", "rank 0 host", "nodes", "hosts", "verdict", "failed checks"],
        [
            [
                str(r.path),
                r.hostname,
                str(r.nodes),
                ", ".join(r.hosts) or "-",
                r.verdict.upper(),
                ", ".join(f"{c.name} ({c.category or '-'})" for c in failed_checks(r)) or "-",
            ]
            for r in summary.multi_node
        ],
    )
    lines += ["", "### Weak scaling", ""]
    if not summary.scaling:
        return [*lines, "No multi-node run has a pretraining step time with its layout."]
    lines += [
        "Efficiency = single-node step time (median of the finished single-node runs) / N-node step time; "
        "1.0 is ideal.",
        "",
    ]
    lines += _md_table(
        ["model", "nodes", "N-node layout", "N-node step", "1-node layout", "1-node step", "efficiency"],
        [_scaling_row(w) for w in summary.scaling],
    )
    for w in summary.scaling:
        if w.per_node_s:
            straggler = w.straggler
            lines += ["", f"Per-node {w.per_node_what} of {_md(str(w.run.path))} ({w.step.metric}):", ""]
            lines += _md_table(["node", f"{w.per_node_what} (s)"], [[h, f"{s:.4g}"] for h, s in w.per_node_s.items()])
            if straggler is not None:
                lines += ["", f"Straggler: {_md(straggler.host)}, {_straggler_text(w)}."]
    return lines


def _scaling_row(w: WeakScaling) -> list[str]:
    layouts = sorted({r.layout for r in w.references})
    reference = w.reference_s
    return [
        w.step.model,
        str(w.nodes),
        w.step.layout,
        f"{w.step.value_s:.4g} s",
        ", ".join(layouts) or "-",
        "-" if reference is None else f"{reference:.4g} s (median of {len(w.references)})",
        w.note if w.efficiency is None else f"{w.efficiency:.3f}",
    ]


def _straggler_text(w: WeakScaling) -> str:
    s = w.straggler
    ranks = "" if w.rank_spread_pct is None else f"; ranks' spread {w.rank_spread_pct:.1f}%"
    if s is None:
        return ranks.removeprefix("; ")
    return (
        f"{w.per_node_what}: slowest {s.slowest_s:.4g} s, fastest {s.fastest_s:.4g} s, median {s.median_s:.4g} s: "
        f"spread (max-min)/median {s.spread_pct:.1f}%{ranks}"
    )


def _metric_row(m: MetricStats) -> list[str]:
    s = m.spread
    return [
        m.key.label,
        m.unit,
        m.direction,
        str(s.nodes),
        _num(s.median),
        _num(s.minimum),
        _num(s.maximum),
        _num(s.mad),
        "-" if s.spread_pct is None else f"{s.spread_pct:.1f}%",
        _num(m.expected),
        ", ".join(o.host for o in m.outliers) or ("-" if s.nodes >= stats.MIN_NODES else "- (too few nodes)"),
    ]


def _count_reports(summary: Summary) -> str:
    kinds = Counter(r.kind for r in summary.not_merged)
    parts = [f"{len(summary.nodes)} node(s)", f"{len(summary.multi_node)} multi-node run(s)"]
    parts += [f"{count} {kind}" for kind, count in kinds.items()]
    return ", ".join(parts)


def _nm(summary: Summary) -> list[NotMerged]:
    """Corrupt first: they fail the summary."""
    return sorted(summary.not_merged, key=lambda r: (r.kind != CORRUPT, str(r.path)))


def _md(text: str) -> str:
    return one_line(text).replace("|", "\\|")


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(_md(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_md(c) for c in row) + " |" for row in rows]
    return lines


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


# --- CSV ---------------------------------------------------------------------------------------------------------

NODE_COLUMNS = (
    "hostname",
    "verdict",
    "drain",
    "reason",
    "failed_checks",
    "fault_actions",
    "outlier_metrics",
    "sku",
    "status",
    "start_time",
    *SOFTWARE,
    "report",
)


def nodes_csv(summary: Summary) -> str:
    """One row per node; one per host that only a multi-node run speaks for (a finding of it); then one per report
    not merged, its kind as the verdict and why as the reason."""
    rows: list[dict[str, object]] = []
    for n in summary.nodes:
        actions = dict.fromkeys(f"{c.category}: {c.action}" for c in n.failed if c.action)
        rows.append(
            {
                "hostname": n.hostname,
                "verdict": n.verdict,
                "drain": "yes" if n.drain else "no",
                "reason": n.drain_reason() if n.drain else "",
                "failed_checks": "; ".join(f"{c.test_id} [{c.category or '-'}]" for c in n.failed),
                "fault_actions": "; ".join(actions),
                "outlier_metrics": "; ".join(o.short() for o in n.outliers),
                "sku": n.report.sku or "",
                "status": n.report.status,
                "start_time": str(n.report.data.get("start_time") or ""),
                **n.software,
                "report": str(n.report.path),
            }
        )
    reasons = dict(summary.drain_list())
    for host, found in summary.unreported_suspects.items():
        rows.append(
            {
                "hostname": host,
                "verdict": "multi-node finding",
                "drain": "yes",
                "reason": reasons[host],
                "failed_checks": "; ".join(dict.fromkeys(f"{s.test_id} [{s.category or '-'}]" for s in found)),
                "report": "; ".join(dict.fromkeys(str(s.run) for s in found)),
            }
        )
    for r in _nm(summary):
        row: dict[str, object] = {"hostname": r.hostname or "", "verdict": r.kind, "drain": "no", "reason": r.reason}
        row["sku"] = r.sku or ""
        rows.append(row | {"report": str(r.path)})
    return _csv(NODE_COLUMNS, rows)


METRIC_COLUMNS = (
    "metric",
    "scope",
    "placement",
    "tool",
    "unit",
    "direction",
    "nodes",
    "median",
    "min",
    "max",
    "mad",
    "spread_pct",
    "expected",
    "outliers",
)


def metrics_csv(summary: Summary) -> str:
    rows: list[dict[str, object]] = []
    for m in summary.metrics:
        s = m.spread
        rows.append(
            {
                "metric": m.key.metric,
                "scope": m.key.scope,
                "placement": m.key.placement or "",
                "tool": m.key.tool or "",
                "unit": m.unit,
                "direction": m.direction,
                "nodes": s.nodes,
                "median": s.median,
                "min": s.minimum,
                "max": s.maximum,
                "mad": s.mad,
                "spread_pct": "" if s.spread_pct is None else round(s.spread_pct, 3),
                "expected": "" if m.expected is None else m.expected,
                "outliers": " ".join(o.host for o in m.outliers),
            }
        )
    return _csv(METRIC_COLUMNS, rows)


def _csv(columns: Sequence[str], rows: Sequence[Mapping[str, object]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, restval="", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


# --- terminal ----------------------------------------------------------------------------------------------------


def terminal(summary: Summary, written: Sequence[Path], plot_note: str | None) -> list[str]:
    lines = [f"gbvalidate fleet summary: {headline(summary)}"]
    if summary.sorted.sku_note.startswith("tie"):
        lines.append(f"fleet SKU: {summary.sorted.sku_note}")
    rows = [("node", "verdict", "failed checks", "outliers")]
    for n in summary.nodes:
        failed = ", ".join(f"{c.name} ({c.category or '-'})" for c in n.failed)
        rows.append((n.hostname, n.verdict.upper(), failed or "-", ", ".join(o.short() for o in n.outliers) or "-"))
    lines += _columns(rows)
    if summary.statistics_note:
        lines.append(summary.statistics_note)
    if summary.outliers:
        lines.append(f"outliers ({rules_text(summary)}):")
        lines += [f"  {n.hostname}  {o.describe()}" for n, o in summary.outliers]
    lines += [f"software differs: {d}" for d in software_differences(summary.nodes)]
    if summary.not_merged:
        lines.append("reports not merged:")
        lines += [f"  {r.kind}: {r.path}: {shorten(r.reason, MESSAGE_MAX_CHARS)}" for r in _nm(summary)]
    for r in summary.multi_node:
        lines.append(f"multi-node run {r.path}: {r.nodes} nodes, rank 0 on {r.hostname}: {r.verdict.upper()}")
    for w in summary.scaling:
        efficiency = w.note if w.efficiency is None else f"efficiency {w.efficiency:.3f}"
        reference = "" if w.reference_s is None else f" vs 1 node {w.reference_s:.4g} s"
        line = f"  weak scaling {w.step.model} on {w.nodes} nodes: step {w.step.value_s:.4g} s{reference}: {efficiency}"
        if w.straggler is not None:
            line += f"; straggler {w.straggler.host} ({_straggler_text(w)})"
        lines.append(line)
    if summary.drain_list():
        lines.append("take out of service (Slurm, printed, not run):")
        lines += [f"  {command}" for command in drain_commands(summary)]
        lines += [f"  {host}: {NOT_DRAINED}" for host in not_drained(summary)]
    if plot_note:
        lines.append(plot_note)
    lines.append("written: " + ", ".join(str(p) for p in written))
    return lines


def _suspect_md(suspect: Suspect) -> str:
    return f"  - {_md(suspect.short)} in {_md(str(suspect.run))}: {_md(shorten(suspect.why, MESSAGE_MAX_CHARS))}"


def _columns(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
