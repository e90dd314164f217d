"""rules/sampling.py, the rule that decides when a check measures its figures once more, and noise.Noise.error_of,
the figure's own error that further passes can make finer."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_gbvalidate.rules import noise, sampling
from pytest_gbvalidate.rules.sampling import Pending

BUDGET_S = 600.0  # the standard level's


def test_a_plain_figure_is_measured_once_and_a_flagged_one_twice() -> None:
    assert sampling.stop(Pending(1, flagged=False, unresolved=False), BUDGET_S) == "settled"
    # whatever the budget: a fall is seen twice before it fails, as before the rule
    assert sampling.stop(Pending(1, flagged=True, unresolved=False), 0.0) is None
    assert sampling.stop(Pending(2, flagged=True, unresolved=False, pass_s=1.0), BUDGET_S) == "resolved"
    assert sampling.stop(Pending(2, flagged=False, unresolved=False, pass_s=1.0), BUDGET_S) == "resolved"


def test_an_unresolved_figure_is_measured_until_the_cap_or_the_budget() -> None:
    assert sampling.stop(Pending(2, True, True, pass_s=1.0), BUDGET_S) is None
    assert sampling.stop(Pending(sampling.MAX_PASSES, True, True, pass_s=1.0), BUDGET_S) == "cap"
    share_s = sampling.CHECK_SHARE * BUDGET_S
    assert sampling.stop(Pending(2, True, True, pass_s=share_s), BUDGET_S) is None  # one more fits exactly
    assert sampling.stop(Pending(3, True, True, pass_s=share_s), BUDGET_S) == "budget"
    assert sampling.stop(Pending(2, True, True, pass_s=share_s * 1.01), BUDGET_S) == "budget"
    assert sampling.stop(Pending(2, True, True, pass_s=None), BUDGET_S) == "budget"  # an untimed pass: no guess


@given(
    passes=st.integers(1, 20),
    flagged=st.booleans(),
    unresolved=st.booleans(),
    pass_s=st.none() | st.floats(0, 1e6),
    budget_s=st.floats(0, 1e6),
)
def test_the_passes_are_bounded_and_only_what_can_change_is_measured_again(
    passes: int, flagged: bool, unresolved: bool, pass_s: float | None, budget_s: float
) -> None:
    stopped = sampling.stop(Pending(passes, flagged, unresolved, pass_s), budget_s)
    if stopped is None:  # another pass only for a figure it could change, never past the cap
        assert flagged and passes < sampling.MAX_PASSES
        assert passes == 1 or unresolved
        assert passes == 1 or (pass_s is not None and (passes - 1) * pass_s <= sampling.CHECK_SHARE * budget_s)
    else:
        assert passes > 1 or not flagged


def test_a_figure_s_error_is_its_median_s_and_shrinks_with_its_samples() -> None:
    few = noise.of_samples([9.0, 10.0, 11.0, 10.0])
    many = noise.of_samples([9.0, 10.0, 11.0, 10.0] * 16)
    assert few is not None and many is not None and few.spread_pct == many.spread_pct
    assert few.error_of() == pytest.approx(few.spread_pct * math.sqrt(math.pi / 2) / 2)
    assert many.error_of() == pytest.approx(few.error_of() / 4)
    # an older report's figure, without `error_pct`: taken from its spread and count; a best pass's, its spread
    assert noise.Noise(noise.MEDIAN, 25, 10.0).error_of() == pytest.approx(10.0 * noise.MEDIAN_ERROR / 5)
    assert noise.Noise(noise.BEST_PASS, 2, 10.0, (9.0, 10.0)).error_of() == 10.0


def test_a_best_pass_s_error_is_its_own_and_a_report_s_error_is_read_back_or_refused() -> None:
    quiet = noise.of_samples([10.0, 10.1, 9.9])
    disturbed = noise.of_samples([6.0, 9.0, 3.0])
    best = noise.of_passes([10.0, 6.0], [quiet])
    assert best is not None and quiet is not None and disturbed is not None
    assert best.error_of() == quiet.error_of() and best.error_pct == quiet.error_pct
    assert noise.from_record(best.as_record()) == noise.Noise(
        noise.BEST_PASS, 2, round(best.spread_pct, 3), (10.0, 6.0), None, round(quiet.error_of(), 3)
    )
    for bad in (-1.0, math.nan, "1", True):
        assert noise.from_record(best.as_record() | {"error_pct": bad}) is None
