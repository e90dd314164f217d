"""Recording: a baseline written from a run's measurements, each expected value the median measured (rounded to
three significant digits), with limits the same node passes run after run: the previous baseline's where they are
wider than the node's own noise allows, else bands from that noise (noise.py: NOISE_K times the largest spread its
samples or passes showed, at least the defaults). A floor-only metric (a fail limit and nothing else: figures that
differ tenfold between machines) stays floor-only, with no warn band. Each metric's provenance says what spread was
seen."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_gbvalidate import noise
from pytest_gbvalidate.baselines.model import (
    _WHOLE_UNITS,
    SCHEMA_VERSION,
    Baseline,
    Detect,
    Limit,
    Reference,
    _better,
    _is_number,
)
from pytest_gbvalidate.baselines.verdicts import INFO
from pytest_gbvalidate.metrics import CATALOG, PER_LABEL_SCOPE_KINDS

# Limits a recorded metric gets at least when no earlier baseline gave one: SuperBench's rule for its published
# baselines fails 10% below the reference; warn halfway there. A noisier figure gets wider bands: warn at the
# change its noise allows (noise.margin_pct), fail at twice that.
DEFAULT_FAIL_PCT, DEFAULT_WARN_PCT = 10.0, 5.0
DEFAULT_FAIL, DEFAULT_WARN = Limit(relative_pct=DEFAULT_FAIL_PCT), Limit(relative_pct=DEFAULT_WARN_PCT)
# A higher-is-better limit 90% below the expected value is the widest that stays a positive number.
MAX_HIGHER_FAIL_PCT = 90.0


def recorded_baseline(
    sku: str,
    previous: Baseline | None,
    measurements: list[dict[str, Any]],
    provenance: str,
    node_gpu_count: int | None = None,
) -> dict[str, Any]:
    """A baseline document whose expected values are this run's medians. Limits, params and the detect
    section carry over from `previous` (the baseline the run was checked against) where it had them; a SKU
    recorded for the first time gets the node's GPU count as its `detect.gpu_count`."""
    by_metric: dict[str, list[dict[str, Any]]] = {}
    for m in measurements:
        if m.get("verdict") != INFO and _recordable(m.get("value")):
            by_metric.setdefault(m["metric"], []).append(m)
    metrics: dict[str, Any] = {}
    for name, records in by_metric.items():
        first = records[0]
        unit, direction, kind = first["unit"], first["direction"], first["scope_kind"]
        old = previous.metrics.get(name) if previous else None
        entry: dict[str, Any] = {}
        spec = CATALOG.get(name)
        if spec is None or (spec.unit, spec.direction, spec.scope_kind) != (unit, direction, kind):
            # The catalog says these for its metrics; a site's own metric says them here. (One measured against
            # a spec that disagrees with the catalog keeps them, and the loader refuses the recording.)
            entry.update(unit=unit, direction=direction, scope=kind)
        seen = _noisiest(records)
        entry.update(status="measured", provenance=provenance + _seen_note(seen, len(records)))
        if seen is not None:
            entry["spread_pct"] = round(seen.spread_pct, 1)
        if kind in PER_LABEL_SCOPE_KINDS:
            labels: dict[str, list[float]] = {}
            for r in records:
                labels.setdefault(r["scope"], []).append(r["value"])
            worst = min if direction == "higher" else max
            expected_by_label = {label: _rounded(statistics.median(v)) for label, v in labels.items()}
            anchor = worst(expected_by_label.values())  # limits must fit every label's value
            entry.update(_limits(old.default if old else None, anchor, direction, unit, seen))
            entry["values"] = {label: {"expected": value} for label, value in expected_by_label.items()}
        else:
            expected = _rounded(statistics.median(r["value"] for r in records))
            entry["expected"] = expected
            entry.update(_limits(old.default if old else None, expected, direction, unit, seen))
        if old is not None and old.default.params:
            entry["params"] = dict(old.default.params)
        metrics[name] = entry
    doc: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "sku": sku}
    doc["description"] = previous.description if previous else f"{sku}, recorded from a golden node"
    if previous is None and node_gpu_count is not None:
        doc["detect"] = {"gpu_count": node_gpu_count}
    if previous is not None and previous.detect != Detect():
        d = previous.detect
        doc["detect"] = {
            k: v
            for k, v in (
                ("azure_vm_sizes", list(d.azure_vm_sizes)),
                ("gpu_name_contains", d.gpu_name_contains),
                ("gpu_count", d.gpu_count),
            )
            if v not in (None, [])
        }
    # The health gates and the expected layout are not measured: they carry over as they were.
    if previous is not None and previous.health is not None:
        doc["health"] = previous.health.as_doc()
    if previous is not None and previous.topology is not None:
        doc["topology"] = previous.topology.as_doc()
    doc["metrics"] = metrics
    if previous is not None and previous.pretrain is not None:
        doc["pretrain"] = previous.pretrain.as_doc()
    return doc


def _recordable(value: Any) -> bool:
    """A measured value that can be an expected one: a finite, positive number (a failed measurement comes as
    None or text, a broken one as 0; the loader refuses either as an expected value)."""
    return _is_number(value) and value > 0


