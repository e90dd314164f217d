"""Unit tests of --gb-record's baseline: limits at the resolution each metric needs, the node's noise counted once,
a node too noisy to record refused (pure module, no pytest run)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_gbvalidate import baselines as bl
from pytest_gbvalidate.baselines import recording
from pytest_gbvalidate.baselines.loading import parse_baseline
from pytest_gbvalidate.rules import resolution as rs
from tests.helpers.runs import REPO

# A catalog metric each way: higher is better, lower is better.
METRICS = {"higher": ("host_copy_bandwidth_gbps", "GB/s"), "lower": ("checkpoint_write_s", "s")}


def figure(
    value: float, spread_pct: float | None, direction: str = "higher", scope: str = "node", passes: int = 0
) -> dict[str, Any]:
    metric, unit = METRICS[direction]
    m: dict[str, Any] = {
        "metric": metric,
        "scope": scope,
        "scope_kind": "node",
        "unit": unit,
        "direction": direction,
        "value": value,
    }
    if spread_pct is not None:
        # `spread_pct` given as the figure's error too: what a recording writes and judges (noise.Noise.error_of)
        noise: dict[str, Any] = {"summary": "median", "count": 20, "spread_pct": spread_pct, "error_pct": spread_pct}
        if passes:
            noise |= {"summary": "best_pass", "count": passes, "passes": [value] * passes}
        m["noise"] = noise
    return m


def busbw(scope: str, value: float, spread_pct: float) -> dict[str, Any]:
    return {
        "metric": "all_reduce_busbw_gbps",
        "scope": scope,
        "scope_kind": "message_size",
        "unit": "GB/s",
        "direction": "higher",
        "value": value,
        "noise": {"summary": "median", "count": 20, "spread_pct": spread_pct, "error_pct": spread_pct},
    }


def previous(needed_pct: float | None) -> bl.Baseline:
    """A SKU's baseline with wide limits (the cpu SKU's kind), declaring `needed_pct` as its resolution."""
    resolution = "" if needed_pct is None else f"resolution: {{pct: {needed_pct!r}, provenance: the tests}}\n"
    text = (
        "schema_version: 1\nsku: LAB\ndescription: a lab SKU\n" + resolution + "metrics:\n"
        "  host_copy_bandwidth_gbps: {status: measured, expected: 10, fail: 95%, provenance: the tests}\n"
        "  checkpoint_write_s: {status: measured, expected: 1, fail: 400%, warn: 150%, provenance: the tests}\n"
    )
    return parse_baseline(Path("LAB.yaml"), text.encode())


def recorded(old: bl.Baseline | None, measurements: list[dict[str, Any]]) -> bl.Baseline:
    """The recording of `measurements`, loaded back as the loader reads it."""
    text = bl.dump_baseline(bl.recorded_baseline("LAB", old, measurements, "measured on node7"))
    return parse_baseline(Path("LAB.yaml"), text.encode())


def reference(baseline: bl.Baseline, direction: str = "higher") -> bl.Reference:
    return baseline.metrics[METRICS[direction][0]].default


@settings(max_examples=200, deadline=None)
@given(
    direction=st.sampled_from(["higher", "lower"]),
    needed=st.floats(min_value=0.1, max_value=100.0),
    median=st.floats(min_value=1e-3, max_value=1e5),
    # the node's spread, as a share of the most a recording at that resolution may have (2 x sqrt(2) x it <= needed)
    noisiness=st.floats(min_value=0.0, max_value=0.98),
    healthy=st.lists(
        st.tuples(st.floats(-1.0, 1.0), st.one_of(st.none(), st.floats(0.0, 1.0))), min_size=10, max_size=10
    ),
    fall_spread=st.one_of(st.none(), st.floats(min_value=0.0, max_value=50.0)),
)
def test_a_recording_passes_the_node_within_its_spread_and_fails_a_fall_of_twice_the_needed_resolution(
    direction: str,
    needed: float,
    median: float,
    noisiness: float,
    healthy: list[tuple[float, float | None]],
    fall_spread: float | None,
) -> None:
    spread = noisiness * needed / (2 * math.sqrt(2))
    ref = reference(recorded(previous(needed), [figure(median, spread, direction)]), direction)
    assert ref.needed.pct == needed and ref.spread_pct is not None and ref.spread_pct >= spread
    worse = -1.0 if direction == "higher" else 1.0
    for shift, own in healthy:  # ten healthy runs, each within the recorded spread, as noisy or quieter
        value = median * math.exp(shift * ref.spread_pct / 100.0)
        samples = None if own is None else own * ref.spread_pct
        verdict = bl.compare(ref, value, "node", rs.of_spreads(samples=samples, reference=ref.spread_pct))
        assert verdict.verdict == bl.PASS, verdict.message
    fallen = median * math.exp(worse * 2 * needed / 100.0)
    verdict = bl.compare(ref, fallen, "node", rs.of_spreads(samples=fall_spread, reference=ref.spread_pct))
    assert verdict.verdict == bl.FAIL, verdict.message


@pytest.mark.parametrize("dead", [0.0, 1.087])  # nothing, or a tenth of the expected figure
def test_a_dead_node_fails_against_a_recording_made_under_wide_limits(dead: float) -> None:
    cpu = bl.load_baseline(REPO / "baselines" / "cpu.yaml")  # fail at 95% below, needs 60%
    measured = [figure(10.87, 10.0), busbw("1MiB", 1.5, 12.0), busbw("4MiB", 1.6, 8.0)]
    new = recorded(cpu, measured)
    ref = reference(new)
    assert bl.compare(ref, dead, "node", rs.of_spreads(samples=10.0, reference=ref.spread_pct)).verdict == bl.FAIL
    size = new.metrics["all_reduce_busbw_gbps"].reference("1MiB")
    assert size is not None and size.expected == 1.5
    assert bl.compare(size, 0.15, "1MiB", rs.of_spreads(samples=12.0, reference=size.spread_pct)).verdict == bl.FAIL
    assert new.resolution.pct == 60 and ref.fail_limit is not None and ref.fail_limit > 6  # not the old 0.54


@pytest.mark.parametrize("direction", ["higher", "lower"])
def test_the_noise_is_written_once_and_does_not_widen_the_bands(direction: str) -> None:
    quiet = reference(recorded(None, [figure(20.0, 0.5, direction)]), direction)
    noisy = reference(recorded(None, [figure(20.0, 2.1, direction)]), direction)
    assert (quiet.spread_pct, noisy.spread_pct) == (0.5, 2.1)
    assert (quiet.fail, quiet.warn) == (noisy.fail, noisy.warn)
    # 3/4 and 1/2 of the 6% needed, as log ratios, to the worse side
    expected = {"higher": ("4.4%", "3%"), "lower": ("4.6%", "3%")}[direction]
    assert (str(noisy.fail), str(noisy.warn)) == expected
    # the previous baseline's limits are not kept, wide or narrow
    kept = reference(recorded(previous(None), [figure(20.0, 2.1, direction)]), direction)
    assert (kept.fail, kept.warn) == (noisy.fail, noisy.warn)


@pytest.mark.parametrize(("spread", "needed"), [(500.0, 70.0), (30.0, 70.0), (2.2, None)])
def test_a_figure_too_noisy_to_record_is_written_not_gated_and_named(
    tmp_path: Path, spread: float, needed: float | None
) -> None:
    old = previous(needed)
    path = tmp_path / "LAB.yaml"
    measured = [figure(10.0, 0.5, "lower"), figure(10.0, spread)]
    left_out, not_gated = recording.write_recorded_baseline(path, old, measured, {"hostname": "n1"}, None)
    shown = needed if needed is not None else 6
    resolution = 2 * math.hypot(spread, spread)
    ((metric, scope, why, required),) = [(n.metric, n.scope, n.why, n.required) for n in not_gated]
    assert (metric, scope, required, left_out) == ("host_copy_bandwidth_gbps", "node", True, [])  # the old one gated it
    assert f"resolution {resolution:.1f}%" in why and f"coarser than the {shown:g}% needed" in why
    written = parse_baseline(path, path.read_bytes())
    noisy, quiet = reference(written), reference(written, "lower")
    assert (noisy.status, noisy.expected, noisy.fail, noisy.has_reference) == ("provisional", None, None, False)
    assert f"not gated, too noisy to record here: node (resolution {resolution:.1f}%" in noisy.provenance
    assert quiet.status == "measured" and quiet.expected == 10.0 and quiet.has_reference  # recorded all the same


def test_each_size_too_noisy_to_record_is_left_out_of_its_sweep_and_the_rest_recorded() -> None:
    doc, not_gated = recording.recording("cpu", None, [busbw("1MiB", 1.5, 1.0), busbw("4MiB", 1.6, 30.0)], "m")
    assert [(n.metric, n.scope, n.required) for n in not_gated] == [("all_reduce_busbw_gbps", "4MiB", False)]
    entry = doc["metrics"]["all_reduce_busbw_gbps"]
    assert set(entry["values"]) == {"1MiB"} and "not gated, too noisy to record here: 4MiB (" in entry["provenance"]
    doc, not_gated = recording.recording("cpu", None, [busbw("4MiB", 1.6, 30.0)], "m")  # every size: provisional
    assert doc["metrics"]["all_reduce_busbw_gbps"]["status"] == "provisional" and len(not_gated) == 1
    assert "values" not in doc["metrics"]["all_reduce_busbw_gbps"]


def test_a_recording_as_noisy_as_its_metric_allows_is_written() -> None:
    # 2 x sqrt(2) x 2.12% is 6.0%: the 6% needed
    ref = reference(recorded(None, [figure(10.0, 2.12)]))
    assert ref.spread_pct == 2.12 and ref.expected == 10.0


def test_the_provenance_says_the_figures_were_the_best_of_two_passes() -> None:
    doc = bl.recorded_baseline("LAB", None, [figure(10.0, 1.0, passes=2), figure(10.2, 0.5, scope="node")], "m")
    assert doc["metrics"]["host_copy_bandwidth_gbps"]["provenance"] == (
        "m; spread seen: up to 1.0% (best of 2 passes, spread 1.0%) over 2 measurement(s), 1 of them the best of 2 "
        "passes (--gb-record measures again)"
    )


def test_the_needed_resolutions_carry_over_and_recording_again_changes_nothing(tmp_path: Path) -> None:
    text = """\
