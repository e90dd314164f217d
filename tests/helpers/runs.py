"""What the end-to-end tests share: where the repository and its suites are, the lab SKU's baseline and the checks
run against it, the command line options that write JUnit XML with the measurements, a run of the health and
topology suites, and readers of what a run wrote (JUnit test cases, the JSON report's measurements, a usage error,
the xunit2 schema)."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import xmlschema

REPO = Path(__file__).resolve().parents[2]
SUITES = REPO / "suites"

BASELINE = """\
schema_version: 1
sku: LAB
description: a lab SKU for the plugin's tests
metrics:
  host_copy_bandwidth_gbps:
    unit: GB/s
    direction: higher
    scope: node
    status: measured
    expected: 100
    fail: 50%
    warn: 90
    provenance: the plugin's tests
  all_reduce_busbw_gbps:
    unit: GB/s
    direction: higher
    scope: message_size
    status: provisional
    fail: 10%
    provenance: the plugin's tests
    values:
      1GiB: {expected: 400}
  step_time_s:
    unit: s
    direction: lower
    scope: node
    status: provisional
    provenance: nothing published yet
"""

CHECKS = """\
def test_pass(gb_expect):
    gb_expect("host_copy_bandwidth_gbps", 101.5, details={"size_bytes": 1024})

def test_warn(gb_expect):
    gb_expect("host_copy_bandwidth_gbps", 80.0)

def test_fail(gb_expect):
    gb_expect("host_copy_bandwidth_gbps", 40.0)

def test_per_size(gb_expect):
    gb_expect("all_reduce_busbw_gbps", 395.0, scope="1GiB")
    gb_expect("all_reduce_busbw_gbps", 300.0, scope="2GiB")

def test_provisional_without_value(gb_expect):
    from pytest_gbvalidate.metrics import MetricSpec
    gb_expect("step_time_s", 1.5, spec=MetricSpec("step_time_s", "s", "lower", "node", "one training step"))

def test_not_in_baseline(gb_expect):
    gb_expect("h2d_bandwidth_gbps", 50.0, scope="gpu0")
"""


# A one-metric lab SKU, for the tests of what a run may write and read.
# The cpu SKU's host copy check (HOST_COPY) on a 32 MiB buffer against a reference any machine passes: for tests of
# what a run does with its measurements (compares, keeps, exports), not of this machine's speed. A floor only: a
# busy 2-vCPU VM's copy, its waits for a CPU explaining a fourfold fall, was unresolved within reach of a warn band.
HOST_COPY = (str(SUITES / "test_bandwidth.py"), "-k", "host_copy", "-p", "no:cacheprovider")
CPU_HOST_COPY_BASELINE = """\
schema_version: 1
sku: cpu
description: the cpu SKU's host copy, for the plugin's tests
detect: {gpu_count: 0}
metrics:
  host_copy_bandwidth_gbps:
    status: measured
    expected: 0.5
    fail: 95%
    params: {size_bytes: 33554432, iterations: 10}
    provenance: the plugin's tests
"""

LAB = """\
schema_version: 1
sku: LAB
description: a lab SKU for the outputs' tests
metrics:
  host_copy_bandwidth_gbps:
    status: measured
    expected: 100
    fail: 50%
    provenance: the plugin's tests
"""


# A JUnit file with each measurement as properties of its testcase: only the xunit1 family has them (xunit2,
# pytest's default, is checked against its schema in e2e/test_junit_schema.py).
XUNIT1 = ("--junitxml=r.xml", "-o", "junit_family=xunit1")


def lab_args(*extra: str) -> list[str]:
    return ["--gb-sku=LAB", "--gb-baselines=baselines", *XUNIT1, "--gb-report=r.json", *extra]


def junit_cases(path: Path) -> dict[str, dict[str, Any]]:
    """testcase name -> {'outcome', 'props': [(name, value), ...], 'message'}."""
    cases = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", None
        for tag in ("failure", "error", "skipped"):
            element = case.find(tag)
            if element is not None:
                outcome, message = tag, element.get("message")
        props = [(p.get("name"), p.get("value")) for p in case.iter("property")]
        cases[case.get("name", "")] = {"outcome": outcome, "props": props, "message": message}
    return cases


def with_outcome(cases: dict[str, dict[str, Any]], outcome: str) -> dict[str, str]:
    """Test case name -> its message, for the cases of `junit_cases` with this outcome (failure, error, skipped)."""
    return {name: case["message"] or "" for name, case in cases.items() if case["outcome"] == outcome}


def by_test(report: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for m in report["measurements"]:
        out.setdefault(m["test_id"].rsplit("::", 1)[-1], []).append(m)
    return out


def assert_usage_error(result: pytest.RunResult, *lines: str) -> None:
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(list(lines))
    assert "Traceback" not in result.stderr.str() + result.stdout.str()


# The health and topology suites, run on a fake node (tests/helpers/fakenode.py) by the node suites' end-to-end tests.
HEALTH, TOPOLOGY = str(SUITES / "test_health.py"), str(SUITES / "test_topology.py")
NO_TELEMETRY = ("-k", "not telemetry")  # the telemetry check samples for half a second: only where it matters


def run_suites(
    pytester: pytest.Pytester, sku: str, *args: str, suites: tuple[str, ...] = (HEALTH, TOPOLOGY)
) -> tuple[pytest.RunResult, dict[str, dict[str, Any]], dict[str, Any]]:
    """`suites` run in `pytester` on `sku`: pytest's result, the JUnit test cases (xunit1) and the JSON report."""
    result = pytester.runpytest(
        *suites, f"--gb-sku={sku}", *XUNIT1, "--gb-report=r.json", "-p", "no:cacheprovider", *args
    )
    report = json.loads((pytester.path / "r.json").read_text())
    return result, junit_cases(pytester.path / "r.xml"), report


