"""Unit tests of report/prometheus.py: a report as node_exporter's textfile collector reads it, parsed back with
prometheus-client's own parser. (A real run's file: e2e/test_history_runs.py.)"""

from __future__ import annotations

import datetime as dt
import math
import os
import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pytest_gbvalidate.files import OutputError
from pytest_gbvalidate.metrics import UNITS
from pytest_gbvalidate.report import history, prometheus
from tests.helpers.reports import minimal_report

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def a_report() -> Any:
    """A finished report (tests.helpers.reports), to change as each test needs."""
    return minimal_report()


def parsed(report: Any) -> tuple[dict[str, str], Samples]:
    """(family name -> type, (sample name, labels) -> value) of the report's exposition."""
    types, samples = {}, {}
    for family in text_string_to_metric_families(prometheus.exposition(report).decode("utf-8")):
        types[family.name] = family.type
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            assert key not in samples, f"two series of {key}: node_exporter would refuse the file"
            samples[key] = sample.value
    return types, samples


def labels(**given: str) -> frozenset[tuple[str, str]]:
    return frozenset(given.items())


def measurement(metric: str, value: Any, unit: str, **fields: Any) -> dict[str, Any]:
    return {
        "test_id": f"t.py::test_{metric}",
        "metric": metric,
        "scope": "node",
        "scope_kind": "node",
        "value": value,
        "unit": unit,
        "direction": "higher",
        "details": {},
        "verdict": "pass",
        "message": "",
        **fields,
    }


def test_measurements_with_a_reference_in_base_units_with_their_verdict_one_hot() -> None:
    report = a_report()
    report["measurements"] = [
        measurement("host_copy_bandwidth_gbps", 12.5, "GB/s", expected=10.0, limit=5.0, warn_limit=9.0),
        measurement("checkpoint_write_s", 1500, "ms", expected=1000.0, limit=2000.0, verdict="warn"),
        measurement("gemm_bf16_tflops", "nan", "TFLOPS", expected=700.0, limit=600.0, verdict="fail", scope="gpu3"),
        measurement("gemm_bf16_tflops", 1.0, "TFLOPS", verdict="info", scope="gpu4"),  # no reference: left out
        measurement("site_widgets", 3.0, "widgets", expected=4.0, verdict="skip"),  # a site's unit, a verdict more
    ]
    _, samples = parsed(report)

    node = {"scope": "node", "placement": "", "tool": ""}
    copy = labels(metric="host_copy_bandwidth_gbps", unit="bytes_per_second", **node)
    assert samples[("gbvalidate_measurement_value", copy)] == 12.5e9
    assert samples[("gbvalidate_measurement_expected", copy)] == 10e9
    assert samples[("gbvalidate_measurement_fail_limit", copy)] == 5e9
    assert samples[("gbvalidate_measurement_warn_limit", copy)] == 9e9
    checkpoint = labels(metric="checkpoint_write_s", unit="seconds", **node)
    assert samples[("gbvalidate_measurement_value", checkpoint)] == pytest.approx(1.5)
    gemm = labels(metric="gemm_bf16_tflops", unit="flops", scope="gpu3", placement="", tool="")
    assert math.isnan(samples[("gbvalidate_measurement_value", gemm)])  # a broken measurement stays visible
    assert samples[("gbvalidate_measurement_expected", gemm)] == 700e12
    assert not any(dict(lbl).get("scope") == "gpu4" for _, lbl in samples)
    widgets = labels(metric="site_widgets", unit="widgets", **node)
    assert samples[("gbvalidate_measurement_value", widgets)] == 3.0

    def verdicts(metric: str, scope: str = "node") -> dict[str, float]:
        return {
            dict(lbl)["verdict"]: value
            for (name, lbl), value in samples.items()
            if name == "gbvalidate_measurement_verdict"
            and dict(lbl)["metric"] == metric
            and dict(lbl)["scope"] == scope
        }

    assert verdicts("host_copy_bandwidth_gbps") == {"pass": 1.0, "warn": 0.0, "fail": 0.0, "info": 0.0}
    assert verdicts("checkpoint_write_s") == {"pass": 0.0, "warn": 1.0, "fail": 0.0, "info": 0.0}
    assert verdicts("gemm_bf16_tflops", "gpu3") == {"pass": 0.0, "warn": 0.0, "fail": 1.0, "info": 0.0}
    assert verdicts("site_widgets") == {"pass": 0.0, "warn": 0.0, "fail": 0.0, "info": 0.0, "skip": 1.0}


