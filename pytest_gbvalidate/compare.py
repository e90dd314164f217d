"""The node against its own earlier report (`--gb-compare PATH`): before and after maintenance.

The earlier run's JSON report is read once; the run first checks it is the same node (hostname, and each GPU's
serial and UUID by PCI bus id), then every measurement is also compared with the one of the same metric and scope in
that report. The change allowed is `--gb-compare-fail`'s, else the resolution the metric needs (the baseline's
`resolution`, rules/resolution.py): never a baseline's fail band, which would let a node lose most of a figure
between two runs. The figure's resolution is made of the spreads behind the comparison: the new figure's samples
(and its waits for a CPU), the earlier figure's, and, with the node's kept history (`--gb-history`, from
noise.MIN_RUNS runs on), the figure's run-to-run spread on this node. resolution.side turns the change and that
resolution into the verdict, the allowed change and the noise overlapping (both are tolerances for the same scatter:
a change is excused by the larger, not their sum): noise excuses no more than the metric needs, and a figure too
noisy for it is `unresolved`, never `ok`. With a kept history the figure is also judged, by the same rule, against
the node's reference runs (the median of its oldest noise.MIN_RUNS kept runs): a node losing a little each run never
moves far from the run before, and only the reference shows the fall. The worse of the two verdicts holds.

pytest-benchmark's convention, mirrored rather than reused: `--benchmark-compare` / `--benchmark-compare-fail=
mean:5%` compare pytest-benchmark's own saved timing statistics of functions it timed itself; our measurements are
bandwidths, TFLOPS and step times that the checks take with CUDA events, kept in our JSON report. So the names
follow it (`--gb-compare`, `--gb-compare-fail=[METRIC:]PCT%`), the storage is the report the run already writes.

No pytest here.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pytest_gbvalidate.files import InputError, read_json
from pytest_gbvalidate.labels import printable
from pytest_gbvalidate.metrics import CATALOG
from pytest_gbvalidate.report import history, schema
from pytest_gbvalidate.report.records import (
    CompareVerdict,
    MeasurementCompareRecord,
    MeasurementRecord,
    PaceFirstPassRecord,
    ResolutionRecord,
    RunPaceRecord,
    RunReportRecord,
    measurement_key,
)
from pytest_gbvalidate.rules import noise
from pytest_gbvalidate.rules import pace as pacing
from pytest_gbvalidate.rules import resolution as rs

# The slowdown a run's pace (run_pace) is allowed where --gb-compare-fail gives no default: pytest-benchmark's
# documented example threshold (`--benchmark-compare-fail=mean:5%`), and about twice the run-to-run spread of the
# GPU measurements we have seen (bf16 GEMM 784.6 vs 786.6 TFLOPS, d2d 1488 vs 1488 GB/s on one H100).
DEFAULT_ALLOWED_PCT = 5.0

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


class CompareError(Exception):
    """The earlier report cannot be used: unreadable, not ours, or from another node. A usage error."""


@dataclass(frozen=True)
class AllowedRegression:
    """`--gb-compare-fail`: percentages by metric name, and one for every other metric (None: the resolution the
    metric needs)."""

    default_pct: float | None = None
    by_metric: Mapping[str, float] = field(default_factory=dict)

    def for_metric(self, metric: str, needed: rs.Needed) -> tuple[float, str]:
        """(the percentage, where it comes from): `--gb-compare-fail`'s for the metric, else its default, else the
        resolution the metric needs (`needed`). Never a baseline's fail band: that is how far any healthy node may
        be from the expected figure, and a node that lost that much since its last run has lost it (a fail band of
        95% let a figure fall to a twentieth of the run before)."""
        if metric in self.by_metric:
            return self.by_metric[metric], f"--gb-compare-fail {metric}"
        if self.default_pct is not None:
            return self.default_pct, "--gb-compare-fail"
        return needed.pct, f"the resolution the metric needs, {needed.source}"


def parse_allowed(text: str) -> AllowedRegression:
    """`5%`, `all_reduce_busbw_gbps:3%`, or several, separated by commas or spaces: `3%,gemm_bf16_tflops:2%`."""
    default: float | None = None
    by_metric: dict[str, float] = {}
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
        if metric in by_metric or (not metric and default is not None):  # which of the two was meant?
            raise ValueError(f"{part!a}: a second percentage for {metric or 'every other metric'}")
        if metric:
            by_metric[metric] = pct
        else:
            default = pct
    if default is None and not by_metric:
        raise ValueError("expected [METRIC:]PCT%, e.g. 5% or all_reduce_busbw_gbps:3%")
    return AllowedRegression(default, by_metric)


@dataclass(frozen=True)
class GpuIdentity:
    index: int
    pci_bus_id: str
    uuid: str
    serial: str | None


@dataclass(frozen=True)
class EarlierReport:
    path: Path
    date: str  # the earlier run's start time
    status: str
    sku: str | None
    hostname: str | None
    gpus: tuple[GpuIdentity, ...] | None  # None: the earlier run did not read the inventory
    measurements: Mapping[tuple[str, str, str, str], MeasurementRecord]
    # With --gb-history: the node's kept runs of this SKU (each figure's value, oldest first), and each figure
    # across them (noise.of_runs), where there are enough of them.
    runs: tuple[Mapping[tuple[str, str, str, str], float], ...] = ()
    run_to_run: Mapping[tuple[str, str, str, str], noise.RunToRun] = field(default_factory=dict)


def load_earlier(path: Path) -> EarlierReport:
    """Read an earlier JSON report. A partial one (status `running`: the run was killed) is used for what it
    measured; the caller says so."""
    try:
        data = read_json(path)
    except InputError as exc:
        raise CompareError(str(exc)) from None
    problem = schema.problem(data)
    if problem is not None:
        raise CompareError(f"{path} is not a pytest-gbvalidate report of this version: {problem}")
    report: RunReportRecord = data
    try:  # the date every line about the comparison shows: a time, as the fleet's readers require
        history.start_time(report)
    except ValueError:
        raise CompareError(f"{path}: start_time {report['start_time'][:40]!a} is not an ISO 8601 time") from None
    measurements: dict[tuple[str, str, str, str], MeasurementRecord] = {}
    for record in report["measurements"]:
        value = noise.finite(record["value"])
        if value is not None:  # a later measurement of the same figure replaces an earlier one
            measurements[measurement_key(record)] = record | {"value": value}
    gpus_section = report.get("gpus")
    devices = gpus_section.get("devices") if isinstance(gpus_section, dict) else None
    gpus = None
    if isinstance(devices, list):
        try:
            gpus = tuple(
                GpuIdentity(int(d["index"]), str(d["pci_bus_id"]), str(d["uuid"]), d.get("serial")) for d in devices
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CompareError(
                f"{path}: a GPU of its `gpus` section lacks index, pci_bus_id or uuid ({exc!r})"
            ) from None
    sku, node = report["sku"], report.get("node")
    return EarlierReport(
        path=path,
        date=report["start_time"],
        status=report["status"],
        sku=None if sku is None else sku["name"],
        hostname=None if node is None else node["hostname"],
        gpus=gpus,
        measurements=measurements,
    )


def node_runs(paths: Sequence[Path], sku: str, hostname: str) -> tuple[dict[tuple[str, str, str, str], float], ...]:
    """This node's kept reports `paths` (oldest first, future-dated ones left out already) as runs, oldest first:
    the last noise.MAX_RUNS that read as reports of this node and SKU, each figure's value. A report that cannot
    be read, or is another node's or SKU's, is no run of this node; nor is one that did not finish (killed, stopped,
    or this very run's own record, kept `running` as it started)."""
    runs: list[dict[tuple[str, str, str, str], float]] = []
    for path in reversed(paths):
        if len(runs) == noise.MAX_RUNS:
            break
        try:
            earlier = load_earlier(path)
        except CompareError:
            continue
        if (earlier.hostname, earlier.sku, earlier.status) != (hostname, sku, "finished"):
            continue
        values = {key: noise.finite(record["value"]) for key, record in earlier.measurements.items()}
        runs.insert(0, {key: value for key, value in values.items() if value is not None})
    return tuple(runs)


def with_history(earlier: EarlierReport, runs: Sequence[Mapping[tuple[str, str, str, str], float]]) -> EarlierReport:
    """`earlier` with the node's kept `runs` (node_runs') behind it: each figure's run-to-run spread from them."""
    values: dict[tuple[str, str, str, str], list[float]] = {}
    for run in runs:
        for key, value in run.items():
            values.setdefault(key, []).append(value)
    spreads = {key: noise.of_runs(figures) for key, figures in values.items()}
    run_to_run = {key: spread for key, spread in spreads.items() if spread is not None}
    return dataclasses.replace(earlier, runs=tuple(runs), run_to_run=run_to_run)


def _shown(z: float) -> float | str:
    """A z-score for the report: rounded, or "inf" / "-inf" (JSON has no infinity)."""
    return round(z, 3) if math.isfinite(z) else str(z)


def run_pace(
    earlier: EarlierReport,
    measurements: Sequence[MeasurementRecord],
    allowed: AllowedRegression,
    again: Sequence[MeasurementRecord] | None = None,
) -> RunPaceRecord | None:
    """The run as a whole against the node's kept runs (rules/pace.py): regressed where its pace -- the median of its
    figures, or its share of worse figures -- is an outlier among theirs (beyond noise.family_z for two figures
    against as many runs) and its figures are, at the median, worse by more than the regression allowed
    (`--gb-compare-fail`'s default, else DEFAULT_ALLOWED_PCT): a node slower across the board, each figure still
    within its own run-to-run spread. With `again` (the run's checks measured once more, where the first pass's
    pace regressed): the pace of each figure's better pass, the first pass's beside it in `first_pass`. None
    without a history that can say (fewer than noise.MIN_RUNS + 1 kept runs, or figures)."""
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
            best = max(value, other) if record["direction"] == "higher" else min(value, other)
            record = record | {"value": best}
        better.append(record)
    return better


def _pace(
    earlier: EarlierReport, measurements: Sequence[MeasurementRecord], allowed: AllowedRegression
) -> RunPaceRecord | None:
    now: dict[tuple[str, str, str, str], float] = {}
    directions: dict[tuple[str, str, str, str], str] = {}
    for record in measurements:
        value = noise.finite(record["value"])
        if value is not None:
            now[measurement_key(record)] = value
            directions[measurement_key(record)] = record["direction"]
    found = pacing.pace(now, earlier.runs, directions)
    z = None if found is None else found.z()
    if found is None or z is None:
        return None
    share_z = found.share_z()
    pct = DEFAULT_ALLOWED_PCT if allowed.default_pct is None else allowed.default_pct
    # Two figures of the run (its median and its share of worse figures), each against a spread taken from a few
    # runs' own, the run not among them.
    cutoff = noise.family_z(len(found.earlier), 2, apart=True)
    beyond = z > cutoff or (share_z is not None and share_z > cutoff)
    verdict: Literal["ok", "regressed"] = "regressed" if beyond and found.worse_pct > pct else "ok"
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


@dataclass(frozen=True)
class SameNode:
    """The outcome of the same-node check: GPUs replaced since the earlier run (scope label -> what changed),
    and notes for the header and the JSON report."""

    replaced: Mapping[str, str]
    notes: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"replaced_gpus": dict(self.replaced), "notes": list(self.notes)}


