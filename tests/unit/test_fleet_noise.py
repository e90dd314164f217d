"""The fleet's noise: a node is judged against the fleet's typical spread (and run-to-run spread), never its own,
and no single node's spread, however large, widens anybody's allowance; a node far noisier than its peers and no
outlier is too noisy to judge (no verdict: neither drained nor passed). (The outlier rule itself:
unit/test_fleet_summary.py.)"""

from __future__ import annotations

import math
import statistics
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_gbvalidate.fleet import findings
from pytest_gbvalidate.fleet.render_stats import rules_text
from pytest_gbvalidate.fleet.reports import NotMerged, read
from pytest_gbvalidate.fleet.summary import summarize
from pytest_gbvalidate.rules import noise, outliers
from pytest_gbvalidate.rules import resolution as rs
from tests.helpers.fleet_reports import write
from tests.helpers.reports import minimal_report

QUIET = 2.0  # percent: the spread of a healthy node's samples
HEALTHY = {"n1": 10.0, "n2": 10.1, "n3": 9.9, "n4": 10.05, "n5": 9.95}


def _noises(spreads: dict[str, float]) -> dict[str, noise.Noise | None]:
    return {host: noise.Noise(noise.MEDIAN, 20, spread) for host, spread in spreads.items()}


def _drained(
    values: dict[str, float], spreads: dict[str, float], direction: str = "higher", mad_k: float = 3.5
) -> list[str]:
    return [o.host for o in outliers.outliers(values, direction, mad_k=mad_k, noises=_noises(spreads))]


def test_a_slow_node_s_own_scatter_buys_it_no_pass() -> None:
    """n5 26% slow, 50 scaled MADs out: drained with quiet samples, and drained still when its own samples scatter
    16% (a link that retrains, a throttling GPU): the allowance is the fleet's (2 x 2% x sqrt 2), not its own."""
    values = HEALTHY | {"n5": 7.4}
    quiet = dict.fromkeys(values, QUIET)
    assert _drained(values, quiet) == ["n5"]
    (slow,) = outliers.outliers(values, "higher", noises=_noises(quiet | {"n5": 16.0}))
    assert slow.host == "n5" and slow.rules[-2:] == (
        "beyond the 5.7% the figures' noise allows (the fleet's spread, not its own)",
        "its own spread, 16.0% against the fleet's 2.0%, excuses nothing",
    )


def test_an_erratic_node_that_is_no_outlier_is_too_noisy_to_judge_whichever_side_it_lies() -> None:
    quiet = dict.fromkeys(HEALTHY, QUIET)
    for value in (9.6, 10.4):  # 4% slow (within the percent rule) or 4% fast: its scatter hides what it is
        judged = outliers.judge(HEALTHY | {"n5": value}, "higher", noises=_noises(quiet | {"n5": 16.0}))
        assert judged.outliers == []
        (erratic,) = judged.unjudged
        assert (
            erratic.host == "n5" and erratic.describe() == "too noisy to judge: spread 16.0% against the fleet's 2.0%"
        )
    # a little noisier than the rest, or as noisy as most of them, is judged
    assert outliers.judge(HEALTHY, "higher", noises=_noises(quiet | {"n5": 3.9})).unjudged == []
    most = quiet | {"n3": 16.0, "n4": 16.0, "n5": 16.0}
    assert outliers.judge(HEALTHY, "higher", noises=_noises(most)).unjudged == []


def test_a_metric_noisy_on_every_node_still_drains_nobody() -> None:
    values = HEALTHY | {"n5": 7.4}  # 26% slow: within 2 x 12% x sqrt 2
    judged = outliers.judge(values, "higher", noises=_noises(dict.fromkeys(values, 12.0)))
    assert judged.outliers == [] and judged.unjudged == []


def test_one_noisy_node_widens_nobody_else_s_allowance() -> None:
    """n3 26% slow. Two nodes report their spread, one of them 40%: the old rule took the median of the spreads
    reported (of two, their mean, 21%) as every node's typical noise and let n3 pass; a typical spread is the fleet's
    only where more than half of the other nodes give one. Where they do, the median of theirs keeps the 2%."""
    values = HEALTHY | {"n3": 7.4}
    assert _drained(values, {"n1": QUIET, "n2": 40.0}) == ["n3"]
    assert _drained(values, {"n1": QUIET, "n2": 40.0, "n4": QUIET}) == ["n3"]
    assert _drained(values, {"n1": QUIET, "n2": 40.0, "n3": QUIET, "n4": QUIET, "n5": QUIET}) == ["n3"]


