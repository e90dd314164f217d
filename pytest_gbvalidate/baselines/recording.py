"""Recording: a baseline written from a run's measurements, with limits that catch a fall on that node at the
resolution each metric needs (rules/resolution.py), and the node's noise counted once.

The rule. Each expected value is the median measured, rounded to three significant digits (more where the rounding
would exceed ROUNDING_SHARE of the needed resolution). Its limits come from the resolution the metric needs (the
previous baseline's, else the SKU's `resolution`, else baselines.DEFAULT_NEEDED), never from previous limits or noise:
fail at FAIL_SHARE, warn at WARN_SHARE of it to the worse side, as log ratios (resolution.worse_pct), written as
percentages of the expected value (two significant digits). A verdict excuses no more than the needed resolution, so a
fall of about 1.8 times it fails however noisy the figure, and a dead node (0, or a tenth of expected) always fails.

The noise is counted once: the largest error the node's figures showed for an expected value (noise.Noise.error_of,
with the fall its waits for a CPU explain) is written beside it as `spread_pct` (rounded up), which later verdicts
count in the figure's resolution; the bands are not widened. A figure too noisy to record -- its resolution against a
recording as noisy, resolution.of_spreads(samples=error, reference=error) (2.8 times the error), coarser than needed
-- is written not gated: a sweep's size left out of `values`, a metric `provisional` with no expected value, its spread
and why in the provenance; where the previous baseline gated it, it is written and the run fails (NotGated.required).

A floor-only metric (a fail limit and no expected value or warn limit anywhere: figures that differ tenfold between
machines) stays floor-only: its floor is kept while the node measures above it.

Several runs: --gb-record keeps each figure's best pass (gb_expect.measure_again, expect.py), with that pass's error.
With --gb-history, an expected value the node's last noise.MIN_RUNS to noise.MAX_RUNS runs kept is their median, its
spread the larger of its error and their run-to-run spread (noise.of_runs); runs that scatter too widely are refused.
Each provenance says how many runs each expected value came from, how many figures were a best pass, the spread seen."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from pathlib import Path
from typing import Any

from pytest_gbvalidate.baselines.model import (
    DEFAULT_NEEDED,
    SCHEMA_VERSION,
    Baseline,
    Detect,
    MetricBaseline,
    _is_number,
)
from pytest_gbvalidate.baselines.verdicts import INFO
from pytest_gbvalidate.metrics import CATALOG, PER_LABEL_SCOPE_KINDS
from pytest_gbvalidate.rules import noise
from pytest_gbvalidate.rules import resolution as rs

# Shares of the needed resolution (the module's rule): past the fail limit by what a verdict excuses is a 1.75x fall.
FAIL_SHARE, WARN_SHARE = 0.75, 0.5
ROUNDING_SHARE = 0.05


@dataclass(frozen=True)
class NotGated:
    """A figure too noisy to record: written not gated, with why."""

    metric: str
    scope: str
    why: str  # its resolution against a recording as noisy, the one needed, its spread
    required: bool  # the previous baseline gated it: the recording falls short of what the SKU asks

    def line(self) -> str:
        return f"{self.metric} [{self.scope}]: {self.why}"


@dataclass(frozen=True)
class _Figure:
    metric: str
    scope: str
    spread_pct: float  # as written: rounded up
    needed: rs.Needed


# The node's kept runs (report/earlier.py's node_runs): each figure's value by its measurement key.
Runs = Sequence[Mapping[tuple[str, str, str, str], float]]


def recorded_baseline(
    sku: str,
    previous: Baseline | None,
    measurements: list[dict[str, Any]],
    provenance: str,
    node_gpu_count: int | None = None,
    runs: Runs = (),
) -> dict[str, Any]:
    """The baseline document `recording` makes (its figures too noisy to record written not gated)."""
    return recording(sku, previous, measurements, provenance, node_gpu_count, runs)[0]


def recording(
    sku: str,
    previous: Baseline | None,
    measurements: list[dict[str, Any]],
    provenance: str,
    node_gpu_count: int | None = None,
    runs: Runs = (),
) -> tuple[dict[str, Any], list[NotGated]]:
    """The baseline document recorded by the module's rule, and the figures too noisy to record, written not gated.
    Needed resolutions, params and the detect, health, topology and pretrain sections carry over from `previous`."""
    sku_needed = previous.resolution if previous is not None else DEFAULT_NEEDED
    by_metric: dict[str, list[dict[str, Any]]] = {}
    for m in measurements:
        if m.get("verdict") != INFO and _recordable(m.get("value")):
            by_metric.setdefault(m["metric"], []).append(m)
    metrics: dict[str, Any] = {}
    not_gated: list[NotGated] = []
    for name, records in by_metric.items():
        unit, direction, kind = (records[0][k] for k in ("unit", "direction", "scope_kind"))
        old = previous.metrics.get(name) if previous else None
        needed = old.default.needed if old is not None else sku_needed
        entry = _entry(name, unit, direction, kind, needed, sku_needed)
        seen = _noisiest(records)
        counted: list[int] = []  # how many runs each expected value of the metric was taken from
        floor_only = old is not None and _floor_only(old)
        if kind in PER_LABEL_SCOPE_KINDS:
            values = _label_values(name, records, old, needed, runs, counted, not_gated)
            if values:
                anchor = rs.worse_of((v["expected"] for v in values.values()), direction)  # a kept floor lies below all
                entry.update(_limits(old if floor_only else None, anchor, direction, needed))
                entry["values"] = values
            else:
                entry["status"] = "provisional"
        else:
            expected, figure, count = _expected(name, None, records, runs, needed)
            counted.append(count)
            if (why := _too_noisy(figure)) is not None:  # its spread in the provenance: it may be past the loader's
                not_gated.append(NotGated(name, str(records[0]["scope"]), why, _gated(old, None)))
                entry["status"] = "provisional"
            else:
                if figure is not None:
                    entry["spread_pct"] = figure.spread_pct
                entry["expected"] = _rounded(expected, needed.pct)
                entry.update(_limits(old if floor_only else None, entry["expected"], direction, needed))
        skipped = [f"{n.scope} ({n.why})" for n in not_gated if n.metric == name]
        not_gated_note = f"; not gated, too noisy to record here: {'; '.join(skipped)}" if skipped else ""
        entry["provenance"] = provenance + _runs_note(counted) + _seen_note(seen, records) + not_gated_note
        if old is not None and old.default.params:
            entry["params"] = dict(old.default.params)
        metrics[name] = entry
    doc = _carried_over(sku, previous, node_gpu_count, sku_needed)
    doc["metrics"] = metrics
    if previous is not None and previous.pretrain is not None:
        doc["pretrain"] = previous.pretrain.as_doc()
    return doc, not_gated


def _entry(name: str, unit: str, direction: str, kind: str, needed: rs.Needed, sku_needed: rs.Needed) -> dict[str, Any]:
    """A metric's entry before its figures: what the catalog does not say of it, and its own needed resolution."""
    entry: dict[str, Any] = {}
    spec = CATALOG.get(name)
    if spec is None or (spec.unit, spec.direction, spec.scope_kind) != (unit, direction, kind):
        entry.update(unit=unit, direction=direction, scope=kind)  # a disagreeing one: the loader refuses it
    entry["status"] = "measured"
    return entry | ({"resolution_pct": needed.pct} if needed != sku_needed else {})