def test_a_sweep_s_placements_and_tools_are_series_of_their_own_and_a_repeat_counts_once() -> None:
    report = a_report()
    sweep: dict[str, Any] = {"metric": "all_reduce_busbw_gbps", "scope": "1GiB", "expected": 400.0}
    report["measurements"] = [
        measurement(value=390.0, unit="GB/s", details={"placement": "in_place"}, **sweep),
        measurement(value=380.0, unit="GB/s", details={"placement": "in_place", "tool": "nccl-tests"}, **sweep),
        measurement(value=300.0, unit="GB/s", details={"placement": "in_place"}, **sweep),  # the same again
    ]
    _, samples = parsed(report)
    values = {
        (dict(lbl)["placement"], dict(lbl)["tool"]): value
        for (name, lbl), value in samples.items()
        if name == "gbvalidate_measurement_value"
    }
    assert values == {("in_place", ""): 300e9, ("in_place", "nccl-tests"): 380e9}  # the later one, as --gb-compare


def test_each_test_s_outcome_over_its_phases_and_the_run() -> None:
    report = a_report()
    phase = {"duration_s": 0.1, "message": None, "text": None}
    report["tests"] = [
        {"test_id": "t.py::test_ok", "when": "call", "outcome": "passed", **phase},
        {"test_id": "t.py::test_teardown", "when": "call", "outcome": "passed", **phase},
        {"test_id": "t.py::test_teardown", "when": "teardown", "outcome": "failed", **phase},
        {"test_id": "t.py::test_skipped", "when": "setup", "outcome": "skipped", **phase},
    ]
    report["status"], report["exit_status"] = "interrupted", 2
    report["start_time"], report["end_time"] = "2026-11-24T10:15:00+00:00", "2026-11-24T10:20:30+00:00"
    report["node"]["hostname"] = 'node"7\\\n'  # what the exposition must escape
    report["level"] = "quick"
    types, samples = parsed(report)

    outcomes = {
        (dict(lbl)["test"], dict(lbl)["outcome"]): value
        for (name, lbl), value in samples.items()
        if name == "gbvalidate_test_outcome"
    }
    current = {test: outcome for (test, outcome), value in outcomes.items() if value == 1.0}
    assert current == {"t.py::test_ok": "passed", "t.py::test_teardown": "failed", "t.py::test_skipped": "skipped"}
    assert len(outcomes) == 3 * 3 and set(outcomes.values()) == {0.0, 1.0}  # one series per outcome, one of them 1
    assert samples[("gbvalidate_run_status", labels(status="interrupted"))] == 1.0
    assert samples[("gbvalidate_run_status", labels(status="finished"))] == 0.0
    assert samples[("gbvalidate_run_exit_code", labels())] == 2.0
    start = dt.datetime(2026, 11, 24, 10, 15, tzinfo=dt.timezone.utc).timestamp()
    assert samples[("gbvalidate_run_start_timestamp_seconds", labels())] == start
    assert samples[("gbvalidate_run_end_timestamp_seconds", labels())] == start + 330
    info = labels(sku="cpu", level="quick", hostname='node"7\\\n', nvlink_domain="")  # no GPU, no NVLink domain
    assert samples[("gbvalidate_run_info", info)] == 1.0
    assert set(types.values()) == {"gauge"}


