"""Reports: the JSON run report (rewritten atomically as results arrive, so a crash loses nothing already
measured), JUnit properties, and the terminal table. No pytest here."""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

REPORT_SCHEMA = "pytest-gbvalidate/report/1"
# Per measurement, in this order, as JUnit testcase properties (repeated when a test checks several metrics).
JUNIT_FIELDS = ("metric", "scope", "value", "unit", "expected", "limit", "warn_limit", "delta_pct", "verdict")


def utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` so a reader sees the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class RunReport:
    """Everything the JSON report holds. `status` is `running` until the session ends, so a file left by a
    killed run says it is partial."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
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

    def add_test(self, nodeid: str, when: str, outcome: str, duration_s: float, message: str | None) -> None:
        self.data["tests"].append(
            {
                "test_id": nodeid,
                "when": when,
                "outcome": outcome,
                "duration_s": round(duration_s, 6),
                "message": message,
            }
        )

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
        if self.path is not None:
            atomic_write_text(self.path, json.dumps(self.data, indent=1, default=str, allow_nan=False) + "\n")


def json_safe(value: float) -> float | str:
    """JSON has no NaN or infinity; a broken measurement is kept as text rather than dropped."""
    return value if math.isfinite(value) else str(value)


def junit_properties(record: dict[str, Any]) -> list[tuple[str, object]]:
    return [(f"gb_{name}", "" if record.get(name) is None else record[name]) for name in JUNIT_FIELDS]


def terminal_table(records: list[dict[str, Any]]) -> list[str]:
    """Measured vs baseline, one row per measurement, columns sized to their content."""
    header = ("test", "metric", "scope", "measured", "expected", "limit", "unit", "delta", "verdict")
    rows = [header]
    for r in records:
        rows.append(
            (
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
        )
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(header))]
    return ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def _num(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, (int, float)):
        return f"{value:.4g}"
    return str(value)
