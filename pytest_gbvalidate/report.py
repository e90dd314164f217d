"""Reports: the JSON run report (rewritten atomically as results arrive, so a crash loses nothing already
measured), JUnit properties, and the terminal table. No pytest here."""

from __future__ import annotations

import datetime as dt
import io
import json
import math
from pathlib import Path
from typing import Any

from pytest_gbvalidate.files import OutputError, atomic_write_bytes, atomic_write_text

REPORT_SCHEMA = "pytest-gbvalidate/report/1"
# Per measurement, in this order, as JUnit testcase properties (repeated when a test checks several metrics).
JUNIT_FIELDS = ("metric", "scope", "value", "unit", "expected", "limit", "warn_limit", "delta_pct", "verdict")
# With --gb-compare, after those: the same measurement in the node's earlier report and the verdict against it.
JUNIT_COMPARE_FIELDS = ("earlier_value", "earlier_date", "delta_pct", "allowed_pct", "verdict")


def utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


class RunReport:
    """Everything the JSON report holds. `status` is `running` until the session ends, so a file left by a
    killed run says it is partial."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.write_error: str | None = None  # the first write that failed
        self.data: dict[str, Any] = {
            "schema": REPORT_SCHEMA,
            "status": "running",
            "exit_status": None,
            "start_time": utc_now(),
            "end_time": None,
            "sku": None,
            "node": {},
            "settings": {},
            "tests": [],
            "measurements": [],
        }

    @property
    def measurements(self) -> list[dict[str, Any]]:
        return list(self.data["measurements"])

    def add_test(
        self,
        nodeid: str,
        when: str,
        outcome: str,
        duration_s: float,
        message: str | None,
        text: str | None,
        fault: dict[str, Any] | None,
    ) -> None:
        """`message`: what went wrong in one line; `text`: all of it, as the terminal shows it (a traceback);
        `fault`: a failure's category and the operator's action (faults.py)."""
        test = {
            "test_id": nodeid,
            "when": when,
            "outcome": outcome,
            "duration_s": round(duration_s, 6),
            "message": message,
            "text": text,
        }
        self.data["tests"].append(test if fault is None else test | {"fault": fault})

    def add_measurements(self, records: list[dict[str, Any]]) -> None:
        self.data["measurements"].extend(records)

    def set_section(self, name: str, value: Any) -> None:
        """A section of its own about the node (e.g. `gpus`, `numa_map`): the latest value wins."""
        self.data[name] = value

    def add_record(self, section: str, record: dict[str, Any]) -> None:
        """A record in a list section (e.g. `telemetry`: one per sampler), created on first use."""
        self.data.setdefault(section, []).append(record)

    def finish(self, exit_status: int, status: str) -> None:
        self.data.update(status=status, exit_status=exit_status, end_time=utc_now())

    def write(self) -> None:
        """Rewrite the file. A write that fails (a full disk, say) leaves the last good file and is remembered in
        `write_error`, not raised: the run goes on, and the session says so and fails at its end."""
        if self.path is None:
            return
        try:
            atomic_write_text(self.path, json.dumps(self.data, indent=1, default=str, allow_nan=False) + "\n")
        except OutputError as exc:
            self.write_error = self.write_error or str(exc)


def json_safe(value: float) -> float | str:
    """JSON has no NaN or infinity; a broken measurement is kept as text rather than dropped."""
    return value if math.isfinite(value) else str(value)


def junit_properties(record: dict[str, Any]) -> list[tuple[str, object]]:
    properties = [(f"gb_{name}", _blank(record.get(name))) for name in JUNIT_FIELDS]
    compared = record.get("compare")
    if compared is not None:
        properties += [(f"gb_compare_{name}", _blank(compared.get(name))) for name in JUNIT_COMPARE_FIELDS]
    return properties


def _blank(value: Any) -> object:
    return "" if value is None else value


def terminal_table(records: list[dict[str, Any]]) -> list[str]:
    """Measured vs baseline, one row per measurement, columns sized to their content."""
    header: tuple[str, ...] = ("test", "metric", "scope", "measured", "expected", "limit", "unit", "delta", "verdict")
    compared = any("compare" in r for r in records)
    if compared:
        header += ("vs earlier",)
    rows = [header]
    for r in records:
        row = (
            r["test_id"].rsplit("::", 1)[-1],
            r["metric"],
            r["scope"],
            _num(r["value"]),
            _num(r.get("expected")),
            _num(r.get("limit")),
            r["unit"],
            "" if r.get("delta_pct") is None else f"{r['delta_pct']:+.1f}%",
            r["verdict"].upper(),
        )
        rows.append(row + ((_versus_earlier(r.get("compare")),) if compared else ()))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(header))]
    return ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def terminal_summary(sku: str, report: RunReport, notes: list[str]) -> list[tuple[str, list[str]]]:
    """The end-of-run summary as (section title, lines): measured vs baseline, the sweeps' tables, then the
    plots, `notes` (where the reports and the recorded baseline went) and failed start-ups of the ranks."""
    from pytest_gbvalidate.baselines.verdicts import INFO

    measurements = report.measurements
    gated = [m for m in measurements if m["verdict"] != INFO]
    lines = terminal_table(gated) if gated else ["no measurements"]
    if len(gated) < len(measurements):
        ungated = len(measurements) - len(gated)
        lines.append(f"(and {ungated} measurements no baseline gates: in the tables below and the JSON report)")
    sections = [(f"gbvalidate: {sku} measured vs baseline", lines)]
    tables = sweep_tables(measurements)
    if tables:
        sections.append(("gbvalidate: collectives, per message size (nccl-tests columns)", tables))
    last = sections[-1][1]
    last += [f"busbw plot: {plot['path']}" for plot in report.data.get("plots", [])]
    last += notes
    failed_starts = report.data.get("gang", {}).get("failed_starts", [])
    if failed_starts:
        last.append(f"the ranks' start-up failed {len(failed_starts)} time(s) and was tried again:")
        last += [f"  {reason}" for reason in failed_starts]
    faults = fault_lines(report.data["tests"])
    if faults:
        sections.append(("gbvalidate: failures by fault category, with the operator's action", faults))
    return sections


def fault_lines(tests: list[dict[str, Any]]) -> list[str]:
    """The failed tests grouped by fault category: the category's disposition and action, then its tests."""
    by_category: dict[str, list[dict[str, Any]]] = {}
    for test in tests:
        if test.get("fault"):
            by_category.setdefault(test["fault"]["category"], []).append(test)
    lines = []
    for category, failed in by_category.items():
        fault = failed[0]["fault"]
        lines.append(f"{category} ({fault['disposition']}): {fault['action']}")
        lines += [f"  {t['test_id']}: {t['message']}" for t in failed]
    return lines


