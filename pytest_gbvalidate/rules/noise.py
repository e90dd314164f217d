"""How noisy a measurement is, from the samples or passes that made it, and whether a difference between two figures
holds against that noise. Pure functions on numbers: no torch, no pytest.

A figure's spread is the scaled MAD of its samples (1.4826 x MAD: the standard deviation of normal data, blind to a
few wild samples) in percent of their median; its error (`Noise.error_pct`) is their median's standard error, which
shrinks as more are taken (rules/sampling.py). A difference between two figures is real only beyond NOISE_K times
their combined noise. Drift between runs (a neighbour, the page cache, clocks) is no part of a run's error
(docs/noise.md): from MIN_RUNS kept runs on, a changed figure must also be an outlier among them (RunToRun). A
capacity figure measured in several passes is the best pass (STREAM's rule: interference only slows a pass); its
spread is its samples' and, from three passes on, the passes', its error the best pass's own.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from pytest_gbvalidate.report.records import NoiseRecord, RunToRunRecord

# 1 / 0.6745 (the 0.75 quantile of the standard normal): MAD x 1.4826 estimates the standard deviation. The one MAD
# constant: Iglewicz & Hoaglin's modified z-score, 0.6745 (x - median) / MAD, is (x - median) / (MAD_TO_SIGMA x MAD).
MAD_TO_SIGMA = 1.4826
# How many combined robust spreads (one sample's) a difference must exceed: the median of >= 10 samples is several
# times tighter (0.28 of a sample's spread for 20), so 2 spreads apart is about 5 of its standard deviations.
NOISE_K = 2.0
MEDIAN, BEST_PASS = "median", "best_pass"
OUTLIER_Z = 3.5  # Iglewicz & Hoaglin's cut-off for one modified z-score ("How to Detect and Handle Outliers", 1993)
MIN_RUNS = 5  # kept runs before their spread is believed: the MAD of three is one run's distance from the middle
MAX_RUNS = 20  # the most recent runs the run-to-run spread is taken from: the node as it is now
# Figures are judged at once, each against a few values: 73% of healthy nodes with 150 figures among 10 have one
# beyond OUTLIER_Z (4000 simulations). Cut-off: the z a healthy node's worst exceeds in FAMILY_LEVEL of them (family_z).
FAMILY_LEVEL = 0.01
SIMULATED_FAMILIES = 2000
# More values or figures than these are judged as this many (the cut-off falls with values, rises with figures).
MAX_SIMULATED_VALUES = 40
MAX_SIMULATED_FIGURES = 400
# A measurement that waited a share w of its timed window for a CPU ran 1/(1 - w) times as long as alone: as a log
# ratio, -ln(1 - w), the fall its waits explain (explained_pct); a share past MAX_WAIT_SHARE counts as that.
MAX_WAIT_SHARE = 0.99
# The standard error of the median of n samples from a normal spread sigma is about sqrt(pi / 2) sigma / sqrt(n).
MEDIAN_ERROR = math.sqrt(math.pi / 2)


@dataclass(frozen=True)
class Noise:
    """How a figure was summarised (`median` of samples, or best of `passes`), from how many, their spread (%)."""

    summary: str
    count: int
    spread_pct: float
    passes: tuple[float, ...] = ()
    cpu_wait_pct: float | None = None  # percent of its time it waited for a CPU: one-sided, no part of `spread_pct`
    error_pct: float | None = None  # its own error (percent); None: see error_of

    def as_record(self) -> NoiseRecord:
        record: NoiseRecord = {"summary": self.summary, "count": self.count, "spread_pct": round(self.spread_pct, 3)}
        if self.passes:
            record["passes"] = [float(f"{p:.6g}") for p in self.passes]
        if self.cpu_wait_pct is not None:
            record["cpu_wait_pct"] = round(self.cpu_wait_pct, 1)
        if self.error_pct is not None:
            record["error_pct"] = round(self.error_pct, 3)
        return record

    def error_of(self) -> float:
        """How far the figure may be off (percent): its `error_pct`, else its median's standard error, else (a best
        pass an older report gave without it) its whole spread: never surer than the evidence shows."""
        if self.error_pct is not None:
            return self.error_pct
        return median_error_pct(self.spread_pct, self.count) if self.summary == MEDIAN else self.spread_pct

    def error_with_waits_pct(self) -> float:
        """The figure's error and the fall its waits for a CPU explain (over NOISE_K), combined: how unsure a
        reference made from this figure would be (a recording made beside a neighbour is too low by up to that)."""
        return math.hypot(self.error_of(), 0.0 if not self.cpu_wait_pct else neighbours_pct(self.cpu_wait_pct))

    def describe(self) -> str:
        how = f"best of {len(self.passes)} passes" if self.summary == BEST_PASS else f"median of {self.count}"
        waited = "" if not self.cpu_wait_pct else f", {self.cpu_wait_pct:.0f}% of its time waiting for a CPU"
        return f"{how}, spread {self.spread_pct:.1f}%{waited}"


def neighbours_pct(cpu_wait_pct: float) -> float:
    """The fall (percent, a log ratio) that waiting `cpu_wait_pct` of its time explains, over NOISE_K: as a spread."""
    return -math.log1p(-min(max(cpu_wait_pct, 0.0) / 100.0, MAX_WAIT_SHARE)) * 100.0 / NOISE_K


def explained_pct(own: Noise | None) -> float:
    """The fall (percent, a log ratio) a figure's waits for a CPU explain: NOISE_K x neighbours_pct; 0 without."""
    waited = None if own is None else own.cpu_wait_pct
    return 0.0 if not waited else NOISE_K * neighbours_pct(waited)


