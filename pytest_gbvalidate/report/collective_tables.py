"""Collective sweeps (ours and the reference tools'): nccl-tests-like tables per message size, and a busbw plot."""

from __future__ import annotations

import io
from typing import Any

from pytest_gbvalidate import labels
from pytest_gbvalidate.report.records import MeasurementRecord

OUR_TOOL = "pytest-gbvalidate"
_PLACEMENT_ORDER = ("out_of_place", "in_place")


def sweep_records(records: list[MeasurementRecord]) -> list[MeasurementRecord]:
    """The measurements that are one size of a collective sweep (ours or a reference tool's)."""
    return [r for r in records if r.get("scope_kind") == "message_size" and "placement" in (r.get("details") or {})]


def sweep_tables(records: list[MeasurementRecord]) -> list[str]:
    """One table per collective and tool, a row per size as nccl-tests prints them, and the gated sizes' verdict."""
    groups: dict[tuple[str, str], dict[str, dict[str, MeasurementRecord]]] = {}
    for record in sweep_records(records):
        tool = record["details"].get("tool", OUR_TOOL)
        rows = groups.setdefault((record["metric"], tool), {})
        rows.setdefault(record["scope"], {})[record["details"]["placement"]] = record
    lines: list[str] = []
    for (metric, tool), rows in groups.items():
        placements = [p for p in _PLACEMENT_ORDER if any(p in by_place for by_place in rows.values())]
        header = ["size", "count", "type"]
        for p in placements:
            header += [f"{p}:time_us", "algbw", "busbw", "#wrong"]
        header += ["gate"]
        table = [header]
        for label, by_place in sorted(rows.items(), key=lambda item: _first(item[1])["details"].get("size_bytes", 0)):
            first = _first(by_place)
            row = [label, str(first["details"].get("count", "")), str(first["details"].get("dtype", ""))]
            for p in placements:
                r = by_place.get(p)
                if r is None:
                    row += ["-"] * 4
                    continue
                d = r["details"]
                if d.get("not_run"):  # "memory: needs ..." -> "not run (memory)"
                    row += [f"not run ({str(d['not_run']).split(':')[0]})", "-", "-", "-"]
                    continue
                row += [number(d.get("time_us")), number(d.get("algbw_gbps")), number(r["value"])]
                row += ["-" if d.get("wrong") is None else str(d["wrong"])]
            row += [_gate(by_place)]
            table.append(row)
        widths = [max(len(row[i]) for row in table) for i in range(len(header))]
        lines.append(f"{metric} ({tool}; GB/s with GB = 1e9 bytes)")
        lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in table]
        lines.append("")
    return lines[:-1] if lines else lines


def _first(by_place: dict[str, MeasurementRecord]) -> MeasurementRecord:
    return next(iter(by_place.values()))


def _gate(by_place: dict[str, MeasurementRecord]) -> str:
    gated = [r for r in by_place.values() if r.get("verdict") not in (None, "info")]
    if not gated:
        return ""
    expected = next((r.get("expected") for r in gated if r.get("expected") is not None), None)
    verdicts = "/".join(sorted({r["verdict"].upper() for r in gated}))
    return verdicts if expected is None else f"{verdicts} (expected {number(expected)})"


def busbw_series(records: list[MeasurementRecord]) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """One collective's plotted lines: (tool, placement) -> (size in bytes, busbw) by size, the last measured of a
    size as the tables keep it (the quick level's all_reduce size is measured again by the sweep)."""
    lines: dict[tuple[str, str], dict[int, float]] = {}
    for r in records:
        d, value = r["details"], r["value"]
        if isinstance(value, (int, float)):
            lines.setdefault((d.get("tool", OUR_TOOL), d["placement"]), {})[d["size_bytes"]] = value
    return {line: sorted(points.items()) for line, points in lines.items()}


def busbw_png(records: list[MeasurementRecord], title: str) -> bytes:
    """busbw against message size as a PNG, one panel per collective, with the baseline's expected values and
    fail limits where it has them. Needs matplotlib (an optional dependency): ImportError without it."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    from pytest_gbvalidate.labels import size_label

    by_metric: dict[str, list[MeasurementRecord]] = {}
    for r in sweep_records(records):
        if isinstance(r["value"], (int, float)):
            by_metric.setdefault(r["metric"], []).append(r)
    fig, axes = plt.subplots(len(by_metric), 1, figsize=(9, 3.2 * len(by_metric)), squeeze=False)
    for ax, (metric, rs) in zip(axes[:, 0], sorted(by_metric.items()), strict=True):
        for (tool, placement), points in sorted(busbw_series(rs).items()):
            xs, ys = zip(*sorted(points), strict=True)
            ax.plot(xs, ys, marker=".", label=f"{tool} {placement}")
        expected = sorted({(r["details"]["size_bytes"], r["expected"]) for r in rs if r.get("expected") is not None})
        limits = sorted({(r["details"]["size_bytes"], r["limit"]) for r in rs if r.get("limit") is not None})
        if expected:
            xs, ys = zip(*expected, strict=True)
            ax.scatter(xs, ys, marker="o", s=70, facecolors="none", edgecolors="black", label="baseline expected")
        if limits:
            xs, ys = zip(*limits, strict=True)
            ax.scatter(xs, ys, marker="x", s=70, color="red", label="baseline fail limit")
        ax.set_xscale("log", base=2)
        sizes = [r["details"]["size_bytes"] for r in rs]
        first, last = min(sizes).bit_length() - 1, max(sizes).bit_length() - 1
        step = max(1, -(-(last - first) // 10))  # at most about ten labelled sizes
        ax.set_xticks(
            [2**k for k in range(first, last + 1, step)], [size_label(2**k) for k in range(first, last + 1, step)]
        )
        ax.set_xlabel("message size")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_title(metric)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100)
    plt.close(fig)
    return png.getvalue()


def number(value: Any) -> str:
    """A figure as the tables show it: labels.number (4 significant digits), `-` for none."""
    if value is None:
        return "-"
    if isinstance(value, (int, float)):
        return labels.number(value)
    return str(value)
