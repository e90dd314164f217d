"""What a figure's evidence can tell, and the one rule that turns a figure, a threshold and that evidence into a
verdict. Pure functions on numbers: no torch, no pytest.

A figure's resolution is the smallest change its evidence can tell apart from noise: noise.NOISE_K times the
combined errors behind it -- its own (its median's standard error: rules/noise.py), its reference's (a recorded
baseline's spread, an earlier report's error) and, where the node's runs are kept, their run-to-run spread. It is a
distance on `worse_pct`'s scale: a log ratio in percent for two positive figures, so a tenfold fall (230%) is never
"within" any plausible spread.

Each metric declares the resolution it needs (the baseline's `resolution`, per SKU and per metric), and noise may
move a verdict by no more than that: a figure beyond its threshold by more than min(resolution, needed) is judged on
its value -- unless its waits for a CPU explain that much (node/neighbours.py): a busy neighbour's fall is no fault of
the node, and the figure is unresolved. A figure whose resolution is coarser than needed is judged only where its
verdict holds against its whole resolution (the threshold crossed by more than the needed resolution, or not
approached within its resolution); between, it is UNRESOLVED: never a pass, never a fail. Every verdict is monotonic
in the value: as a figure gets worse its verdict never gets milder (PASS < WARN < UNRESOLVED < FAIL).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from pytest_gbvalidate.rules.noise import NOISE_K

Direction = Literal["higher", "lower"]
# Against one threshold: not past it, past within the allowed noise, past what noise may excuse, or too noisy to tell.
Side = Literal["within", "within_noise", "beyond", "unresolved"]


def direction_of(text: str) -> Direction:
    """A direction word read from a spec, a baseline or a report: `lower`, else `higher` (the catalog's default)."""
    return "lower" if text == "lower" else "higher"


def worse_pct(value: float, reference: float, direction: str) -> float:
    """How far `value` lies to the worse side of `reference` (+ worse) where `direction` is better: a log ratio in
    percent where both are above 0 (a tenfold fall is 230%), else in percent of |reference|, infinite from 0. Monotonic
    in `value`: a figure at or below 0 is infinitely far below a positive reference."""
    return toward_worse(_above_pct(value, reference), direction)


def toward_worse(signed: float, direction: str) -> float:
    """A signed difference (+ above) turned toward the worse side (+ worse): the one place a direction decides it."""
    return -signed if direction == "higher" else signed


def moved_toward_worse(value: float, pct: float, direction: str) -> float:
    """`value` moved `pct` (a log ratio in percent) to the worse side: worse_pct's inverse for a positive `value`."""
    return value * math.exp(toward_worse(pct, direction) / 100.0)


def moved_linearly(value: float, pct: float, direction: str) -> float:
    """`value` moved `pct` percent of itself to the worse side: a baseline's relative limit (`fail: 10%`)."""
    return value * (1.0 + toward_worse(pct, direction) / 100.0)


def better_of(a: float, b: float, direction: str) -> float:
    """The better of two figures of a metric where `direction` is better (`a` where they are equal)."""
    return b if is_worse(a, b, direction) else a


def worse_of(values: Iterable[float], direction: str) -> float:
    """The worst of `values` of a metric where `direction` is better."""
    return min(values, key=lambda v: -toward_worse(v, direction))


def side_word(direction: str, *, worse: bool) -> str:
    """Where a figure worse (or better) than another lies, in words: a worse one `below` where higher is better."""
    return "below" if (direction_of(direction) == "higher") == worse else "above"


def at_least_as_good(value: float, healthy: float, direction: str) -> bool:
    """Whether `value` is at or to the better side of `healthy` (the earlier report's, the expected value). Noise only
    ever slows a capacity figure, so such a figure shows the node at least that good however it scattered: judged on
    its value, never too noisy to judge."""
    return worse_pct(value, healthy, direction) <= 0


def is_worse(value: float, reference: float, direction: str) -> bool:
    """`value` lies to the worse side of `reference`."""
    return worse_pct(value, reference, direction) > 0


def _above_pct(value: float, reference: float) -> float:
    if reference > 0:
        return (math.log(value) - math.log(reference)) * 100.0 if value > 0 else -math.inf  # no underflow
    if reference == 0:
        return 0.0 if value == 0 else math.copysign(math.inf, value)
    return (value - reference) / abs(reference) * 100.0


@dataclass(frozen=True)
class Resolution:
    """The smallest change a figure's evidence can tell (`pct`), and its errors (name -> percent: `samples`, the
    figure's own, `reference`, `run_to_run`)."""

    pct: float
    spreads: tuple[tuple[str, float], ...]
    explained_pct: float = 0.0  # the fall (%, log ratio) its CPU waits explain: one-sided, the node at least this good

    def describe(self) -> str:
        parts = ", ".join(f"{name.replace('_', '-')} {spread:.1f}%" for name, spread in self.spreads)
        waits = f"; its waits for a CPU explain a fall of {self.explained_pct:.0f}%" if self.explained_pct else ""
        return f"resolution {self.pct:.1f}% ({NOISE_K:g} x the combined error of {parts}{waits})"


def of_spreads(*, explained_pct: float = 0.0, **spreads: float | None) -> Resolution | None:
    """The resolution from the spreads (percent) behind a figure, by name (None: not known), and the fall its waits
    for a CPU explain; None where no spread is known (the figure is taken at its value)."""
    known = tuple((name, float(s)) for name, s in spreads.items() if s is not None)
    if not known:
        return None
    # hypot, not the root of the squares' sum: a report's spread of 1e200 must not overflow.
    return Resolution(NOISE_K * math.hypot(*(s for _, s in known)), known, explained_pct)


# The bounds a declared resolution must lie within, in percent (a log ratio: 230% is a tenfold change). Past the
# upper one no allowance means anything: a figure a tenth of its reference would be "within" it.
MIN_NEEDED_PCT, MAX_NEEDED_PCT = 0.1, 100.0


@dataclass(frozen=True)
class Needed:
    """The resolution a metric needs (percent) to be judged, and where that figure comes from."""

    pct: float
    source: str


def side(beyond_pct: float, resolution: Resolution | None, needed: Needed, tolerance_pct: float = 0.0) -> Side:
    """A figure `beyond_pct` past a threshold (worse_pct against it: + beyond, - short), by the module's rule:
    `beyond` past min(resolution, needed) and past what its waits for a CPU explain (or not a number);
    `unresolved` past what noise may excuse but not past those waits, past at all where the waits explain all noise
    excuses, or, with a resolution coarser than needed, within it of the threshold; `within` short of it (by more
    than a coarse resolution); else `within_noise` (past it, by no more than the noise the metric allows).

    `tolerance_pct`: where the threshold is itself a change allowed for the same noise (--gb-compare's), noise excuses
    only what reaches past it (they overlap, not add up); a neighbour's waits are no such noise: they count in full."""
    r = 0.0 if resolution is None else resolution.pct
    excused = max(min(r, needed.pct) - tolerance_pct, 0.0)
    explained = 0.0 if resolution is None else resolution.explained_pct
    if math.isnan(beyond_pct) or beyond_pct > max(excused, explained):
        return "beyond"
    # Past by no more than its waits explain, where they explain all noise excuses: a neighbour's fall, not a WARN.
    if beyond_pct > excused or (beyond_pct > 0 and explained >= excused):
        return "unresolved"
    if r > needed.pct:
        return "within" if beyond_pct <= -r else "unresolved"
    return "within_noise" if beyond_pct > 0 else "within"
