"""PNG plots of the metrics across the nodes: one band per metric, the nodes along the x axis.

Each band shows every node's value relative to the fleet median (the solid line through the band), better up
whatever the metric's direction, the baseline's expected value (dashed, green), the practical margin below the median
(dotted), and the outliers in red; a value beyond the band's range sits on its edge as a triangle. All bands of a
page share one set of axes, without ticks, at a low resolution: matplotlib's cost is per axes, per tick and per
glyph, and the whole command with 20 nodes' reports has to take under a second (benchmarks/fleet_summary.py times
it). matplotlib is optional (`pip install 'pytest-gbvalidate[plots]'`): without it the plots are skipped with a note.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_gbvalidate.files import atomic_write_bytes
from pytest_gbvalidate.fleet.findings import MetricStats
from pytest_gbvalidate.fleet.summary import Summary
from pytest_gbvalidate.rules.outliers import DEFAULT_PCT, LOWER

if TYPE_CHECKING:
    from matplotlib.figure import Figure

BANDS_PER_PAGE = 40  # more metrics (a GPU node's per-GPU scopes) go on further pages: fleet-2.png, ...
PLOT_NAME = re.compile(r"fleet(-[0-9]+)?\.png")  # every name a page may have: the command line keeps reports off them
DPI = 120  # a 6-point label is 10 pixels high: read where the page shows the picture, without zooming
BAND_HALF = 0.36  # of a band's height of 1, the rest is a gap
BAND_IN = 0.3  # inches per band
NODE_IN = 0.2  # inches per node along the x axis
CHAR_IN = 0.05  # about one character of a 6-point label, to size the margins without measuring text (slow)


def plot_fleet(summary: Summary, directory: Path) -> tuple[list[Path], str | None]:
    """The plots written under `directory`, and a note where some or all were not drawn."""
    try:
        import matplotlib
        from matplotlib.backends.backend_agg import FigureCanvasAgg
    except ImportError:
        return [], "plots skipped: matplotlib is not installed (pip install 'pytest-gbvalidate[plots]')"
    drawable = [m for m in summary.metrics if m.spread.median != 0]
    dropped = len(summary.metrics) - len(drawable)
    note = f"{dropped} metric(s) with a fleet median of 0 not plotted" if dropped else None
    hosts = [n.hostname for n in summary.nodes if n.report.finished]
    if not drawable or not hosts:
        return [], note or "no metric to plot"
    directory.mkdir(parents=True, exist_ok=True)
    pages = [drawable[i : i + BANDS_PER_PAGE] for i in range(0, len(drawable), BANDS_PER_PAGE)]
    paths = []
    for number, page in enumerate(pages, start=1):
        path = directory / ("fleet.png" if len(pages) == 1 else f"fleet-{number}.png")
        # One font, the one matplotlib ships (no fallback chain to search), and no hinting: less time per text. No
        # mathtext: a report's `$\\x$` in a name is text, not a formula that fails to parse.
        with matplotlib.rc_context({"font.family": ["DejaVu Sans"], "text.hinting": "none", "text.parse_math": False}):
            figure = _page(summary, hosts, page)
            FigureCanvasAgg(figure)
            png = io.BytesIO()
            figure.savefig(png, format="png", dpi=DPI)
        atomic_write_bytes(path, png.getvalue())
        paths.append(path)
    return paths, note


_Xy = tuple[list[float], list[float]]


def _points(
    metrics: Sequence[MetricStats], centers: Sequence[float], x_of: dict[str, int], span: float
) -> tuple[_Xy, _Xy, list[tuple[float, float, str, str]], list[float], _Xy]:
    """Where each node's figure goes on its metric's band: the normal ones, the outliers, those off the band (x, y on
    its edge, marker, colour), and each band's expected value, on it or (as a marker on its edge) beyond it."""
    normal: _Xy = ([], [])
    flagged: _Xy = ([], [])
    off_band: list[tuple[float, float, str, str]] = []
    expected_y: list[float] = []
    expected_off: _Xy = ([], [])
    for center, m in zip(centers, metrics, strict=True):
        outlying = {o.host for o in m.outliers}
        for host, value in m.values.items():
            offset = _relative(m, value) / span
            y = center + max(-1.0, min(1.0, offset)) * BAND_HALF
            if abs(offset) > 1:
                off_band.append((x_of[host], y, "^" if offset > 0 else "v", "red" if host in outlying else "tab:blue"))
            else:
                target = flagged if host in outlying else normal
                target[0].append(x_of[host])
                target[1].append(y)
        if m.expected is not None:
            offset = _relative(m, m.expected) / span
            if abs(offset) <= 1:
                expected_y.append(center + offset * BAND_HALF)
            else:
                expected_off[offset > 0].append(center + (BAND_HALF if offset > 0 else -BAND_HALF))
    return normal, flagged, off_band, expected_y, expected_off


