"""A verdict only where the measurement can tell, end to end: a figure too noisy for the resolution its metric needs
is UNRESOLVED in the test, the terminal, the JSON report and JUnit, its fault category says to run again on an idle
node, the run does not exit 0, and neither the fleet summary nor the health check drains the node for it; a
scattered figure far past its fail limit still fails."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from typing import Any

import pytest

from pytest_gbvalidate.healthcheck import verdict as hc
from tests.helpers.runs import junit_cases

BASELINE = """\
schema_version: 1
sku: LAB
description: a CPU-only lab SKU for the plugin's tests
detect: {gpu_count: 0}
resolution: {pct: 6, provenance: the plugin's tests}
metrics:
  host_copy_bandwidth_gbps: {status: measured, expected: 10, fail: 10%, warn: 5%, provenance: the plugin's tests}
"""
CHECKS = """\
def samples(center, spread):
    return {"samples_gbps": [center * (1 - spread), center, center * (1 + spread)]}

def test_noisy_near_its_limits(gb_expect):  # samples 20% apart: a resolution of about 40%, 6% needed
    gb_expect("host_copy_bandwidth_gbps", 9.8, details=samples(9.8, 0.2))

def test_noisy_far_past_its_fail_limit(gb_expect):  # scattered, and still a third of the expected figure
    gb_expect("host_copy_bandwidth_gbps", 3.0, details=samples(3.0, 0.5))

def test_quiet(gb_expect):
    gb_expect("host_copy_bandwidth_gbps", 10.1, details=samples(10.1, 0.005))
"""
ARGS = [
    "--gb-sku=LAB",
    "--gb-baselines=baselines",
    "--junitxml=r.xml",
    "-o",
    "junit_family=xunit1",
    "--gb-report=r.json",
    "-p",
    "no:cacheprovider",
]


@pytest.fixture
def run(pytester: pytest.Pytester) -> tuple[pytest.RunResult, dict[str, Any], pytest.Pytester]:
    (pytester.path / "baselines").mkdir()
    (pytester.path / "baselines" / "LAB.yaml").write_text(BASELINE)
    pytester.makepyfile(CHECKS)
    result = pytester.runpytest(*ARGS)
    return result, json.loads((pytester.path / "r.json").read_text()), pytester


def test_an_unresolved_figure_is_neither_a_pass_nor_a_fault_of_the_node(
    run: tuple[pytest.RunResult, dict[str, Any], pytest.Pytester],
) -> None:
    result, report, pytester = run
    where = pytester.path
    assert result.ret == pytest.ExitCode.TESTS_FAILED  # an operator's gate must not read it as a pass
    by_test = {m["test_id"].rsplit("::", 1)[-1]: m for m in report["measurements"]}
    noisy, far, quiet = (
        by_test[t] for t in ("test_noisy_near_its_limits", "test_noisy_far_past_its_fail_limit", "test_quiet")
    )
    assert (noisy["verdict"], far["verdict"], quiet["verdict"]) == ("unresolved", "fail", "pass")
    assert noisy["resolution"]["needed_pct"] == 6 and noisy["resolution"]["pct"] > 6
    assert set(noisy["resolution"]["spreads"]) == {"samples"}
    faults = {t["test_id"].rsplit("::", 1)[-1]: t.get("fault", {}).get("category") for t in report["tests"]}
    assert faults["test_noisy_near_its_limits"] == "unresolved"
    assert faults["test_noisy_far_past_its_fail_limit"] == "performance"
    # the terminal: the resolution column, and why the row is unresolved
    result.stdout.fnmatch_lines(
        [
            "*test_noisy_near_its_limits*9.8*10*9*GB/s*-2.0%*of 6%*UNRESOLVED",
            "UNRESOLVED *test_noisy_near_its_limits: *too noisy to judge: its resolution *, coarser than the 6%*",
            "unresolved (MONITOR): re-run the checks on an idle node*",
        ]
    )
    # JUnit: the test that could not tell is an error of type `unresolved`, counted apart from the node's failure;
    # the properties carry the resolution beside the figure
    cases = junit_cases(where / "r.xml")
    assert cases["test_noisy_near_its_limits"]["outcome"] == "error"
    assert cases["test_noisy_far_past_its_fail_limit"]["outcome"] == "failure"
    assert (cases["test_noisy_near_its_limits"]["message"] or "").startswith(
        "Failed: UNRESOLVED: host_copy_bandwidth_gbps"
    )
    suite = ET.parse(where / "r.xml").getroot().find("testsuite")
    assert suite is not None and (suite.get("failures"), suite.get("errors")) == ("1", "1")
    assert suite.find("testcase/error[@type='unresolved']") is not None
    props = dict(cases["test_quiet"]["props"])
    assert float(props["gb_resolution_pct"]) < 6 and props["gb_resolution_needed_pct"] == "6.0"

    # Without the figure far past its limit: the node's report says nothing worse than unresolved.
    pytester.runpytest(*ARGS[:2], "--gb-report=alone.json", "-p", "no:cacheprovider", "-k", "not far_past")
    alone = json.loads((where / "alone.json").read_text())
    # the fleet summary: no verdict on the node, nothing drained, and the summary does not pass
    summary = subprocess.run(
        [sys.executable, "-m", "pytest_gbvalidate.fleet", "summary", str(where / "alone.json"), "--out", "fleet"],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert summary.returncode == 1, summary.stdout + summary.stderr
    assert "1 node(s) unresolved: too noisy to judge" in summary.stdout
    assert "state=drain" not in summary.stdout and "kubectl" not in summary.stdout
    # the health check: no verdict, naming why, and no drain reason
    judged = hc.judge(hc.Run("standard", 1, False, 600.0, 10.0, alone))
    assert judged.state == hc.UNKNOWN and judged.drain_reason() is None
    assert judged.detail.startswith("unresolved: too noisy to judge (test_noisy_near_its_limits)")
