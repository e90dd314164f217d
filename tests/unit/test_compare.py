"""--gb-compare's pure parts (pytest_gbvalidate/compare.py): allowed regressions, which way a metric regresses,
sweeps matched by placement, and an earlier report that is malformed. (End to end: e2e/test_compare_runs.py.)"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest

from pytest_gbvalidate import compare as cmp
from pytest_gbvalidate import noise
from pytest_gbvalidate.report.records import measurement_key
from tests.helpers.reports import minimal_report, report_text


def test_allowed_regressions_parse_and_pick_the_most_specific() -> None:
    allowed = cmp.parse_allowed("3%, all_reduce_busbw_gbps:1.5%")
    bands = cmp.Bands(warn_pct=10.0, fail_pct=20.0)
    assert allowed.for_metric("all_reduce_busbw_gbps", bands, 0) == (1.5, "--gb-compare-fail all_reduce_busbw_gbps")
    assert allowed.for_metric("gemm_bf16_tflops", bands, 0) == (3.0, "--gb-compare-fail")
    assert cmp.AllowedRegression().for_metric("m", bands, None) == (10.0, "the baseline's warn band")
    assert cmp.AllowedRegression().for_metric("m", None, None) == (cmp.DEFAULT_ALLOWED_PCT, "default")
    assert cmp.AllowedRegression().for_metric("m", None, 2) == (cmp.DEFAULT_ALLOWED_PCT, "default")
    # Where the node's history does not show the figure's run-to-run spread yet: as far as the baseline lets a
    # healthy node be (without a fail band, the warn band as before).
    assert cmp.AllowedRegression().for_metric("m", bands, 2) == (
        20.0,
        "the baseline's fail band: its run-to-run spread on this node is not known yet, 2 of the node's kept runs "
        "(--gb-history) have it, 5 show it",
    )
    assert cmp.AllowedRegression().for_metric("m", cmp.Bands(10.0, None), 2) == (10.0, "the baseline's warn band")
    assert cmp.bands(100.0, 90.0, 2.0) == cmp.Bands(10.0, 98.0)
    assert cmp.bands(None, 90.0, 2.0) == cmp.Bands(None, None)
    for bad in ("5", "x:%", "-1%", "", "nan%"):
        with pytest.raises(ValueError, match=r"PCT%|>= 0"):
            cmp.parse_allowed(bad)
    # A metric that does not exist would compare nothing, silently: refused, with the likely one.
    with pytest.raises(ValueError) as info:
        cmp.parse_allowed("3%,all_reduce_busbw_gpbs:1%")
    assert str(info.value) == (
        "'all_reduce_busbw_gpbs:1%': no metric 'all_reduce_busbw_gpbs' (did you mean all_reduce_busbw_gbps?); "
        "the metrics are those in metrics.CATALOG"
    )


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("3%,5%", "'5%': a second percentage for every other metric"),
        ("all_reduce_busbw_gbps:2%,all_reduce_busbw_gbps:3%", "a second percentage for all_reduce_busbw_gbps"),
    ],
)
def test_a_percentage_given_twice_is_refused(text: str, error: str) -> None:
    """Which of the two was meant cannot be told: neither is picked silently."""
    with pytest.raises(ValueError, match=error):
        cmp.parse_allowed(text)


@pytest.mark.parametrize(
    ("hostname", "sku", "error"),
    [
        ("n2", "cpu", "e.json is the report of node 'n2'; this is node 'n1'"),
        (None, "cpu", "e.json names no node; this is node 'n1'"),
        ("n1", "LAB", "e.json checked SKU 'LAB'; this run checks SKU 'cpu'"),
        ("n1", None, "e.json names no SKU; this run checks SKU 'cpu'"),
    ],
)
def test_another_node_s_or_sku_s_report_is_named_once(hostname: str | None, sku: str | None, error: str) -> None:
    """The caller names the setting (`--gb-compare on the command line: ...`): the message names the file only."""
    earlier = cmp.EarlierReport(Path("e.json"), "then", "finished", sku, hostname, None, {})
    with pytest.raises(cmp.CompareError) as info:
        cmp.check_same_node(earlier, "cpu", "n1", None)
    assert str(info.value) == error


def test_lower_is_better_regresses_upwards_and_sweeps_are_matched_by_placement() -> None:
    def record(metric: str, value: float, direction: str, placement: str = "") -> Any:
        details = {"placement": placement} if placement else {}
        return {
            "metric": metric,
            "scope": "1MiB",
            "value": value,
            "unit": "x",
            "direction": direction,
            "details": details,
        }

    earlier = cmp.EarlierReport(
        Path("e.json"),
        "2026-01-01T00:00:00+00:00",
        "finished",
        "cpu",
        "n1",
        None,
        {
            measurement_key(record("step_time_s", 1.0, "lower")): record("step_time_s", 1.0, "lower"),
            measurement_key(record("busbw", 10.0, "higher", "in_place")): record("busbw", 10.0, "higher"),
        },
    )
    same = cmp.SameNode({}, ())
    allowed = cmp.AllowedRegression(5.0)

    def verdict(r: dict[str, Any]) -> str | None:
        section = cmp.compare_one(earlier, r, allowed, None, same, "now")
        return None if section is None else str(section["verdict"])

    assert verdict(record("step_time_s", 1.06, "lower")) == "regressed"
    assert verdict(record("step_time_s", 0.5, "lower")) == "ok"
    assert verdict(record("busbw", 9.6, "higher", "in_place")) == "ok"
    assert verdict(record("busbw", 9.4, "higher", "in_place")) == "regressed"
    assert verdict(record("busbw", 1.0, "higher", "out_of_place")) is None  # not in the earlier report


def test_from_zero_only_a_change_for_the_worse_regresses() -> None:
    def record(value: float, direction: str) -> Any:
        return {"metric": "errors", "scope": "node", "value": value, "unit": "count", "direction": direction}

    def verdict(before: float, now: float, direction: str) -> str:
        earlier = cmp.EarlierReport(
            Path("e.json"),
            "then",
            "finished",
            "cpu",
            "n1",
            None,
            {measurement_key(record(before, direction)): record(before, direction)},
        )
        section = cmp.compare_one(
            earlier, record(now, direction), cmp.AllowedRegression(5.0), None, cmp.SameNode({}, ()), "now"
        )
        assert section is not None
        return str(section["verdict"])

    assert verdict(0, 0, "lower") == "ok"
    assert verdict(0, 3, "lower") == "regressed"
    assert verdict(0, 3, "higher") == "ok"


def _busbw(value: float, spread_pct: float | None) -> Any:
    record: dict[str, Any] = {
        "test_id": "suites/test_collectives.py::test_reduce_scatter_busbw[in_place]",
        "metric": "reduce_scatter_busbw_gbps",
        "scope": "1MiB",
        "value": value,
        "unit": "GB/s",
        "direction": "higher",
        "details": {},
    }
    if spread_pct is not None:
        record["noise"] = {"summary": "median", "count": 20, "spread_pct": spread_pct}
    return record


def _earlier(measurements: dict[Any, Any] | None = None) -> cmp.EarlierReport:
    return cmp.EarlierReport(Path("e.json"), "then", "finished", "cpu", "n1", None, measurements or {})


def _against(before: Any, now: Any, runs: list[float] | None = None, bands: cmp.Bands | None = None) -> Any:
    """The compare section of `now` against `before`; `runs`: the figure in the node's kept runs, oldest first;
    `bands`: its baseline reference's."""
    key = measurement_key(before)
    earlier = cmp.with_history(_earlier({key: before}), [{key: value} for value in runs or []])
    section = cmp.compare_one(earlier, now, cmp.AllowedRegression(), bands, cmp.SameNode({}, ()), "now")
    assert section is not None
    return section