def test_the_names_follow_prometheus_conventions() -> None:
    """prometheus.io's metric and label naming: one application prefix, legal names, times in `_seconds`, no
    family without a series."""
    report = a_report()
    report["measurements"][0] |= {"expected": 10.0, "limit": 5.0}
    text = prometheus.exposition(report).decode("utf-8")
    names = set(re.findall(r"^# TYPE (\S+) ", text, flags=re.MULTILINE))
    assert names and all(re.fullmatch(r"gbvalidate_[a-z_]+", name) for name in names)
    assert {n for n in names if "time" in n} == {
        "gbvalidate_run_start_timestamp_seconds",
        "gbvalidate_run_end_timestamp_seconds",
    }
    assert "gbvalidate_measurement_warn_limit" not in names  # the report has no warn limit
    assert text.endswith("\n")  # node_exporter wants the last line ended


def test_every_unit_of_the_catalog_has_a_base_unit() -> None:
    """A new unit in metrics.UNITS must say how Prometheus sees it (or it would reach dashboards unconverted)."""
    assert set(UNITS) <= set(prometheus.BASE_UNITS)
    assert prometheus.base_unit("GiB") == ("bytes", 2**30) and prometheus.base_unit("%") == ("ratio", 0.01)


def test_the_file_is_written_atomically_and_only_over_a_regular_file(tmp_path: Path) -> None:
    path = tmp_path / "node.prom"
    path.write_text("old\n")
    prometheus.write(path, a_report())
    assert path.read_text().startswith("# HELP gbvalidate_") and os.listdir(tmp_path) == ["node.prom"]
    link = tmp_path / "link.prom"
    link.symlink_to(path)
    before = path.read_bytes()
    with pytest.raises(OutputError, match=r"link\.prom: is a symbolic link"):
        prometheus.write(link, a_report())
    assert path.read_bytes() == before


def test_an_mfu_carries_the_peak_it_divides_by_and_that_peak_s_source() -> None:
    report = a_report()
    source = "dense bf16, dgxc-benchmarking"
    peak = {"peak_tflops_per_gpu": 2450.0, "peak_tflops_source": source}
    mfu = measurement("llama3_8b_mfu_pct", 53.3, "%", expected=55.0, details=peak)
    report["measurements"] = [mfu, measurement("host_copy_bandwidth_gbps", 10.0, "GB/s", expected=10.0)]
    _, samples = parsed(report)
    key = labels(metric="llama3_8b_mfu_pct", scope="node", placement="", tool="", source=source)
    assert samples[("gbvalidate_measurement_mfu_peak_flops", key)] == pytest.approx(2450e12)
    assert [k for k in samples if k[0] == "gbvalidate_measurement_mfu_peak_flops"] == [
        ("gbvalidate_measurement_mfu_peak_flops", key)
    ]  # the copy has no peak: no series


def states(samples: Samples, name: str, label: str, **others: str) -> dict[str, float]:
    """`name`'s one-hot series whose labels include `others`: state (the value of `label`) -> value."""
    return {
        dict(lbl)[label]: value
        for (sample, lbl), value in samples.items()
        if sample == name and others.items() <= dict(lbl).items()
    }


PHASE = {"when": "call", "duration_s": 0.1, "message": "m", "text": None}
UNRESOLVED_FAULT = {
    "category": "unresolved",
    "title": "too noisy to judge",
    "action": "re-run the checks on an idle node",
    "disposition": "MONITOR",
    "why": "the figure's evidence cannot tell a fall of the size its metric needs from its noise",
}
SLOW_FAULT = UNRESOLVED_FAULT | {"category": "performance", "title": "slow", "disposition": "DRAIN"}


def judged(report: Any, verdict: str) -> Any:
    """`report` changed so that node_verdict.py says `verdict` of it."""
    failed = {"test_id": "t.py::test_x", "outcome": "failed", **PHASE}
    if verdict == "fail":
        report["tests"], report["exit_status"] = [failed | {"fault": SLOW_FAULT}], 1
    elif verdict == "unresolved":
        report["tests"], report["exit_status"] = [failed | {"fault": UNRESOLVED_FAULT}], 1
    elif verdict == "partial":
        report["status"], report["exit_status"] = "interrupted", 2
    elif verdict == "no verdict":  # a usage error, or a file the run could not write: no failed check
        report["exit_status"] = 4
    return report