def _label_values(
    name: str,
    records: list[dict[str, Any]],
    old: MetricBaseline | None,
    needed: rs.Needed,
    runs: Runs,
    counted: list[int],
    not_gated: list[NotGated],
) -> dict[str, Any]:
    """The expected value of each scope label (a sweep's sizes, a node's GPUs), with its spread and its own bands
    where it needs its own resolution; the runs each was taken from go to `counted`, the too noisy to `not_gated`."""
    direction, floor_only = records[0]["direction"], old is not None and _floor_only(old)
    labels: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        labels.setdefault(r["scope"], []).append(r)
    values: dict[str, Any] = {}
    for label, of_label in labels.items():
        ref = None if old is None else old.values.get(label)  # its own needed resolution where it declared one
        label_needed = needed if old is None or ref is None or ref.needed == old.default.needed else ref.needed
        expected, figure, count = _expected(name, label, of_label, runs, label_needed)
        counted.append(count)
        if (why := _too_noisy(figure)) is not None:
            not_gated.append(NotGated(name, label, why, _gated(old, label)))
            continue
        values[label] = {"expected": _rounded(expected, label_needed.pct)}
        if figure is not None:
            values[label]["spread_pct"] = figure.spread_pct  # each size its own: a quiet one stays quiet
        if label_needed != needed and not floor_only:
            values[label].update(_bands(label_needed, direction), resolution_pct=label_needed.pct)
    return values


