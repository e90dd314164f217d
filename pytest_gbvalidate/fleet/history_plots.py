"""PNG plots of one node's history (`fleet history DIR/<hostname> --plots OUT`): a file per metric, `OUT/<metric>.png`,
its value over the node's runs, a line per scope (and placement and tool in sweeps), the baseline's expected values
dashed, a failed measurement marked with a red cross. matplotlib is optional, as for plots.py. A metric whose name
is no file name (a site's metric named with a `/`, say) is not plotted, and the note says so.
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_gbvalidate.files import atomic_write_bytes
from pytest_gbvalidate.fleet.history import NodeHistory, Trend
from pytest_gbvalidate.labels import printable_exactly
from pytest_gbvalidate.report.records import FAIL

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DPI = 80
_FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,150}")
LEGEND_MAX = 24  # lines named in the legend; a GPU node's 30 message sizes would hide the plot


def plot_history(history: NodeHistory, directory: Path) -> tuple[list[Path], str | None]:
    """The plots written under `directory`, and a note where some or all were not drawn. Raises OutputError
    (naming the file) where one cannot be written."""
    try:
        import matplotlib
        from matplotlib.backends.backend_agg import FigureCanvasAgg
    except ImportError:
        return [], "plots skipped: matplotlib is not installed (pip install 'pytest-gbvalidate[plots]')"
    by_metric: dict[str, list[Trend]] = {}
    for trend in history.trends:
        if any(p.value is not None for p in trend.points):
            by_metric.setdefault(trend.key.metric, []).append(trend)
    notes, paths = [], []
    for metric, trends in by_metric.items():
        if not _FILE_NAME.fullmatch(metric):
            notes.append(f"'{metric}' not plotted: its name cannot name a file")
            continue
        # One font, the one matplotlib ships (no fallback chain to search), and no hinting: less time per text. No
        # mathtext: a report's `$\\x$` in a name is text, not a formula that fails to parse.
        with matplotlib.rc_context({"font.family": ["DejaVu Sans"], "text.hinting": "none", "text.parse_math": False}):
            figure = _figure(history.hostname, metric, trends)
            FigureCanvasAgg(figure)
            png = io.BytesIO()
            figure.savefig(png, format="png", dpi=DPI)
        path = directory / f"{metric}.png"
        atomic_write_bytes(path, png.getvalue())
        paths.append(path)
    if not by_metric:
        notes.append("no measurement with a number to plot")
    return paths, "; ".join(notes) or None


def _figure(hostname: str, metric: str, trends: Sequence[Trend]) -> Figure:
    from matplotlib.figure import Figure  # without pyplot: no backend machinery, no global figure registry

    figure = Figure(figsize=(8, 4.5))
    ax = figure.add_subplot()
    expected: set[float] = set()
    for trend in trends:
        # Days since 1970: matplotlib's date numbers (its default epoch since 3.3), shown as dates by xaxis_date().
        points = [(p.start.timestamp() / 86400, p.value, p.verdict) for p in trend.points if p.value is not None]
        label = ", ".join(part for part in (trend.key.scope, trend.key.placement, trend.key.tool) if part)
        ax.plot([x for x, _, _ in points], [y for _, y, _ in points], marker="o", markersize=3, label=label)
        failed = [(x, y) for x, y, verdict in points if verdict == FAIL]
        ax.scatter([x for x, _ in failed], [y for _, y in failed], marker="x", color="red", zorder=3)
        expected |= {p.expected for p in trend.points[-1:] if p.expected is not None}
    ax.xaxis_date()
    for value in sorted(expected):
        ax.axhline(value, color="tab:green", linestyle="dashed", linewidth=0.8)
    units = sorted({t.unit for t in trends})
    direction = trends[0].direction
    ax.set_title(f"{printable_exactly(hostname)}: {metric} ({', '.join(units)}; {direction} is better)", fontsize=9)
    ax.set_ylabel(", ".join(units), fontsize=8)
    ax.tick_params(labelsize=7)
    if len(trends) <= LEGEND_MAX:
        ax.legend(fontsize=6, ncol=1 + len(trends) // 8)
    figure.autofmt_xdate()
    return figure
