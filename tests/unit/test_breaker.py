"""rules/breaker.py: how many nodes the fleet summary takes out at once (property tests of the rule)."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from pytest_gbvalidate.rules.breaker import DEFAULT_MAX_PCT, Breaker

shares = st.floats(min_value=0, max_value=100, allow_nan=False)
numbers = st.one_of(st.none(), st.integers(min_value=1, max_value=10_000))
fleets = st.integers(min_value=1, max_value=10_000)


@given(shares, numbers, fleets, st.integers(min_value=0, max_value=10_000))
def test_it_trips_exactly_past_the_share_and_the_number_and_one_node_always_may_go(
    pct: float, number: int | None, fleet: int, to_drain: int
) -> None:
    breaker = Breaker(pct, number)
    limit = max(1, min(math.floor(pct / 100 * fleet + 1e-9), number if number is not None else fleet))
    assert breaker.allowed(fleet) == limit
    assert (breaker.tripped(to_drain, fleet) is not None) == (to_drain > limit)


@given(shares, numbers, fleets, st.integers(min_value=0, max_value=10_000))
def test_more_nodes_to_take_out_never_closes_it_and_a_larger_fleet_never_trips_it_sooner(
    pct: float, number: int | None, fleet: int, to_drain: int
) -> None:
    breaker = Breaker(pct, number)
    if breaker.tripped(to_drain, fleet):
        assert breaker.tripped(to_drain + 1, fleet)
    if not breaker.tripped(to_drain, fleet):
        assert not breaker.tripped(to_drain, fleet + 1)


def test_the_default_is_half_the_fleet_and_its_line_names_the_likelier_cause() -> None:
    assert Breaker().max_pct == DEFAULT_MAX_PCT == 50.0 and Breaker().max_nodes is None
    assert Breaker().tripped(4, 8) is None
    said = Breaker().tripped(5, 8)
    assert said is not None and said.startswith("breaker tripped: 5 of 8 nodes to take out, more than the 4 allowed")
    assert "a fleet-wide cause -- the baseline, the image, the fabric -- is likelier" in said
    assert Breaker(50, 2).tripped(3, 100) is not None  # the number holds where the share would allow 50
