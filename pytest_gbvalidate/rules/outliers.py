"""Robust statistics of one metric across the nodes of a fleet: median, spread, and the nodes worse than the fleet
median by too much. Pure functions on numbers, no I/O.

A node is an outlier of a metric when it is worse than the fleet median (direction-aware) by all of

- more than `mad_k` scaled MADs: Iglewicz & Hoaglin's modified z-score, 0.6745 * (x - median) / MAD ("How to Detect
  and Handle Outliers", ASQC Basic References in Quality Control vol. 16, 1993, which recommends flagging |z| > 3.5);
- more than `pct` percent, a log ratio (resolution.worse_pct's scale: a node a few percent slow is a node);
- more than the fleet's noise allows: noise.margin_pct of the fleet's typical spread (the median of the other nodes'
  spreads, of two the smaller), twice: the figure and the median. A node's own scatter never widens its allowance (an
  erratic figure is itself a symptom), and no single node, however noisy, widens anybody's.

Where its reports give the metric's needed resolution (rules/resolution.py), that decides alone: a node worse than the
median by more than it is an outlier unless its waits for a CPU explain the dip, and no finer fall drains (widely
scattering peers would let a slow node pass: docs/noise.md). A node that is no outlier but whose own spread lies far
beyond the others' (more than max(`mad_k`, OUTLIER_Z) of their scaled MADs above their median, and TOO_NOISY_RATIO
times it) is too noisy to judge for that figure (Unjudged): neither drained nor passed.

The MAD is never taken as less than the nodes' typical run-to-run spread where over half their reports give one
(`--gb-history` with --gb-compare): the other nodes' median (of two, the smaller), never the judged node's own
(docs/noise.md: ten runs of one healthy VM as ten nodes). Each rule alone drains healthy nodes: the percent rule any
metric noisier than `pct`, the MAD rule a dip of 2% where a few nodes agree closely. MAD == 0 (over half the nodes
report the same value, as quantised readings do): the modified z-score is undefined and the MAD rule holds for any
deviation. `noise_floor_pct` (default 0, off) also requires the deviation to exceed that percent of the median. Only
deviations to the worse side count: a node faster than the rest is no reason to drain it.
"""

from __future__ import annotations

import bisect
import functools
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

import numpy as np

from pytest_gbvalidate.rules import noise as nz
from pytest_gbvalidate.rules import resolution as rs
from pytest_gbvalidate.rules.noise import modified_z

DEFAULT_MAD_K = nz.OUTLIER_Z  # Iglewicz & Hoaglin's recommended cut-off for one modified z-score
DEFAULT_PCT = 10.0
MIN_NODES = 3  # fewer: the median of two is their mean, and "worse than the rest" means nothing
# Too noisy needs this many times the fleet's spread too: where most nodes agree (MAD 0), a little noisier is judged.
TOO_NOISY_RATIO = 2.0
# Rounds a judgement of siblings round by round needs: fewer, and how far a device's rounds stray from their own
# median says too little of its error (sibling_z for four devices: 17.9 at three rounds, 5.7 at four, 4.8 at six).
MIN_SIBLING_ROUNDS = 4
HIGHER, LOWER = "higher", "lower"
Figures = Mapping[str, tuple[float, Mapping[str, Any]]]  # a node's devices: label -> (figure, details)


@dataclass(frozen=True)
class Spread:
    """How one metric's values spread across the nodes; `spread_pct`: (max - min) / |median| in percent (None at 0)."""

    nodes: int
    median: float
    minimum: float
    maximum: float
    mad: float
    spread_pct: float | None


@dataclass(frozen=True)
class Outlier:
    """A node worse than the fleet median: by `worse_pct` of |median| (None at 0), `z` its signed modified z-score
    (None at MAD 0), flagged by `rules`."""

    host: str
    value: float
    worse_pct: float | None
    z: float | None
    rules: tuple[str, ...]


def spread(values: Sequence[float]) -> Spread:
    center = statistics.median(values)
    low, high = min(values), max(values)
    spread_pct = None if center == 0 else (high - low) / abs(center) * 100.0
    return Spread(len(values), center, low, high, statistics.median(abs(v - center) for v in values), spread_pct)


def outliers(
    values: Mapping[str, float],
    direction: str,
    mad_k: float = DEFAULT_MAD_K,
    pct: float = DEFAULT_PCT,
    noise_floor_pct: float = 0.0,
    noises: Mapping[str, nz.Noise | None] | None = None,
    run_to_run_pct: float | None = None,
    run_to_runs: Mapping[str, float] | None = None,
    needed_pct: float | None = None,
) -> list[Outlier]:
    """The outliers of judge(): the hosts to drain for this metric."""
    return judge(
        values, direction, mad_k, pct, noise_floor_pct, noises, run_to_run_pct, run_to_runs, needed_pct
    ).outliers


