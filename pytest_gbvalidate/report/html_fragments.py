"""The node's page for a person: HTML fragments for pytest-html's page (html_page.py puts them there). No pytest.

At the top, the node's verdict and the measured-vs-baseline table, with the terminal's rows (terminal.py); beside
each test, its own figures, the pictures as PNG bytes (the page embeds them: one file that opens offline). Every text
is escaped: hostnames, messages and test ids are untrusted."""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape as html_escape

from pytest_gbvalidate.labels import visible
from pytest_gbvalidate.report import collective_tables
from pytest_gbvalidate.report.node_verdict import of_report as node_verdict_of
from pytest_gbvalidate.report.records import MeasurementRecord, RunReportRecord, TelemetryRecord
from pytest_gbvalidate.report.terminal import (
    faults_by_category,
    gated,
    level_lines,
    measured_rows,
    skipped_lines,
    verdict_line,
)

CSS_CLASS = "gbvalidate"
# Scoped to our fragments; pytest-html's own style sheet styles the rest of the page.
STYLE = f"""<style>
.{CSS_CLASS} table {{ border-collapse: collapse; margin: 0.5em 0; font-size: 12px; }}
.{CSS_CLASS} th, .{CSS_CLASS} td {{ border: 1px solid #ccc; padding: 2px 6px; text-align: left; }}
.{CSS_CLASS} .verdict {{ color: #fff; background: #6e7781; padding: 2px 8px; }}
.{CSS_CLASS} .verdict-pass {{ background: #2a7d2a; }}
.{CSS_CLASS} .verdict-warn {{ background: #9a6700; }}
.{CSS_CLASS} .verdict-fail {{ background: #b22222; }}
.{CSS_CLASS} td.cell-warn {{ color: #9a6700; font-weight: bold; }}
.{CSS_CLASS} td.cell-fail {{ color: #b22222; font-weight: bold; }}
.{CSS_CLASS} td.cell-unresolved {{ color: #6e7781; font-weight: bold; }}
</style>"""
# A measured-vs-baseline cell's first word -> its class: a WARN, a FAIL or an UNRESOLVED figure seen at a glance.
CELL_CLASSES = {"WARN": "cell-warn", "FAIL": "cell-fail", "REGRESSED": "cell-fail", "UNRESOLVED": "cell-unresolved"}


@dataclass(frozen=True)
class Extra:
    """One attachment of a test on the page: an HTML fragment (escaped already) or a PNG picture."""

    name: str
    html: str | None = None
    png: bytes | None = None


def node_verdict(report: RunReportRecord) -> str:
    """The node's verdict (node_verdict.py), WARN for a pass with a figure past its warn limit: the badge on top."""
    verdict = node_verdict_of(report)
    if verdict == "pass" and any(m["verdict"] == "warn" for m in report["measurements"]):
        return "warn"
    return verdict


def verdict_html(report: RunReportRecord) -> str:
    """The node's verdict and measured vs baseline: the top of the page."""
    sku, node = report["sku"], report.get("node")
    facts = [
        ("SKU", "-" if sku is None else sku["name"]),
        ("level", report.get("level", "-")),
        ("host", "-" if node is None else node["hostname"]),
        ("exit status", "-" if report["exit_status"] is None else str(report["exit_status"])),
        ("status", report["status"]),
    ]
    verdict = node_verdict(report)
    badge = f'<span class="verdict verdict-{verdict.replace(" ", "-")}">{verdict.upper()}</span>'
    parts = [
        STYLE,
        f'<div class="{CSS_CLASS}" id="gbvalidate-verdict">',
        f"<h2>gbvalidate: node {badge}</h2>",
        f"<p>{escape(verdict_line(report))}</p>",  # the terminal's last line: a fault apart from a run that cannot tell
        "<p>" + "; ".join(f"{escape(name)} <b>{escape(value)}</b>" for name, value in facts) + "</p>",
    ]
    by_category = faults_by_category(report["tests"])
    if by_category:
        parts.append("<h3>Failures by fault category, with the operator's action</h3><ul>")
        for category, failed in by_category.items():
            fault = failed[0]["fault"]
            tests = "".join(f"<li>{_text(t['test_id'])}: {_text(t['message'] or '')}</li>" for t in failed)
            repair = f" (repair: <b>{_text(fault['repair'])}</b>)" if "repair" in fault else ""
            parts.append(
                f"<li><b>{_text(category)}</b> ({_text(fault['disposition'])}): {_text(fault['action'])}{repair}"
                f"<ul>{tests}</ul></li>"
            )
        parts.append("</ul>")
    parts += [f"<p>{_text(line)}</p>" for line in level_lines(report)]
    skipped = skipped_lines(report["tests"])
    if skipped:
        parts.append("<ul>" + "".join(f"<li>{_text(line)}</li>" for line in skipped) + "</ul>")
    shown = gated(report["measurements"])
    parts.append("<h3>Measured vs baseline</h3>")
    parts.append(_table(measured_rows(shown)) if shown else "<p>no measurements a baseline gates</p>")
    ungated = len(report["measurements"]) - len(shown)
    if ungated:
        parts.append(f"<p>{ungated} measurements no baseline gates: beside their tests below</p>")
    parts.append("</div>")
    return "\n".join(parts)


