"""--gb-compare: the node against its own earlier report, before and after maintenance. End to end on reports
that real runs of the cpu suites wrote (an earlier value made better stands for a node that has since regressed),
and a fake GPU node for a replaced GPU. (The pure parts: unit/test_compare.py.)"""

from __future__ import annotations

import copy
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch  # noqa: F401 -- in-process pytester runs drop modules they imported, and torch cannot load twice

from tests.helpers.fakenode import nd96asr_v4
from tests.helpers.runs import CPU_HOST_COPY_BASELINE, HOST_COPY, XUNIT1, assert_usage_error, junit_cases

METRIC = "host_copy_bandwidth_gbps"


def with_baseline(directory: Path) -> Path:
    (directory / "b").mkdir(exist_ok=True)
    (directory / "b" / "cpu.yaml").write_text(CPU_HOST_COPY_BASELINE)
    return directory


def run_cpu(pytester: pytest.Pytester, report: str, *extra: str) -> tuple[pytest.RunResult, dict[str, Any]]:
    with_baseline(pytester.path)
    result = pytester.runpytest(
        *HOST_COPY, "--gb-sku=cpu", "--gb-baselines=b", f"--gb-report={report}", *XUNIT1, *extra
    )
    return result, json.loads((pytester.path / report).read_text())


@pytest.fixture(scope="module")
def earlier_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The report of a real run of the cpu host copy check on this machine: the node before maintenance. One run
    for the tests of this module (a pytest of its own: pytester is per test)."""
    directory = with_baseline(tmp_path_factory.mktemp("earlier"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GBVALIDATE_", "PYTEST_"))}
    command = [sys.executable, "-m", "pytest", *HOST_COPY, "--gb-sku=cpu", "--gb-baselines=b"]
    command += ["--gb-report=before.json", f"--rootdir={directory}"]
    done = subprocess.run(command, cwd=directory, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == pytest.ExitCode.OK, done.stdout + done.stderr
    report: dict[str, Any] = json.loads((directory / "before.json").read_text())
    return report


@pytest.fixture
def earlier(pytester: pytest.Pytester, earlier_report: dict[str, Any]) -> dict[str, Any]:
    """That report as before.json in this test's directory; a copy of its own to change."""
    (pytester.path / "before.json").write_text(json.dumps(earlier_report))
    return copy.deepcopy(earlier_report)


def rewrite(pytester: pytest.Pytester, report: dict[str, Any], name: str) -> str:
    (pytester.path / name).write_text(json.dumps(report))
    return name


def test_the_same_node_compares_every_measurement_with_its_earlier_one(
    pytester: pytest.Pytester, earlier: dict[str, Any]
) -> None:
    # 1000% (a log ratio: 22,000 times slower), so the machine's noise cannot fail this test: a busy 2-vCPU VM's
    # host copy has halved between two runs seconds apart, its samples scattering 54% (a resolution of 142%, which
    # a figure must be short of the allowed change by to be judged). What is compared, and how it is reported, is
    # under test.
    result, report = run_cpu(pytester, "after.json", "--gb-compare=before.json", "--gb-compare-fail=1000%")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    (before,) = [m for m in earlier["measurements"] if m["metric"] == METRIC]
    (after,) = [m for m in report["measurements"] if m["metric"] == METRIC]
    compared = after["compare"]
    assert compared["earlier_value"] == before["value"] and compared["earlier_date"] == earlier["start_time"]
    assert compared["delta_pct"] == pytest.approx((after["value"] - before["value"]) / before["value"] * 100, abs=1e-3)
    assert (compared["allowed_pct"], compared["verdict"]) == (1000.0, "ok")
    section = report["compare"]
    assert section["path"].endswith("before.json") and section["source"] == "--gb-compare on the command line"
    assert section["allowed_source"] == "--gb-compare-fail on the command line"
    assert section["notes"] == [f"same node {socket.gethostname()}, earlier run of {earlier['start_time']}"]
    result.stdout.fnmatch_lines(["gbvalidate: comparing with *before.json (--gb-compare on the command line): same*"])
    result.stdout.fnmatch_lines(["test *vs earlier", f"test_host_copy_bandwidth *{METRIC}*% OK"])