def _versus_earlier(section: dict[str, Any] | None) -> str:
    if section is None:
        return "-"
    if not isinstance(section.get("delta_pct"), (int, float)):
        return str(section["verdict"]).upper()
    return f"{section['delta_pct']:+.1f}% {str(section['verdict']).upper()}"


def _num(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, (int, float)):
        return f"{value:.4g}"
    return str(value)


# --- collective sweeps: nccl-tests-like tables and a busbw plot ---------------------------------------------

OUR_TOOL = "pytest-gbvalidate"
_PLACEMENT_ORDER = ("out_of_place", "in_place")


def sweep_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The measurements that are one size of a collective sweep (ours or a reference tool's)."""
    return [r for r in records if r.get("scope_kind") == "message_size" and "placement" in (r.get("details") or {})]


def sweep_tables(records: list[dict[str, Any]]) -> list[str]:
    """One table per collective and tool, one row per size, out-of-place and in-place side by side as
    nccl-tests prints them (time, algbw, busbw, #wrong), and the verdict of the sizes the baseline gates."""
    groups: dict[tuple[str, str], dict[str, dict[str, dict[str, Any]]]] = {}
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
        ordered = sorted(rows.items(), key=lambda item: _first(item[1])["details"].get("size_bytes", 0))
        for label, by_place in ordered:
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
                row += [_num(d.get("time_us")), _num(d.get("algbw_gbps")), _num(r["value"])]
                row += ["-" if d.get("wrong") is None else str(d["wrong"])]
            row += [_gate(by_place)]
            table.append(row)
        widths = [max(len(row[i]) for row in table) for i in range(len(header))]
        lines.append(f"{metric} ({tool}; GB/s with GB = 1e9 bytes)")
        lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in table]
        lines.append("")
    return lines[:-1] if lines else lines


def _first(by_place: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return next(iter(by_place.values()))


def _gate(by_place: dict[str, dict[str, Any]]) -> str:
    gated = [r for r in by_place.values() if r.get("verdict") not in (None, "info")]
    if not gated:
        return ""
    expected = next((r.get("expected") for r in gated if r.get("expected") is not None), None)
    verdicts = "/".join(sorted({r["verdict"].upper() for r in gated}))
    return verdicts if expected is None else f"{verdicts} (expected {_num(expected)})"


def busbw_plot(records: list[dict[str, Any]], path: Path, title: str) -> Path:
    """busbw against message size, one panel per collective, with the baseline's expected values and fail
    limits where it has them. Needs matplotlib (an optional dependency): ImportError without it."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    from pytest_gbvalidate.labels import size_label

    by_metric: dict[str, list[dict[str, Any]]] = {}
    for r in sweep_records(records):
        if isinstance(r["value"], (int, float)):
            by_metric.setdefault(r["metric"], []).append(r)
    fig, axes = plt.subplots(len(by_metric), 1, figsize=(9, 3.2 * len(by_metric)), squeeze=False)
    for ax, (metric, rs) in zip(axes[:, 0], sorted(by_metric.items()), strict=True):
        lines: dict[tuple[str, str], list[tuple[int, float]]] = {}
        for r in rs:
            d = r["details"]
            lines.setdefault((d.get("tool", OUR_TOOL), d["placement"]), []).append((d["size_bytes"], r["value"]))
        for (tool, placement), points in sorted(lines.items()):
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
    atomic_write_bytes(path, png.getvalue())
    return path
