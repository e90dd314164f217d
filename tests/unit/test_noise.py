"""A figure's noise (pytest_gbvalidate/noise.py), and a limit's verdict that holds against it
(baselines/verdicts.py)."""

from __future__ import annotations

import math
import random
import statistics
from typing import Any

import pytest

from pytest_gbvalidate import baselines as bl
from pytest_gbvalidate.rules import noise, pace
from pytest_gbvalidate.rules import resolution as rs


def test_the_spread_is_the_scaled_mad_in_percent_of_the_median_and_ignores_a_wild_sample() -> None:
    samples = [10.0, 10.2, 9.8, 10.1, 9.9, 2.0]  # one sample taken while a neighbour ran
    found = noise.of_samples(samples)
    assert found is not None and (found.summary, found.count) == ("median", 6)
    # median 9.95, |deviations| 0.05 0.25 0.15 0.15 0.05 7.95 -> MAD 0.15
    assert found.spread_pct == pytest.approx(1.4826 * 0.15 / 9.95 * 100)
    assert noise.of_samples([1.0]) is None and noise.of_samples([0.0, 0.0]) is None
    assert noise.of_samples([1.0, math.nan]) is None


def test_details_give_the_noise_of_a_median_or_of_the_best_pass() -> None:
    assert noise.from_details({"size_bytes": 8}) is None
    median = noise.from_details({"samples_gbps": [10.0, 10.0, 11.0, 9.0]})
    assert median is not None and median.summary == "median" and median.count == 4
    best = noise.from_details({"samples_gbps": [10.0, 10.0, 11.0, 9.0], "passes": [7.0, 10.0]})
    assert best is not None and best.summary == "best_pass" and best.passes == (7.0, 10.0)
    # two passes 30% apart: the slower was disturbed; the best one's samples say how far it may be off
    assert best.spread_pct == median.spread_pct
    record = {"summary": "best_pass", "count": 2, "spread_pct": 7.413, "passes": [7.0, 10.0], "error_pct": 4.645}
    assert best.as_record() == record  # its error: the best pass's median's, 7.413% x 1.2533 / sqrt(4)
    # nothing known within two passes: their half-difference
    two = noise.of_passes([7.0, 10.0])
    assert two is not None and two.spread_pct == pytest.approx(1.5 / 8.5 * 100)
    # three passes, one slowed by a neighbour: their robust spread, which ignores it
    storage = noise.of_passes([1.79, 0.68, 1.83])
    assert storage is not None and storage.spread_pct == pytest.approx(1.4826 * 0.04 / 1.79 * 100)


def test_a_report_s_noise_is_read_back_and_a_malformed_one_is_none() -> None:
    record = {"summary": "median", "count": 20, "spread_pct": 3.5}
    assert noise.from_record(record) == noise.Noise("median", 20, 3.5)
    bad: object
    for bad in (None, [], record | {"spread_pct": -1}, record | {"spread_pct": "3"}, record | {"count": "20"}):
        assert noise.from_record(bad) is None
    assert noise.from_record(record | {"passes": [1, "x"]}) is None


def test_the_margin_combines_the_figures_spreads() -> None:
    assert noise.margin_pct(3.0, 4.0) == pytest.approx(noise.NOISE_K * 5.0)
    assert noise.margin_pct(3.0, None) == pytest.approx(noise.NOISE_K * 3.0)
    assert noise.margin_pct() == 0.0


def _ref(expected: float, fail_pct: float, warn_pct: float) -> bl.Reference:
    return bl.Reference(
        "host_copy_bandwidth_gbps",
        "GB/s",
        "higher",
        "node",
        "measured",
        expected,
        bl.Limit(relative_pct=fail_pct),
        bl.Limit(relative_pct=warn_pct),
        "test",
    )


