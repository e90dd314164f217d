"""The node against its own earlier report (`--gb-compare PATH`): before and after maintenance.

The earlier run's JSON report is read once; the run first checks it is the same node (hostname, and each GPU's
serial and UUID by PCI bus id), then every measurement is also compared with the one of the same metric and scope
in that report. A regression beyond the allowed percentage, and beyond what the two figures' own noise allows
(noise.py: the spread of the samples or passes each report keeps beside its figure), fails the test that made the
measurement; a change within that noise is `within_noise`, and says so. With the node's kept history
(`--gb-history`, from noise.MIN_RUNS runs on) a regression must also be an outlier among the node's own runs:
drift between runs is within one run's samples' agreement, and only the history shows it.

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

from pytest_gbvalidate import noise
from pytest_gbvalidate.files import InputError, read_json
from pytest_gbvalidate.labels import printable
from pytest_gbvalidate.metrics import CATALOG
from pytest_gbvalidate.report import history, schema
from pytest_gbvalidate.report.records import (
    MeasurementCompareRecord,
    MeasurementRecord,
    PaceFirstPassRecord,
    RunPaceRecord,
    RunReportRecord,
    measurement_key,
)

# The regression allowed when neither --gb-compare-fail nor the baseline's warn band says: pytest-benchmark's
# documented example threshold (`--benchmark-compare-fail=mean:5%`), and about twice the run-to-run spread of the
# GPU measurements we have seen (bf16 GEMM 784.6 vs 786.6 TFLOPS, d2d 1488 vs 1488 GB/s on one H100).
DEFAULT_ALLOWED_PCT = 5.0

REGRESSED, OK, WITHIN_NOISE, GPU_REPLACED = "regressed", "ok", "within_noise", "gpu_replaced"
UNRESOLVED = "unresolved"


class CompareError(Exception):
    """The earlier report cannot be used: unreadable, not ours, or from another node. A usage error."""


@dataclass(frozen=True)
class AllowedRegression:
    """`--gb-compare-fail`: percentages by metric name, and one for every other metric (None: the baseline's
    warn band, else DEFAULT_ALLOWED_PCT)."""

    default_pct: float | None = None
    by_metric: Mapping[str, float] = field(default_factory=dict)

    def for_metric(self, metric: str, bands: Bands | None, kept_runs: int | None) -> tuple[float, str]:
        """(the percentage, where it comes from). `kept_runs`: None where the node's history shows the figure's
        run-to-run spread, else how many of its kept runs have the figure. Without that spread, a figure its
        baseline gates may change as far as the baseline lets any healthy node be from the expected value (its
        fail band) before the comparison calls it a regression: between two runs a minute apart, one healthy
        2-vCPU VM's host copy moved 36%, its checkpoint reads 19% and its inference 29%, each 3 to 8 times what
        the run's own samples spread, and nothing in one run shows that."""
        if metric in self.by_metric:
            return self.by_metric[metric], f"--gb-compare-fail {metric}"
        if self.default_pct is not None:
            return self.default_pct, "--gb-compare-fail"
        if bands is not None and kept_runs is not None and bands.fail_pct is not None:
            return bands.fail_pct, (
                f"the baseline's fail band: its run-to-run spread on this node is not known yet, {kept_runs} of the "
                f"node's kept runs (--gb-history) have it, {noise.MIN_RUNS} show it"
            )
        if bands is not None and bands.warn_pct is not None:
            return bands.warn_pct, "the baseline's warn band"
        return DEFAULT_ALLOWED_PCT, "default"