fleets = st.integers(min_value=4, max_value=9).flatmap(
    lambda n: st.tuples(
        st.lists(st.floats(min_value=50.0, max_value=150.0), min_size=n, max_size=n),
        st.lists(st.floats(min_value=0.1, max_value=20.0), min_size=n, max_size=n),
    )
)


@settings(deadline=None, max_examples=150)  # a busy 2-core machine times no example
@given(
    fleet=fleets,
    which=st.integers(min_value=0),
    more=st.floats(min_value=0.1, max_value=1000.0),
    direction=st.sampled_from(["higher", "lower"]),
    slow=st.floats(min_value=0.05, max_value=0.95),
)
def test_adding_noise_to_one_node_s_samples_never_turns_its_drain_into_a_pass(
    fleet: tuple[list[float], list[float]], which: int, more: float, direction: str, slow: float
) -> None:
    figures, spread_list = fleet
    hosts = [f"n{i}" for i in range(len(figures))]
    host = hosts[which % len(hosts)]
    values = dict(zip(hosts, figures, strict=True))
    values[host] *= slow if direction == "higher" else 1 / slow  # often an outlier, sometimes not
    spreads = dict(zip(hosts, spread_list, strict=True))
    before = host in _drained(values, spreads, direction)
    after = host in _drained(values, spreads | {host: spreads[host] + more}, direction)
    assert after or not before


@settings(deadline=None, max_examples=150)  # a busy 2-core machine times no example
@given(
    fleet=fleets,
    which=st.integers(min_value=0),
    beyond=st.tuples(st.floats(min_value=0.0, max_value=1e6), st.floats(min_value=0.0, max_value=1e6)),
    direction=st.sampled_from(["higher", "lower"]),
    victim=st.integers(min_value=0),
    slow=st.floats(min_value=0.05, max_value=0.95),
)
def test_the_noise_allowance_does_not_depend_on_how_noisy_the_noisiest_node_is(
    fleet: tuple[list[float], list[float]],
    which: int,
    beyond: tuple[float, float],
    direction: str,
    victim: int,
    slow: float,
) -> None:
    """The noisiest node's spread raised by any amount beyond the others': every node's outlier verdict stays
    (the allowance is the median of the others', of two the smaller, whichever node is the noisiest)."""
    figures, spread_list = fleet
    hosts = [f"n{i}" for i in range(len(figures))]
    noisiest = hosts[which % len(hosts)]
    values = dict(zip(hosts, figures, strict=True))
    values[hosts[victim % len(hosts)]] *= slow if direction == "higher" else 1 / slow  # some node slow, maybe it
    spreads = dict(zip(hosts, spread_list, strict=True))
    spreads[noisiest] = max(spreads.values())

    def drained(extra: float) -> list[str]:
        return _drained(values, spreads | {noisiest: spreads[noisiest] + extra}, direction)

    assert drained(beyond[0]) == drained(beyond[1])


# Ten runs of one healthy VM as ten nodes (unit/test_fleet_summary.py), the sixth's checkpoint read 63% slow.
CHECKPOINT_READS_MS = [24.06, 24.67, 24.22, 23.94, 27.95, 40.0, 25.50, 24.98, 24.49, 24.32]


def _reports(tmp_path: Path, run_to_run: dict[int, float], spreads: dict[int, float] | None = None) -> list[Any]:
    reports = []
    for i, ms in enumerate(CHECKPOINT_READS_MS, 1):
        report = minimal_report()
        report["node"]["hostname"] = f"node-{i:02d}"
        (m,) = report["measurements"]
        m |= {"metric": "checkpoint_read_s", "value": ms / 1000, "unit": "s", "direction": "lower", "expected": None}
        if spreads is not None:
            m["noise"] = {"summary": "median", "count": 20, "spread_pct": spreads.get(i, 1.0)}
        if i in run_to_run:
            history = {"runs": 10, "median": 0.0249, "spread_pct": run_to_run[i], "z": 5.5}
            m["compare"] = {
                **{"earlier_value": 0.0279, "earlier_date": "2026-11-27T23:17:12+00:00", "message": "..."},
                **{"date": "2026-11-27T23:17:54+00:00", "delta_pct": 15.4, "allowed_pct": 5.0},
                **{"verdict": "within_noise", "noise_margin_pct": 6.4, "run_to_run": history},
            }
        reports.append(write(tmp_path, f"node-{i:02d}.json", report))
    return reports