def judge(
    values: Mapping[str, float],
    direction: str,
    mad_k: float = DEFAULT_MAD_K,
    pct: float = DEFAULT_PCT,
    noise_floor_pct: float = 0.0,
    noises: Mapping[str, nz.Noise | None] | None = None,
    run_to_run_pct: float | None = None,
    run_to_runs: Mapping[str, float] | None = None,
    needed_pct: float | None = None,
) -> Judgement:
    """The outliers of `values` (host -> value) by the module's rules, and the hosts too noisy to judge, in its order.
    `noises`: host -> its report's noise; `run_to_run_pct`: the fleet's run-to-run spread as one number, `run_to_runs`
    host -> its own (each host's floor the others', fleet_spread_pct; the larger counts). No verdicts among fewer than
    MIN_NODES values or for a direction other than higher/lower (nothing says which side is worse)."""
    if len(values) < MIN_NODES or direction not in (HIGHER, LOWER):
        return Judgement([], [])
    s = spread(list(values.values()))
    spreads = {host: n.spread_pct for host, n in (noises or {}).items() if n is not None and host in values}
    fleet_spreads, fleet_runs = Others(spreads, list(values)), Others(run_to_runs or {}, list(values))
    found, unjudged = [], []
    for host, value in values.items():
        typical_pct = fleet_spreads.typical(host)
        r2r = max(run_to_run_pct or 0.0, fleet_runs.typical(host) or 0.0)
        floor = abs(s.median) * r2r / 100.0 / nz.MAD_TO_SIGMA
        worse = rs.toward_worse(value - s.median, direction)
        z = modified_z(value, s.median, max(s.mad, floor))
        worse_pct = None if s.median == 0 else worse / abs(s.median) * 100.0
        margin = nz.margin_pct(typical_pct, typical_pct)
        noisy = fleet_spreads.too_noisy(host, max(mad_k, nz.OUTLIER_Z))
        linear_pct = max(pct, noise_floor_pct) if needed_pct is None else noise_floor_pct
        practical = _practical(value, s.median, direction, linear_pct, needed_pct)
        if needed_pct is None:
            far_out = z is None or abs(z) > mad_k
            out = worse > 0 and far_out and practical is not None and nz.beyond(value, s.median, margin)
        else:  # the needed resolution decides alone
            margin = min(margin, needed_pct)
            out = practical is not None
        if out and practical is not None:
            busy = _waits_explain(value, s.median, direction, (noises or {}).get(host), margin)
            if busy is not None:  # a neighbour held its CPUs: the dip may be the neighbour's, not the node's
                unjudged.append(Unjudged(host, value, spreads[host], typical_pct or 0.0, None, busy))
                continue
            if needed_pct is None:
                far = f"{abs(z):.1f} scaled MADs > {mad_k:.1f}" if z is not None else ""
                if z is not None and floor > s.mad:
                    far += f" (the MAD taken as the nodes' typical run-to-run spread, {r2r:.1f}%)"
                rules = [far or "the value of more than half the nodes differs", practical]
                if margin:
                    rules += [f"beyond the {margin:.1f}% the figures' noise allows (the fleet's spread, not its own)"]
            else:
                scatter = f"{abs(z):.1f} scaled MADs from the median" if z is not None else "off the median"
                rules = [f"{scatter}: the fleet's scatter excuses no more than its metric needs", practical]
            if noisy is not None:
                rules += [f"its own spread, {spreads[host]:.1f}% against the fleet's {noisy[0]:.1f}%, excuses nothing"]
            found.append(Outlier(host, value, worse_pct, z, tuple(rules)))
            continue
        if noisy is not None:
            unjudged.append(Unjudged(host, value, spreads[host], noisy[0], noisy[1]))
    return Judgement(found, unjudged)


def _practical(value: float, median: float, direction: str, pct: float, needed_pct: float | None) -> str | None:
    """Why `value` lies beyond the practical margin below the fleet's `median` (as a log ratio, beyond `pct` and any
    `needed_pct`), or None where it does not."""
    log_pct = rs.worse_pct(value, median, direction)
    if not log_pct > pct or (needed_pct is not None and not log_pct > needed_pct):
        return None
    if needed_pct is None:
        return f"{log_pct:.1f}% worse than the median as a log ratio > {pct:g}%"
    return f"{log_pct:.1f}% worse than the median as a log ratio > the {needed_pct:g}% its metric needs to tell"