def check_same_node(
    earlier: EarlierReport, sku: str, hostname: str, gpus_now: tuple[GpuIdentity, ...] | str | None
) -> SameNode:
    """Raise CompareError when the earlier report is another node's (or another SKU's). `gpus_now`: this node's
    GPUs, the reason they could not be read, or None on a SKU without GPUs."""
    where = str(earlier.path)  # the caller names the setting
    if earlier.hostname != hostname:
        shown = f"is the report of node '{printable(earlier.hostname)}'" if earlier.hostname else "names no node"
        raise CompareError(f"{where} {shown}; this is node '{printable(hostname)}'")
    if earlier.sku != sku:
        shown = "names no SKU" if earlier.sku is None else f"checked SKU '{printable(earlier.sku)}'"
        raise CompareError(f"{where} {shown}; this run checks SKU '{sku}'")
    notes = [f"same node {hostname}, earlier run of {earlier.date}"]
    if earlier.status != "finished":
        notes.append(f"the earlier run did not finish (status {earlier.status}): compared where it measured")
    replaced: dict[str, str] = {}
    if isinstance(gpus_now, str):
        notes.append(f"GPUs not compared by serial: {gpus_now}")
    elif gpus_now is not None and earlier.gpus is None:
        notes.append("GPUs not compared by serial: the earlier report has no GPU inventory (health checks not run)")
    elif gpus_now is not None and earlier.gpus is not None:
        before = {g.pci_bus_id.lower(): g for g in earlier.gpus}
        for now in gpus_now:
            old = before.get(now.pci_bus_id.lower())
            if old is None:
                notes.append(f"gpu{now.index} at {now.pci_bus_id}: no GPU there in the earlier report")
                replaced[f"gpu{now.index}"] = "no GPU at its PCI bus id in the earlier report"
            elif (old.serial, old.uuid) != (now.serial, now.uuid):
                what = f"replaced since the earlier run (serial {old.serial} -> {now.serial}, {old.uuid} -> {now.uuid})"
                replaced[f"gpu{now.index}"] = what
                notes.append(f"gpu{now.index} at {now.pci_bus_id}: {what}")
        missing = sorted(set(before) - {g.pci_bus_id.lower() for g in gpus_now})
        notes += [f"no GPU answers at {pci} now (gpu{before[pci].index} in the earlier report)" for pci in missing]
        if not replaced and not missing:
            notes.append(f"all {len(gpus_now)} GPUs have the serials of the earlier run")
    return SameNode(replaced, tuple(notes))