def test_a_change_within_the_noise_of_the_two_figures_is_not_a_regression() -> None:
    # A healthy 2-core machine a minute apart: -10.5%, each figure's samples spreading 6%.
    section = _against(_busbw(0.53, 6.0), _busbw(0.474, 6.0))
    assert section["verdict"] == "within_noise" and section["noise_margin_pct"] == pytest.approx(16.971, abs=0.01)
    assert "within the noise of the two figures: their spread allows 17.0% -> WITHIN_NOISE" in section["message"]
    # The same change between quiet figures is one; so is a change far beyond the noise.
    assert _against(_busbw(0.53, 1.0), _busbw(0.474, 1.0))["verdict"] == "regressed"
    assert _against(_busbw(0.53, 6.0), _busbw(0.3, 6.0))["verdict"] == "regressed"
    # Without a known noise (a version-2 report from before) the allowed percentage alone decides, as it did.
    assert _against(_busbw(0.53, None), _busbw(0.474, None))["verdict"] == "regressed"
    assert "noise_margin_pct" not in _against(_busbw(0.53, None), _busbw(0.474, None))
    # A figure too noisy to judge says so, and a malformed noise field is no noise.
    assert "too noisy to judge" in _against(_busbw(0.53, 20.0), _busbw(0.35, 20.0))["message"]
    # and a figure ten times off is beyond any spread: the noise is compared as a ratio
    assert _against(_busbw(5.3, 40.0), _busbw(0.53, 40.0))["verdict"] == "regressed"
    bad = _busbw(0.53, None) | {"noise": {"summary": "median", "count": 20, "spread_pct": "x"}}
    assert _against(bad, _busbw(0.474, None))["verdict"] == "regressed"