def _metric(paths: list[Any]) -> findings.MetricStats:
    merged = [r for r in (read(p, i) for i, p in enumerate(paths)) if not isinstance(r, NotMerged)]
    assert len(merged) == len(paths)
    (metric,) = findings.metric_stats(merged, 7.5, 10.0)
    return metric


def test_one_node_s_run_to_run_spread_sets_no_floor_for_the_fleet(tmp_path: Path) -> None:
    """One node's history spreads 60% run to run: it does not become every node's MAD floor (which would hide the
    sixth node, 63% slow); nor does the slow node's own history, however wide, excuse it."""
    assert [o.host for o in _metric(_reports(tmp_path, {2: 60.0})).outliers] == ["node-06"]
    assert [o.host for o in _metric(_reports(tmp_path, {2: 60.0, 3: 60.0})).outliers] == ["node-06"]
    everyone = dict.fromkeys(range(1, 11), 6.45)
    assert [o.host for o in _metric(_reports(tmp_path, everyone | {6: 80.0})).outliers] == ["node-06"]
    assert [o.host for o in _metric(_reports(tmp_path, everyone | {4: 80.0})).outliers] == ["node-06"]


@settings(deadline=None, max_examples=150)  # a busy 2-core machine times no example
@given(
    known=st.lists(st.floats(min_value=0.5, max_value=20.0), min_size=1, max_size=10),
    beyond=st.tuples(st.floats(min_value=0.0, max_value=1e4), st.floats(min_value=0.0, max_value=1e4)),
)
def test_the_mad_floor_does_not_depend_on_how_far_the_noisiest_node_s_runs_spread(
    known: list[float], beyond: tuple[float, float]
) -> None:
    """Any number of the ten nodes give their run-to-run spread; the widest of them widened by any amount."""
    values = {f"node-{i:02d}": ms for i, ms in enumerate(CHECKPOINT_READS_MS, 1)}
    runs = dict(zip(values, known, strict=False))
    widest = max(runs, key=lambda host: runs[host])

    def drained(extra: float) -> list[str]:
        wider = runs | {widest: runs[widest] + extra}
        return [o.host for o in outliers.outliers(values, "lower", mad_k=7.5, run_to_runs=wider)]

    assert drained(beyond[0]) == drained(beyond[1])


def test_the_summary_lists_a_node_too_noisy_to_judge_drains_it_not_and_passes_it_not(tmp_path: Path) -> None:
    healthy = [24.06, 24.67, 24.22, 23.94, 24.95, 24.6, 25.50, 24.98, 24.49, 24.32]
    paths = []
    for i, ms in enumerate(healthy, 1):
        report = minimal_report()
        report["node"]["hostname"] = f"node-{i:02d}"
        (m,) = report["measurements"]
        m |= {"metric": "checkpoint_read_s", "value": ms / 1000, "unit": "s", "direction": "lower", "expected": None}
        m["noise"] = {"summary": "median", "count": 20, "spread_pct": 30.0 if i == 6 else 1.0 + 0.1 * i}
        paths.append(write(tmp_path, f"node-{i:02d}.json", report))
    summary = summarize(paths)
    assert summary.drained == [] and summary.exit_code == 1
    ((node, unjudged),) = summary.unjudged
    assert node.hostname == "node-06" and "too noisy to judge: spread 30.0% against the fleet's 1.5%" in (
        unjudged.describe()
    )
    assert summary.failures() == ["1 node(s) too noisy to judge on some figure (no verdict: run again on an idle node)"]
    from pytest_gbvalidate.fleet.render_stats import outliers_md, outliers_terminal

    assert "### Too noisy to judge" in outliers_md(summary)
    assert any("node-06" in line and "too noisy to judge" in line for line in outliers_terminal(summary))
    # Every per-node view says so: the node table and nodes.csv (unresolved, not PASS), fleet.xml (an error).
    from pytest_gbvalidate.fleet.junit import fleet_junit
    from pytest_gbvalidate.fleet.render import node_row

    rows = {n.hostname: node_row(n) for n in summary.nodes}
    assert rows["node-06"].cells([])[1:5] == ["UNRESOLVED", "-", "-", "no"] and rows["node-06"].csv()["drain"] == "no"
    assert {row.verdict for host, row in rows.items() if host != "node-06"} == {"pass"}
    suite = next(s for s in ET.fromstring(fleet_junit(summary)) if s.get("name") == "node-06")
    (case,) = [c for c in suite.iter("testcase") if c.get("classname") == "fleet.too_noisy"]
    (error,) = case.findall("error")
    assert "too noisy to judge" in str(error.get("message")) and suite.get("errors") == "1"