def compare_one(
    earlier: EarlierReport,
    record: Mapping[str, Any],
    allowed: AllowedRegression,
    needed: rs.Needed,
    same_node: SameNode,
    now: str,
) -> MeasurementCompareRecord | None:
    """The `compare` section of a measurement `record` (metric, scope, value, unit, direction, details, noise), or
    None when the earlier report has no such measurement. `needed`: the resolution the metric needs (its
    baseline's), which is also the change allowed where `--gb-compare-fail` gives none.

    The figure is judged against the earlier report's, and, where the node's kept runs have it, against the
    node's reference runs (_reference_runs), each by resolution.side: its change to the worse side (a log ratio)
    beyond the allowed one, against its resolution -- the spreads of its samples, of what it is compared with and
    of the node's runs. The worse verdict holds (SEVERITY), and the message says which comparison decided. A
    figure that is not a finite number regressed."""
    old = earlier.measurements.get(measurement_key(record))
    value = record.get("value")
    if old is None or not isinstance(value, (int, float)):
        return None
    metric, scope, unit = record["metric"], record["scope"], record["unit"]
    old_value = old["value"]
    if not isinstance(old_value, (int, float)):  # only numbers are kept by load_earlier
        return None
    replaced = same_node.replaced.get(scope)
    if replaced is not None:
        message = f"{metric} [{scope}]: not compared with the earlier report: this GPU was {replaced}"
        return _compared(old_value, earlier.date, now, None, None, GPU_REPLACED, message)
    delta_pct = _delta_pct(value, old_value)
    key = measurement_key(record)
    runs = earlier.run_to_run.get(key)
    pct, source = allowed.for_metric(metric, needed)
    direction = rs.direction_of(str(record["direction"]))
    own, theirs = noise.from_record(record.get("noise")), noise.from_record(old.get("noise"))
    samples = None if own is None else own.spread_pct
    explained = noise.explained_pct(own)  # a fall its waits for a CPU explain is no regression of the node
    run_to_run = None if runs is None else runs.spread_pct
    judged = [
        _judge(
            "the earlier report",
            float(value),
            float(old_value),
            direction,
            pct,
            needed,
            rs.of_spreads(
                samples=samples,
                reference=None if theirs is None else theirs.spread_pct,
                run_to_run=run_to_run,
                explained_pct=explained,
            ),
            _SpreadNames("the earlier report's", runs),
        )
    ]
    reference = _reference_runs(earlier, key)
    if reference is not None:
        figure, spread, against = reference
        resolution = rs.of_spreads(samples=samples, reference=spread, run_to_run=run_to_run, explained_pct=explained)
        names = _SpreadNames("the reference runs' median's", runs)
        judged.append(_judge(against, float(value), figure, direction, pct, needed, resolution, names))
    decided = max(judged, key=lambda j: SEVERITY.index(j.verdict))  # the first of equals: the earlier report
    message = (
        f"{metric} [{scope}]: {_fmt(value)} {unit} now ({now}) against {_fmt(old_value)} {unit} in the earlier "
        f"report ({earlier.date}), delta {delta_pct:+.1f}%, {direction} is better, allowed {pct:g}% "
        f"({source}){judged[0].why}"
    )
    for other in judged[1:]:
        shown = f"{_fmt(other.reference)} {unit}, delta {_delta_pct(value, other.reference):+.1f}%"
        message += f"; against {other.against}: {shown}{other.why}"
    message += f" -> {decided.verdict.upper()}"
    if len(judged) > 1:
        message += f", decided against {decided.against}"
    shown_delta = round(delta_pct, 3) if math.isfinite(delta_pct) else str(delta_pct)
    section = _compared(old_value, earlier.date, now, shown_delta, pct, decided.verdict, message)
    if decided.resolution is not None:
        section["resolution"] = _resolution_record(decided.resolution, needed)
        section["noise_margin_pct"] = round(decided.resolution.pct, 3)  # the resolution, as readers before it had it
    if runs is not None:
        section["run_to_run"] = runs.as_record(value)
    return section


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
                parts.append(f"its samples' {spread:.1f}%")
            elif name == "reference":
                parts.append(f"{self.reference} {spread:.1f}%")
            elif name == "run_to_run" and self.runs is not None:
                parts.append(f"the node's run-to-run {spread:.1f}% over {self.runs.runs} runs")
            else:
                parts.append(f"{name.replace('_', '-')} {spread:.1f}%")
        return f"{noise.NOISE_K:g} x the spread of {', '.join(parts)}"


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
    shown = f"{worse:+.1f}% to the worse side as a log ratio"
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
    else:
        why = ""
    return _Judged(against, reference, resolution, _BY_SIDE[side], why)