def test_before_the_node_s_runs_show_its_spread_a_gated_figure_may_move_within_its_baseline_s_fail_band() -> None:
    # A healthy 2-vCPU VM's checkpoint read, a minute apart: 18.6% slower, each run's passes within 3.3%; the
    # baseline fails it beyond 95% of its expected value, and warns beyond 5%.
    before = _busbw(0.53, 3.3) | {"metric": "checkpoint_read_s", "scope": "node", "unit": "s", "direction": "lower"}
    now = before | {"value": 0.53 * 1.205}
    gated = cmp.Bands(warn_pct=5.0, fail_pct=95.0)
    assert _against(before, now)["verdict"] == "regressed"  # no baseline gates it: the comparison alone does
    section = _against(before, now, bands=gated)
    assert section["verdict"] == "ok" and section["allowed_pct"] == 95.0
    assert (
        "allowed 95% (the baseline's fail band: its run-to-run spread on this node is not known yet"
        in (section["message"])
    )
    # three kept runs do not show it either; beyond the fail band it is a regression all the same
    assert _against(before, now, [0.53, 0.55, 0.51], gated)["allowed_pct"] == 95.0
    assert _against(before, before | {"value": 0.53 * 25}, [0.53, 0.55, 0.51], gated)["verdict"] == "regressed"
    # once they do, the warn band and the node's runs judge it
    section = _against(before, now, [0.53, 0.55, 0.51, 0.54, 0.52], gated)
    assert (
        section["allowed_pct"] == 5.0
        and "(the baseline's warn band); within the node's run-to-run" in (section["message"])
    )


def test_an_earlier_report_with_a_malformed_gpu_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "e.json"
    path.write_text(report_text({"gpus": {"devices": [{"index": 0}]}}))
    with pytest.raises(cmp.CompareError, match=r"e.json: a GPU of its `gpus` section lacks index, pci_bus_id or uuid"):
        cmp.load_earlier(path)


def test_a_change_the_node_s_own_runs_have_shown_before_is_not_a_regression() -> None:
    # The run before was a lucky one (0.55, its samples within 1%); the node's five runs spread about 7%.
    figures = [0.45, 0.475, 0.525, 0.5, 0.55]
    assert _against(_busbw(0.55, 1.0), _busbw(0.51, 1.0))["verdict"] == "regressed"  # without the history
    section = _against(_busbw(0.55, 1.0), _busbw(0.51, 1.0), figures)
    assert section["verdict"] == "within_noise"
    assert (
        "within the node's run-to-run spread (the node's last 5 runs: median 0.5, spread 7.4%, modified z +0.3"
        in (section["message"])
    )
    assert section["run_to_run"] == {"runs": 5, "median": 0.5, "spread_pct": 7.413, "z": 0.27}
    # Five runs' MAD is itself uncertain: one new figure lies 3.5 of their spreads below by chance in one run of
    # about 16 (normal figures), so a regression needs the 99% cut-off for one figure against five runs, 9.2.
    section = _against(_busbw(0.55, 1.0), _busbw(0.35, 1.0), figures)
    assert section["verdict"] == "within_noise" and "modified z -4.0; an outlier beyond 9.2" in section["message"]
    # far below every run the node has made: a regression, the history shown beside it
    section = _against(_busbw(0.55, 1.0), _busbw(0.1, 1.0), figures)
    assert section["verdict"] == "regressed" and "modified z -10.8)" in section["message"]
    # lower is better: a figure far above the node's runs is the worse side
    slow = _busbw(0.55, 1.0) | {"metric": "step_time_s", "direction": "lower"}
    assert _against(slow, slow | {"value": 0.9}, figures)["verdict"] == "regressed"
    assert _against(slow, slow | {"value": 0.35}, figures)["verdict"] == "ok"


def test_a_run_is_judged_on_all_its_figures_at_once_against_its_runs() -> None:
    """One new figure against five runs needs 9.2 of their spreads to be a regression at 1%; a run judged on 150
    figures at once against nine runs, 18.8 (a healthy VM's scratch write fell 7.9 spreads against nine runs, in
    every pass: failed at 3.5); against twenty runs the spread is known well, and the cut-off falls."""
    assert noise.family_z(5, 1, apart=True) == pytest.approx(9.2, abs=0.1)
    assert noise.family_z(9, 150, apart=True) > 7.9 > noise.OUTLIER_Z
    assert noise.family_z(20, 150, apart=True) < noise.family_z(9, 150, apart=True)
    # a value among the values judged (a fleet's node) spreads less than one judged apart (a run against its runs)
    assert noise.family_z(9, 150) < noise.family_z(9, 150, apart=True)


