"""The fleet summary as text: Markdown (summary.md), CSV (nodes.csv, metrics.csv), the compact terminal summary,
and the lines that take nodes out of service (commands.py: printed for the operator, never run). Each document is
its sections in order, one function per section and format; the sections of numbers are in render_stats.py. A
node's row is formatted once (`node_row`) for the Markdown table, the terminal and nodes.csv."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pytest_gbvalidate.fleet import render_stats as stats
from pytest_gbvalidate.fleet.commands import NOT_DRAINED, drain_commands, kubectl_commands, kubectl_notes, not_drained
from pytest_gbvalidate.fleet.findings import SESSION_CHECK, Suspect
from pytest_gbvalidate.fleet.markup import checks_cell, columns, csv_text, md, md_table, yes
from pytest_gbvalidate.fleet.reports import CORRUPT, NO_VERDICT, NotMerged
from pytest_gbvalidate.fleet.summary import FLAPPING, SOFTWARE, UNCONFIRMED, Node, Summary
from pytest_gbvalidate.fleet.text import shorten

# Long failure messages are cut in tables: the whole message is in the node's own report.
MESSAGE_MAX_CHARS = 160


def markdown(summary: Summary, plots: Sequence[Path], plot_note: str | None, out: Path) -> str:
    sections = (_overview_md, _software_md, _nodes_md, _domains_md, _drain_md, stats.outliers_md, stats.metrics_md)
    lines = [line for section in (*sections, stats.multi_node_md, _not_merged_md) for line in section(summary)]
    return "\n".join([*lines, *_plots_md(plots, plot_note, out)]).rstrip() + "\n"


def nodes_csv(summary: Summary) -> str:
    """One row per node; one per host that only a multi-node run speaks for (a finding of it); then one per report
    not merged, its kind as the verdict and why as the reason."""
    return csv_text(NODE_COLUMNS, [*_nodes_rows(summary), *_drain_rows(summary), *_not_merged_rows(summary)])


def metrics_csv(summary: Summary) -> str:
    return csv_text(stats.METRIC_COLUMNS, stats.metrics_rows(summary))


def terminal(summary: Summary, written: Sequence[Path], plot_note: str | None) -> list[str]:
    sections = [_overview_terminal, _nodes_terminal, _domains_terminal, stats.outliers_terminal, _software_terminal]
    sections += [_not_merged_terminal, stats.multi_node_terminal, _drain_terminal]
    return [*(line for section in sections for line in section(summary)), *_outputs_terminal(written, plot_note)]


def headline(summary: Summary) -> str:
    counts = Counter(n.fleet_verdict for n in summary.nodes)
    shown = ("pass", "fail", FLAPPING, "unresolved", UNCONFIRMED, "partial", NO_VERDICT)
    verdicts = ", ".join(f"{counts[v]} {v}" for v in shown if counts[v])
    outlying = sum(1 for n in summary.nodes if n.outliers)
    failures = summary.failures()
    outcome = "FAIL (exit 1): " + "; ".join(failures) if failures else "PASS (exit 0)"
    if failures and summary.shadow:
        outcome = "SHADOW MODE (exit 0), would fail: " + "; ".join(failures)
    nodes = f"{len(summary.nodes)} nodes" + (f" ({verdicts})" if verdicts else "")
    return f"SKU {summary.sku}, {nodes}, {outlying} outlier node(s): {outcome}"


def _overview_md(summary: Summary) -> list[str]:
    given = [f"{len(summary.nodes)} node(s)", f"{len(summary.multi_node)} multi-node run(s)"]
    given += [f"{count} {kind}" for kind, count in Counter(r.kind for r in summary.not_merged).items()]
    lines = [f"# Fleet summary: SKU {md(str(summary.sku))}", "", f"**{md(headline(summary))}**", ""]
    lines += [f"- reports given: {', '.join(given)}", f"- fleet SKU: {summary.sku} ({summary.sorted.sku_note})"]
    note = [f"- {summary.statistics_note}"] if summary.statistics_note else []
    return [*lines, f"- outliers: {stats.rules_text(summary)}", *note]


def _overview_terminal(summary: Summary) -> list[str]:
    lines = [f"gbvalidate fleet summary: {headline(summary)}"]
    if summary.sorted.sku_note.startswith("tie"):
        lines.append(f"fleet SKU: {summary.sorted.sku_note}")
    return lines


def software_differences(nodes: Sequence[Node]) -> list[str]:
    """`torch: 2.13.0 (4 node(s)), 2.12.0 (1 node(s): node-3)` for each part of the stack that differs."""
    lines = []
    for name in SOFTWARE:
        by_version: dict[str, list[str]] = {}
        for n in nodes:
            by_version.setdefault(n.software.get(name, "(none)"), []).append(n.hostname)
        if len(by_version) > 1:
            ranked = sorted(by_version.items(), key=lambda item: -len(item[1]))
            parts = [f"{v} ({len(h)} node(s)" + (f": {', '.join(h)})" if len(h) <= 3 else ")") for v, h in ranked]
            lines.append(f"{name}: {', '.join(parts)}")
    return lines


def _software_md(summary: Summary) -> list[str]:
    """Bullets of the overview's list."""
    return [f"- software differs across nodes: {md(d)}" for d in software_differences(summary.nodes)]


