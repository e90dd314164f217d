"""No false alarms, end to end through pytester: a figure about to fail is measured again and the better pass counts;
a node passes the baseline it recorded; a change within the resolution of two runs is not a regression, a figure
too noisy to tell is unresolved, and a fall beyond is one; a device far behind its siblings is named, and only it."""

from __future__ import annotations

import dataclasses
import importlib
import json
import re
import statistics
from pathlib import Path
from typing import Any

import pytest
import torch  # noqa: F401 -- in-process pytester runs drop modules they imported, and torch cannot load twice
import yaml

from pytest_gbvalidate.rules import outliers
from tests.helpers.runs import SUITES, junit_cases

BASELINE = """\
schema_version: 1
sku: LAB
description: a CPU-only lab SKU for the plugin's tests
detect: {gpu_count: 0}
metrics:
  host_copy_bandwidth_gbps: {status: measured, expected: 10, fail: 10%, warn: 5%, provenance: the plugin's tests}
"""


def resolved(pct: float, baseline: str = BASELINE) -> str:
    """`baseline` declaring the resolution its figures need: the checks here spread up to 6% within a run, and up to
    7% between runs, more than the 6% a SKU needs where it declares none."""
    return baseline.replace(
        "detect: {gpu_count: 0}\n", f"detect: {{gpu_count: 0}}\nresolution: {{pct: {pct:g}, provenance: the tests}}\n"
    )


ARGS = ["--gb-sku=LAB", "--gb-baselines=baselines", "--junitxml=r.xml", "--gb-report=r.json", "-p", "no:cacheprovider"]