@pytest.mark.parametrize("verdict", ["pass", "fail", "unresolved", "partial", "no verdict"])
def test_the_run_s_verdict_on_its_node_one_hot(verdict: str) -> None:
    """node_verdict.py's word, the fleet's: a failed gate (`fail`) is told apart from our own failures (`partial`,
    `no verdict`) and from figures too noisy to judge, which exit 1 all the same."""
    _, samples = parsed(judged(a_report(), verdict))
    expected = dict.fromkeys(["pass", "fail", "unresolved", "partial", "no verdict"], 0.0) | {verdict: 1.0}
    assert states(samples, "gbvalidate_run_verdict", "verdict") == expected
    assert "gbvalidate_node_consecutive_unresolved_runs" not in {name for name, _ in samples}  # no history


FABRIC_FAULT = SLOW_FAULT | {
    "category": "nvlink_fabric",
    "title": "NVLink fabric",
    "disposition": "ISOLATE",
    "repair": "reboot",
}
IMEX_FAULT = SLOW_FAULT | {"category": "imex", "title": "IMEX not ready", "disposition": "MONITOR"}


def test_each_failed_test_s_fault_category_once() -> None:
    """The fault table's category of each failed test (what the domain rule counts, as the fleet does): one series
    per failed test, its first failed phase's; none for a failed test without a fault, nor for a passed one."""
    report = a_report()
    fabric, imex = "suites/test_health.py::test_nvlink_fabric[gpu0]", "suites/test_health.py::test_imex"
    report["tests"] = [
        {"test_id": fabric, "outcome": "failed", **PHASE, "fault": FABRIC_FAULT},
        {"test_id": fabric, "outcome": "failed", **PHASE, "when": "teardown", "fault": SLOW_FAULT},
        {"test_id": imex, "outcome": "failed", **PHASE, "fault": IMEX_FAULT},
        {"test_id": "t.py::test_before_faults", "outcome": "failed", **PHASE},  # a report without a fault
        {"test_id": "t.py::test_ok", "outcome": "passed", **PHASE},
    ]
    report["exit_status"] = 1
    types, samples = parsed(report)
    faults = {lbl: value for (name, lbl), value in samples.items() if name == "gbvalidate_test_fault"}
    assert faults == {
        labels(test=fabric, category="nvlink_fabric", repair="reboot"): 1.0,
        labels(test=imex, category="imex", repair=""): 1.0,  # a report from before repairs
    }
    assert types["gbvalidate_test_fault"] == "gauge"
    report["tests"] = [{"test_id": "t.py::test_ok", "outcome": "passed", **PHASE}]
    report["exit_status"] = 0
    types, samples = parsed(report)
    assert "gbvalidate_test_fault" not in types  # no failed test: no family


def test_a_compared_measurement_s_verdict_against_the_earlier_report_one_hot() -> None:
    report = a_report()
    compared = {"earlier_value": 12.0, "earlier_date": "2026-11-01", "date": "2026-11-02", "delta_pct": -40.0}
    compared |= {"allowed_pct": 5.0, "message": "40% below the earlier run"}
    report["measurements"] = [
        measurement(
            "host_copy_bandwidth_gbps", 7.2, "GB/s", expected=10.0, compare={**compared, "verdict": "regressed"}
        ),
        measurement("gemm_bf16_tflops", 600.0, "TFLOPS", compare={**compared, "verdict": "ok"}),  # no reference
        measurement("checkpoint_write_s", 1.0, "s", expected=1.0),  # not compared: no series
    ]
    _, samples = parsed(report)
    node = {"scope": "node", "placement": "", "tool": ""}
    name = "gbvalidate_measurement_compare_verdict"
    none = dict.fromkeys(["ok", "regressed", "within_noise", "unresolved", "gpu_replaced"], 0.0)
    assert states(samples, name, "verdict", metric="host_copy_bandwidth_gbps", **node) == none | {"regressed": 1.0}
    assert states(samples, name, "verdict", metric="gemm_bf16_tflops", **node) == none | {"ok": 1.0}
    assert states(samples, name, "verdict", metric="checkpoint_write_s") == {}
    _, samples = parsed(a_report())
    assert name not in {sample for sample, _ in samples}  # no --gb-compare: no family