def _carried_over(
    sku: str, previous: Baseline | None, node_gpu_count: int | None, sku_needed: rs.Needed
) -> dict[str, Any]:
    """The document's head: what is not measured carries over from `previous`; a SKU recorded for the first time gets
    the node's GPU count to detect it."""
    doc: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "sku": sku}
    if previous is None:
        doc["description"] = f"{sku}, recorded from a golden node"
        return doc | ({"detect": {"gpu_count": node_gpu_count}} if node_gpu_count is not None else {})
    doc["description"] = previous.description
    if (d := previous.detect) != Detect():
        found = {"azure_vm_sizes": list(d.azure_vm_sizes), "gpu_name_contains": d.gpu_name_contains}
        doc["detect"] = {k: v for k, v in (found | {"gpu_count": d.gpu_count}).items() if v not in (None, [])}
    if sku_needed != DEFAULT_NEEDED:
        where = previous.path.name
        doc["resolution"] = {"pct": sku_needed.pct, "provenance": f"as {where} declared it ({sku_needed.source})"}
    if previous.health is not None:
        doc["health"] = previous.health.as_doc()
    if previous.topology is not None:
        doc["topology"] = previous.topology.as_doc()
    return doc


def _expected(
    metric: str, scope: str | None, records: Sequence[dict[str, Any]], runs: Runs, needed: rs.Needed
) -> tuple[float, _Figure | None, int]:
    """One expected value of `metric` (at `scope`; None: every scope, pooled) from this run's `records` and the kept
    `runs` (the module's rule): (the value, its figure as written, how many runs it was taken from)."""
    now = statistics.median(r["value"] for r in records)
    figure = _figure(metric, records, needed)
    across = noise.of_runs([*_kept_figures(runs, metric, scope), now])
    if across is None:
        return now, figure, 1
    between = _rounded_up(across.spread_pct)
    if figure is None or between > figure.spread_pct:
        figure = _Figure(metric, scope or str(records[0]["scope"]), between, needed)
    return across.median, figure, across.runs


def _kept_figures(runs: Runs, metric: str, scope: str | None) -> list[float]:
    """The figure in each kept run that has it, oldest first: the median of its measurements of `metric` at `scope`
    (every scope where None; a run may hold several placements or tools)."""
    found = ([v for key, v in run.items() if key[0] == metric and scope in (None, key[1])] for run in runs)
    return [statistics.median(values) for values in found if values]


def _runs_note(counted: Sequence[int]) -> str:
    if max(counted, default=1) <= 1:
        return ""
    low, high = min(counted), max(counted)
    runs = f"{low}" if low == high else f"{low} to {high}"
    return f"; each figure the median of {runs} runs: this one and the node's kept ones (--gb-history)"


def _figure(metric: str, records: Sequence[dict[str, Any]], needed: rs.Needed) -> _Figure | None:
    """The noisiest of the records one expected value is the median of, its spread as written (None: none gives one)."""
    spreads = [(s, r) for r in records if (s := _spread_written(r)) is not None]
    if not spreads:
        return None
    spread, noisiest = max(spreads, key=lambda t: t[0])
    return _Figure(metric, str(noisiest["scope"]), spread, needed)


def _floor_only(old: MetricBaseline) -> bool:
    """A metric the previous baseline gave only a fail limit: no expected value and no warn limit at any scope."""
    refs = [old.default, *old.values.values()]
    return old.default.fail is not None and all(r.expected is None and r.warn is None for r in refs)


def too_noisy_to_record(record: Mapping[str, Any], needed: rs.Needed) -> bool:
    """Whether a measurement's record is too noisy to record at resolution `needed` (gb_expect.measure_again)."""
    spread = _spread_written(dict(record))
    return spread is not None and _too_noisy(_Figure("", "", spread, needed)) is not None


def _too_noisy(fig: _Figure | None) -> str | None:
    """Why a figure cannot be recorded (the module's rule), or None where it can (or shows no spread)."""
    res = None if fig is None else rs.of_spreads(samples=fig.spread_pct, reference=fig.spread_pct)
    if fig is None or res is None or res.pct <= fig.needed.pct:
        return None
    return f"{res.describe()} against a recording as noisy, coarser than the {fig.needed.pct:g}% needed"


def _gated(old: MetricBaseline | None, label: str | None) -> bool:
    """Whether the previous baseline judged this figure (an expected value or a fail limit): the SKU requires it."""
    ref = None if old is None else (old.default if label is None else old.reference(label))
    return ref is not None and ref.has_reference


def _recordable(value: Any) -> bool:
    """A measured value that can be an expected one: a finite number above 0 (not a failed or broken one)."""
    return _is_number(value) and value > 0


def left_out(measurements: list[dict[str, Any]]) -> list[str]:
    """The measurements a recording leaves out, each as `metric [scope]: value`."""
    return [
        f"{m.get('metric')} [{m.get('scope')}]: {m.get('value')!r}"
        for m in measurements
        if m.get("verdict") != INFO and not _recordable(m.get("value"))
    ]