@dataclass(frozen=True)
class Bands:
    """A baseline reference's bands, in percent of its expected value (None where it has no such limit)."""

    warn_pct: float | None
    fail_pct: float | None


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
    be read, or is another node's or SKU's, is no run of this node."""
    runs: list[dict[tuple[str, str, str, str], float]] = []
    for path in reversed(paths):
        if len(runs) == noise.MAX_RUNS:
            break
        try:
            earlier = load_earlier(path)
        except CompareError:
            continue
        if (earlier.hostname, earlier.sku) != (hostname, sku):
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
    """The run as a whole against the node's kept runs (noise.pace): regressed where its pace -- the median of its
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
    found = noise.pace(now, earlier.runs, directions)
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
        f"figures more than {noise.SHARE_Z:g} spreads worse (their runs' {shares:.0%} at the median), modified z "
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
    bands: Bands | None,
    same_node: SameNode,
    now: str,
) -> MeasurementCompareRecord | None:
    """The `compare` section of a measurement `record` (metric, scope, value, unit, direction, details), or None
    when the earlier report has no such measurement."""
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
    if old_value:
        delta_pct = (value - old_value) / abs(old_value) * 100.0
    else:  # from nothing (an error count of 0): any change is infinitely many percent, none is no change
        delta_pct = math.copysign(math.inf, value) if value else 0.0
    runs = earlier.run_to_run.get(measurement_key(record))
    kept_runs = None if runs is not None else sum(measurement_key(record) in run for run in earlier.runs)
    pct, source = allowed.for_metric(metric, bands, kept_runs)
    worse_pct = -delta_pct if record["direction"] == "higher" else delta_pct
    noises = (noise.from_record(old.get("noise")), noise.from_record(record.get("noise")))
    margin = noise.margin_pct(*noises) if any(noises) else None
    if not math.isfinite(value):
        verdict, why = REGRESSED, ""
    elif worse_pct > pct and margin is not None and not noise.beyond(value, old_value, margin):
        verdict = WITHIN_NOISE
        judge = "too noisy to judge" if margin >= noise.TOO_NOISY_PCT else "within the noise of the two figures"
        why = f"; {judge}: their spread allows {margin:.1f}%"
    elif (
        worse_pct > pct
        and runs is not None
        and runs.worse_z(value, record["direction"])
        <= (cutoff := noise.family_z(runs.runs, len(earlier.run_to_run), apart=True))
    ):
        # Drift between runs that one run cannot see: the node has been here before. The run is judged on all its
        # figures with a history at once, each against a spread taken from a few runs: the family-wise cut-off.
        verdict = WITHIN_NOISE
        why = (
            f"; within the node's run-to-run spread ({runs.describe(value)}; an outlier beyond {cutoff:.1f}, the "
            f"cut-off for the run's {len(earlier.run_to_run)} figure(s) against {runs.runs} runs)"
        )
    elif worse_pct > pct:
        verdict, why = REGRESSED, "" if runs is None else f" ({runs.describe(value)})"
    else:
        verdict, why = OK, ""
    message = (
        f"{metric} [{scope}]: {_fmt(value)} {unit} now ({now}) against {_fmt(old_value)} {unit} in the earlier "
        f"report ({earlier.date}), delta {delta_pct:+.1f}%, {record['direction']} is better, allowed {pct:g}% "
        f"({source}){why} -> {verdict.upper()}"
    )
    shown_delta = round(delta_pct, 3) if math.isfinite(delta_pct) else str(delta_pct)
    section = _compared(old_value, earlier.date, now, shown_delta, pct, verdict, message)
    if margin is not None:
        section["noise_margin_pct"] = round(margin, 3)
    if runs is not None:
        section["run_to_run"] = runs.as_record(value)
    return section


def _compared(
    earlier_value: float,
    earlier_date: str,
    now: str,
    delta_pct: float | str | None,
    allowed_pct: float | None,
    verdict: str,
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


def bands(expected: float | None, warn_limit: float | None, fail_limit: float | None) -> Bands:
    """A baseline reference's warn and fail bands as percentages of its expected value."""

    def band(limit: float | None) -> float | None:
        if expected is None or limit is None or expected == 0:
            return None
        return abs(expected - limit) / abs(expected) * 100.0

    return Bands(band(warn_limit), band(fail_limit))


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