def _waits_explain(
    value: float, median: float, direction: str, own: nz.Noise | None, margin_pct: float
) -> tuple[float, float] | None:
    """(the share of its time the measurement waited for a CPU, the fall that explains; percent, a log ratio) where
    those waits explain its dip below the fleet's median, within the noise margin; else None."""
    explained = nz.explained_pct(own)
    if own is None or own.cpu_wait_pct is None or not explained:
        return None
    return (own.cpu_wait_pct, explained) if rs.worse_pct(value, median, direction) <= explained + margin_pct else None


@dataclass(frozen=True)
class Unjudged:
    """A node too noisy to judge for a figure: its `spread_pct` against the fleet's typical one (without it), `z` the
    modified z of its spread among the others' (None where their MAD is 0)."""

    host: str
    value: float
    spread_pct: float
    fleet_spread_pct: float
    z: float | None
    busy: tuple[float, float] | None = None  # (% of time waiting for a CPU, the fall explained) where that explains it

    def describe(self) -> str:
        if self.busy is not None:
            waited, explained = self.busy
            return (
                f"too busy to judge: it waited {waited:.0f}% of its time for a CPU, which explains a fall of "
                f"{explained:.0f}% (as a log ratio)"
            )
        return f"too noisy to judge: spread {self.spread_pct:.1f}% against the fleet's {self.fleet_spread_pct:.1f}%"


@dataclass(frozen=True)
class Judgement:
    """One metric's verdicts across the nodes: the outliers to drain, and the nodes too noisy to judge."""

    outliers: list[Outlier]
    unjudged: list[Unjudged]


class Others:
    """The hosts' spreads of one figure (host -> spread, of `hosts`; negative or NaN left out), each judged against
    the others' alone: sorted once, the others' median found by position (10,000 nodes: lookups, not sorts)."""

    def __init__(self, spreads: Mapping[str, float], hosts: Sequence[str]) -> None:
        self.spreads = {h: spreads[h] for h in hosts if h in spreads and spreads[h] >= 0}
        self.sorted = sorted(self.spreads.values())
        self.hosts = len(hosts)

    def values(self, host: str) -> list[float] | None:
        """The spreads of the hosts other than `host`, where more than half and at least two give one; else None."""
        known = list(self.sorted)
        if host in self.spreads:
            known.pop(bisect.bisect_left(known, self.spreads[host]))
        return known if len(known) >= 2 and len(known) > (self.hosts - 1) / 2 else None

    def typical(self, host: str) -> float | None:
        """The fleet's typical spread that `host` is judged against: _typical of values(host), without a copy."""
        known = self.sorted
        skip = bisect.bisect_left(known, self.spreads[host]) if host in self.spreads else None
        count = len(known) - (skip is not None)
        if count < 2 or count <= (self.hosts - 1) / 2:
            return None

        def at(i: int) -> float:  # the i-th of the others, in order
            return known[i if skip is None or i < skip else i + 1]

        if count < 3:
            return min(at(0), at(1))
        half = count // 2
        return at(half) if count % 2 else (at(half - 1) + at(half)) / 2

    def too_noisy(self, host: str, cutoff: float) -> tuple[float, float | None] | None:
        """(the fleet's typical spread, the modified z of the host's among the others') where `host`'s spread is more
        than `cutoff` scaled MADs (any amount at MAD 0) and TOO_NOISY_RATIO times beyond the others'; else None."""
        own, center = self.spreads.get(host), self.typical(host)
        if own is None or center is None or own <= TOO_NOISY_RATIO * center:
            return None
        known = self.values(host)
        assert known is not None  # as typical(host)
        z = modified_z(own, center, _typical([abs(v - center) for v in known]))
        return (center, z) if z is None or z > cutoff else None


def fleet_spread_pct(spreads: Mapping[str, float], hosts: Sequence[str], host: str) -> float | None:
    """The fleet's typical spread of a figure (percent) `host` is judged against: the median of the other hosts'
    `spreads` (of two, the smaller) where more than half and at least two give one; else None."""
    return Others(spreads, hosts).typical(host)


def _typical(values: Sequence[float]) -> float:
    """The median of `values`, of two the smaller: the median of two is their mean, which the larger moves."""
    return statistics.median(values) if len(values) >= 3 else min(values)


def is_number(value: object) -> TypeGuard[float]:
    """A finite int or float (a report keeps a broken measurement's value as text, e.g. "nan")."""
    return nz.finite(value) is not None