def _software_terminal(summary: Summary) -> list[str]:
    return [f"software differs: {d}" for d in software_differences(summary.nodes)]


# The nodes table's columns before the software ones, for people; the terminal shows the first four.
NODE_TABLE = ("node", "verdict", "failed checks", "outlier metrics", "drain", "level")
TERMINAL_NODE_TABLE = ("node", "verdict", "failed checks", "outliers")
NODE_COLUMNS = (
    *("hostname", "verdict", "drain", "reason", "failed_checks", "fault_actions", "outlier_metrics", "sku", "level"),
    *("status", "start_time", *SOFTWARE, "report"),
)


@dataclass(frozen=True)
class NodeRow:
    """A node's row, each field formatted once: people read `cells` (the verdict in capitals, checks by name, "-"
    for none); programs read `csv` (the report's own verdict and test ids, "; " between items, empty for none)."""

    hostname: str
    verdict: str  # Node.fleet_verdict: the report's, unresolved where the fleet could not judge a passing node
    drain: str  # yes or no
    drain_reason: str  # empty where the node stays in service
    checks: str  # the failed checks for people (`checks_cell`)
    check_ids: tuple[str, ...]  # the failed checks by test id and fault category
    fault_actions: tuple[str, ...]  # "category: action" of the failed checks, each once
    outliers: tuple[str, ...]  # "metric [scope] -12%"
    software: dict[str, str]  # the parts of the stack the report names
    sku: str
    level: str  # the check level the node's report took on: a quick run's pass says less than a full one's
    status: str
    start_time: str
    report: str

    def cells(self, software: Sequence[str]) -> list[str]:
        """The cells under NODE_TABLE, then `software`'s versions."""
        outliers = ", ".join(self.outliers) or "-"
        people = [self.hostname, self.verdict.upper(), self.checks, outliers, self.drain, self.level or "-"]
        return people + [self.software.get(name, "-") for name in software]

    def csv(self) -> dict[str, object]:
        row: dict[str, object] = {"hostname": self.hostname, "verdict": self.verdict, "drain": self.drain}
        row |= {"reason": self.drain_reason, "failed_checks": "; ".join(self.check_ids)}
        row |= {"fault_actions": "; ".join(self.fault_actions), "outlier_metrics": "; ".join(self.outliers)}
        row |= {"sku": self.sku, "level": self.level, "status": self.status, "start_time": self.start_time}
        return row | self.software | {"report": self.report}