def _limits(floor_only: MetricBaseline | None, expected: float, direction: str, needed: rs.Needed) -> dict[str, Any]:
    """The bands of the needed resolution; for a floor-only metric its old floor where the node measures above it,
    else the fail band alone."""
    bands = _bands(needed, direction)
    if floor_only is None:
        return bands
    fail = floor_only.default.fail
    assert fail is not None  # _floor_only
    if rs.is_worse(fail.threshold(expected, direction), expected, direction):
        return {"fail": str(fail) if fail.absolute is None else fail.absolute}
    return {"fail": bands["fail"]}


def _bands(needed: rs.Needed, direction: str) -> dict[str, Any]:
    """Fail and warn at FAIL_SHARE and WARN_SHARE of the needed resolution, as percentages of the expected value
    (two significant digits: the shares stay apart, and every figure a person reads)."""
    return {k: f"{_band_pct(s * needed.pct, direction):g}%" for k, s in (("fail", FAIL_SHARE), ("warn", WARN_SHARE))}


def _band_pct(log_pct: float, direction: str) -> float:
    """The percentage of the expected value a limit `log_pct` (a log ratio in percent) to the worse side lies at."""
    return float(f"{abs(rs.moved_toward_worse(1.0, log_pct, direction) - 1.0) * 100.0:.2g}")


def _spread_written(record: dict[str, Any]) -> float | None:
    """A measurement's spread (its report's `noise`) as a recording writes it (_rounded_up); None where none."""
    seen = noise.from_record(record.get("noise"))
    return None if seen is None else _rounded_up(seen.error_with_waits_pct())  # a neighbour's waits lower a figure


def _rounded_up(spread: float) -> float:
    """A spread as a recording writes it: rounded up to three significant digits, never less noise than seen."""
    if not spread > 0:
        return 0.0
    d = Decimal(repr(spread))
    return float(d.quantize(Decimal(1).scaleb(d.adjusted() - 2), rounding=ROUND_CEILING))


def _noisiest(records: Sequence[dict[str, Any]]) -> noise.Noise | None:
    """The largest noise among the records' (each as its report gives it), or None where none gives one."""
    found = [n for n in (noise.from_record(r.get("noise")) for r in records) if n is not None]
    return max(found, key=lambda n: n.spread_pct) if found else None


def _seen_note(seen: noise.Noise | None, records: Sequence[dict[str, Any]]) -> str:
    if seen is None:
        return ""
    note = f"; spread seen: up to {seen.spread_pct:.1f}% ({seen.describe()}) over {len(records)} measurement(s)"
    passes = [n for n in (noise.from_record(r.get("noise")) for r in records) if n and n.summary == noise.BEST_PASS]
    if passes:
        counts = "/".join(str(c) for c in sorted({n.count for n in passes}))
        note += f", {len(passes)} of them the best of {counts} passes (--gb-record measures again)"
    return note


def _rounded(value: float, needed_pct: float) -> float:
    """Three significant digits (more than the node repeats, and a file a person can read), or more where the
    rounding would exceed ROUNDING_SHARE of the resolution the metric needs (`needed_pct`)."""
    digits = 3
    while 50.0 * 10.0 ** (1 - digits) > ROUNDING_SHARE * needed_pct and digits < 9:
        digits += 1
    return float(f"{value:.{digits}g}")


def write_recorded_baseline(
    path: Path,
    previous: Baseline | None,
    measurements: list[dict[str, Any]],
    node_facts: dict[str, str],
    node_gpu_count: int | None,
    runs: Runs = (),
) -> tuple[list[str], list[NotGated]]:
    """Write the baseline `measurements` record to `path` atomically, its provenance naming the node and its stack
    (OutputError where the loader would refuse it); returns what was left out and the figures written not gated."""
    from pytest_gbvalidate.baselines.loading import parse_baseline
    from pytest_gbvalidate.baselines.model import BaselineError
    from pytest_gbvalidate.files import OutputError, atomic_write_text
    from pytest_gbvalidate.report.writer import utc_now

    stack = ", ".join(f"{k} {v}" for k, v in node_facts.items() if k != "hostname")
    provenance = f"measured on {node_facts.get('hostname', '?')} ({utc_now()[:10]}; {stack}) by --gb-record"
    doc, not_gated = recording(path.stem, previous, measurements, provenance, node_gpu_count, runs)
    text = dump_baseline(doc)
    try:
        parse_baseline(path, text.encode("utf-8"))
    except BaselineError as exc:
        raise OutputError(f"{path}: not written, the loader would refuse it: {exc}") from None
    atomic_write_text(path, text)
    return left_out(measurements), not_gated


def dump_baseline(doc: dict[str, Any]) -> str:
    import yaml

    header = "# Recorded by pytest-gbvalidate --gb-record. Review the limits before committing.\n"
    return header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=120)