COLLECTIVE_TESTS = {
    "test_all_reduce_busbw[in_place]": "all_reduce_busbw_gbps",
    "test_all_gather_busbw[in_place]": "all_gather_busbw_gbps",
    "test_all_gather_busbw[out_of_place]": "all_gather_busbw_gbps",
    "test_reduce_scatter_busbw[in_place]": "reduce_scatter_busbw_gbps",
    "test_reduce_scatter_busbw[out_of_place]": "reduce_scatter_busbw_gbps",
    "test_alltoall_busbw[out_of_place]": "alltoall_busbw_gbps",
    "test_broadcast_busbw[in_place]": "broadcast_busbw_gbps",
}


# xunit2, pytest's default JUnit family, as the Jenkins xUnit plugin checks it.
XUNIT2 = xmlschema.XMLSchema(Path(__file__).parent / "schemas" / "junit-xunit2.xsd")


def schema_errors(path: Path) -> list[str]:
    return [f"{e.path}: {e.reason}" for e in XUNIT2.iter_errors(str(path))]


# Test-only: wrap the session's gang so that chosen tests get a fault on rank 1, and note after each test how
# many ranks are alive. The plan names a test, or by its node id one of several files' tests of that name.
CONFTEST = """\
import json, os
import pytest
from tests.helpers import rank_faults

PLAN = json.loads(os.environ["GBV_TEST_FAULTS"])


class FaultyGang:
    def __init__(self, gang):
        self.gang, self.world_size, self.test = gang, gang.world_size, ""

    def run(self, fn, *args, timeout_s=None):
        fault = PLAN.get(self.test)
        if fault is None:
            return self.gang.run(fn, *args, timeout_s=timeout_s)
        return self.gang.run(rank_faults.inject, fault, 1, fn, *args, timeout_s=timeout_s)

    def close(self):
        self.gang.close()


@pytest.fixture(scope="session")
def gb_gang(gb_gang):
    return FaultyGang(gb_gang)


@pytest.fixture(autouse=True)
def note_ranks(request, gb_gang):
    gb_gang.test = request.node.nodeid if request.node.nodeid in PLAN else request.node.name
    yield
    with open("ranks.jsonl", "a") as f:
        f.write(json.dumps([request.node.name, len(rank_faults.rank_processes(os.getpid()))]) + "\\n")
"""


def lab_project(pytester: pytest.Pytester, baseline: str, checks: str) -> pytest.Pytester:
    """`pytester`'s project: a LAB baseline in `baselines/` and a `test_checks.py` of checks against it."""
    (pytester.path / "baselines").mkdir()
    (pytester.path / "baselines" / "LAB.yaml").write_text(baseline)
    pytester.makepyfile(test_checks=checks)
    return pytester


def collectives_lab(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, baseline: str, faults: dict[str, str]
) -> pytest.Pytester:
    """`pytester`'s project for rank faults: a LABCPU baseline, a copy of the collectives suite, and the conftest
    that injects `faults` (test id -> fault, tests/helpers/rank_faults.py) into the gang's ranks."""
    (pytester.path / "baselines").mkdir()
    (pytester.path / "baselines" / "LABCPU.yaml").write_text(baseline)
    shutil.copy(SUITES / "test_collectives.py", pytester.path / "test_collectives.py")
    pytester.makeconftest(CONFTEST)
    monkeypatch.setenv("GBV_TEST_FAULTS", json.dumps(faults))  # read by the conftest here and on the ranks
    return pytester