def left_out(measurements: list[dict[str, Any]]) -> list[str]:
    """The measurements a recording leaves out, each as `metric [scope]: value`."""
    return [
        f"{m.get('metric')} [{m.get('scope')}]: {m.get('value')!r}"
        for m in measurements
        if m.get("verdict") != INFO and not _recordable(m.get("value"))
    ]


def _limits(
    old: Reference | None, expected: float, direction: str, unit: str, seen: noise.Noise | None
) -> dict[str, Any]:
    """Limits around the new value that the node's own noise (`seen`) cannot cross: the old limits where they
    order fail < warn < expected (as loading checks it: <= in a whole-number unit) and are at least as wide as the
    noise bands, else the noise bands. A floor-only old reference keeps its floor alone."""
    bands = _noise_bands(seen, direction)
    if old is not None and old.fail is not None and old.warn is None and old.expected is None:
        floor = old.fail.threshold(expected, direction)
        if not _better(direction)(floor, expected):
            return {"fail": _limit_value(old.fail)}
        return {"fail": _limit_value(bands[0])}
    fail = old.fail if old is not None and old.fail is not None else bands[0]
    warn = old.warn if old is not None and old.warn is not None else bands[1]
    if _narrower(fail, bands[0], expected, direction):
        fail = bands[0]
    if _narrower(warn, bands[1], expected, direction):
        warn = bands[1]
    better = _better(direction)
    fail_at, warn_at = fail.threshold(expected, direction), warn.threshold(expected, direction)
    misordered = better(fail_at, warn_at) or better(warn_at, expected)
    if misordered or (unit not in _WHOLE_UNITS and (fail_at == warn_at or warn_at == expected)):
        fail, warn = bands
    return {"fail": _limit_value(fail), "warn": _limit_value(warn)}


def _noise_bands(seen: noise.Noise | None, direction: str) -> tuple[Limit, Limit]:
    """(fail, warn) as percentages of the expected value: warn at the change the noise allows, fail at twice that,
    at least the defaults (a higher-is-better fail band at most MAX_HIGHER_FAIL_PCT)."""
    warn_pct = max(DEFAULT_WARN_PCT, float(math.ceil(noise.margin_pct(seen))))
    fail_pct = max(DEFAULT_FAIL_PCT, 2 * warn_pct)
    if direction == "higher":
        fail_pct = min(fail_pct, MAX_HIGHER_FAIL_PCT)
        warn_pct = min(warn_pct, fail_pct / 2)
    return Limit(relative_pct=fail_pct), Limit(relative_pct=warn_pct)


def _narrower(limit: Limit, band: Limit, expected: float, direction: str) -> bool:
    """Whether `limit` is closer to `expected` than `band`."""
    return abs(limit.threshold(expected, direction) - expected) < abs(band.threshold(expected, direction) - expected)


def _noisiest(records: Sequence[dict[str, Any]]) -> noise.Noise | None:
    """The largest noise among the records' (each as its report gives it), or None where none gives one."""
    found = [n for n in (noise.from_record(r.get("noise")) for r in records) if n is not None]
    return max(found, key=lambda n: n.spread_pct) if found else None


def _seen_note(seen: noise.Noise | None, measurements: int) -> str:
    if seen is None:
        return ""
    return f"; spread seen: up to {seen.spread_pct:.1f}% ({seen.describe()}) over {measurements} measurement(s)"


def _rounded(value: float) -> float:
    """Three significant digits: more than the node repeats, and a file a person can read."""
    return float(f"{value:.3g}")


def _limit_value(limit: Limit) -> str | float:
    return str(limit) if limit.absolute is None else limit.absolute


def write_recorded_baseline(
    path: Path,
    previous: Baseline | None,
    measurements: list[dict[str, Any]],
    node_facts: dict[str, str],
    node_gpu_count: int | None,
) -> list[str]:
    """Write the baseline recorded from `measurements` to `path` (its file name is the SKU), atomically, with a
    provenance naming the node and its software stack. The file is checked by the loader first: one it would
    refuse is not written (OutputError), and the old file stays. What was left out (left_out) is returned."""
    from pytest_gbvalidate.baselines.loading import parse_baseline
    from pytest_gbvalidate.baselines.model import BaselineError
    from pytest_gbvalidate.files import OutputError, atomic_write_text
    from pytest_gbvalidate.report.writer import utc_now

    stack = ", ".join(f"{k} {v}" for k, v in node_facts.items() if k != "hostname")
    provenance = f"measured on {node_facts.get('hostname', '?')} ({utc_now()[:10]}; {stack}) by --gb-record"
    text = dump_baseline(recorded_baseline(path.stem, previous, measurements, provenance, node_gpu_count))
    try:
        parse_baseline(path, text.encode("utf-8"))
    except BaselineError as exc:
        raise OutputError(f"{path}: not written, the loader would refuse it: {exc}") from None
    atomic_write_text(path, text)
    return left_out(measurements)


def dump_baseline(doc: dict[str, Any]) -> str:
    import yaml

    header = "# Recorded by pytest-gbvalidate --gb-record. Review the limits before committing.\n"
    return header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=120)