def _reference_runs(earlier: EarlierReport, key: tuple[str, str, str, str]) -> tuple[float, float | None, str] | None:
    """The node's reference for the figure `key`: the median of its oldest noise.MIN_RUNS kept runs that have it,
    that median's own error (noise.median_error_pct of their spread; None where they give none), and how the
    message names it. None with fewer kept runs. The run before is the reference of a comparison that a node
    losing a little each run always passes; the node's first runs are not."""
    values = [run[key] for run in earlier.runs if key in run and math.isfinite(run[key])]
    if len(values) < noise.MIN_RUNS:
        return None
    first = values[: noise.MIN_RUNS]
    spread = noise.spread_pct(first)
    error = None if spread is None else noise.median_error_pct(spread, len(first))
    against = f"the node's reference runs (median of the first {len(first)} of {len(values)} kept runs)"
    return statistics.median(first), error, against


def _resolution_record(resolution: rs.Resolution, needed: rs.Needed) -> ResolutionRecord:
    return {
        "pct": round(resolution.pct, 3),
        "spreads": {name: round(spread, 3) for name, spread in resolution.spreads},
        "needed_pct": needed.pct,
        "needed_source": needed.source,
    }


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


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def gpus_of_this_node(is_gpu: bool) -> tuple[GpuIdentity, ...] | str | None:
    """This node's GPUs by PCI bus id (None on a SKU without GPUs; NVML's error when it cannot say)."""
    if not is_gpu:
        return None
    from pytest_gbvalidate.node import nvml

    try:
        with nvml.session():
            inventory = nvml.read_inventory()
    except nvml.NvmlError as exc:
        return f"NVML: {exc}"
    return tuple(GpuIdentity(g.index, g.pci_bus_id, g.uuid, g.serial) for g in inventory.gpus.values())
