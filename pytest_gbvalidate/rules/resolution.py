"""What a figure's evidence can tell, and the one rule that turns a figure, a threshold and that evidence into a
verdict. Pure functions on numbers: no torch, no pytest.

A figure's resolution is the smallest change its evidence can tell apart from noise: noise.NOISE_K times the
combined errors that stand behind it -- its own figure's (the standard error of its median: rules/noise.py), the
reference's it is compared with (a recorded baseline's spread, an earlier report's figure's error) and, where the
node's runs are kept, the node's run-to-run spread. It is a distance on the same scale as `worse_pct`: a log ratio
in percent for two positive figures, so a tenfold fall (230%) is never "within" any plausible spread.

Each metric declares the resolution it needs (the baseline's `resolution`, per SKU and per metric). Noise may move a
verdict by no more than that: a figure beyond its threshold by more than min(resolution, needed) is judged on its
value -- unless the measurement waited for a CPU long enough to explain that much (node/neighbours.py): a busy
neighbour's fall is no fault of the node, and the figure is then unresolved. A figure whose resolution is coarser
than needed is judged only where its verdict holds against its whole resolution (the threshold crossed by more than
the needed resolution, or not approached within its resolution); anywhere between it is UNRESOLVED: never a pass,
never a fail. Every verdict here is monotonic in the value: as a figure gets worse its verdict never gets milder
(PASS < WARN < UNRESOLVED < FAIL).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from pytest_gbvalidate.rules.noise import NOISE_K

Direction = Literal["higher", "lower"]
# What a figure against one threshold can be: not beyond it, beyond it but within the noise it is allowed, beyond
# it by more than the noise may excuse, or too noisy to tell which.
Side = Literal["within", "within_noise", "beyond", "unresolved"]


def direction_of(text: str) -> Direction:
    """A direction word read from a spec, a baseline or a report: `lower`, else `higher` (the catalog's default)."""
    return "lower" if text == "lower" else "higher"


def worse_pct(value: float, reference: float, direction: str) -> float:
    """How far `value` lies to the worse side of `reference` (+ worse, - better) for a metric where `direction`
    ("higher" or "lower") is better: a log ratio in percent where both are above 0 (a tenfold fall is 230%, and
    small changes read as percentages), else in percent of |reference|, infinite from a reference of 0. Monotonic
    in `value` for every reference: a figure at or below 0 is infinitely far below a positive reference."""
    return toward_worse(_above_pct(value, reference), direction)


def toward_worse(signed: float, direction: str) -> float:
    """A signed difference (+ above) turned toward the worse side (+ worse) of a metric where `direction` ("higher"
    or "lower") is better: the one place a direction decides which side is worse."""
    return -signed if direction == "higher" else signed


def moved_toward_worse(value: float, pct: float, direction: str) -> float:
    """`value` moved `pct` (a log ratio in percent) to the worse side of a metric where `direction` is better: the
    inverse of worse_pct for a positive `value` (a limit `pct` worse than an expected value)."""
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
    """Where a figure worse (or better) than another lies, in words, for a metric where `direction` is better:
    a worse one `below` it where higher is better."""
    return "below" if (direction_of(direction) == "higher") == worse else "above"


def at_least_as_good(value: float, healthy: float, direction: str) -> bool:
    """Whether `value` is at or to the better side of `healthy`, a healthy figure of the same node or SKU (the earlier
    report's, the baseline's expected value). Noise only ever takes from a capacity figure (a neighbour, a page-cache
    flush, a clock ramp slow a pass, none speeds one up), so such a figure shows the node is at least that good
    however it scattered: judged on its value, never too noisy to judge, never held against the node."""
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
    """The smallest change a figure's evidence can tell (`pct`), and the errors it is made of (name -> percent:
    `samples` (the figure's own), `reference`, `run_to_run`), each as its evidence gives it."""

    pct: float
    spreads: tuple[tuple[str, float], ...]
    # The fall (percent, a log ratio) the measurement's own waits for a CPU explain (noise.with_neighbours: a
    # neighbour held its CPUs): one-sided evidence -- the node is at least this good -- so no part of `pct`.
    explained_pct: float = 0.0

    def describe(self) -> str:
        parts = ", ".join(f"{name.replace('_', '-')} {spread:.1f}%" for name, spread in self.spreads)
        waits = f"; its waits for a CPU explain a fall of {self.explained_pct:.0f}%" if self.explained_pct else ""
        return f"resolution {self.pct:.1f}% ({NOISE_K:g} x the combined error of {parts}{waits})"


def of_spreads(*, explained_pct: float = 0.0, **spreads: float | None) -> Resolution | None:
    """The resolution of a figure from the robust spreads (percent) behind it, by name (None: not known), and the
    fall its waits for a CPU explain; None where no spread is known: the figure is taken at its value."""
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
    """A figure `beyond_pct` past a threshold (worse_pct against it: + beyond, - short of it), with this
    `resolution`, for a metric that needs `needed`: `beyond` where it is past by more than min(resolution, needed)
    and by more than its waits for a CPU explain (or is not a number); `unresolved` where it is past by more than
    the noise may excuse, or past at all where those waits explain at least that much, but by no more than those
    waits explain (a neighbour held its CPUs), or where its resolution
    is coarser than needed and it lies within that resolution of the threshold; `within` where it is short of the
    threshold and either resolved or short by more than its whole resolution; else `within_noise` (past it, by no
    more than its resolution, which the metric allows).

    `tolerance_pct`: where the threshold is itself a change allowed for the same noise (--gb-compare's allowed
    change, `tolerance_pct` past the reference), noise excuses only what reaches past it: the two overlap, they do
    not add up. A neighbour's waits are no such noise: the node alone would have measured the figure that much
    better, and that figure is judged against the same threshold, so the fall they explain counts in full."""
    r = 0.0 if resolution is None else resolution.pct
    excused = max(min(r, needed.pct) - tolerance_pct, 0.0)
    explained = 0.0 if resolution is None else resolution.explained_pct
    if math.isnan(beyond_pct) or beyond_pct > max(excused, explained):
        return "beyond"
    # Past the threshold by no more than its waits explain, where they explain all its noise excuses: a neighbour's
    # fall, not the node's, and no more within the noise (a WARN) than beyond it.
    if beyond_pct > excused or (beyond_pct > 0 and explained >= excused):
        return "unresolved"
    if r > needed.pct:
        return "within" if beyond_pct <= -r else "unresolved"
    return "within_noise" if beyond_pct > 0 else "within"