def test_a_node_whose_measurement_waited_for_a_cpu_is_too_busy_to_judge_not_drained() -> None:
    """n5 halved beside a neighbour that held its CPUs half the time: the waits explain the dip (69%), so no drain
    and no pass; the same figure without waits, or a fall far beyond what they explain, is drained."""
    values = HEALTHY | {"n5": 5.0}
    noises = _noises(dict.fromkeys(values, QUIET))
    busy = noise.with_neighbours(noises["n5"], 50.0)
    judged = outliers.judge(values, "higher", noises=noises | {"n5": busy})
    assert judged.outliers == [] and [u.host for u in judged.unjudged] == ["n5"]
    assert judged.unjudged[0].describe() == (
        "too busy to judge: it waited 50% of its time for a CPU, which explains a fall of 69% (as a log ratio)"
    )
    assert [o.host for o in outliers.judge(values, "higher", noises=noises).outliers] == ["n5"]
    far = outliers.judge(HEALTHY | {"n5": 1.0}, "higher", noises=noises | {"n5": busy})
    assert [o.host for o in far.outliers] == ["n5"]


# GPU-like figures: ten nodes within 1% of each other, each with 1% spread on its samples.
GPU_FLEET = {f"g{i:02d}": 100.0 + d for i, d in enumerate([0.4, -0.3, 0.1, -0.6, 0.8, -0.2, 0.5, 0.0, -0.4])}


def _gpu_fleet_outliers(value: float, needed_pct: float | None) -> list[outliers.Outlier]:
    values = GPU_FLEET | {"g09": value}
    noises = _noises(dict.fromkeys(values, 1.0))
    return outliers.outliers(values, "higher", noise.family_z(len(values), 1), noises=noises, needed_pct=needed_pct)


def _gpu_fleet_with(value: float, needed_pct: float | None) -> list[str]:
    return [o.host for o in _gpu_fleet_outliers(value, needed_pct)]


def test_the_practical_margin_is_the_resolution_the_metric_needs() -> None:
    """A GPU metric that needs 6%: a node 8% slow is drained, where the fixed 10% of the median let it pass; the
    cpu SKU's 60% drains no node for a fall the metric does not need to tell (30%), and does drain one past it."""
    assert _gpu_fleet_with(92.0, needed_pct=6.0) == ["g09"]
    assert _gpu_fleet_with(92.0, needed_pct=None) == []
    assert _gpu_fleet_with(96.0, needed_pct=6.0) == []  # 4%: finer than the metric needs
    assert _gpu_fleet_with(70.0, needed_pct=60.0) == []
    assert _gpu_fleet_with(50.0, needed_pct=60.0) == ["g09"]  # 69% as a log ratio
    (slow,) = _gpu_fleet_outliers(92.0, needed_pct=6.0)
    assert "8.2% worse than the median as a log ratio > the 6% its metric needs to tell" in slow.rules


@settings(deadline=None, max_examples=200)
@given(
    peers=st.lists(st.floats(min_value=50.0, max_value=150.0), min_size=3, max_size=12),
    value=st.floats(min_value=1.0, max_value=200.0),
    worse=st.floats(min_value=0.0, max_value=100.0),
    needed_pct=st.floats(min_value=0.1, max_value=100.0),
    direction=st.sampled_from(["higher", "lower"]),
)
def test_a_drained_node_stays_drained_as_it_gets_worse_and_never_for_less_than_the_metric_needs(
    peers: list[float], value: float, worse: float, needed_pct: float, direction: str
) -> None:
    values = {f"p{i:02d}": v for i, v in enumerate(peers)}
    worse_value = value * (1 - worse / 200) if direction == "higher" else value * (1 + worse / 100)

    def drained(v: float) -> list[outliers.Outlier]:
        return [o for o in outliers.outliers(values | {"x": v}, direction, needed_pct=needed_pct) if o.host == "x"]

    found = drained(value)
    median = outliers.spread([*peers, value]).median
    # Drained exactly where it is worse than the median by more than the metric needs: the peers' scatter excuses
    # no more than that, and nothing finer drains.
    assert bool(found) == (rs.worse_pct(value, median, direction) > needed_pct)
    if found:
        assert drained(worse_value), (value, worse_value)