def test_extras(test_id: str, report: RunReportRecord) -> list[Extra]:
    """What the page shows beside one test: its measurements, busbw plot, telemetry summary and loss curve."""
    measurements = [m for m in report["measurements"] if m["test_id"] == test_id]
    telemetry = [t for t in report.get("telemetry", []) if t["test_id"] == test_id]
    extras = []
    if measurements:
        rows = [row[1:] for row in measured_rows(measurements)]  # the test is the row it sits in
        extras.append(Extra("measurements", html=_fragment("Measurements", _table(rows))))
    if telemetry:
        extras.append(Extra("telemetry", html=_fragment("Telemetry", *[_telemetry(t) for t in telemetry])))
    extras += _pictures(test_id, measurements)
    return extras


def _pictures(test_id: str, measurements: Sequence[MeasurementRecord]) -> list[Extra]:
    """The busbw plot of a collective sweep and the loss curve of a pretraining run; none without matplotlib."""
    name = test_id.rsplit("::", 1)[-1]
    swept = [r for r in collective_tables.sweep_records(list(measurements)) if isinstance(r["value"], (int, float))]
    curves = [curve for m in measurements if (curve := loss_curve(m)) is not None]
    pictures = []
    try:
        if swept:
            pictures.append(
                Extra("busbw", png=collective_tables.busbw_png(swept, f"{name}: bus bandwidth per message size"))
            )
        pictures += [Extra("loss curve", png=loss_png(curve, f"{name}: loss per step")) for curve in curves[:1]]
    except ImportError:  # matplotlib is optional (the `plots` extra): the tables say it all
        return []
    return pictures


def loss_curve(measurement: MeasurementRecord) -> list[float] | None:
    """A pretraining measurement's loss per step, where its details hold a list of numbers."""
    curve = measurement["details"].get("loss_curve")
    if not isinstance(curve, list) or not curve:
        return None
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in curve):
        return None
    return [float(x) for x in curve]


def loss_png(losses: Sequence[float], title: str) -> bytes:
    """The loss against the step as a PNG (steps whose loss is not finite left out). Needs matplotlib."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure  # without pyplot: no global figure registry

    points = [(step, x) for step, x in enumerate(losses, start=1) if math.isfinite(x)]
    figure = Figure(figsize=(6, 3))
    FigureCanvasAgg(figure)
    ax = figure.add_subplot()
    if points:
        ax.plot([p[0] for p in points], [p[1] for p in points], marker=".")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    figure.tight_layout()
    png = io.BytesIO()
    figure.savefig(png, format="png", dpi=80)
    return png.getvalue()


def _telemetry(record: TelemetryRecord) -> str:
    label = f" ({record['label']})" if record["label"] else ""
    head = (
        f"<p>{record['sample_count']} samples over {record['duration_s']:.1f} s, every {record['interval_s']:g} s"
        f"{_text(label)}</p>"
    )
    rows: list[tuple[str, ...]] = [("series", "mean", "p5", "p95")]
    rows += [
        (series, *(collective_tables.number(figures.get(k)) for k in ("mean", "p5", "p95")))
        for series, figures in record["summary"].items()
    ]
    errors = "".join(f"<p>error: {_text(e)}</p>" for e in record["errors"])
    return head + _table(rows) + errors


def _fragment(title: str, *body: str) -> str:
    return f'<div class="{CSS_CLASS}"><h4>{escape(title)}</h4>{"".join(body)}</div>'


def _table(rows: Sequence[Sequence[str]]) -> str:
    """A header row and its data rows, every cell escaped."""
    header, *data = rows
    head = "".join(f"<th>{_text(c)}</th>" for c in header)
    body = "".join("<tr>" + "".join(_cell(c) for c in row) + "</tr>" for row in data)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _cell(value: str) -> str:
    found = CELL_CLASSES.get(value.split(" ", 1)[0]) if value else None
    return f'<td class="{found}">{_text(value)}</td>' if found else f"<td>{_text(value)}</td>"


def _text(value: object) -> str:
    return escape(str(value))


def escape(text: str) -> str:
    """`text` for the page: HTML's special characters escaped, those that do not print as escapes (labels.visible)."""
    return html_escape(visible(text), quote=True)