def test_a_regression_beyond_the_allowed_band_fails_with_both_values_and_dates(
    pytester: pytest.Pytester, earlier: dict[str, Any]
) -> None:
    (before,) = [m for m in earlier["measurements"] if m["metric"] == METRIC]
    # Before maintenance the node copied at 1000 GB/s, faster than any host copy: a regression however loaded this
    # machine is now (ten times the shared earlier run's figure was not, when that run fell on a busy moment).
    before["value"] = 1000.0
    rewrite(pytester, earlier, "before.json")
    result, report = run_cpu(pytester, "after.json", "--gb-compare=before.json")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    (after,) = [m for m in report["measurements"] if m["metric"] == METRIC]
    assert after["verdict"] == "pass"  # against the baseline; against itself:
    delta_pct = (after["value"] - before["value"]) / before["value"] * 100
    assert after["compare"]["verdict"] == "regressed" and after["compare"]["delta_pct"] == pytest.approx(
        delta_pct, abs=1e-3
    )
    message = junit_cases(pytester.path / "r.xml")["test_host_copy_bandwidth"]["message"] or ""
    for part in (
        f"{after['value']:.4g} GB/s now ({after['compare']['date']})",
        f"against {before['value']:.4g} GB/s in the earlier report ({earlier['start_time']})",
        f"delta {delta_pct:+.1f}%",
        # not the baseline's fail band (95%): the resolution the metric needs, the default where it declares none
        "allowed 6% (the resolution the metric needs, the default); ",
    ):
        assert part in message, (part, message)
    assert message.endswith("-> REGRESSED"), message
    props = dict(junit_cases(pytester.path / "r.xml")["test_host_copy_bandwidth"]["props"])
    assert props["gb_compare_verdict"] == "regressed" and float(props["gb_compare_earlier_value"]) == before["value"]
    (test,) = [t for t in report["tests"] if t["outcome"] == "failed"]
    assert test["fault"]["category"] == "performance" and "regressed against the node's earlier" in test["fault"]["why"]

    # What is allowed can be widened per metric, as --benchmark-compare-fail does per statistic. The change is a
    # log ratio: a hundredth of the earlier figure is 460% to the worse side, any share of it less than 100%.
    result, report = run_cpu(pytester, "again.json", "--gb-compare=before.json", f"--gb-compare-fail=1%,{METRIC}:1000%")
    assert result.ret == pytest.ExitCode.OK
    (after,) = [m for m in report["measurements"] if m["metric"] == METRIC]
    assert after["compare"]["allowed_pct"] == 1000 and after["compare"]["verdict"] == "ok"
    assert report["compare"]["allowed"] == {"default_pct": 1.0, "by_metric": {METRIC: 1000.0}}


def test_another_node_s_report_is_a_usage_error(pytester: pytest.Pytester, earlier: dict[str, Any]) -> None:
    earlier["node"]["hostname"] = "node-b17"
    rewrite(pytester, earlier, "other.json")
    result = pytester.runpytest(*HOST_COPY, "--gb-sku=cpu", "--gb-compare=other.json")
    assert_usage_error(
        result, "*--gb-compare on the command line: *other.json is the report of node 'node-b17'; this is node '*'"
    )


@pytest.mark.parametrize(
    ("content", "error"),
    [
        ("{not json", "*other.json: not JSON: *"),
        ('{"schema": "something-else/1"}', "*is not a pytest-gbvalidate report of this version: report_version is*"),
        ("[1, 2]", "*is not a pytest-gbvalidate report of this version: not a JSON object but a list"),
    ],
)
def test_a_file_that_is_not_a_report_is_a_usage_error(pytester: pytest.Pytester, content: str, error: str) -> None:
    (pytester.path / "other.json").write_text(content)
    assert_usage_error(pytester.runpytest(*HOST_COPY, "--gb-sku=cpu", "--gb-compare=other.json"), error)