def test_a_widely_scattered_fleet_excuses_no_more_than_the_metric_needs() -> None:
    """Nine GPU-like peers that happened to scatter from -3.6% to +2.5% (a MAD rule reaching 13%): a node 10% slow
    is drained all the same, and says why."""
    scatter = [-0.0359, -0.0248, -0.0024, 0.0, 0.0131, 0.0188, 0.0238, 0.0246]
    values = {f"p{i}": 100.0 * (1 + d) for i, d in enumerate(scatter)} | {"x": 89.5}
    noises = _noises(dict.fromkeys(values, 1.5))
    found = outliers.outliers(values, "higher", noise.family_z(len(values), 1), noises=noises, needed_pct=6.0)
    assert [o.host for o in found] == ["x"]
    assert (
        found[0].rules[0]
        == "3.0 scaled MADs from the median: the fleet's scatter excuses no more than its metric needs"
    )
    assert found[0].rules[1].endswith("worse than the median as a log ratio > the 6% its metric needs to tell")
    assert outliers.outliers(values, "higher", noise.family_z(len(values), 1), noises=noises) == []  # without it


def test_the_fleet_summary_takes_each_metric_s_needed_resolution_from_its_reports(tmp_path: Path) -> None:
    """Reports that say their metric needs 6%: a node 8% slow is drained, and the rule says by what; with
    --below-median-pct the operator's percent holds instead, and reports that say nothing keep the 10%."""

    def reports(needed_pct: float | None) -> list[Path]:
        (tmp_path / str(needed_pct)).mkdir(exist_ok=True)
        paths = []
        for host, gbps in (GPU_FLEET | {"g09": 92.0}).items():
            report = minimal_report()
            report["node"]["hostname"] = host
            (m,) = report["measurements"]
            m |= {"value": gbps, "expected": 100.0, "noise": {"summary": "median", "count": 20, "spread_pct": 1.0}}
            if needed_pct is not None:
                spreads = {"samples": 1.0}
                m["resolution"] = {"pct": 2.8, "spreads": spreads, "needed_pct": needed_pct, "needed_source": "x"}
            paths.append(write(tmp_path / str(needed_pct), f"{host}.json", report))
        return paths

    needed = summarize(reports(6.0))
    assert [n.hostname for n in needed.drained] == ["g09"] and needed.metrics[0].needed_pct == 6.0
    assert "the resolution its metric needs" in rules_text(needed)
    assert summarize(reports(6.0), pct=10.0).drained == []
    assert "10% as a log ratio" in rules_text(summarize(reports(6.0), pct=10.0))
    assert summarize(reports(None)).drained == [] and summarize(reports(None)).metrics[0].needed_pct is None
    assert summarize(reports(1e9)).drained == []  # out of the baselines' bounds: not believed, the 10% holds


@given(
    st.dictionaries(
        st.sampled_from([f"n{i}" for i in range(12)]),
        st.one_of(st.floats(-5, 500), st.just(math.nan)),
        max_size=12,
    ),
    st.integers(3, 12),
)
def test_each_host_s_fleet_spread_is_the_median_of_the_others_found_by_position(
    spreads: dict[str, float], hosts_count: int
) -> None:
    """outliers.Others: the others' median (of two the smaller) found in one sorted list, as taking each host out
    and sorting the rest gives it; and the too-noisy judgement on it."""
    hosts = [f"n{i}" for i in range(hosts_count)]
    fleet = outliers.Others(spreads, hosts)
    for host in hosts:
        others = [h for h in hosts if h != host]
        known = [spreads[h] for h in others if h in spreads and spreads[h] >= 0]
        naive = None
        if len(known) >= 2 and len(known) > len(others) / 2:
            naive = statistics.median(known) if len(known) >= 3 else min(known)
        assert fleet.typical(host) == naive
        assert fleet.values(host) == (None if naive is None else sorted(known))
