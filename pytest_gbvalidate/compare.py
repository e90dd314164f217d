"""The node against its own earlier report (`--gb-compare PATH`): before and after maintenance. No pytest here.

The earlier run's JSON report is read once; the run first checks it is the same node (hostname, and each GPU's serial
and UUID by PCI bus id), then every measurement is also compared with the one of the same metric and scope in that
report (compare_one). The change allowed is `--gb-compare-fail`'s, else the resolution the metric needs (the baseline's
`resolution`, rules/resolution.py): never a baseline's fail band, which would let a node lose most of a figure between
two runs. The figure's resolution is made of the spreads behind the comparison: the new figure's samples (and its waits
for a CPU), the earlier figure's, and, with the node's kept history (`--gb-history`, from noise.MIN_RUNS runs on), the
figure's run-to-run spread on this node. resolution.side turns the change and that resolution into the verdict: a figure
too noisy for the metric is `unresolved`, never `ok`. With a kept history the figure is also judged, by the same rule,
against the node's reference runs (the median of its oldest noise.MIN_RUNS kept runs): a node losing a little each run
never moves far from the run before, and only the reference shows the fall. The worse verdict holds.

The names follow pytest-benchmark's (`--benchmark-compare`, `--benchmark-compare-fail=mean:5%`), not its storage: it
compares timings it took itself, ours are the bandwidths, TFLOPS and step times in the report the run already writes.
"""

from __future__ import annotations

import difflib
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_gbvalidate.labels import number
from pytest_gbvalidate.metrics import CATALOG
from pytest_gbvalidate.report.earlier import EarlierReport, SameNode
from pytest_gbvalidate.report.records import (
    CompareVerdict,
    MeasurementCompareRecord,
    MeasurementRecord,
    PaceFirstPassRecord,
    RunPaceRecord,
    measurement_key,
)
from pytest_gbvalidate.rules import noise
from pytest_gbvalidate.rules import pace as pacing
from pytest_gbvalidate.rules import resolution as rs
from pytest_gbvalidate.rules.allowed import DEFAULT_ALLOWED_PCT

REGRESSED: CompareVerdict = "regressed"
OK: CompareVerdict = "ok"
WITHIN_NOISE: CompareVerdict = "within_noise"
GPU_REPLACED: CompareVerdict = "gpu_replaced"
UNRESOLVED: CompareVerdict = "unresolved"
# The verdicts of a judged figure, mildest first: of two comparisons, the later one here holds.
SEVERITY: tuple[CompareVerdict, ...] = (OK, WITHIN_NOISE, UNRESOLVED, REGRESSED)
_BY_SIDE: Mapping[rs.Side, CompareVerdict] = {
    "within": OK,
    "within_noise": WITHIN_NOISE,
    "unresolved": UNRESOLVED,
    "beyond": REGRESSED,
}


@dataclass(frozen=True)
class AllowedRegression:
    """`--gb-compare-fail`: percentages by metric name, and one for every other metric (None: the resolution the
    metric needs)."""

    default_pct: float | None = None
    by_metric: Mapping[str, float] = field(default_factory=dict)

    def for_metric(self, metric: str, needed: rs.Needed) -> tuple[float, str]:
        """(the percentage, where it comes from): `--gb-compare-fail`'s for the metric, else its default, else the
        resolution the metric needs (`needed`); never a baseline's fail band (the module's rule)."""
        if metric in self.by_metric:
            return self.by_metric[metric], f"--gb-compare-fail {metric}"
        if self.default_pct is not None:
            return self.default_pct, "--gb-compare-fail"
        return needed.pct, f"the resolution the metric needs, {needed.source}"