def test_a_value_past_a_limit_within_its_own_noise_does_not_get_that_limit_s_verdict() -> None:
    ref = _ref(10.0, 10.0, 5.0)  # fail below 9, warn below 9.5; needs the default 6%
    noisy = rs.of_spreads(samples=3.0)  # resolution 6%: as much as the metric allows
    assert bl.compare(ref, 8.8, "node").verdict == bl.FAIL
    within = bl.compare(ref, 8.8, "node", noisy)  # 2.2% below the fail limit, noise allows 6%
    assert within.verdict == bl.WARN
    said = "past the fail limit within the noise its resolution 6.0% (2 x the combined error of samples 3.0%) allows"
    assert said in within.message
    assert bl.compare(ref, 9.3, "node", noisy).verdict == bl.PASS
    assert "past the warn limit within the noise" in bl.compare(ref, 9.3, "node", noisy).message
    # far past the limit, or not a number, whatever the noise
    assert bl.compare(ref, 5.0, "node", noisy).verdict == bl.FAIL
    assert bl.compare(ref, math.nan, "node", rs.of_spreads(samples=30.0)).verdict == bl.FAIL


def test_a_figure_among_the_node_s_runs_is_its_modified_z_score_from_five_runs_on() -> None:
    assert noise.of_runs([10.0, 11.0, 9.0, 10.5]) is None  # four runs: their MAD says too little
    runs = noise.of_runs([9.0, 9.5, 10.5, 10.0, 11.0])
    # median 10, |deviations| 1 .5 .5 0 1 -> MAD .5: sigma 1.4826 x .5
    assert runs is not None and (runs.runs, runs.median) == (5, 10.0)
    assert runs.spread_pct == pytest.approx(1.4826 * 0.5 / 10 * 100)
    assert runs.z(7.0) == pytest.approx(-3 / (1.4826 * 0.5))
    assert runs.as_record(7.0) == {"runs": 5, "median": 10.0, "spread_pct": 7.413, "z": -4.047}
    # only the last MAX_RUNS count, and only finite figures
    many = noise.of_runs([100.0] * 30 + [10.0] * noise.MAX_RUNS + [math.nan])
    assert many is not None and (many.runs, many.median) == (noise.MAX_RUNS, 10.0)
    # runs that agree exactly: any other figure is infinitely far out
    same = noise.of_runs([4.0] * 5)
    assert same is not None and same.z(4.0) == 0.0 and same.z(3.9) == -math.inf
    assert same.as_record(3.9)["z"] == "-inf"


# --- a run's pace against the node's runs -------------------------------------------------------------------------

# Thirty figures of a node (24 bandwidths, higher better; 6 step times, lower better) over eight healthy runs, each
# figure drifting from run to run by its own few percent, as a quiet node's do.
DIRECTIONS = {f"bw{i}": "higher" for i in range(24)} | {f"step{i}": "lower" for i in range(6)}


def _healthy_runs(count: int = 8) -> list[dict[str, float]]:
    drift = random.Random(7)
    return [{name: 100.0 * (1 + drift.gauss(0, 0.03)) for name in DIRECTIONS} for _ in range(count)]


def _slowed(run: dict[str, float], speed: float) -> dict[str, float]:
    """The run's figures with everything at `speed` of its pace: bandwidths times it, step times over it."""
    return {name: v * speed if DIRECTIONS[name] == "higher" else v / speed for name, v in run.items()}


def test_a_run_slower_in_every_figure_is_an_outlier_of_the_node_s_paces_though_its_typical_figure_is_not() -> None:
    runs = _healthy_runs()
    slowed = _slowed(runs[-1], 0.93)  # 7% slower: within 3.5 spreads of each figure's runs
    found = pace.pace(slowed, runs, DIRECTIONS)
    assert found is not None and found.figures == 30 and len(found.earlier) == 8
    assert found.worse_z < noise.OUTLIER_Z  # the typical figure is within its own runs' spread
    z = found.z()
    assert z is not None and z > noise.OUTLIER_Z and found.worse_pct > 5
    # a healthy run's pace lies among the others'
    healthy = pace.pace(_healthy_runs(9)[-1], runs, DIRECTIONS)
    assert healthy is not None and (healthy.z() or 0.0) < noise.OUTLIER_Z