def test_the_node_s_runs_are_read_from_its_kept_reports_of_this_node_and_sku(tmp_path: Path) -> None:
    def kept(name: str, value: object, hostname: str = "n1", sku: str = "cpu") -> Path:
        report: Any = minimal_report() | {"sku": {"name": sku, "source": "default", "baseline_file": None}}
        report["node"]["hostname"] = hostname
        report["measurements"][0]["value"] = value
        path = tmp_path / name
        path.write_text(json.dumps(report) if value != "corrupt" else "{")
        return path

    paths = [kept(f"{i}.json", v) for i, v in enumerate([0.45, 0.475, 0.525, 0.5])]
    assert cmp.with_history(_earlier(), cmp.node_runs(paths, "cpu", "n1")).run_to_run == {}  # four: not enough
    paths += [
        kept("other-node.json", 9.0, hostname="n2"),
        kept("other-sku.json", 9.0, sku="LAB"),
        kept("corrupt.json", "corrupt"),
        kept("huge.json", 10**400),  # a JSON integer no float holds: no figure
        kept("last.json", 0.55),
    ]
    runs = cmp.node_runs(paths, "cpu", "n1")
    key = measurement_key(minimal_report()["measurements"][0])
    assert runs == tuple({key: value} for value in [0.45, 0.475, 0.525, 0.5, 0.55])
    ((key, spread),) = cmp.with_history(_earlier(), runs).run_to_run.items()
    assert (spread.runs, spread.median) == (5, 0.5)


def test_measured_again_each_figure_keeps_its_better_pass() -> None:
    fast, slow = _busbw(10.0, 1.0), _busbw(8.0, 1.0)
    step = slow | {"metric": "step_time_s", "direction": "lower", "value": 2.0}
    other = _busbw(5.0, 1.0) | {"scope": "2MiB"}
    again = [fast, step | {"value": 3.0}, other | {"value": math.nan}]
    assert [r["value"] for r in cmp.better_passes([slow, step, other], again)] == [10.0, 2.0, 5.0]
    assert cmp.better_passes([slow], []) == [slow]


def test_a_run_slower_across_the_board_than_the_node_s_runs_regresses_as_a_whole() -> None:
    """Thirty figures over eight kept runs, each drifting 3% from run to run: a run 7% slower in all of them has
    no figure that regresses on its own (each within its run-to-run spread), and is an outlier as a whole."""
    drift = random.Random(7)
    names = [f"bw{i}" for i in range(30)]
    kept = [
        {("reduce_scatter_busbw_gbps", n, "", ""): 10.0 * (1 + drift.gauss(0, 0.03)) for n in names} for _ in range(8)
    ]

    def records(speed: float) -> list[Any]:
        return [_busbw(kept[-1][("reduce_scatter_busbw_gbps", n, "", "")] * speed, 1.0) | {"scope": n} for n in names]

    earlier = cmp.with_history(_earlier(), kept)
    slowed = cmp.run_pace(earlier, records(0.93), cmp.AllowedRegression())
    assert slowed is not None and slowed["verdict"] == "regressed" and slowed["figures"] == 30 and slowed["runs"] == 8
    assert slowed["worse_pct"] > 5 and isinstance(slowed["z"], float) and slowed["z"] > noise.OUTLIER_Z
    assert (
        slowed["message"].startswith("the node as a whole: 30 figures, at the median +")
        and "-> REGRESSED" in (slowed["message"])
    )
    healthy = cmp.run_pace(earlier, records(1.0), cmp.AllowedRegression())
    assert healthy is not None and healthy["verdict"] == "ok"
    # measured again: slow in both passes, regressed; slow in the first only (a busy moment), at pace
    again = cmp.run_pace(earlier, records(0.93), cmp.AllowedRegression(), records(0.94))
    assert again is not None and again["verdict"] == "regressed" and again["first_pass"]["verdict"] == "regressed"
    busy = cmp.run_pace(earlier, records(0.93), cmp.AllowedRegression(), records(1.0))
    assert busy is not None and busy["verdict"] == "ok" and busy["first_pass"]["measured_again"] == 30
    assert "the first pass alone: " in busy["message"] and busy["message"].endswith("-> REGRESSED)")
    # slower as a whole, but by less than the regression allowed: a practical margin, as for each figure
    assert cmp.run_pace(earlier, records(0.93), cmp.AllowedRegression(default_pct=10.0))["verdict"] == "ok"  # type: ignore[index]
    # no history that can say: no pace
    assert cmp.run_pace(cmp.with_history(_earlier(), kept[:5]), records(0.5), cmp.AllowedRegression()) is None