def parse_allowed(text: str) -> AllowedRegression:
    """`5%`, `all_reduce_busbw_gbps:3%`, or several, separated by commas or spaces: `3%,gemm_bf16_tflops:2%`."""
    by_metric: dict[str, float] = {}  # "": every other metric
    for part in text.replace(",", " ").split():
        metric, _, pct_text = part.rpartition(":")
        if not pct_text.endswith("%"):
            raise ValueError(f"{part!a}: expected [METRIC:]PCT%, e.g. 5% or all_reduce_busbw_gbps:3%")
        try:
            pct = float(pct_text[:-1])
        except ValueError:
            pct = math.nan
        if not math.isfinite(pct) or pct < 0:
            raise ValueError(f"{part!a}: the percentage must be a number >= 0")
        if metric and metric not in CATALOG:  # a misspelt name would silently compare nothing
            close = difflib.get_close_matches(metric, CATALOG, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ValueError(f"{part!a}: no metric {metric!a}{hint}; the metrics are those in metrics.CATALOG")
        if metric in by_metric:  # which of the two was meant?
            raise ValueError(f"{part!a}: a second percentage for {metric or 'every other metric'}")
        by_metric[metric] = pct
    if not by_metric:
        raise ValueError("expected [METRIC:]PCT%, e.g. 5% or all_reduce_busbw_gbps:3%")
    return AllowedRegression(by_metric.pop("", None), by_metric)


def _shown(z: float) -> float | str:
    """A z-score or a delta for the report: rounded, or "inf" / "-inf" / "nan" (JSON has neither)."""
    return round(z, 3) if math.isfinite(z) else str(z)


def run_pace(
    earlier: EarlierReport,
    measurements: Sequence[MeasurementRecord],
    allowed: AllowedRegression,
    again: Sequence[MeasurementRecord] | None = None,
) -> RunPaceRecord | None:
    """The run as a whole against the node's kept runs, by pace.Pace.verdict with `--gb-compare-fail`'s default, else
    DEFAULT_ALLOWED_PCT: a node slower across the board, each figure still within its own run-to-run spread. With
    `again` (the run's checks measured once more, where the first pass's pace regressed): the pace of each figure's
    better pass, the first pass's in `first_pass`. None without a history that can say."""
    pace = _pace(earlier, measurements, allowed)
    if pace is None or again is None:
        return pace
    better = _pace(earlier, better_passes(measurements, again), allowed)
    if better is None:
        return pace
    first: PaceFirstPassRecord = {
        "measured_again": len(again),
        "worse_pct": pace["worse_pct"],
        "z": pace["z"],
        "share_z": pace.get("share_z"),
        "verdict": pace["verdict"],
    }
    better["message"] += (
        f"; each figure's better of two passes ({len(again)} figures measured again; the first pass alone: "
        f"{pace['worse_pct']:+.1f}% at the median -> {pace['verdict'].upper()})"
    )
    return better | {"first_pass": first}


def better_passes(first: Sequence[MeasurementRecord], again: Sequence[MeasurementRecord]) -> list[MeasurementRecord]:
    """`first`'s records, each with the better of its value and the same figure's in `again` (by its direction;
    a figure `again` lacks, or holds no finite number for, keeps its first value): interference only slows a
    pass, a degraded node is slow in both."""
    second = {measurement_key(r): v for r in again if (v := noise.finite(r["value"])) is not None}
    better = []
    for record in first:
        value, other = noise.finite(record["value"]), second.get(measurement_key(record))
        if value is not None and other is not None:
            record = record | {"value": rs.better_of(value, other, record["direction"])}
        better.append(record)
    return better


def _pace(
    earlier: EarlierReport, measurements: Sequence[MeasurementRecord], allowed: AllowedRegression
) -> RunPaceRecord | None:
    kept = [
        (measurement_key(r), v, r["direction"]) for r in measurements if (v := noise.finite(r["value"])) is not None
    ]
    now, directions = {key: v for key, v, _ in kept}, {key: d for key, _, d in kept}
    found = pacing.pace(now, earlier.runs, directions)
    if found is None or (z := found.z()) is None:
        return None
    share_z = found.share_z()
    pct = DEFAULT_ALLOWED_PCT if allowed.default_pct is None else allowed.default_pct
    verdict, cutoff = found.verdict(pct)
    center = statistics.median(found.earlier)
    shares = statistics.median(found.earlier_shares) if found.earlier_shares else math.nan
    message = (
        f"the node as a whole: {found.figures} figures, at the median {found.worse_pct:+.1f}% to the worse side of "
        f"the node's last {len(earlier.runs)} runs (modified z {found.worse_z:+.2f}; their runs' own "
        f"{center:+.2f} at the median), the run's modified z {z:+.1f} among them; {found.worse_share:.0%} of its "
        f"figures more than {pacing.SHARE_Z:g} spreads worse (their runs' {shares:.0%} at the median), modified z "
        f"{'-' if share_z is None else f'{share_z:+.1f}'}; allowed {pct:g}% and {cutoff:.1f} (the cut-off for two "
        f"figures against {len(found.earlier)} runs) -> {verdict.upper()}"
    )
    return {
        "figures": found.figures,
        "runs": len(earlier.runs),
        "worse_pct": round(found.worse_pct, 3),
        "worse_z": round(found.worse_z, 3),
        "earlier_worse_z": [round(p, 3) for p in found.earlier],
        "z": _shown(z),
        "worse_share": round(found.worse_share, 4),
        "earlier_worse_share": [round(s, 4) for s in found.earlier_shares],
        "share_z": None if share_z is None else _shown(share_z),
        "allowed_pct": pct,
        "verdict": verdict,
        "message": message,
    }


def compare_one(
    earlier: EarlierReport,
    record: Mapping[str, Any],
    allowed: AllowedRegression,
    needed: rs.Needed,
    same_node: SameNode,
    now: str,
) -> MeasurementCompareRecord | None:
    """The `compare` section of a measurement `record` (metric, scope, value, unit, direction, details, noise) by the
    module's rules, or None when the earlier report has no such measurement. `needed`: the resolution the metric
    needs (its baseline's). The message says which comparison decided; a figure that is no finite number regressed."""
    key = measurement_key(record)
    old, value = earlier.measurements.get(key), record.get("value")
    if old is None or not isinstance(value, (int, float)):
        return None
    metric, scope, unit, old_value = record["metric"], record["scope"], record["unit"], old["value"]
    if not isinstance(old_value, (int, float)):  # only numbers are kept by load_earlier
        return None
    if (replaced := same_node.replaced.get(scope)) is not None:
        message = f"{metric} [{scope}]: not compared with the earlier report: this GPU was {replaced}"
        return _compared(old_value, earlier.date, now, None, None, GPU_REPLACED, message)
    delta_pct = _delta_pct(value, old_value)
    runs = earlier.run_to_run.get(key)
    pct, source = allowed.for_metric(metric, needed)
    direction = rs.direction_of(str(record["direction"]))
    own, theirs = noise.from_record(record.get("noise")), noise.from_record(old.get("noise"))
    samples = None if own is None else own.error_of()
    run_to_run = None if runs is None else runs.spread_pct
    explained = noise.explained_pct(own)  # a fall its waits for a CPU explain is not the node's
    # The earlier report's figure, then the node's reference runs where they have it, each with its own error.
    references = [(float(old_value), None if theirs is None else theirs.error_of(), "the earlier report")]
    references += [] if (reference := _reference_runs(earlier, key)) is None else [reference]
    judged = []
    for n, (figure, spread, against) in enumerate(references):
        resolution = rs.of_spreads(samples=samples, reference=spread, run_to_run=run_to_run, explained_pct=explained)
        names = _SpreadNames("the earlier report's figure" if n == 0 else "the reference runs' median", runs)
        judged.append(_judge(against, float(value), figure, direction, pct, needed, resolution, names))
    decided = max(judged, key=lambda j: SEVERITY.index(j.verdict))  # the first of equals: the earlier report
    head = (
        f"{metric} [{scope}]: {number(value)} {unit} now ({now}) against {number(old_value)} {unit} in the earlier "
        f"report ({earlier.date}), delta {delta_pct:+.1f}%, {direction} is better, allowed {pct:g}% ({source})"
    )
    message = _message(head, float(value), unit, judged, decided)
    section = _compared(old_value, earlier.date, now, _shown(delta_pct), pct, decided.verdict, message)
    if (resolution := decided.resolution) is not None:
        section["resolution"] = {
            "pct": round(resolution.pct, 3),
            "spreads": {name: round(spread, 3) for name, spread in resolution.spreads},
            "needed_pct": needed.pct,
            "needed_source": needed.source,
        }
        section["noise_margin_pct"] = round(resolution.pct, 3)  # the resolution, as readers before it had it
    if runs is not None:
        section["run_to_run"] = runs.as_record(value)
    return section


def _message(head: str, value: float, unit: str, judged: Sequence[_Judged], decided: _Judged) -> str:
    """A comparison's message: the figure against the earlier report (`head`), then against each other reference,
    each with why it came out as it did, and the verdict that holds."""
    message = head + judged[0].why
    for other in judged[1:]:
        shown = f"{number(other.reference)} {unit}, delta {_delta_pct(value, other.reference):+.1f}%"
        message += f"; against {other.against}: {shown}{other.why}"
    message += f" -> {decided.verdict.upper()}"
    return message + (f", decided against {decided.against}" if len(judged) > 1 else "")


def _delta_pct(value: float, reference: float) -> float:
    """The change from `reference` to `value` in percent of |reference|: from nothing (an error count of 0), any
    change is infinitely many percent, none is no change."""
    if reference:
        return (value - reference) / abs(reference) * 100.0
    return math.copysign(math.inf, value) if value else 0.0


@dataclass(frozen=True)
class _SpreadNames:
    """How a comparison's message names the spreads of its resolution: the reference's (`reference`), and the
    node's run-to-run spread with the runs it comes from."""

    reference: str
    runs: noise.RunToRun | None

    def describe(self, resolution: rs.Resolution) -> str:
        parts = []
        for name, spread in resolution.spreads:
            if name == "samples":
                parts.append(f"its figure {spread:.1f}%")
            elif name == "reference":
                parts.append(f"{self.reference} {spread:.1f}%")
            elif name == "run_to_run" and self.runs is not None:
                parts.append(f"the node's run-to-run spread {spread:.1f}% over {self.runs.runs} runs")
            else:
                parts.append(f"{name.replace('_', '-')} {spread:.1f}%")
        return f"{noise.NOISE_K:g} x the combined error of {', '.join(parts)}"


@dataclass(frozen=True)
class _Judged:
    """One comparison of a figure: with what (`against`), its figure, and the verdict with why."""

    against: str
    reference: float
    resolution: rs.Resolution | None
    verdict: CompareVerdict
    why: str


def _judge(
    against: str,
    value: float,
    reference: float,
    direction: rs.Direction,
    allowed_pct: float,
    needed: rs.Needed,
    resolution: rs.Resolution | None,
    names: _SpreadNames,
) -> _Judged:
    """`value` against `reference`, `allowed_pct` allowed to the worse side (resolution.side, with `needed`)."""
    if not math.isfinite(value):
        return _Judged(against, reference, resolution, REGRESSED, "; not a finite number")
    worse = rs.worse_pct(value, reference, direction)
    side = rs.side(worse - allowed_pct, resolution, needed, tolerance_pct=allowed_pct)
    if rs.at_least_as_good(value, reference, direction):
        side = "within"
    shown, why = f"{worse:+.1f}% to the worse side as a log ratio", ""
    if resolution is None:
        why = f"; {shown}" if side == "beyond" else ""
    elif side == "within_noise":
        why = f"; {shown}, within {resolution.pct:.1f}%: {names.describe(resolution)}"
    elif side == "unresolved":
        why = (
            f"; too noisy to judge: {shown}, resolution {resolution.pct:.1f}% ({names.describe(resolution)}), "
            f"coarser than the {needed.pct:g}% needed ({needed.source})"
        )
    elif side == "beyond":
        excused = max(allowed_pct, min(resolution.pct, needed.pct))
        why = f"; {shown}, beyond the {excused:.1f}% it and its resolution allow ({names.describe(resolution)})"
    return _Judged(against, reference, resolution, _BY_SIDE[side], why)


def _reference_runs(earlier: EarlierReport, key: tuple[str, str, str, str]) -> tuple[float, float | None, str] | None:
    """The node's reference for the figure `key` (the module's rule): the median of its oldest noise.MIN_RUNS kept
    runs that have it, that median's own error (noise.median_error_pct; None where they give none), and how the
    message names it. None with fewer kept runs."""
    values = [run[key] for run in earlier.runs if key in run and math.isfinite(run[key])]
    if len(values) < noise.MIN_RUNS:
        return None
    first = values[: noise.MIN_RUNS]
    spread = noise.spread_pct(first)
    error = None if spread is None else noise.median_error_pct(spread, len(first))
    against = f"the node's reference runs (median of the first {len(first)} of {len(values)} kept runs)"
    return statistics.median(first), error, against


def _compared(
    earlier_value: float,
    earlier_date: str,
    now: str,
    delta_pct: float | str | None,
    allowed_pct: float | None,
    verdict: CompareVerdict,
    message: str,
) -> MeasurementCompareRecord:
    return {
        "earlier_value": earlier_value,
        "earlier_date": earlier_date,
        "date": now,
        "delta_pct": delta_pct,
        "allowed_pct": allowed_pct,
        "verdict": verdict,
        "message": message,
    }