schema_version: 1
sku: LAB
description: a lab SKU
resolution: {pct: 40, provenance: the tests}
metrics:
  host_copy_bandwidth_gbps: {status: measured, expected: 10, fail: 95%, resolution_pct: 20, provenance: the tests}
  all_reduce_busbw_gbps:
    status: measured
    fail: 95%
    provenance: the tests
    values:
      1MiB: {expected: 1.5, resolution_pct: 80}
      4MiB: {expected: 1.6}
"""
    old = parse_baseline(tmp_path / "LAB.yaml", text.encode())
    measured = [figure(10.0, 5.0), busbw("1MiB", 1.5, 20.0), busbw("4MiB", 1.6, 10.0)]
    doc = bl.recorded_baseline("LAB", old, measured, "measured on node7")
    new = parse_baseline(tmp_path / "LAB.yaml", bl.dump_baseline(doc).encode())
    assert new.resolution.pct == 40 and reference(new).needed.pct == 20
    sizes = new.metrics["all_reduce_busbw_gbps"].values
    assert (sizes["1MiB"].needed.pct, sizes["4MiB"].needed.pct) == (80, 40)
    # each at its own needed resolution: 3/4 of 20%, 80% and 40% below
    assert [str(r.fail) for r in (reference(new), sizes["1MiB"], sizes["4MiB"])] == ["14%", "45%", "26%"]
    assert (sizes["1MiB"].spread_pct, sizes["4MiB"].spread_pct) == (20.0, 10.0)  # each size its own
    assert bl.recorded_baseline("LAB", new, measured, "measured on node7") == doc


def test_a_floor_only_metric_stays_floor_only_and_a_node_below_its_floor_gets_the_fail_band() -> None:
    cpu = bl.load_baseline(REPO / "baselines" / "cpu.yaml")  # the triad: a floor of 2 GB/s, nothing else

    def triad(value: float) -> dict[str, Any]:
        return {**figure(value, 5.0, scope="numa0"), "metric": "host_memory_triad_gbps", "scope_kind": "numa"}

    above = recorded(cpu, [triad(44.6)]).metrics["host_memory_triad_gbps"].default
    assert (above.fail, above.warn, above.expected) == (bl.Limit(absolute=2.0), None, 44.6)
    below = recorded(cpu, [triad(1.5)]).metrics["host_memory_triad_gbps"].default
    assert (str(below.fail), below.warn) == ("36%", None)


def kept(values: list[float], direction: str = "higher") -> list[dict[tuple[str, str, str, str], float]]:
    """The node's kept runs (report/earlier.py's node_runs' shape), one figure each."""
    metric = METRICS[direction][0]
    return [{(metric, "node", "", ""): v} for v in values]