def report(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


@pytest.fixture
def lab(pytester: pytest.Pytester) -> pytest.Pytester:
    (pytester.path / "baselines").mkdir()
    (pytester.path / "baselines" / "LAB.yaml").write_text(BASELINE)
    return pytester


def test_a_figure_about_to_fail_is_measured_again_and_the_better_pass_counts(lab: pytest.Pytester) -> None:
    lab.makepyfile(
        """
        import pytest

        from pytest_gbvalidate.expect import Measured

        def passes(*values):
            figures = iter(values)
            def measure():
                v = next(figures)
                return [Measured("host_copy_bandwidth_gbps", v, "node", {"samples_gbps": [v * 0.99, v, v * 1.01]})]
            return measure

        def test_busy(gb_expect):  # a neighbour in the first pass, the node as it is in the second
            measure = passes(8.0, 10.0)
            gb_expect.each(measure(), again=measure)

        def test_degraded(gb_expect):  # slow in both
            measure = passes(7.0, 7.1)
            gb_expect.each(measure(), again=measure)

        def test_quiet(gb_expect):  # nothing to decide twice
            gb_expect.each(passes(10.2)(), again=lambda: pytest.fail("measured again"))

        def test_part(gb_expect):  # measured again only where it is judged, as a sweep's gated sizes are
            first = [*passes(8.0)(), Measured("host_copy_bandwidth_gbps", 3.0, "reported", {})]
            node, reported = gb_expect.measure_again(first, passes(10.0))
            gb_expect.each([node])
            gb_expect.record(*reported[:3], details=reported.details)
        """
    )
    lab.runpytest(*ARGS).assert_outcomes(passed=3, failed=1)
    by_test = {m["test_id"].rsplit("::", 1)[-1]: m for m in report(lab.path / "r.json")["measurements"]}
    part = {m["scope"]: m for m in report(lab.path / "r.json")["measurements"] if m["test_id"].endswith("test_part")}
    assert (part["node"]["value"], part["node"]["details"]["sampling"]) == (10.0, {"passes": 2, "stopped": "resolved"})
    assert part["reported"]["value"] == 3.0 and part["reported"]["details"] == {}  # one pass, and says no more
    busy, degraded, quiet = by_test["test_busy"], by_test["test_degraded"], by_test["test_quiet"]
    assert (busy["value"], busy["verdict"], busy["details"]["passes"]) == (10.0, "pass", [8.0, 10.0])
    # the better pass's samples say how far it may be off; the slower pass says only that it was disturbed
    best = {"summary": "best_pass", "count": 2, "spread_pct": 1.483, "passes": [8.0, 10.0], "error_pct": 1.073}
    assert busy["noise"] == best
    assert busy["details"]["sampling"] == {"passes": 2, "stopped": "resolved"}
    assert (degraded["value"], degraded["verdict"], degraded["noise"]["passes"]) == (7.1, "fail", [7.0, 7.1])
    assert "measured 7.1 GB/s" in (junit_cases(lab.path / "r.xml")["test_degraded"]["message"] or "")
    assert quiet["noise"] == {"summary": "median", "count": 3, "spread_pct": 1.483, "error_pct": 1.073}
    assert "sampling" not in quiet["details"]


def test_a_figure_too_noisy_to_judge_is_measured_until_it_can_tell_and_else_exits_apart(lab: pytest.Pytester) -> None:
    """rules/sampling.py: an unresolved figure gets further passes until one is quiet enough (stopped `resolved`),
    or up to sampling.MAX_PASSES (`cap`): then UNRESOLVED, saying how often it was measured, a JUnit error of type
    unresolved and exit node_verdict.EXIT_UNRESOLVED -- never the 1 of a node that failed."""
    lab.makepyfile(
        """
        from pytest_gbvalidate.expect import Measured

        def passes(*figures):  # (value, how far each side its samples lie)
            taken = iter(figures)
            def measure():
                v, apart = next(taken)
                samples = [v * (1 - apart), v, v * (1 + apart)]
                return [Measured("host_copy_bandwidth_gbps", v, "node", {"samples_gbps": samples})]
            return measure

        def test_settles(gb_expect):  # 9.3 +-30% cannot tell 10% below 10 from 5%; the third pass can
            measure = passes((9.3, 0.3), (9.3, 0.3), (9.8, 0.005))
            gb_expect.each(measure(), again=measure)

        def test_never_settles(gb_expect):
            measure = passes(*[(9.3, 0.3)] * 4)
            gb_expect.each(measure(), again=measure)
        """
    )
    result = lab.runpytest(*ARGS)
    assert result.ret == 10
    by_test = {m["test_id"].rsplit("::", 1)[-1]: m for m in report(lab.path / "r.json")["measurements"]}
    settles, never = by_test["test_settles"], by_test["test_never_settles"]
    assert (settles["verdict"], settles["details"]["passes"]) == ("pass", [9.3, 9.3, 9.8])
    assert settles["details"]["sampling"] == {"passes": 3, "stopped": "resolved"}
    assert (never["verdict"], never["details"]["sampling"]) == ("unresolved", {"passes": 4, "stopped": "cap"})
    case = junit_cases(lab.path / "r.xml")["test_never_settles"]
    assert case["outcome"] == "error"
    assert "(measured in 4 passes, stopped: cap) -> UNRESOLVED" in (case["message"] or "")
    assert report(lab.path / "r.json")["exit_status"] == 10
    result.stdout.fnmatch_lines(["UNRESOLVED: this run could not tell: 1 check(s) too noisy to judge*"])


# A figure whose samples spread 6% (scaled MAD): 10 GB/s, 4.047% either side.
CHECK = """
import os

def test_copy(gb_expect):
    v = float(os.environ["COPY_GBPS"])
    gb_expect("host_copy_bandwidth_gbps", v, details={"samples_gbps": [v * (1 - 0.04047), v, v * (1 + 0.04047)]})
"""

# A figure whose samples spread 44% (scaled MAD): 30% either side.
NOISY_CHECK = CHECK.replace("0.04047", "0.3")


def test_a_node_passes_the_baseline_it_recorded(lab: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    (lab.path / "baselines" / "LAB.yaml").write_text(resolved(20))
    lab.makepyfile(CHECK)
    (lab.path / "recorded").mkdir()
    monkeypatch.setenv("COPY_GBPS", "10.0123")
    lab.runpytest(*ARGS, "--gb-record=recorded/LAB.yaml").assert_outcomes(passed=1)
    entry = yaml.safe_load((lab.path / "recorded" / "LAB.yaml").read_text())["metrics"]["host_copy_bandwidth_gbps"]
    # rounded, and bands at the 20% the SKU needs (fail at 3/4 of it, warn at 1/2, as log ratios), the figure's
    # error (its 3 samples spread 6%: 6% x 1.2533 / sqrt(3), rounded up) written once beside them, not widening them
    assert (entry["expected"], entry["warn"], entry["fail"], entry["spread_pct"]) == (10.0, "9.5%", "14%", 4.35)
    assert entry["provenance"].endswith("spread seen: up to 6.0% (median of 3, spread 6.0%) over 1 measurement(s)")

    # 10% below the recording, a minute later: within the node's noise, no warning
    monkeypatch.setenv("COPY_GBPS", "9.0")
    result = lab.runpytest(*ARGS, "--gb-baselines=recorded")
    result.assert_outcomes(passed=1)
    assert "GbValidateWarning" not in result.stdout.str()


def test_a_recording_with_the_node_s_history_is_the_median_of_its_runs(
    lab: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four runs kept in --gb-history, then --gb-record with it: the expected value is the median of the five runs'
    figures, and the provenance says so."""
    (lab.path / "baselines" / "LAB.yaml").write_text(resolved(20))
    lab.makepyfile(CHECK)
    (lab.path / "recorded").mkdir()
    for gbps in ("10.2", "9.9", "10.3", "10.0"):
        monkeypatch.setenv("COPY_GBPS", gbps)
        lab.runpytest(*ARGS, "--gb-history=history").assert_outcomes(passed=1)
    monkeypatch.setenv("COPY_GBPS", "9.0")
    result = lab.runpytest(*ARGS, "--gb-history=history", "--gb-record=recorded/LAB.yaml")
    assert result.ret == 0, result.stdout.str()
    entry = yaml.safe_load((lab.path / "recorded" / "LAB.yaml").read_text())["metrics"]["host_copy_bandwidth_gbps"]
    assert entry["expected"] == 10.0  # of 9.0 now and 10.2, 9.9, 10.3, 10.0 kept; this run's alone would be 9.0
    assert "each figure the median of 5 runs: this one and the node's kept ones (--gb-history)" in entry["provenance"]


def test_the_noise_of_two_runs_is_no_regression_and_a_fall_beyond_it_is(
    lab: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs whose figures are each the median of 3 samples spreading 6% (an error of 4.34%) resolve 12.3%,
    finer than the 20% the SKU needs: 9% down, 5% allowed, is within it; 59% down is a regression; a figure whose
    samples spread 44% cannot tell, and says so."""
    (lab.path / "baselines" / "LAB.yaml").write_text(resolved(20))
    lab.makepyfile(CHECK)
    monkeypatch.setenv("COPY_GBPS", "10.8")
    lab.runpytest(*ARGS).assert_outcomes(passed=1)
    (lab.path / "r.json").rename(lab.path / "before.json")
    compare = [*ARGS, "--gb-compare=before.json", "--gb-compare-fail=5%"]

    monkeypatch.setenv("COPY_GBPS", "9.84")
    lab.runpytest(*compare).assert_outcomes(passed=1)
    (measured,) = report(lab.path / "r.json")["measurements"]
    compared = measured["compare"]
    assert compared["verdict"] == "within_noise" and compared["noise_margin_pct"] == compared["resolution"]["pct"]
    assert compared["resolution"] == {
        "pct": 12.281,
        "spreads": {"samples": 4.342, "reference": 4.342},
        "needed_pct": 20.0,
        "needed_source": "resolution.pct",
    }
    assert (
        "within 12.3%: 2 x the combined error of its figure 4.3%, the earlier report's figure 4.3% -> WITHIN_NOISE"
        in (compared["message"])
    )
    monkeypatch.setenv("COPY_GBPS", "6.0")
    lab.runpytest(*compare).assert_outcomes(failed=1)
    (measured,) = report(lab.path / "r.json")["measurements"]
    assert measured["compare"]["verdict"] == "regressed"

    lab.makepyfile(NOISY_CHECK)
    monkeypatch.setenv("COPY_GBPS", "9.84")
    lab.runpytest(*compare).assert_outcomes(failed=1)  # never a pass
    (measured,) = report(lab.path / "r.json")["measurements"]
    assert measured["compare"]["verdict"] == "unresolved" and measured["compare"]["resolution"]["pct"] > 20
    assert "too noisy to judge: " in measured["compare"]["message"]
    assert "coarser than the 20% needed (resolution.pct) -> UNRESOLVED" in measured["compare"]["message"]


QUIET_CHECK = """
import os


def test_copy(gb_expect):
    v = float(os.environ["COPY_GBPS"])
    gb_expect("host_copy_bandwidth_gbps", v, details={"samples_gbps": [v * 0.99, v, v * 1.01]})
"""


def test_drift_the_node_s_own_history_has_shown_is_no_regression_and_a_fall_beyond_it_is(
    lab: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each run's samples agree within 1%, its runs within about 7%: the run before was a lucky one, and the next is
    7% below it. Only the node's kept runs show that this is how the node is: their spread is part of the figure's
    resolution, which the SKU (20% needed) allows; a fall beyond it is a regression however the runs spread."""
    (lab.path / "baselines" / "LAB.yaml").write_text(resolved(20))
    lab.makepyfile(QUIET_CHECK)
    keep = [*ARGS, "--gb-history=h", "--gb-compare=last", "--gb-compare-fail=5%"]
    for figure in ["9.0", "9.5", "10.5", "10.0", "11.0"]:
        monkeypatch.setenv("COPY_GBPS", figure)
        lab.runpytest(*keep).assert_outcomes(passed=1)
    (node_dir,) = (lab.path / "h").iterdir()
    # Kept reports that cannot count for the comparison: one dated 2099 (a clock set wrong) and another SKU's.
    last = report(sorted(node_dir.iterdir())[-1])
    future = last | {"start_time": "2099-01-01T00:00:00+00:00"}
    future["measurements"] = [m | {"value": 100.0} for m in last["measurements"]]
    (node_dir / "20990101T000000Z.json").write_text(json.dumps(future))

    monkeypatch.setenv("COPY_GBPS", "10.2")
    lab.runpytest(*keep).assert_outcomes(passed=1)
    (measured,) = report(lab.path / "r.json")["measurements"]
    compared = measured["compare"]
    assert compared["earlier_value"] == 11.0  # not the future report's 100
    assert compared["verdict"] == "within_noise"
    assert compared["resolution"]["spreads"] == {"samples": 1.073, "reference": 1.073, "run_to_run": 7.413}
    assert compared["run_to_run"] == {"runs": 5, "median": 10.0, "spread_pct": 7.413, "z": 0.27}
    assert "the node's run-to-run spread 7.4% over 5 runs" in compared["message"]
    assert "against the node's reference runs (median of the first 5 of 5 kept runs): 10 GB/s" in compared["message"]
    assert compared["message"].endswith("-> WITHIN_NOISE, decided against the earlier report")

    # Without the history it was a regression: -7.3% against the run before, beyond its 3.0% resolution.
    earlier = str(sorted(node_dir.iterdir())[-3])  # the run of 11.0 (the newest two: 10.2's and the 2099 one)
    lab.runpytest(*ARGS, f"--gb-compare={earlier}", "--gb-compare-fail=2%").assert_outcomes(failed=1)

    # 30% below the node's median is 4 of its runs' spreads: the family-wise cut-off for one figure against six
    # runs (5.5 spreads) excused it; the resolution excuses no more than the SKU needs, and the history's spread
    # widens it to 15%.
    monkeypatch.setenv("COPY_GBPS", "7.0")
    lab.runpytest(*keep).assert_outcomes(failed=1)
    (measured,) = report(lab.path / "r.json")["measurements"]
    assert measured["verdict"] == "fail" and measured["compare"]["verdict"] == "regressed"
    assert "it and its resolution allow" in measured["compare"]["message"]


# Twelve figures of a node, each run drifting 3% from figure to figure (a seeded draw per run), samples within 5%;
# LAB_SPEED scales them all, as a node that lost pace.
PACE_CHECK = """
import os
import random


from pytest_gbvalidate.expect import Measured


def test_sweep(gb_expect):
    drift = random.Random(int(os.environ["LAB_RUN"]))
    speed = float(os.environ.get("LAB_SPEED", "1"))
    busy_once = os.environ.get("LAB_BUSY_ONCE")  # a file: the machine is busy the first time the check runs
    if busy_once and not os.path.exists(busy_once):
        open(busy_once, "w").close()
        speed *= 0.92
    measured = []
    for size in [f"{2**k}KiB" for k in range(11)] + ["1GiB"]:  # 1GiB is gated, the others are not
        v = 400.0 * speed * (1 + drift.gauss(0, 0.03))
        measured.append(Measured("all_reduce_busbw_gbps", v, size, {"samples_gbps": [v * 0.95, v, v * 1.05]}))
    gb_expect.each(measured)
"""
# Samples within 5% (a spread of 7.4%) and runs within 3%: a resolution of about 22%, which the SKU allows.
PACE_BASELINE = (
    resolved(25)
    + """\
  all_reduce_busbw_gbps:
    {status: provisional, provenance: the plugin's tests, values: {1GiB: {expected: 400, fail: 10%}}}
"""
)


def test_a_run_slower_across_the_board_fails_the_node_s_pace_though_no_figure_regresses(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Six kept runs, then one 8% slower in each of its twelve figures: every figure is within its noise and the
    node's run-to-run spread (none regresses), the run as a whole is an outlier, and `gbvalidate::node_pace` fails
    as a test does: the terminal, JUnit, the JSON report with its fault category, the exit status. A healthy run
    passes it."""
    (pytester.path / "baselines").mkdir()
    (pytester.path / "baselines" / "LAB.yaml").write_text(PACE_BASELINE)
    pytester.makepyfile(PACE_CHECK)
    keep = [*ARGS, "--gb-history=h", "--gb-compare=last"]
    for run in range(6):
        monkeypatch.setenv("LAB_RUN", str(run))
        pytester.runpytest(*keep).assert_outcomes(passed=1)
    monkeypatch.setenv("LAB_RUN", "6")
    pytester.runpytest(*keep).assert_outcomes(passed=1)  # a healthy seventh run
    pace = report(pytester.path / "r.json")["compare"]["pace"]
    assert pace["verdict"] == "ok" and pace["figures"] == 12 and pace["runs"] == 6
    # the share of its figures two spreads worse, each kept run's, and the run's among them, as the schema has them
    assert 0 <= pace["worse_share"] <= 1 and len(pace["earlier_worse_share"]) == 6 and "share_z" in pace

    monkeypatch.setenv("LAB_RUN", "7")
    monkeypatch.setenv("LAB_SPEED", "0.92")
    result = pytester.runpytest(*keep)
    result.assert_outcomes(passed=1, failed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["FAILED gbvalidate::node_pace - the node as a whole: 12 figures, at the median*"])
    data = report(pytester.path / "r.json")
    pace = data["compare"]["pace"]
    assert data["exit_status"] == 1 and pace["verdict"] == "regressed"
    # slow in the second pass too: measured again before the verdict, and both passes said so
    assert pace["first_pass"]["verdict"] == "regressed" and pace["first_pass"]["measured_again"] == 12
    assert "each figure's better of two passes (12 figures measured again; the first pass alone: " in pace["message"]
    assert {m["compare"]["verdict"] for m in data["measurements"]} <= {"ok", "within_noise"}  # none on its own
    (failed,) = [t for t in data["tests"] if t["outcome"] == "failed"]
    assert failed["test_id"] == "gbvalidate::node_pace" and failed["fault"]["category"] == "performance"
    cases = junit_cases(pytester.path / "r.xml")
    assert cases["node_pace"]["outcome"] == "failure" and "the node as a whole" in cases["node_pace"]["message"]
    assert len(cases) == 2  # the second pass adds no test to any report

    # The machine busy for the first pass only, as a neighbour's job of a minute: measured again, at pace.
    monkeypatch.setenv("LAB_RUN", "8")
    monkeypatch.delenv("LAB_SPEED")
    monkeypatch.setenv("LAB_BUSY_ONCE", str(pytester.path / "busy-once"))
    pytester.runpytest(*keep).assert_outcomes(passed=1)
    pace = report(pytester.path / "r.json")["compare"]["pace"]
    assert pace["verdict"] == "ok" and pace["first_pass"]["verdict"] == "regressed"


# Four devices' figures with 2% spread; gpu2 at 75% of the others. (The benchmark measures them: a noisy machine
# decides whether 25% is beyond the noise; here the wiring is checked, so the figures are given.)
SIBLINGS = """
import pytest


def devices(slow, again=False):
    figures = {}
    for index, value in enumerate([10.0, 10.2, 9.9, 10.1]):
        value *= 0.75 if index == slow else 1.0
        samples = [value * (1 - 0.0135), value, value * (1 + 0.0135)]
        figures[f"gpu{index}"] = (value, {"samples_gbps": samples})
    return figures


@pytest.mark.parametrize("slow", [None, 2])
def test_devices(gb_expect, slow):
    gb_expect.siblings("h2d_bandwidth_gbps", devices(slow), again=lambda: devices(slow, again=True))


def test_two_devices_cannot_tell(gb_expect):
    gb_expect.siblings("h2d_bandwidth_gbps", {"gpu0": (10.0, {}), "gpu1": (5.0, {})})
"""


def test_a_device_far_behind_its_siblings_is_named_and_only_it(lab: pytest.Pytester) -> None:
    lab.makepyfile(SIBLINGS)
    lab.runpytest(*ARGS).assert_outcomes(passed=1, failed=1, skipped=1)
    cases = junit_cases(lab.path / "r.xml")
    message = cases["test_devices[2]"]["message"] or ""
    assert message.startswith(
        "Failed: h2d_bandwidth_gbps [gpu2]: 7.425 GB/s, 26.1% behind the node's 4 GPUs (median 10.05 GB/s; "
    )
    assert "[gpu0]" not in message and "[gpu1]" not in message and "every GPU: gpu0 10, gpu1 10.2" in message
    # the medians' own error: 2% samples, three of them, 1.45% each, 4.1% for two (one sample's spread: 5.7%)
    assert "beyond the 4.1% the figures' noise allows" in message
    assert "telling one apart needs 3" in (cases["test_two_devices_cannot_tell"]["message"] or "")


# A SKU of four GPUs whose copies and GEMM are small enough for CPU ranks to stand in for them.
FOUR_DEVICES = """schema_version: 1
sku: LABGPU
detect: {gpu_count: 4}
metrics:
  h2d_bandwidth_gbps: &small {status: provisional, fail: 0.000001, provenance: the plugin's tests,
                              params: {size_bytes: 4194304, warmup: 1}}
  d2h_bandwidth_gbps: *small
  d2d_bandwidth_gbps: *small
  gemm_bf16_tflops: {status: provisional, fail: 0.000000001, provenance: the plugin's tests,
                     params: {m: 128, n: 128, k: 128, warmup: 1}}
"""


def test_the_siblings_check_measures_the_gpus_in_turns_and_names_the_slow_one(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The suite's siblings check end to end on a node of four "GPUs": CPU ranks run the copies and GEMMs (the
    gang's device, not the SKU, is replaced), and what each rank's measurement returns is replaced by a GPU's
    steady figures (samples within 2%, as a GPU's copies and GEMMs are; CPU ranks sharing two cores are not, and
    would make this a test of their noise), GPU 2 at three quarters of its siblings' speed. Every metric is
    measured in the suite's rounds, each GPU in turn, each figure the median of every round's samples, and GPU
    2 is named, alone, in every metric, judged round by round. How often a healthy GPU is named, or a GPU 25%
    slower is not, on a noisy
    machine is the false-alarm benchmark's to measure (docs/noise.md)."""
    # The modules as the inner run will find them (an earlier in-process run may have left a package's attribute
    # naming a module object it then dropped from sys.modules).
    gang = importlib.import_module("pytest_gbvalidate.ranks.gang")
    noise = importlib.import_module("pytest_gbvalidate.rules.noise")
    target = importlib.import_module("pytest_gbvalidate.target")
    monkeypatch.setattr(target.Target, "device_type", property(lambda self: "cpu"))
    (pytester.path / "baselines").mkdir()
    (pytester.path / "baselines" / "LABGPU.yaml").write_text(FOUR_DEVICES)
    seen: list[dict[str, tuple[float, Any]]] = []
    real_in_rounds, real_run = noise.in_rounds, gang.LocalGang.run

    def in_rounds(rounds: Any) -> Any:
        merged = real_in_rounds(rounds)
        seen.append(merged)
        return merged

    def run(self: Any, fn: Any, *args: Any, timeout_s: float | None = None) -> list[Any]:
        """Each rank's measurement as a GPU's, the rank of GPU 2 at 3/4 of the others' speed."""
        results = real_run(self, fn, *args, timeout_s=timeout_s)
        return [
            dataclasses.replace(r, value=_a_gpu(r.value, 0.75 if r.rank == 2 else 1.0))
            if isinstance(r, gang.NodeResult)
            else r
            for r in results
        ]

    monkeypatch.setattr(noise, "in_rounds", in_rounds)
    monkeypatch.setattr(gang.LocalGang, "run", run)  # the class: whatever module the suite's names come from
    args = ["--gb-sku=LABGPU", "--gb-baselines=baselines", "-k", "siblings", "--junitxml=r.xml"]
    result = pytester.runpytest(str(SUITES / "test_bandwidth.py"), *args, "-p", "no:cacheprovider")
    result.assert_outcomes(failed=4)
    for case in junit_cases(pytester.path / "r.xml").values():
        message = case["message"] or ""
        assert re.search(r"\w+ \[gpu2\]: .* 25.0% behind the node's 4 GPUs .* round by round", message), message
        assert not re.search(r"\[gpu[013]\]", message), message
    assert len(seen) == 8  # every metric: a first pass, and a second before GPU 2 is named
    for merged in seen:
        assert sorted(merged) == ["gpu0", "gpu1", "gpu2", "gpu3"]
        for value, details in merged.values():
            samples = next(v for k, v in details.items() if k.startswith("samples_"))
            rounds = len(details["rounds"])  # the suite's SIBLING_ROUNDS, enough to be judged round by round
            assert rounds >= outliers.MIN_SIBLING_ROUNDS and len(samples) == 10 * rounds == details["iterations"]
            assert value == statistics.median(samples)


def _a_gpu(result: Any, speed: float) -> Any:
    """A copy's or GEMM's result, as many samples, as a GPU at `speed` of its siblings would have measured:
    50 GB/s or 500 TFLOPS at full speed, each sample within 2% of it."""
    if hasattr(result, "samples_gbps"):
        samples = [speed * 50.0 * (1 + 0.01 * (k % 5 - 2)) for k in range(len(result.samples_gbps))]
        return dataclasses.replace(result, bandwidth_gbps=statistics.median(samples), samples_gbps=samples)
    samples = [speed * 500.0 * (1 + 0.01 * (k % 5 - 2)) for k in range(len(result.samples_tflops))]
    return dataclasses.replace(result, tflops=statistics.median(samples), samples_tflops=samples)