def node_row(n: Node, held: bool = False) -> NodeRow:
    """The node's row; `held`: the breaker tripped, and a node to take out is held (no drain line)."""
    return NodeRow(
        hostname=n.hostname,
        verdict=n.fleet_verdict,
        drain="held" if held and n.drain else yes(n.drain),
        drain_reason=n.drain_reason() if n.drain else "",
        checks=checks_cell(n.failed),
        check_ids=tuple(_check_id(c.test_id, c.category) for c in n.failed),
        fault_actions=tuple(dict.fromkeys(f"{c.category}: {c.action}" for c in n.failed if c.action)),
        outliers=tuple(o.short() for o in n.outliers),
        software=n.software,
        sku=n.report.sku or "",
        level=n.report.level,
        status=n.report.status,
        start_time=str(n.report.data.get("start_time") or ""),
        report=str(n.report.path),
    )


def _nodes_md(summary: Summary) -> list[str]:
    software = [name for name in SOFTWARE if any(name in n.software for n in summary.nodes)]
    held = bool(summary.tripped)  # the whole drain list, judged once: not once a row
    rows = [node_row(n, held).cells(software) for n in summary.nodes]
    why_none = [  # the run's own words: what to fix before it can speak for its node
        f"- **{md(n.hostname)}** (no verdict): {md(shorten(c.message, MESSAGE_MAX_CHARS))}"
        for n in summary.nodes
        if n.fleet_verdict == NO_VERDICT
        for c in n.failed
        if c.test_id == SESSION_CHECK
    ]
    why_none += [f"- {md(note)}" for n in summary.nodes if (note := n.confirm_note()) is not None]
    return ["", "## Nodes", "", *md_table([*NODE_TABLE, *software], rows), *(["", *why_none] if why_none else [])]


def _nodes_terminal(summary: Summary) -> list[str]:
    held = bool(summary.tripped)
    rows = [node_row(n, held).cells([])[: len(TERMINAL_NODE_TABLE)] for n in summary.nodes]
    return [*columns([TERMINAL_NODE_TABLE, *rows]), *filter(None, (n.confirm_note() for n in summary.nodes))]


def _nodes_rows(summary: Summary) -> list[dict[str, object]]:
    held = bool(summary.tripped)
    return [node_row(n, held).csv() for n in summary.nodes]


def _check_id(test_id: str, category: str | None) -> str:
    """A failed check for nodes.csv: its whole test id and its fault category."""
    return f"{test_id} [{category or '-'}]"


def _domains_md(summary: Summary) -> list[str]:
    if not summary.domains:
        return []
    return ["", "## NVLink domains", "", *[f"- {md(finding.line())}" for finding in summary.domains]]


def _domains_terminal(summary: Summary) -> list[str]:
    return [finding.line() for finding in summary.domains]


# Shadow mode's word where the drain and kubectl lines would be (Summary.shadow).
SHADOW_LINE = "would take out of service (shadow mode: no drain or kubectl line printed, nothing taken out):"


def _drain_md(summary: Summary) -> list[str]:
    """Each node with everything against it, then the Slurm lines."""
    lines = ["", "## Take out of service", ""]
    if summary.tripped:
        held = ", ".join(md(node.host) for node in summary.take_out)
        return [*lines, f"None: the {md(summary.tripped)}.", "", f"Held: {held}."]
    if not summary.drain_list():
        return [*lines, "None."]
    lines += [md(SHADOW_LINE), ""] if summary.shadow else []
    for n in summary.drained:
        lines.append(f"- **{md(n.hostname)}** ({n.verdict}): {md(n.drain_reason())}")
        lines += [
            f"  - {md(c.name)}: {md(c.category or 'no fault category')}"
            + (f" ({c.disposition})" if c.disposition else "")
            + (f", action: {md(c.action)}" if c.action else "")
            + f"; {md(shorten(c.message, MESSAGE_MAX_CHARS))}"
            for c in n.failed
        ]
        lines += [f"  - outlier {md(o.describe())}" for o in n.outliers]
        lines += [_suspect_md(s) for s in n.suspected]
    for host, found in summary.unreported_suspects.items():
        lines.append(f"- **{md(host)}** (no report of its own here)")
        lines += [_suspect_md(s) for s in found]
    if summary.shadow:
        return lines
    lines += ["", "Slurm (printed, not run):", "", "```sh", *drain_commands(summary), "```"]
    lines += [f"- **{md(host)}**: {NOT_DRAINED}" for host in not_drained(summary)]
    lines += ["", "Kubernetes (printed, not run):", "", "```sh", *kubectl_commands(summary), "```"]
    lines += [f"- {md(note)}" for note in kubectl_notes(summary)]
    return lines