def test_the_run_info_names_the_node_s_nvlink_domain() -> None:
    """node/fabric.py's domain of the GPU inventory: where most GPUs registered; empty where none did."""
    report = a_report()
    cluster = "1e6c5a7d-2b3f-4c8e-9a01-5d2f7b9c4e60"
    placed = {"fabric_cluster_uuid": cluster, "fabric_clique_id": 7}
    report["gpus"] = {"devices": [{"index": 0, **placed}, {"index": 1, **placed}, {"index": 2}]}
    _, samples = parsed(report)
    info = labels(sku="cpu", level="", hostname="node7", nvlink_domain=f"{cluster}/7")
    assert samples[("gbvalidate_run_info", info)] == 1.0
    report["gpus"] = {"devices": [{"index": 0, "fabric_cluster_uuid": None, "fabric_clique_id": None}]}
    _, samples = parsed(report)
    assert samples[("gbvalidate_run_info", labels(sku="cpu", level="", hostname="node7", nvlink_domain=""))] == 1.0


def kept_run(root: Path, minute: int, verdict: str, **changes: Any) -> Any:
    """A run of node7 started at 10:`minute`, judged `verdict`, kept in the history `root` as the plugin keeps it;
    the report."""
    report = judged(a_report(), verdict) | changes
    report["start_time"] = f"2026-11-24T10:{minute:02d}:00+00:00"
    report["end_time"] = f"2026-11-24T10:{minute:02d}:30+00:00"
    report["settings"]["history"] = {"value": str(root), "source": "--gb-history on the command line"}
    directory = history.node_directory(root, "node7")
    directory.mkdir(parents=True, exist_ok=True)
    history.keep(directory, report)
    return report


def consecutive(report: Any) -> float | None:
    _, samples = parsed(report)
    return samples.get(("gbvalidate_node_consecutive_unresolved_runs", labels()))


def test_unresolved_runs_in_a_row_are_counted_in_the_node_s_history(tmp_path: Path) -> None:
    """One file holds one run; the count makes "unresolved twice in a row" one alert. Counted back from this run
    to the last pass or fail of its SKU and level; runs that say nothing of the node and other levels' runs are
    passed over."""
    root = tmp_path / "h"
    kept_run(root, 0, "unresolved")  # before the pass: not in a row with the latest
    kept_run(root, 1, "pass")
    kept_run(root, 2, "unresolved")
    kept_run(root, 3, "no verdict")  # passed over
    kept_run(root, 4, "partial")  # passed over
    kept_run(root, 5, "pass", level="quick")  # another level's run: passed over
    latest = kept_run(root, 6, "unresolved")  # this run, kept before its file is written
    assert consecutive(latest) == 2
    kept_run(root, 7, "unresolved")  # a later run (a file made afterwards from an earlier report) does not count
    assert consecutive(latest) == 2
    assert consecutive(kept_run(root, 8, "unresolved")) == 4
    assert consecutive(kept_run(root, 9, "fail")) == 0  # not unresolved: none in a row
    assert consecutive(kept_run(root, 10, "unresolved")) == 1


def test_a_report_that_does_not_read_ends_the_count_and_no_history_gives_no_series(tmp_path: Path) -> None:
    root = tmp_path / "h"
    kept_run(root, 0, "unresolved")
    kept_run(root, 1, "unresolved")
    broken = root / "node7" / history.file_name(dt.datetime(2026, 11, 24, 10, 2, tzinfo=dt.timezone.utc))
    broken.write_text('{"report_version": 2}')  # not a report of the records: what it said is not known
    assert consecutive(kept_run(root, 3, "unresolved")) == 1
    broken.unlink()
    assert consecutive(kept_run(root, 4, "unresolved")) == 4
    assert consecutive(judged(a_report(), "unresolved")) is None  # no --gb-history: nothing to count in
    missing = judged(a_report(), "unresolved")
    missing["settings"]["history"] = {"value": str(tmp_path / "none"), "source": "GBVALIDATE_HISTORY"}
    assert consecutive(missing) == 1  # a history with nothing kept yet: this run alone
