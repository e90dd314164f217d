"""A run as a whole against the node's kept runs: one figure's drift between runs says little, a node that lost pace
is worse in most of its figures at once -- copies, GEMMs, collectives and the training step together. Pure functions
on numbers: no torch, no pytest. compare.run_pace judges a run's pace with it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pytest_gbvalidate.rules.noise import MAD_TO_SIGMA, MAX_RUNS, MIN_RUNS, family_z, modified_z, of_runs
from pytest_gbvalidate.rules.resolution import toward_worse

MIN_PACE_FIGURES = 5  # the fewest figures a pace is taken over: a median of fewer says as little as one
# A figure this many of the runs' spreads to the worse side counts in the run's share of worse figures
# (Pace.worse_share): about 2% of normal figures by chance, half of them where all shift by two spreads.
SHARE_Z = 2.0
SHARE_BY_CHANCE = 0.5 * math.erfc(SHARE_Z / math.sqrt(2))  # normal figures beyond SHARE_Z: 2.3%


@dataclass(frozen=True)
class Pace:
    """A run against the node's history: of its figures the node's runs give a spread for, the median of how far each
    lies to the worse side of those runs (modified z) and by how much (percent of their median); `earlier`: each
    earlier run's against the others. `worse_share`: the share of its figures more than SHARE_Z spreads to the worse
    side, `earlier_shares` each run's: where runs drift as wholes (a VM) a node slower across the board moves its
    share before the median (docs/noise.md: a run 25% slower among a VM's healthy runs)."""

    figures: int
    worse_z: float
    worse_pct: float
    earlier: tuple[float, ...]
    worse_share: float = 0.0
    earlier_shares: tuple[float, ...] = ()

    def z(self) -> float | None:
        """The modified z of this run's pace among the earlier runs' (+ slower; _z_among)."""
        return _z_among(self.worse_z, self.earlier)

    def share_z(self) -> float | None:
        """The same of the run's share of worse figures among the earlier runs'. Where most runs have none or the
        same few (a MAD of 0), the spread is at least counting's (binomial, at the median share or SHARE_BY_CHANCE)."""
        if len(self.earlier_shares) < MIN_RUNS:
            return None
        center = max(statistics.median(self.earlier_shares), SHARE_BY_CHANCE)
        return _z_among(self.worse_share, self.earlier_shares, floor=math.sqrt(center * (1 - center) / self.figures))

    def verdict(self, allowed_pct: float) -> tuple[Literal["ok", "regressed"], float]:
        """(the verdict, the cut-off): regressed where the run's pace or share of worse figures is an outlier among
        the earlier runs' (beyond noise.family_z for two, the run apart) and its median worse by over `allowed_pct`."""
        z, share_z = self.z(), self.share_z()
        cutoff = family_z(len(self.earlier), 2, apart=True)
        beyond = (z is not None and z > cutoff) or (share_z is not None and share_z > cutoff)
        return ("regressed" if beyond and self.worse_pct > allowed_pct else "ok"), cutoff


def _z_among(value: float, earlier: Sequence[float], floor: float = 0.0) -> float | None:
    """The modified z of `value` among `earlier` (+ above their median), their robust spread at least `floor`;
    None with fewer than MIN_RUNS of them, or where they all agree and `value` does too."""
    if len(earlier) < MIN_RUNS:
        return None
    center = statistics.median(earlier)
    mad = max(statistics.median(abs(p - center) for p in earlier), floor / MAD_TO_SIGMA)
    return modified_z(value, center, mad, infinite=True)


def pace(now: Mapping[Any, float], runs: Sequence[Mapping[Any, float]], directions: Mapping[Any, str]) -> Pace | None:
    """The pace of `now` (figure key -> value) against the node's earlier `runs` (oldest first, the last MAX_RUNS), by
    `directions`; figures whose runs agree exactly are left out. None where under MIN_PACE_FIGURES have a spread."""
    recent = list(runs)[-MAX_RUNS:]
    figures = _figure_paces(now, recent, directions)
    if len(figures) < MIN_PACE_FIGURES:
        return None
    earlier, shares = [], []
    for i, run in enumerate(recent):  # each earlier run against the others: how a healthy run's pace strays
        theirs = _figure_paces(run, recent[:i] + recent[i + 1 :], directions)
        if len(theirs) >= MIN_PACE_FIGURES:
            earlier.append(statistics.median(z for z, _ in theirs))
            shares.append(_worse_share(theirs))
    worse_z = statistics.median(z for z, _ in figures)
    worse_pct = statistics.median(pct for _, pct in figures)
    return Pace(len(figures), worse_z, worse_pct, tuple(earlier), _worse_share(figures), tuple(shares))


def _worse_share(figures: Sequence[tuple[float, float]]) -> float:
    return sum(z > SHARE_Z for z, _ in figures) / len(figures)


def _figure_paces(
    now: Mapping[Any, float], runs: Sequence[Mapping[Any, float]], directions: Mapping[Any, str]
) -> list[tuple[float, float]]:
    """(modified z, percent), each + to the worse side, of every figure in `now` with a spread among `runs`."""
    found = []
    for key, value in now.items():
        spread = of_runs([run[key] for run in runs if key in run])
        if spread is None or spread.spread_pct == 0 or key not in directions or not math.isfinite(value):
            continue
        above_pct = (value - spread.median) / abs(spread.median) * 100.0
        found.append((toward_worse(spread.z(value), directions[key]), toward_worse(above_pct, directions[key])))
    return found