def with_neighbours(own: Noise | None, cpu_wait_pct: float | None) -> Noise | None:
    """`own` with the share of its time the measurement waited for a CPU (None: none known, unchanged)."""
    if cpu_wait_pct is None:
        return own
    return Noise(MEDIAN, 0, 0.0, cpu_wait_pct=cpu_wait_pct) if own is None else replace(own, cpu_wait_pct=cpu_wait_pct)


def modified_z(value: float, center: float, mad_value: float, *, infinite: bool = False) -> float | None:
    """Iglewicz & Hoaglin's modified z-score of `value` among values of median `center` and MAD `mad_value` (+ above):
    the one form of it here. None where the MAD is 0; with `infinite`, a value off the center is infinitely far."""
    if mad_value == 0:
        return None if not infinite or value == center else math.copysign(math.inf, value - center)
    return (value - center) / (MAD_TO_SIGMA * mad_value)


def spread_pct(values: Sequence[float]) -> float | None:
    """The scaled MAD of `values` in percent of their median; None for fewer than 2, a median of 0 or a non-finite."""
    if len(values) < 2 or not all(math.isfinite(v) for v in values) or (center := statistics.median(values)) == 0:
        return None
    return MAD_TO_SIGMA * statistics.median(abs(v - center) for v in values) / abs(center) * 100.0


def of_samples(samples: Sequence[float]) -> Noise | None:
    """The noise of a figure that is the median of `samples` (None where they cannot say: see spread_pct)."""
    spread = spread_pct(samples)
    if spread is None:
        return None
    return Noise(MEDIAN, len(samples), spread, error_pct=median_error_pct(spread, len(samples)))


def of_passes(passes: Sequence[float], within: Sequence[Noise | None] = ()) -> Noise | None:
    """The noise of the best of `passes`: the largest spread `within` them and, from three passes on, the passes' own
    (the slower of two says how disturbed it was, not how far off the best is); of two with nothing known within,
    their half-difference in percent of their median. Its error: the largest `within`, else that spread."""
    errors = [n.error_of() for n in within if n is not None]
    spreads = [n.spread_pct for n in within if n is not None]
    finite = [p for p in passes if math.isfinite(p)]
    if len(finite) >= 3 and (between := spread_pct(finite)) is not None:
        spreads.append(between)
    elif len(finite) == 2 and not spreads and statistics.median(finite) != 0:
        spreads.append(abs(finite[0] - finite[1]) / 2 / abs(statistics.median(finite)) * 100.0)
    if not spreads:
        return None
    return Noise(BEST_PASS, len(passes), max(spreads), tuple(passes), error_pct=max(errors or spreads))


