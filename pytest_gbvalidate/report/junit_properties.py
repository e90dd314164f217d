"""A measurement as JUnit testcase properties, for CI tools that read JUnit XML only."""

from __future__ import annotations

from typing import Any

from pytest_gbvalidate.report.records import MeasurementRecord

# Per measurement, in this order (repeated when a test checks several metrics).
JUNIT_FIELDS = ("metric", "scope", "value", "unit", "expected", "limit", "warn_limit", "delta_pct", "verdict")
# Then what the figure's evidence can tell and what its metric needs (rules/resolution.py), blank where not judged.
JUNIT_RESOLUTION_FIELDS = ("pct", "needed_pct")
# With --gb-compare, after those: the same measurement in the node's earlier report and the verdict against it.
JUNIT_COMPARE_FIELDS = ("earlier_value", "earlier_date", "delta_pct", "allowed_pct", "verdict")


def junit_properties(record: MeasurementRecord) -> list[tuple[str, object]]:
    fields: dict[str, Any] = dict(record)
    properties = [(f"gb_{name}", _blank(fields.get(name))) for name in JUNIT_FIELDS]
    resolution: dict[str, Any] = fields.get("resolution") or {}
    properties += [(f"gb_resolution_{name}", _blank(resolution.get(name))) for name in JUNIT_RESOLUTION_FIELDS]
    compared: dict[str, Any] | None = fields.get("compare")
    if compared is not None:
        properties += [(f"gb_compare_{name}", _blank(compared.get(name))) for name in JUNIT_COMPARE_FIELDS]
    return properties


def _blank(value: Any) -> object:
    return "" if value is None else value