def _suspect_md(suspect: Suspect) -> str:
    return f"  - {md(suspect.short)} in {md(str(suspect.run))}: {md(shorten(suspect.why, MESSAGE_MAX_CHARS))}"


def _drain_terminal(summary: Summary) -> list[str]:
    if summary.tripped:
        return [summary.tripped]
    if not summary.drain_list():
        return []
    if summary.shadow:
        return [SHADOW_LINE, *(f"  would drain {node.host}: {node.reason}" for node in summary.drain_list())]
    lines = ["take out of service (Slurm, printed, not run):", *(f"  {c}" for c in drain_commands(summary))]
    lines += [f"  {host}: {NOT_DRAINED}" for host in not_drained(summary)]
    lines += ["take out of service (Kubernetes, printed, not run):", *(f"  {c}" for c in kubectl_commands(summary))]
    lines += [f"  {note}" for note in kubectl_notes(summary)]
    return lines


def _drain_rows(summary: Summary) -> list[dict[str, object]]:
    """nodes.csv's rows for the hosts that only a multi-node run speaks for: the nodes have rows of their own."""
    reasons = {node.host: node.reason for node in summary.drain_list()}
    return [
        {
            "hostname": host,
            "verdict": "multi-node finding",
            "drain": "held" if summary.tripped else "yes",
            "reason": reasons[host],
            "failed_checks": "; ".join(dict.fromkeys(_check_id(s.test_id, s.category) for s in found)),
            "report": "; ".join(dict.fromkeys(str(s.run) for s in found)),
        }
        for host, found in summary.unreported_suspects.items()
    ]


def _not_merged(summary: Summary) -> list[NotMerged]:
    """Corrupt first: they fail the summary."""
    return sorted(summary.not_merged, key=lambda r: (r.kind != CORRUPT, str(r.path)))


def _not_merged_md(summary: Summary) -> list[str]:
    lines = ["", "## Reports not merged", ""]
    if not summary.not_merged:
        return [*lines, "None: every report given is in the tables above."]
    header = ["report", "kind", "hostname", "reason", "fails the summary"]
    rows = [[str(r.path), r.kind, r.hostname or "-", r.reason, yes(r.fails_fleet)] for r in _not_merged(summary)]
    return lines + md_table(header, rows)


def _not_merged_terminal(summary: Summary) -> list[str]:
    found = [f"  {r.kind}: {r.path}: {shorten(r.reason, MESSAGE_MAX_CHARS)}" for r in _not_merged(summary)]
    return ["reports not merged:", *found] if found else []


def _not_merged_rows(summary: Summary) -> list[dict[str, object]]:
    return [
        dict(
            hostname=r.hostname or "", verdict=r.kind, drain="no", reason=r.reason, sku=r.sku or "", report=str(r.path)
        )
        for r in _not_merged(summary)
    ]


def _plots_md(plots: Sequence[Path], plot_note: str | None, out: Path) -> list[str]:
    """Each plot by its path relative to summary.md's folder, so that the folder can move."""
    lines = ["", "## Plots", "", *([plot_note] if plot_note else [])]
    for plot in plots:
        rel = plot.relative_to(out) if plot.is_relative_to(out) else plot
        lines += [f"![{rel.stem}]({rel.as_posix()})", ""]
    return lines


def _outputs_terminal(written: Sequence[Path], plot_note: str | None) -> list[str]:
    lines = [plot_note] if plot_note else []
    return [*lines, "written: " + ", ".join(str(p) for p in written)]
