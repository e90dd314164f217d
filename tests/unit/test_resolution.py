"""The rule that decides every judged figure (rules/resolution.py) and the baseline verdicts built on it: a verdict
holds against the noise its evidence shows, noise never excuses more than the metric needs, and where the evidence
cannot tell the answer is UNRESOLVED. Properties over the whole input space (Hypothesis), then the cases that once
passed a node they should not have."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_gbvalidate import baselines as bl
from pytest_gbvalidate.baselines.model import Limit, Reference
from pytest_gbvalidate.rules import resolution as rs

SEVERITY = {bl.PASS: 0, bl.WARN: 1, bl.UNRESOLVED: 2, bl.FAIL: 3}
NEEDED = rs.Needed(6.0, "test")

figures = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)
spreads = st.one_of(st.none(), st.floats(min_value=0.0, max_value=300.0))


def reference(direction: str = "higher", needed: rs.Needed = NEEDED, **limits: Limit | float | None) -> Reference:
    return Reference(
        metric="m",
        unit="GB/s",
        direction=direction,
        scope_kind="node",
        status="measured",
        expected=limits.get("expected", 100.0),  # type: ignore[arg-type]
        fail=limits.get("fail", Limit(relative_pct=10.0)),  # type: ignore[arg-type]
        warn=limits.get("warn", Limit(relative_pct=5.0)),  # type: ignore[arg-type]
        provenance="test",
        needed=needed,
    )


@settings(deadline=None)  # a busy 2-core machine times no example
@given(
    a=figures, b=figures, ref=st.floats(min_value=-1e3, max_value=1e3), direction=st.sampled_from(["higher", "lower"])
)
def test_worse_pct_is_monotonic_in_the_value(a: float, b: float, ref: float, direction: str) -> None:
    worse, better = (min(a, b), max(a, b)) if direction == "higher" else (max(a, b), min(a, b))
    assert rs.worse_pct(worse, ref, direction) >= rs.worse_pct(better, ref, direction)


@settings(deadline=None)  # a busy 2-core machine times no example
@given(
    a=figures,
    b=figures,
    own=spreads,
    recorded=spreads,
    needed=st.floats(min_value=0.1, max_value=100.0),
    direction=st.sampled_from(["higher", "lower"]),
    warn=st.booleans(),
)
def test_a_verdict_never_gets_milder_as_the_figure_gets_worse(
    a: float, b: float, own: float | None, recorded: float | None, needed: float, direction: str, warn: bool
) -> None:
    ref = reference(direction, rs.Needed(needed, "test"), warn=Limit(relative_pct=5.0) if warn else None)
    resolution = rs.of_spreads(samples=own, reference=recorded)
    worse, better = (min(a, b), max(a, b)) if direction == "higher" else (max(a, b), min(a, b))
    assert (
        SEVERITY[bl.compare(ref, worse, "node", resolution).verdict]
        >= SEVERITY[bl.compare(ref, better, "node", resolution).verdict]
    )


@settings(deadline=None)  # a busy 2-core machine times no example
@given(
    value=figures,
    own=st.floats(min_value=0.0, max_value=300.0),
    needed=st.floats(min_value=0.1, max_value=100.0),
    direction=st.sampled_from(["higher", "lower"]),
)
def test_noise_never_excuses_more_than_the_metric_needs(
    value: float, own: float, needed: float, direction: str
) -> None:
    """A figure past the fail limit by more than the needed resolution fails, however scattered its samples; and
    one whose resolution is coarser than needed never passes within that resolution of a limit, unless it is at
    least as good as the expected value (noise only ever takes from a figure: it cannot hide a fall there)."""
    ref = reference(direction, rs.Needed(needed, "test"))
    resolution = rs.of_spreads(samples=own)
    assert resolution is not None
    verdict = bl.compare(ref, value, "node", resolution).verdict
    fail_limit, warn_limit = ref.fail_limit, ref.warn_limit
    assert fail_limit is not None and warn_limit is not None
    if rs.worse_pct(value, fail_limit, direction) > needed:
        assert verdict == bl.FAIL
    good = ref.expected is not None and rs.at_least_as_good(value, ref.expected, direction)
    if resolution.pct > needed and rs.worse_pct(value, warn_limit, direction) > -resolution.pct and not good:
        assert verdict in (bl.UNRESOLVED, bl.FAIL)
    if good:
        assert verdict == bl.PASS


@settings(deadline=None)  # a busy 2-core machine times no example
@given(value=figures, direction=st.sampled_from(["higher", "lower"]))
def test_without_noise_the_limits_decide_alone(value: float, direction: str) -> None:
    ref = reference(direction)
    fail_limit, warn_limit = ref.fail_limit, ref.warn_limit
    assert fail_limit is not None and warn_limit is not None
    expected = bl.PASS
    if rs.worse_pct(value, warn_limit, direction) > 0:
        expected = bl.WARN
    if rs.worse_pct(value, fail_limit, direction) > 0:
        expected = bl.FAIL
    assert bl.compare(ref, value, "node").verdict == expected


def test_scattered_samples_below_the_fail_limit_fail() -> None:
    """Every sample and the median far below the fail limit once warned because the samples "allowed" 250%."""
    ref = reference()  # fail limit 90
    verdict = bl.compare(ref, 30.0, "node", rs.of_spreads(samples=125.0))
    assert verdict.verdict == bl.FAIL


def test_a_figure_of_zero_fails_whatever_the_recorded_spread() -> None:
    """With a recorded spread of 50%, 0 once passed where a small positive figure failed."""
    ref = reference()
    for value in (0.0, -1.0, 1e-9, 1.0):
        assert bl.compare(ref, value, "node", rs.of_spreads(samples=5.0, reference=50.0)).verdict == bl.FAIL


def test_a_noisy_figure_near_its_limits_is_unresolved_and_says_why() -> None:
    ref = reference()  # needs 6%
    verdict = bl.compare(ref, 97.0, "node", rs.of_spreads(samples=10.0))  # resolution 20%
    assert verdict.verdict == bl.UNRESOLVED
    assert "too noisy to judge: its resolution 20.0%" in verdict.message
    assert "coarser than the 6% needed (test)" in verdict.message
    record = verdict.resolution_record()
    assert record == {"pct": 20.0, "spreads": {"samples": 10.0}, "needed_pct": 6.0, "needed_source": "test"}


def test_a_noisy_figure_far_from_its_limits_passes_against_its_whole_resolution() -> None:
    """A floor-only metric 100 times above its floor: no noise its samples show could have hidden a fall to it."""
    ref = reference(expected=None, fail=Limit(absolute=1.0), warn=None)
    assert bl.compare(ref, 100.0, "node", rs.of_spreads(samples=60.0)).verdict == bl.PASS
    assert bl.compare(ref, 3.0, "node", rs.of_spreads(samples=60.0)).verdict == bl.UNRESOLVED


def test_a_resolved_figure_past_a_limit_within_its_noise_says_by_what_allowance() -> None:
    ref = reference()  # fail 90, warn 95
    verdict = bl.compare(ref, 89.0, "node", rs.of_spreads(samples=2.0))  # resolution 4%, 1.1% past the fail limit
    assert verdict.verdict == bl.WARN
    assert "past the fail limit within the noise its resolution 4.0% (2 x the combined error of samples 2.0%)" in (
        verdict.message
    )
    assert bl.compare(ref, 94.0, "node", rs.of_spreads(samples=2.0)).verdict == bl.PASS


@pytest.mark.parametrize(
    ("value", "reference_value", "direction", "expected"),
    [
        (50.0, 100.0, "higher", 100 * math.log(2)),
        (200.0, 100.0, "lower", 100 * math.log(2)),
        (0.0, 100.0, "higher", math.inf),
        (0.0, 100.0, "lower", -math.inf),
        (1.0, 0.0, "lower", math.inf),
        (0.0, 0.0, "lower", 0.0),
        (-2.0, -1.0, "higher", 100.0),
    ],
)
def test_worse_pct(value: float, reference_value: float, direction: str, expected: float) -> None:
    assert rs.worse_pct(value, reference_value, direction) == pytest.approx(expected)


def test_a_resolution_combines_its_spreads_and_names_them() -> None:
    assert rs.of_spreads(samples=None, reference=None) is None
    r = rs.of_spreads(samples=3.0, reference=4.0, run_to_run=None)
    assert r is not None and r.pct == pytest.approx(10.0)
    assert r.describe() == "resolution 10.0% (2 x the combined error of samples 3.0%, reference 4.0%)"


def test_a_fall_its_waits_for_a_cpu_explain_is_unresolved_not_a_fail() -> None:
    """A neighbour held the CPUs half the time (a halving explained): a figure a third below its fail limit cannot
    be called the node's; one far below what the waits explain still fails."""
    ref = reference()  # fail limit 90, needs 6%
    waited = rs.of_spreads(samples=36.0, explained_pct=69.3)
    assert waited is not None
    assert bl.compare(ref, 60.0, "node", waited).verdict == bl.UNRESOLVED  # 41% past the limit, 69% explained
    assert bl.compare(ref, 30.0, "node", waited).verdict == bl.FAIL  # 110% past it: more than the waits explain
    assert bl.compare(ref, 60.0, "node", rs.of_spreads(samples=36.0)).verdict == bl.FAIL  # scatter explains nothing
    assert "its waits for a CPU explain a fall of 69%" in waited.describe()


def test_a_figure_within_its_noise_of_its_fail_limit_that_waited_for_a_cpu_is_unresolved_not_a_warn() -> None:
    """A host copy beside a busy neighbour, 8% past a recorded fail limit, resolved (24%), its waits explaining
    138%: a WARN there was a false alarm on a healthy node; the same figure without waits warns."""
    ref = reference()  # fail limit 90, needs 6%
    waited = rs.of_spreads(samples=2.5, explained_pct=138.0)
    still = rs.of_spreads(samples=2.5)
    assert bl.compare(ref, 86.0, "node", waited).verdict == bl.UNRESOLVED
    assert bl.compare(ref, 86.0, "node", still).verdict == bl.WARN
    assert bl.compare(ref, 95.0, "node", waited).verdict == bl.PASS  # above its floor: waits change nothing