def test_on_a_machine_whose_runs_drift_as_wholes_a_slower_run_moves_its_share_of_worse_figures_first() -> None:
    """Fifteen healthy runs of a VM whose runs drift as wholes (each run's figures share a factor 10% apart from
    run to run, then 5% each): a run 25% slower lies within its runs' median paces (they stray with the machine),
    but its share of figures two spreads worse stands far beyond theirs; no healthy run's does."""
    drift = random.Random(11)

    def run(speed: float = 1.0) -> dict[str, float]:
        whole = 1 + drift.gauss(0, 0.10)
        return _slowed({name: 100.0 * whole * (1 + drift.gauss(0, 0.05)) for name in DIRECTIONS}, speed)

    runs = [run() for _ in range(15)]
    cutoff = noise.family_z(15, 2, apart=True)
    slowed = pace.pace(run(0.75), runs, DIRECTIONS)
    assert slowed is not None and (slowed.z() or 0.0) < cutoff  # the median pace alone misses it
    assert (slowed.share_z() or 0.0) > cutoff and slowed.worse_share > max(slowed.earlier_shares)
    for i, healthy in enumerate(runs):
        found = pace.pace(healthy, runs[:i] + runs[i + 1 :], DIRECTIONS)
        assert found is not None and (found.share_z() or 0.0) < cutoff and (found.z() or 0.0) < cutoff


def test_one_figure_far_off_moves_no_pace_and_a_faster_run_is_no_slower_one() -> None:
    runs = _healthy_runs()
    one_off = dict(runs[-1]) | {"bw3": 10.0}  # one figure's own failure is its own test's verdict
    found = pace.pace(one_off, runs, DIRECTIONS)
    assert found is not None and (found.z() or 0.0) < noise.OUTLIER_Z
    faster = pace.pace(_slowed(runs[-1], 1.15), runs, DIRECTIONS)
    assert faster is not None and (faster.z() or 0.0) < 0 and faster.worse_pct < 0


def test_a_pace_needs_enough_runs_and_figures_and_leaves_out_figures_that_never_move() -> None:
    runs = _healthy_runs()
    assert pace.pace(runs[-1], runs[:4], DIRECTIONS) is None  # no figure has a spread from four runs
    few = {name: DIRECTIONS[name] for name in ("bw0", "bw1", "step0", "step1")}  # the others have no direction
    assert pace.pace(runs[-1], runs, few) is None  # four figures: their median says little
    # six runs: each earlier run has five others to be judged against, so six paces; five runs give none
    assert pace.pace(runs[-1], runs[:6], DIRECTIONS) is not None
    five = pace.pace(runs[-1], runs[:5], DIRECTIONS)
    assert five is not None and five.earlier == () and five.z() is None
    # an error count that stays 0 in every run says nothing of pace
    counts = [r | {"xid": 0.0} for r in runs]
    with_count = pace.pace(runs[-1] | {"xid": 3.0}, counts, DIRECTIONS | {"xid": "lower"})
    assert with_count is not None and with_count.figures == 30


# --- a node's GPUs against each other ------------------------------------------------------------------------------


def test_a_median_s_own_error_is_its_samples_spread_over_the_root_of_their_count() -> None:
    samples = [10.0 * (1 + 0.1 * math.sin(k)) for k in range(16)]
    spread = noise.of_samples(samples)
    found = noise.of_the_median({"samples_gbps": samples})
    assert spread is not None and found is not None and (found.summary, found.count) == ("median", 16)
    assert found.spread_pct == pytest.approx(spread.spread_pct * math.sqrt(math.pi / 2) / 4)
    # the better of two passes: its own samples (the passes' figures are for drift, which siblings share)
    assert noise.of_the_median({"samples_gbps": samples, "passes": [9.0, 10.0]}) == found
    assert noise.of_the_median({"passes": [9.0, 10.0]}) is None and noise.of_the_median({}) is None