def sibling_outliers(figures: Figures, direction: str) -> list[Outlier]:
    """The devices of one node (label -> (figure, details)) worse than their siblings. Measured in rounds
    (noise.in_rounds), each is judged round by round against its siblings of that round (_outliers_by_round): what
    drifted between rounds moved them all. Otherwise by the fleet's rules, the noise being the other devices' typical
    error (noise.of_the_median, never the device's own); a device too noisy to judge is not named."""
    values = {label: float(value) for label, (value, _) in figures.items()}
    rounds = _equal_rounds(figures)
    if rounds is not None:
        return _outliers_by_round(values, rounds, direction)
    noises = {label: nz.of_the_median(details) for label, (_, details) in figures.items()}
    return outliers(values, direction, noises=noises)


def sibling_verdict(
    figures: Figures, direction: str, again: Callable[[], Figures] | None = None
) -> tuple[list[Outlier], Figures]:
    """The devices worse than their siblings (sibling_outliers), all measured `again` before any is named: named where
    both passes find it (a burst of interference does not repeat), as the second pass has it; and the figures read."""
    found = sibling_outliers(figures, direction)
    if not found or again is None:
        return found, figures
    second = again()
    return [o for o in sibling_outliers(second, direction) if o.host in {f.host for f in found}], second


def _outliers_by_round(
    values: Mapping[str, float], rounds: Mapping[str, Sequence[float]], direction: str
) -> list[Outlier]:
    """The devices (label -> its positive figure in each round) behind their siblings round by round (_behind) by more
    than DEFAULT_PCT and sibling_z errors. (A 4-device fleet's MAD rule missed one slowed device in five: one healthy
    device measured fast widened the MAD of four.)"""
    labels = list(rounds)
    if len(labels) < MIN_NODES or direction not in (HIGHER, LOWER):
        return []
    figures = np.array([rounds[label] for label in labels], dtype=float)
    behind, z = _behind(figures if direction == HIGHER else 1.0 / figures)
    cutoff = sibling_z(*figures.shape)
    found = []
    for label, log_behind, z_score in zip(labels, behind.tolist(), z.tolist(), strict=True):
        if -log_behind * 100.0 <= DEFAULT_PCT or not -z_score > cutoff:  # a z of NaN (no spread, not behind): none
            continue
        worse_pct = (1.0 - math.exp(log_behind)) * 100.0  # shown as people read a fall: in percent of the median
        spread_zero = math.isinf(z_score)
        rules = ["every round's spread is 0" if spread_zero else f"{-z_score:.1f} errors of its median > {cutoff:.1f}"]
        rules.append(f"more than {DEFAULT_PCT:g}% behind as a log ratio, round by round")
        found.append(Outlier(label, values[label], worse_pct, None if spread_zero else z_score, tuple(rules)))
    return found


def _behind(figures: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(..., devices, rounds) positive figures, higher better -> how far each device is behind its siblings (a log
    ratio, each round against that round's siblings' median; its rounds' median against the devices'), and that in
    errors of a median: how far each device's rounds stray from their own median, pooled over the devices."""
    logs = np.log(figures)
    devices, count = logs.shape[-2], logs.shape[-1]
    ratios = logs - np.stack([np.median(np.delete(logs, d, axis=-2), axis=-2) for d in range(devices)], axis=-2)
    own = np.median(ratios, axis=-1)
    stray = np.abs(ratios - own[..., None]).reshape(*ratios.shape[:-2], devices * count)
    error = np.median(stray, axis=-1) * nz.MAD_TO_SIGMA * nz.MEDIAN_ERROR / math.sqrt(count)
    behind = own - np.median(own, axis=-1)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        return behind, behind / error[..., None]


@functools.cache
def sibling_z(devices: int, rounds: int) -> float:
    """The errors of its median (_behind) a healthy node's worst device stays within but in FAMILY_LEVEL of seeded
    simulated nodes of `devices` devices and `rounds` rounds (a ratio of log deviations: any noise size alike)."""
    _, z = _behind(np.exp(np.random.default_rng(0).standard_normal((nz.SIMULATED_FAMILIES, devices, rounds))))
    return float(np.quantile(np.nan_to_num(-z, nan=0.0).max(axis=-1), 1.0 - nz.FAMILY_LEVEL))


def _equal_rounds(figures: Figures) -> dict[str, list[float]] | None:
    """Each device's round figures, where all have as many (MIN_SIBLING_ROUNDS or more), positive and finite."""
    rounds = {}
    for label, (_, details) in figures.items():
        found = details.get("rounds")
        if not isinstance(found, list) or not all((x := nz.finite(v)) is not None and x > 0 for v in found):
            return None
        rounds[label] = [float(v) for v in found]
    counts = {len(r) for r in rounds.values()}
    return rounds if len(counts) == 1 and min(counts) >= MIN_SIBLING_ROUNDS else None