def test_with_the_node_s_kept_runs_the_expected_value_is_their_median_and_their_drift_is_counted() -> None:
    """Four kept runs and this one (noise.MIN_RUNS): the expected value is the median of the five, and the spread
    written is their run-to-run spread where it is wider than the samples' -- the drift one run's samples hide."""
    runs = kept([10.0, 11.0, 12.0, 10.5])
    doc = bl.recorded_baseline("LAB", previous(60.0), [figure(9.0, 1.0)], "measured on node7", runs=runs)
    entry = doc["metrics"]["host_copy_bandwidth_gbps"]
    assert entry["expected"] == 10.5
    assert entry["spread_pct"] > 1.0  # the runs' spread (1.4826 x MAD 0.5 of 10.5 = 7.06%), not the samples' 1%
    assert entry["spread_pct"] == pytest.approx(7.06, abs=0.01)
    assert "each figure the median of 5 runs: this one and the node's kept ones (--gb-history)" in (entry["provenance"])
    # Too few kept runs: this run alone, as without a history.
    alone = bl.recorded_baseline("LAB", previous(60.0), [figure(9.0, 1.0)], "on node7", runs=runs[:2])
    assert alone["metrics"]["host_copy_bandwidth_gbps"]["expected"] == 9.0
    assert "kept ones" not in alone["metrics"]["host_copy_bandwidth_gbps"]["provenance"]