def test_a_device_25_percent_behind_siblings_measured_beside_it_is_named_through_its_samples_spread() -> None:
    """Four devices' copies, each the median of 20 samples spreading about 12% (a shared machine): one sample's
    spread (margin about 34%) would hide a device 25% behind; the medians' error (about 9%) does not, and the
    healthy three, within a few percent of each other, stay unnamed."""
    from pytest_gbvalidate.rules import outliers

    def device(value: float) -> tuple[float, dict[str, object]]:
        samples = [value * (1 + 0.12 * math.sin(2.1 * k)) for k in range(20)]
        return value, {"samples_gbps": samples}

    healthy = {"gpu0": device(10.0), "gpu1": device(10.3), "gpu2": device(9.8), "gpu3": device(10.1)}
    assert outliers.sibling_outliers(healthy, "higher") == []
    slow = healthy | {"gpu2": device(7.5)}
    assert [o.host for o in outliers.sibling_outliers(slow, "higher")] == ["gpu2"]
    one_sample_margin = outliers.outliers(
        {k: v for k, (v, _) in slow.items()}, "higher", noises={k: noise.from_details(d) for k, (_, d) in slow.items()}
    )
    assert one_sample_margin == []  # what the rule said before: within one sample's spread


def test_devices_measured_in_turns_share_the_drift_that_sets_one_after_the_other_apart() -> None:
    """Four healthy devices measured 30 samples each, the node's bandwidth 30% lower for the last quarter of the
    check (a VM's memory, a GPU's clocks): one after the other, the last device takes the whole dip and is named;
    in three rounds of ten, the dip is spread over several devices' samples, nobody is named, and a device 25%
    slower is, alone."""
    from pytest_gbvalidate.rules import outliers

    def measure(order: list[tuple[int, int]], slow: int | None = None) -> list[dict[str, tuple[float, dict[str, Any]]]]:
        """`order`: (round, device) in the order measured, 10 samples each."""
        rounds: list[dict[str, tuple[float, dict[str, Any]]]] = [{} for _ in range(max(r for r, _ in order) + 1)]
        for step, (round_, device) in enumerate(order):
            scale = 0.75 if device == slow else 1.0
            node = 14.0 if step >= 9 else 20.0  # the last 3 of 12 passes
            samples = [scale * node * (1 + 0.01 * (k % 3)) for k in range(10)]
            rounds[round_][f"gpu{device}"] = (statistics.median(samples), {"samples_gbps": samples, "iterations": 10})
        return rounds

    def named(rounds: list[dict[str, tuple[float, dict[str, Any]]]]) -> list[str]:
        return [o.host for o in outliers.sibling_outliers(noise.in_rounds(rounds), "higher")]

    one_after_the_other = [(r, d) for d in range(4) for r in range(3)]
    in_turns = [(r, d) for r in range(3) for d in range(4)]
    assert named(measure(one_after_the_other)) == ["gpu3"]
    assert named(measure(in_turns)) == []
    assert named(measure(in_turns, slow=1)) == ["gpu1"]
    value, details = noise.in_rounds(measure(in_turns))["gpu0"]
    assert len(details["samples_gbps"]) == details["iterations"] == 30 and len(details["rounds"]) == 3
    assert value == statistics.median(details["samples_gbps"])
    # a device without samples keeps its first round's figure
    assert noise.in_rounds([{"gpu0": (5.0, {})}, {"gpu0": (4.0, {})}]) == {"gpu0": (5.0, {})}


def _rounds(per_round: list[list[float]]) -> dict[str, tuple[float, dict[str, Any]]]:
    """Devices' figures as noise.in_rounds gives them: `per_round[r][d]`, device d's figure in round r."""
    labels = [f"gpu{d}" for d in range(len(per_round[0]))]
    return {
        label: (statistics.median(r[d] for r in per_round), {"rounds": [r[d] for r in per_round]})
        for d, label in enumerate(labels)
    }