def _page(summary: Summary, hosts: Sequence[str], metrics: Sequence[MetricStats]) -> Figure:
    from matplotlib.figure import Figure  # without pyplot: no backend machinery, no global figure registry

    # The band's range: twice the percent rule's limit, so that limit sits half-way down; a rule switched off
    # (inf) leaves the largest deviation shown.
    deviations = [abs(_relative(m, v)) for m in metrics for v in m.values.values()]
    margins = [_margin(summary, m) for m in metrics]
    finite = [margin for margin in margins if math.isfinite(margin)]
    span = 2 * max(finite) if finite and max(finite) > 0 else max(deviations, default=0) or 1.0
    labels = [m.key.label for m in metrics]  # short: every glyph drawn costs time
    left_in = CHAR_IN * max(len(label) for label in labels) + 0.2
    bottom_in = CHAR_IN * max(len(h) for h in hosts) + 0.3
    limit = "; dotted: the practical margin" if finite else ""
    title = (
        f"SKU {summary.sku}: each node against the fleet median (solid line), better up, band \u00b1{span * 100:.0f}%\n"
        f"dashed green: baseline expected (triangle: off the band){limit}; red: outlier"
    )
    top_in = 0.4
    title_in = CHAR_IN * max(len(line) for line in title.splitlines()) + 0.2
    width_in = max(left_in + max(3.0, NODE_IN * len(hosts)) + 0.2, title_in)
    height_in = BAND_IN * len(metrics) + bottom_in + top_in
    figure = Figure(figsize=(width_in, height_in))
    figure.subplots_adjust(
        left=left_in / width_in, right=1 - 0.2 / width_in, bottom=bottom_in / height_in, top=1 - top_in / height_in
    )
    ax = figure.add_subplot()
    x_of = {h: i for i, h in enumerate(hosts)}
    centers = [-float(i) for i in range(len(metrics))]
    normal, flagged, off_band, expected_y, expected_off = _points(metrics, centers, x_of, span)
    x_min, x_max = -0.5, len(hosts) - 0.5
    ax.hlines([c + 0.5 for c in centers[1:]], x_min, x_max, color="0.7", linewidth=0.5)  # between the bands
    ax.hlines(centers, x_min, x_max, color="black", linewidth=0.7)
    dotted = [c - margin / span * BAND_HALF for c, margin in zip(centers, margins, strict=True) if margin <= span]
    if dotted:
        ax.hlines(dotted, x_min, x_max, color="0.35", linewidth=0.8, linestyles="dotted")
    if expected_y:
        ax.hlines(expected_y, x_min, x_max, color="tab:green", linewidth=0.8, linestyles="dashed")
    for marker, ys in zip("v^", expected_off, strict=True):
        ax.scatter([x_min + 0.15] * len(ys), ys, s=22, marker=marker, color="tab:green", zorder=4)
    ax.scatter(normal[0], normal[1], s=9, color="tab:blue", zorder=3)
    ax.scatter(flagged[0], flagged[1], s=22, color="red", zorder=4)
    for marker in ("^", "v"):
        chosen = [point for point in off_band if point[2] == marker]
        xs, ys, colors = [p[0] for p in chosen], [p[1] for p in chosen], [p[3] for p in chosen]
        ax.scatter(xs, ys, s=22, marker=marker, color=colors, zorder=4)
    ax.set_xlim(x_min, x_max)
    bottom = centers[-1] - 0.5
    ax.set_ylim(bottom, 0.5)
    # Labels as plain texts, no axis: matplotlib's ticks cost more than the texts they carry.
    ax.set_axis_off()
    for center, label in zip(centers, labels, strict=True):
        ax.text(x_min - 0.2, center, label, fontsize=6, ha="right", va="center")
    for x, host in enumerate(hosts):
        ax.text(x, bottom - 0.1, host, fontsize=6, ha="center", va="top", rotation=90)
    # A figure text, not an axes title: the title's automatic placement measures the axes' texts again.
    figure.text(0.1 / width_in, 1 - 0.08 / height_in, title, fontsize=6, va="top")
    return figure


def _margin(summary: Summary, m: MetricStats) -> float:
    """How far below the median (a fraction of it, as _relative draws it) the practical margin lies: the summary's
    percent, else the metric's needed resolution (a log ratio), else the default percent."""
    if summary.pct is not None:
        return summary.pct / 100
    if m.needed_pct is None:
        return DEFAULT_PCT / 100
    log = m.needed_pct / 100
    return math.expm1(log) if m.direction == LOWER else -math.expm1(-log)


def _relative(m: MetricStats, value: float) -> float:
    """`value` against the median as a fraction, positive when better."""
    relative = (value - m.spread.median) / abs(m.spread.median)
    return -relative if m.direction == LOWER else relative