def test_a_node_whose_runs_scatter_too_widely_is_refused_though_each_run_s_samples_agree() -> None:
    """Samples within 1% each run, runs 10 to 30 GB/s: a recording the node's next runs could never be judged
    against at 6%."""
    runs = kept([10.0, 30.0, 12.0, 25.0])
    _, (not_gated,) = recording.recording("LAB", previous(6.0), [figure(20.0, 1.0)], "on node7", runs=runs)
    assert (not_gated.metric, not_gated.scope, not_gated.required) == ("host_copy_bandwidth_gbps", "node", True)
    assert bl.recorded_baseline("LAB", previous(6.0), [figure(20.0, 1.0)], "on node7")  # one run: its samples


def test_per_size_figures_are_matched_to_their_own_size_in_the_kept_runs() -> None:
    metric = "all_reduce_busbw_gbps"
    runs = [{(metric, "1KiB", "in_place", ""): 1.0 + i / 100, (metric, "1MiB", "in_place", ""): 5.0} for i in range(4)]
    doc = bl.recorded_baseline(
        "LAB", previous(60.0), [busbw("1KiB", 2.0, 1.0), busbw("1MiB", 4.0, 1.0)], "on node7", runs=runs
    )
    values = doc["metrics"][metric]["values"]
    assert (values["1KiB"]["expected"], values["1MiB"]["expected"]) == (1.02, 5.0)