def from_details(details: Mapping[str, Any]) -> Noise | None:
    """The noise of a measurement from its details' `samples_<unit>` (the figure their median), `passes` (the best
    of several) and `cpu_wait_pct` (node/neighbours.py); None where they carry none of these."""
    within = None
    for key, value in details.items():
        if key.startswith("samples_") and isinstance(value, list) and all(_is_number(v) for v in value):
            within = of_samples([float(v) for v in value])
            break
    passes = details.get("passes")
    if isinstance(passes, list) and len(passes) >= 2 and all(_is_number(p) for p in passes):
        within = of_passes([float(p) for p in passes], [within])
    waited = finite(details.get("cpu_wait_pct"))
    return with_neighbours(within, None if waited is None or not 0 <= waited <= 100 else waited)


def of_the_median(details: Mapping[str, Any]) -> Noise | None:
    """The noise of the median of `samples_<unit>` in `details` as its standard error, for devices measured side by
    side in one run (no drift separates them); passes and CPU waits do not count: turns share seconds and neighbours."""
    within = from_details({k: v for k, v in details.items() if k not in ("passes", "cpu_wait_pct")})
    if within is None or within.summary != MEDIAN:
        return None
    return Noise(MEDIAN, within.count, median_error_pct(within.spread_pct, within.count))


def median_error_pct(spread_pct: float, count: int) -> float:
    """The standard error of the median of `count` samples that spread `spread_pct` (one sample's robust spread)."""
    return spread_pct * MEDIAN_ERROR / math.sqrt(max(count, 1))


def in_rounds(
    rounds: Sequence[Mapping[str, tuple[float, Mapping[str, Any]]]],
) -> dict[str, tuple[float, dict[str, Any]]]:
    """Devices measured in turns, round after round (label -> (figure, details with `samples_<unit>`)), as one figure
    each: the median of all its rounds' samples, details the first round's with all samples and each round's figure
    (`rounds`; no samples: the first round's). Drift over seconds (a VM's memory: 10-20%) then moves all alike."""
    merged: dict[str, tuple[float, dict[str, Any]]] = {}
    for label in rounds[0] if rounds else {}:
        value, details = rounds[0][label]
        key = next((k for k in details if k.startswith("samples_")), None)
        each = [r[label] for r in rounds if label in r]
        samples = [float(s) for _, d in each for s in d.get(key, [])] if key else []
        if key is None or not samples or not all(math.isfinite(s) for s in samples):
            merged[label] = (value, dict(details))
            continue
        figures = [float(v) for v, _ in each]
        extra = {"iterations": len(samples)} if "iterations" in details else {}
        merged[label] = (statistics.median(samples), {**details, key: samples, **extra, "rounds": figures})
    return merged


def from_record(record: object) -> Noise | None:
    """A report's `noise` field read back (reports are untrusted input: None where it is missing or malformed)."""
    if not isinstance(record, dict):
        return None
    summary, count, spread = record.get("summary"), record.get("count"), record.get("spread_pct")
    passes = record.get("passes", [])
    if not isinstance(summary, str) or not isinstance(count, int) or not isinstance(spread, (int, float)):
        return None
    if not _is_number(spread) or spread < 0 or not isinstance(passes, list) or not all(_is_number(p) for p in passes):
        return None
    waited, error = record.get("cpu_wait_pct"), record.get("error_pct")
    bad_wait = waited is not None and (not _is_number(waited) or not 0 <= waited <= 100)
    if bad_wait or (error is not None and (not _is_number(error) or error < 0)):
        return None
    return Noise(summary, count, float(spread), tuple(float(p) for p in passes), waited, error)


