"""The fleet package (pytest_gbvalidate/fleet/) without a real run: a corrupt report, the command line's usage
errors, and the statistics on their own. (The drain and kubectl lines: unit/test_fleet_commands.py; end to end on
real node reports: e2e/test_fleet_summary_runs.py.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pytest_gbvalidate.fleet import findings
from pytest_gbvalidate.fleet.cli import main
from pytest_gbvalidate.fleet.reports import CORRUPT, NotMerged, natural_key, read
from pytest_gbvalidate.rules import noise, outliers
from tests.helpers.fleet_reports import write
from tests.helpers.reports import minimal_report, report_text


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("{not json", "not JSON: "),
        ("[1, 2]", "not a JSON object but a list"),
        ('{"schema": "other/1"}', "report_version is missing, not 2 (a report of version 1 says `schema`)"),
        (report_text({"status": "odd"}), "status is 'odd', not one of 'running', 'finished', 'interrupted'"),
        (report_text(without=("node",)), "no node.hostname"),
        (report_text({"measurements": [{"value": 1.0}]}), "measurements[0].details is missing"),
        (
            report_text({"tests": [minimal_report()["tests"][0] | {"outcome": ["passed"]}]}),
            "tests[0].outcome is ['passed'], not one of 'passed', 'failed', 'skipped'",
        ),
        (report_text({"suspects": ["not a record"]}), "suspects[0] is text, not an object"),
        ('{"a": NaN}', "not JSON: NaN is no JSON number"),
        (
            report_text({"node": {"hostname": "9" * 5000}}),
            "node.hostname of 5000 characters: a hostname is 253 at most",
        ),
        (
            report_text({"measurements": [minimal_report()["measurements"][0] | {"value": int("9" * 400)}]}),
            "the document.measurements[0].value is an integer of 1329 bits, beyond any float",
        ),
    ],
)
@pytest.mark.broken_reports
def test_a_corrupt_report_says_why(tmp_path: Path, content: str, reason: str) -> None:
    result = read(write(tmp_path, "r.json", content), 0)
    assert isinstance(result, NotMerged) and result.kind == CORRUPT and result.reason.startswith(reason)


@pytest.mark.parametrize(
    "args",
    [
        ["summary", "r.json"],  # no --out
        ["summary", "r.json", "--out", "o", "--mad-k", "-1"],
        ["summary", "r.json", "--out", "o", "--below-median-pct", "nan"],
        ["summary", "r.json", "--out", "o", "--noise-floor-pct", "-1"],
        ["summary", "--out", "o"],  # no report
        ["summarise", "r.json", "--out", "o"],
    ],
)
def test_usage_errors_exit_2(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(args)
    assert exited.value.code == 2 and "usage:" in capsys.readouterr().err


def test_out_must_be_a_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit) as exited:
        main(["summary", str(tmp_path / "r.json"), "--out", str(tmp_path / "file")])
    assert exited.value.code == 2 and "not a directory" in capsys.readouterr().err


def test_spread_has_the_median_mad_and_range_in_percent_of_the_median() -> None:
    s = outliers.spread([1.0, 2.0, 3.0, 4.0, 100.0])
    assert (s.nodes, s.median, s.minimum, s.maximum, s.mad) == (5, 3.0, 1.0, 100.0, 1.0)
    assert s.spread_pct == pytest.approx(99 / 3 * 100)
    assert outliers.spread([0.0, 0.0, 1.0]).spread_pct is None


def test_an_outlier_is_far_in_robust_terms_and_beyond_the_percent_margin_on_the_worse_side_only() -> None:
    values = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0, "e": 100.0}  # median 3, MAD 1
    (slow,) = outliers.outliers(values, "lower", mad_k=3.5, pct=10)
    assert slow.host == "e" and slow.z == pytest.approx(97 / noise.MAD_TO_SIGMA)
    assert slow.worse_pct == pytest.approx(97 / 3 * 100)
    assert slow.rules == ("65.4 scaled MADs > 3.5", "350.7% worse than the median as a log ratio > 10%")
    # higher is better: 100 is the best node; a is 2 below the median (66.7%) but only 1.35 scaled MADs
    assert outliers.outliers(values, "higher", mad_k=3.5, pct=10) == []
    (low,) = outliers.outliers(values, "higher", mad_k=0, pct=50)  # K 0: the percent rule alone
    assert low.host == "a" and low.rules == (
        "1.3 scaled MADs > 0.0",
        "109.9% worse than the median as a log ratio > 50%",
    )


def test_a_healthy_fleet_judged_on_many_figures_at_once_drains_nobody_and_a_broken_figure_still_stands_out() -> None:
    """Ten healthy nodes, 150 figures each spread 4% from node to node (normal, seeded): at 3.5 scaled MADs per
    figure, some figure of some node lies out by chance (10% below the median is only 2.5 of those spreads, so the
    percent rule does not save it); at the family-wise cut-off for 10 nodes and 150 figures, none does. A figure of
    one node 30% low where the nodes agree to 1% stands out at either."""
    rng = np.random.default_rng(7)
    fleet = [{f"n{i}": float(v) for i, v in enumerate(100.0 + 4.0 * rng.standard_normal(10))} for _ in range(150)]
    family = noise.family_z(10, 150)
    assert 8.0 < family < 16.0  # the simulation's 99% point of a healthy node's worst figure (12.2)
    assert sum(len(outliers.outliers(values, "higher", mad_k=3.5, pct=10)) for values in fleet) > 0
    assert sum(len(outliers.outliers(values, "higher", mad_k=family, pct=10)) for values in fleet) == 0
    broken = {f"n{i}": float(v) for i, v in enumerate(100.0 + 1.0 * rng.standard_normal(10))} | {"n3": 70.0}
    assert [o.host for o in outliers.outliers(broken, "higher", mad_k=family, pct=10)] == ["n3"]


def test_the_family_wise_cut_off_rises_with_figures_falls_with_nodes_and_is_never_below_one_figure_s() -> None:
    assert noise.family_z(10, 150) > noise.family_z(10, 10) > outliers.DEFAULT_MAD_K - 1e-9
    assert noise.family_z(6, 150) > noise.family_z(10, 150) > noise.family_z(20, 150)
    assert noise.family_z(10, 1) == outliers.DEFAULT_MAD_K  # one figure: Iglewicz & Hoaglin's 3.5 holds
    # beyond the simulated sizes, the largest simulated one's: a bigger fleet is judged no less strictly
    assert noise.family_z(500, 150) == noise.family_z(noise.MAX_SIMULATED_VALUES, 150)
    assert noise.family_z(10, 150) == noise.family_z(10, 150)  # seeded: the same every time


def test_with_mad_zero_any_deviation_is_far_and_the_percent_rule_decides() -> None:
    values = {"a": 10.0, "b": 10.0, "c": 10.0, "d": 9.5}  # MAD 0: most nodes read the same
    assert outliers.outliers(values, "higher", pct=10) == []
    (flagged,) = outliers.outliers(values, "higher", pct=4)
    assert flagged.host == "d" and flagged.z is None and flagged.worse_pct == pytest.approx(5.0)


def test_a_small_dip_many_mads_out_is_not_beyond_the_practical_margin() -> None:
    values = {"a": 100.0, "b": 100.1, "c": 99.9, "d": 100.05, "e": 98.0}  # MAD 0.1: e is 13 scaled MADs low
    assert outliers.outliers(values, "higher") == []
    (dip,) = outliers.outliers(values, "higher", pct=1)
    assert dip.host == "e" and dip.z == pytest.approx(-2.0 / 0.1 / noise.MAD_TO_SIGMA)  # -13.49
    assert outliers.outliers(values, "higher", pct=1, noise_floor_pct=3) == []


# Four reports of one healthy 2-core machine (2026-11-27) had reduce_scatter 1MiB 10.5% below their median, 0.4
# modified z: the old rule (MADs *or* percent) drained all four nodes for it.
HEALTHY_NOISY = {"n1": 0.474, "n2": 0.53, "n3": 0.545, "n4": 0.424}


def test_healthy_nodes_of_a_noisy_metric_are_not_outliers() -> None:
    noisy = {host: noise.Noise(noise.MEDIAN, 20, 12.0) for host in HEALTHY_NOISY}
    assert outliers.outliers(HEALTHY_NOISY, "higher", noises=noisy) == []
    assert outliers.outliers(HEALTHY_NOISY, "higher") == []  # 0.4 scaled MADs: never far from its peers


def test_a_metric_noisy_on_every_node_drains_nobody_and_a_quiet_one_names_the_slow_node() -> None:
    values = {"n1": 10.0, "n2": 10.1, "n3": 9.9, "n4": 10.05, "n5": 7.4}  # n5 26% slow, 50 scaled MADs
    quiet = {host: noise.Noise(noise.MEDIAN, 20, 2.0) for host in values}
    (slow,) = outliers.outliers(values, "higher", noises=quiet)
    assert slow.host == "n5" and slow.rules[-1] == (
        "beyond the 5.7% the figures' noise allows (the fleet's spread, not its own)"
    )
    noisy = {host: noise.Noise(noise.MEDIAN, 20, 12.0) for host in values}  # 2 x 12% x sqrt(2): 34% is chance
    assert outliers.outliers(values, "higher", noises=noisy) == []
    # a noisy node of a quiet fleet: its own scatter buys it no pass (unit/test_fleet_noise.py)
    (erratic,) = outliers.outliers(values, "higher", noises=quiet | {"n5": noise.Noise(noise.MEDIAN, 20, 16.0)})
    assert erratic.host == "n5"


# Ten runs of one healthy 2-vCPU VM as ten nodes (the false-alarm benchmark): nine checkpoint reads within 24-28 ms,
# the sixth run's at 32 ms, its three passes within 0.3% of each other; the nodes' own histories spread 4-10% run to
# run (median 6.45%).
CHECKPOINT_READS_MS = [24.06, 24.67, 24.22, 23.94, 27.95, 32.25, 25.50, 24.98, 24.49, 24.32]


def test_the_fleet_s_spread_is_never_taken_as_less_than_its_nodes_run_to_run_spread() -> None:
    values = {f"node-{i:02d}": ms for i, ms in enumerate(CHECKPOINT_READS_MS, 1)}
    (alone,) = outliers.outliers(values, "lower", mad_k=7.5)  # a MAD of 1.9% of the median: 11 scaled MADs
    assert alone.host == "node-06" and alone.z is not None and alone.z > 11
    assert outliers.outliers(values, "lower", mad_k=7.5, run_to_run_pct=6.45) == []  # 4.8 such spreads out
    (slow,) = outliers.outliers(values | {"node-06": 40.0}, "lower", mad_k=7.5, run_to_run_pct=6.45)  # 63% slower
    assert slow.host == "node-06" and slow.rules[0] == (
        "9.7 scaled MADs > 7.5 (the MAD taken as the nodes' typical run-to-run spread, 6.5%)"
    )
    # where the fleet's own MAD is wider, it stands
    (wide,) = outliers.outliers(values | {"node-06": 40.0}, "lower", mad_k=7.5, run_to_run_pct=0.5)
    assert wide.rules[0] == f"{abs(wide.z or 0):.1f} scaled MADs > 7.5"


@pytest.mark.broken_reports  # one, on purpose
def test_the_fleet_reads_each_node_s_run_to_run_spread_from_its_report(tmp_path: Path) -> None:
    def node(i: int, ms: float, spread_pct: object) -> Path:
        report = minimal_report()
        report["node"]["hostname"] = f"node-{i:02d}"
        (m,) = report["measurements"]
        m |= {"metric": "checkpoint_read_s", "value": ms / 1000, "unit": "s", "direction": "lower", "expected": None}
        if spread_pct is not None:  # as --gb-compare writes it with --gb-history's last ten runs behind it
            history = {"runs": 10, "median": 0.0249, "spread_pct": spread_pct, "z": 5.5}
            m["compare"] = {
                **{"earlier_value": 0.0279, "earlier_date": "2026-11-27T23:17:12+00:00", "message": "..."},
                **{"date": "2026-11-27T23:17:54+00:00", "delta_pct": 15.4, "allowed_pct": 5.0},
                **{"verdict": "within_noise", "noise_margin_pct": 6.4, "run_to_run": history},
            }
        return write(tmp_path, f"node-{i:02d}.json", report)

    def drained(spreads: list[object]) -> list[str]:
        paths = [node(i, ms, sp) for i, (ms, sp) in enumerate(zip(CHECKPOINT_READS_MS, spreads, strict=True), 1)]
        reports = [read(p, i) for i, p in enumerate(paths)]
        merged = [r for r in reports if not isinstance(r, NotMerged)]
        assert len(merged) == len(reports), reports
        (metric,) = findings.metric_stats(merged, 7.5, 10.0)
        return [o.host for o in metric.outliers]

    assert drained([6.45] * 10) == []
    assert drained([None] * 10) == ["node-06"]  # no history behind them: the fleet's MAD alone
    assert drained([0, -3.0, 0, 0, 0, -1.0, 0, 0, 0, 0]) == ["node-06"]  # no spread above 0 is no spread
    # a spread that is no number: the report is refused, saying where
    refused = read(node(1, 24.0, "6.45"), 0)
    assert isinstance(refused, NotMerged) and refused.reason == (
        "measurements[0].compare.run_to_run.spread_pct is text, not number"
    )


def test_fewer_than_three_nodes_or_no_direction_give_no_outliers() -> None:
    assert outliers.outliers({"a": 1.0, "b": 100.0}, "higher") == []
    assert outliers.outliers({"a": 1.0, "b": 100.0, "c": 100.0}, "sideways") == []


def test_hostnames_sort_naturally_whatever_the_length_of_their_numbers() -> None:
    huge = "node" + "9" * 5000  # int() refuses more than 4300 digits
    names = [huge, "node10", "node9", "node010", "gpu-a2", "node" + "1" + "0" * 4999]
    assert sorted(names, key=natural_key) == ["gpu-a2", "node9", "node10", "node010", names[-1], huge]
