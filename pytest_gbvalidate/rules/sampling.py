"""Measuring until the figures can tell: when a check measures its figures once more, and when it stops. Pure: no
torch, no pytest.

The models: nvbench samples until the noise is below `--max-noise` or `--timeout` is spent (after `--min-samples`);
criterion.rs samples for `measurement_time` and reports within `noise_threshold`. Here a check measures all its
figures in passes (a sweep's every size, a node's every GPU), each the best of its passes (noise.BEST_PASS) with that
pass's error (noise.Noise.error_of):

- a figure whose verdict is plain after one pass (within every threshold by more than its resolution, or resolved)
  stops there: nothing more could change it (`settled`);
- one that would fail, warn, regress or is unresolved gets a second pass, always: a neighbour's burst in one pass is
  no fault of the node, and the fall must be seen twice;
- from then on only an unresolved figure (the one verdict more evidence settles) gets another pass, while the check's
  further passes fit CHECK_SHARE of levels.BUDGET_S at the second pass's pace, up to MAX_PASSES; it stops `resolved`
  (no figure unresolved any more), `budget` or `cap`.

What stopped it is kept beside each figure measured more than once (`sampling` in its details) and named in an
unresolved figure's message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

StopReason = Literal["settled", "resolved", "budget", "cap"]
# Passes of one check at most: the first, the second every flagged figure gets, and two more for an unresolved one
# (an error shrinks only where a pass is calmer than those before: docs/noise.md measures what they buy).
MAX_PASSES = 4
# The share of the level's budget (levels.BUDGET_S) one check's passes after the second may take: ten still fit it.
CHECK_SHARE = 0.1


@dataclass(frozen=True)
class Pending:
    """A check's figures after `passes` passes: whether any would fail, warn, regress or is unresolved (`flagged`),
    whether any is unresolved, and the seconds one further pass took (None: not yet timed)."""

    passes: int
    flagged: bool
    unresolved: bool
    pass_s: float | None = None


def stop(pending: Pending, budget_s: float) -> StopReason | None:
    """Why the check measures no further pass (None: it measures one more). `budget_s`: the level's budget."""
    if not pending.flagged:
        return "settled" if pending.passes == 1 else "resolved"
    if pending.passes == 1:
        return None  # a flagged figure is always seen twice
    if not pending.unresolved:
        return "resolved"
    if pending.passes >= MAX_PASSES:
        return "cap"
    further = pending.passes - 1  # the passes after the first, the next one among them
    return "budget" if pending.pass_s is None or pending.pass_s * further > CHECK_SHARE * budget_s else None