def test_a_missing_report_or_a_bad_allowance_names_its_source(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert_usage_error(
        pytester.runpytest(*HOST_COPY, "--gb-sku=cpu", "--gb-compare=gone.json"),
        "*--gb-compare on the command line: 'gone.json': no such file: *gone.json",
    )
    # Given for this run, without an earlier report, it would allow regressions against nothing; twice, which?
    assert_usage_error(
        pytester.runpytest(*HOST_COPY, "--gb-sku=cpu", "--gb-compare-fail=5%"),
        "ERROR: --gb-compare-fail on the command line: sets the regression --gb-compare allows, and no earlier "
        "report is named: --gb-compare PATH|last, GBVALIDATE_COMPARE or gb_compare",
    )
    assert_usage_error(
        pytester.runpytest(
            *HOST_COPY,
            "--gb-sku=cpu",
            "--gb-compare=last",
            "--gb-compare-fail=host_copy_bandwidth_gbps:1%,host_copy_bandwidth_gbps:2%",
        ),
        "*--gb-compare-fail on the command line: *: 'host_copy_bandwidth_gbps:2%': a second percentage for "
        "host_copy_bandwidth_gbps",
    )
    monkeypatch.setenv("GBVALIDATE_COMPARE_FAIL", "five percent")
    assert_usage_error(
        pytester.runpytest(*HOST_COPY, "--gb-sku=cpu"),
        "*GBVALIDATE_COMPARE_FAIL in the environment: 'five percent': 'five': expected [[]METRIC:[]]PCT%*",
    )


GPU_CHECKS = """\
import os
import pytest
from pytest_gbvalidate.metrics import MetricSpec

SPEC = MetricSpec("lab_h2d_gbps", "GB/s", "higher", "gpu", "a check of this test")

def test_inventory(gpus):
    gpus.require()

@pytest.mark.parametrize("index", [0, 1])
def test_h2d(gb_expect, index):
    gb_expect("lab_h2d_gbps", float(os.environ["LAB_H2D_GBPS"]), scope=f"gpu{index}", spec=SPEC)
"""


def test_a_replaced_gpu_is_reported_and_not_compared_with_its_predecessor(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    lib = nd96asr_v4().install(monkeypatch, tmp_path)
    pytester.makepyfile(test_gpu_checks=GPU_CHECKS)
    args = ["--gb-sku=ND96asr_v4", "-p", "no:cacheprovider", *XUNIT1]
    monkeypatch.setenv("LAB_H2D_GBPS", "24")
    assert pytester.runpytest(*args, "--gb-report=before.json").ret == pytest.ExitCode.OK  # skips: no baseline

    old_serial = lib.gpus[1].serial
    lib.gpus[1].serial, lib.gpus[1].uuid = "1650000009999", "GPU-99999999-0000-0000-0000-000000000002"
    monkeypatch.setenv("LAB_H2D_GBPS", "12")  # half of what it was, on both GPUs
    result = pytester.runpytest(*args, "--gb-report=after.json", "--gb-compare=before.json")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    cases = junit_cases(pytester.path / "r.xml")
    assert cases["test_h2d[0]"]["outcome"] == "failure" and "delta -50.0%" in (cases["test_h2d[0]"]["message"] or "")
    assert cases["test_h2d[1]"]["outcome"] == "skipped"  # no baseline value, and nothing to compare it with
    report = json.loads((pytester.path / "after.json").read_text())
    replaced = report["compare"]["replaced_gpus"]
    assert list(replaced) == ["gpu1"] and f"serial {old_serial} -> 1650000009999" in replaced["gpu1"]
    gpu1 = next(m for m in report["measurements"] if m["scope"] == "gpu1")
    assert gpu1["compare"]["verdict"] == "gpu_replaced" and "this GPU was replaced" in gpu1["compare"]["message"]
    result.stdout.fnmatch_lines(["gbvalidate: comparing with *gpu1 at *: replaced since the earlier run (serial*"])