@dataclass(frozen=True)
class RunToRun:
    """One figure across a node's earlier runs: how many, their median, and their robust spread in percent of it."""

    runs: int
    median: float
    spread_pct: float

    def z(self, value: float) -> float:
        """The modified z of `value` among the runs (+ above); where they agree exactly, infinite or 0."""
        z = modified_z(value, self.median, self.spread_pct / 100.0 * abs(self.median) / MAD_TO_SIGMA, infinite=True)
        return 0.0 if z is None else z

    def as_record(self, value: float) -> RunToRunRecord:
        z = self.z(value)
        shown_z: float | str = round(z, 3) if math.isfinite(z) else str(z)
        median = float(f"{self.median:.6g}")
        return {"runs": self.runs, "median": median, "spread_pct": round(self.spread_pct, 3), "z": shown_z}

    def describe(self, value: float) -> str:
        return (
            f"the node's last {self.runs} runs: median {self.median:.4g}, spread {self.spread_pct:.1f}%, "
            f"modified z {self.z(value):+.1f}"
        )


def of_runs(values: Sequence[float]) -> RunToRun | None:
    """The run-to-run spread of a figure's last MAX_RUNS values (oldest first); None below MIN_RUNS or a median of 0."""
    recent = [v for v in values if math.isfinite(v)][-MAX_RUNS:]
    spread = spread_pct(recent) if len(recent) >= MIN_RUNS else None
    return None if spread is None else RunToRun(len(recent), statistics.median(recent), spread)


@functools.cache
def family_z(values: int, figures: int, *, apart: bool = False) -> float:
    """The modified z a healthy node's worst of `figures` figures stays within in all but FAMILY_LEVEL of cases, each
    against the median and MAD of `values` values: its own and its peers', or (`apart`) its earlier runs without it;
    over SIMULATED_FAMILIES seeded simulations of normal figures, never below OUTLIER_Z (one figure's cut-off)."""
    n, f = min(values, MAX_SIMULATED_VALUES), max(1, min(figures, MAX_SIMULATED_FIGURES))
    if n < 3:  # the median of two is their mean: no outlier among them
        return OUTLIER_Z
    rng = np.random.default_rng(0)
    worst = []
    for _ in range(SIMULATED_FAMILIES // 100):  # 100 at a time: a few MB each, not the whole at once
        x = rng.standard_normal((100, f, n + apart))  # (simulations, figures, values); value 0 is the one judged
        among = x[..., 1:] if apart else x
        center = np.median(among, axis=2)
        mad = np.median(np.abs(among - center[..., None]), axis=2)
        worst.append(((center - x[..., 0]) / (MAD_TO_SIGMA * mad)).max(axis=1))  # its worst figure, lower is worse
    return max(OUTLIER_Z, float(np.quantile(np.concatenate(worst), 1.0 - FAMILY_LEVEL)))


def margin_pct(*spreads_pct: float | None) -> float:
    """How far apart (percent) figures with these robust spreads may be by chance: NOISE_K times their combined
    spread (None adds none; hypot: a report's spread of 1e200 must not overflow)."""
    return NOISE_K * math.hypot(*(s for s in spreads_pct if s is not None))


def beyond(value: float, reference: float, margin_pct: float) -> bool:
    """Whether `value` and `reference` lie further apart than `margin_pct`, as a log ratio (in percent a 90% drop would
    be within two 45% spreads); figures not both above 0 in percent of |reference|."""
    if value > 0 and reference > 0:
        return abs(math.log(value / reference)) * 100.0 > margin_pct
    return reference == 0 or abs(value - reference) / abs(reference) * 100.0 > margin_pct


def finite(value: object) -> float | None:
    """`value` as a finite float, else None: not a bool, NaN, infinity or an int past float range (YAML has those)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _is_number(value: object) -> bool:
    return finite(value) is not None