def test_siblings_measured_in_rounds_are_judged_round_by_round() -> None:
    """Four devices, eight rounds, each round's figures moved alike by the node (x0.7 to x1.3) and each device's by
    up to 10% on its own, one healthy device measured 15% fast throughout (it widened the MAD of four, and a device
    25% slow went unnamed in one trial of five on a busy VM). In 300 seeded trials each way, one pass each: the slow
    device named, alone, in all but 1%; a healthy node's device, or one held down in a single round (a burst),
    named in no more than the simulated nodes' 1% allows, which the second pass then asks to repeat."""
    from pytest_gbvalidate.rules import outliers

    rng = random.Random(7)
    node = [0.7, 1.3, 1.0, 0.8, 1.2, 0.9, 1.1, 0.75]

    def trial(slow: int | None, burst: bool = False) -> list[str]:
        per_round = []
        for r, drift in enumerate(node):
            figures = []
            for d in range(4):
                speed = 1.15 if d == 0 else 1.0
                if d == slow and (not burst or r == 2):
                    speed = 0.5 if burst else 0.75
                figures.append(10.0 * drift * speed * (1 + rng.uniform(-0.1, 0.1)))
            per_round.append(figures)
        return [o.host for o in outliers.sibling_outliers(_rounds(per_round), "higher")]

    trials = 300
    assert sum(trial(3) == ["gpu3"] for _ in range(trials)) >= 0.99 * trials
    assert sum(trial(None) != [] for _ in range(trials)) <= 0.02 * trials
    assert sum("gpu2" in trial(2, burst=True) for _ in range(trials)) <= 0.02 * trials
    slow = _rounds([[10.0 * d, 10.2 * d, 7.5 * d, 9.9 * d] for d in node])
    (found,) = outliers.sibling_outliers(slow, "higher")
    assert found.host == "gpu2" and found.worse_pct == pytest.approx(25.0, abs=1.0)
    assert found.rules == ("every round's spread is 0", "more than 10% behind as a log ratio, round by round")
    # lower is better (a latency): the device whose figure is higher in every round
    slow_latency = _rounds([[2.0 * d, 2.1 * d, 2.8 * d * (1 + 0.02 * (-1) ** r), 1.9 * d] for r, d in enumerate(node)])
    assert [o.host for o in outliers.sibling_outliers(slow_latency, "lower")] == ["gpu2"]
    assert outliers.sibling_z(4, 8) < outliers.sibling_z(4, 6) < outliers.sibling_z(4, 4)  # more rounds, tighter


def test_siblings_without_rounds_to_pair_are_judged_by_the_fleet_rule() -> None:
    """Fewer rounds than MIN_SIBLING_ROUNDS (too few to know a device's own error), rounds of unequal count, or a
    round figure that is no positive number: the figures are judged as a fleet's (robust z, 10%, their noise)."""
    from pytest_gbvalidate.rules import outliers

    figures = _rounds([[10.0, 10.2, 7.0, 9.9], [10.1, 10.0, 7.1, 10.0]])
    (found,) = outliers.sibling_outliers(figures, "higher")
    assert found.host == "gpu2" and "scaled MADs" in found.rules[0]
    uneven = figures | {"gpu3": (9.9, {"rounds": [9.9, 10.0, 9.8]})}
    assert "scaled MADs" in outliers.sibling_outliers(uneven, "higher")[0].rules[0]
    six = _rounds([[10.0, 10.2, 7.0, 9.9]] * 6)  # the same figures every round: no spread, 30% behind
    assert outliers.sibling_outliers(six, "higher")[0].rules[0] == "every round's spread is 0"
    broken = six | {"gpu1": (10.2, {"rounds": [10.2, 0.0, 10.2, 10.2, 10.2, 10.2]})}
    assert "scaled MADs" in outliers.sibling_outliers(broken, "higher")[0].rules[0]


def test_a_sibling_is_named_only_where_the_second_pass_finds_it_too() -> None:
    from pytest_gbvalidate.rules import outliers

    healthy = _rounds([[10.0, 10.1, 9.9, 10.0]] * 6)
    burst = _rounds([[10.0, 10.1, 6.0, 10.0]] * 6)  # gpu2 held down for the whole first pass
    slow = _rounds([[10.0, 10.1, 7.4, 10.0]] * 6)
    passes: list[int] = []

    def again(figures: dict[str, tuple[float, dict[str, Any]]]) -> Any:
        def measure() -> dict[str, tuple[float, dict[str, Any]]]:
            passes.append(1)
            return figures

        return measure

    assert outliers.sibling_verdict(healthy, "higher", again(slow)) == ([], healthy) and passes == []  # not asked
    found, read = outliers.sibling_verdict(burst, "higher", again(healthy))
    assert found == [] and read == healthy and passes == [1]
    found, read = outliers.sibling_verdict(burst, "higher", again(slow))
    assert [o.host for o in found] == ["gpu2"] and read == slow and found[0].value == 7.4
