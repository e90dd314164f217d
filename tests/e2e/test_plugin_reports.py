"""End-to-end runs of the plugin through pytester, reading back the JUnit XML and JSON report they write."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import torch  # noqa: F401 -- in-process pytester runs drop modules they imported, and torch cannot load twice

REPO = Path(__file__).resolve().parents[1]
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


@pytest.fixture
def lab(pytester: pytest.Pytester) -> pytest.Pytester:
    """A project with a LAB baseline directory and a test file of checks against it."""
    (pytester.path / "baselines").mkdir()
    (pytester.path / "baselines" / "LAB.yaml").write_text(BASELINE)
    pytester.makepyfile(test_checks=CHECKS)
    return pytester


# A JUnit file with each measurement as properties of its testcase: only the xunit1 family has them (xunit2,
# pytest's default, is checked against its schema in test_junit_schema.py).
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


def by_test(report: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for m in report["measurements"]:
        out.setdefault(m["test_id"].rsplit("::", 1)[-1], []).append(m)
    return out


def test_verdicts_land_in_the_test_junit_and_json(lab: pytest.Pytester) -> None:
    result = lab.runpytest(*lab_args("-rfs"))
    result.assert_outcomes(passed=2, failed=1, skipped=3, warnings=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "gbvalidate: SKU LAB (--gb-sku on the command line); baseline *LAB.yaml; *torch *",
            "host_copy_bandwidth_gbps [[]node[]]: measured 40 GB/s, expected 100 GB/s, fail limit 50 GB/s, "
            "warn limit 90 GB/s, delta -60.0%, higher is better -> FAIL (measured baseline: the plugin's tests)",
            "*GbValidateWarning: host_copy_bandwidth_gbps [[]node[]]: measured 80 GB/s*-> WARN*",
            "FAILED test_checks.py::test_fail - Failed: host_copy_bandwidth_gbps*",
            "SKIPPED [[]1[]] test_checks.py:14: LAB baseline for step_time_s is provisional with no reference value *",
            "SKIPPED [[]1[]] test_checks.py:18: LAB baseline has no h2d_bandwidth_gbps",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "*gbvalidate: LAB measured vs baseline*",
            "test *metric *scope *measured *verdict",
            "test_pass *host_copy_bandwidth_gbps *node *101.5 *100 *50 *GB/s *+1.5% *PASS",
        ]
    )

    cases = junit_cases(lab.path / "r.xml")
    assert cases["test_pass"]["outcome"] == "passed"
    assert dict(cases["test_pass"]["props"]) == {
        "gb_metric": "host_copy_bandwidth_gbps",
        "gb_scope": "node",
        "gb_value": "101.5",
        "gb_unit": "GB/s",
        "gb_expected": "100.0",
        "gb_limit": "50.0",
        "gb_warn_limit": "90.0",
        "gb_delta_pct": "1.5",
        "gb_verdict": "pass",
    }
    assert dict(cases["test_warn"]["props"])["gb_verdict"] == "warn"
    assert cases["test_fail"]["outcome"] == "failure"
    assert "delta -60.0%" in (cases["test_fail"]["message"] or "")
    per_size = [v for k, v in cases["test_per_size"]["props"] if k == "gb_verdict"]
    assert per_size == ["pass", "skip"]  # 2GiB has no value in the baseline
    assert cases["test_not_in_baseline"]["outcome"] == "skipped"
    assert cases["test_per_size"]["outcome"] == "skipped"

    report = json.loads((lab.path / "r.json").read_text())
    assert report["status"] == "finished" and report["exit_status"] == 1
    assert report["sku"]["name"] == "LAB" and report["sku"]["source"] == "--gb-sku on the command line"
    assert report["start_time"] <= report["end_time"]
    assert report["node"]["torch"] and report["node"]["hostname"]
    tests = by_test(report)
    assert tests["test_pass"][0] | {"details": None} == tests["test_pass"][0] | {
        "metric": "host_copy_bandwidth_gbps",
        "scope": "node",
        "value": 101.5,
        "unit": "GB/s",
        "expected": 100.0,
        "limit": 50.0,
        "verdict": "pass",
        "details": None,
    }
    assert tests["test_pass"][0]["details"] == {"size_bytes": 1024}
    assert [m["verdict"] for m in tests["test_per_size"]] == ["pass", "skip"]
    assert tests["test_fail"][0]["verdict"] == "fail" and tests["test_warn"][0]["verdict"] == "warn"
    assert tests["test_provisional_without_value"][0]["value"] == 1.5  # a skip still keeps what was measured
    outcomes = {t["test_id"].rsplit("::", 1)[-1]: t["outcome"] for t in report["tests"]}
    assert outcomes["test_fail"] == "failed" and outcomes["test_not_in_baseline"] == "skipped"


def test_strict_fails_what_the_baseline_lacks(lab: pytest.Pytester) -> None:
    result = lab.runpytest(*lab_args("--gb-strict"), "-k", "not_in_baseline or provisional")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*LAB baseline has no h2d_bandwidth_gbps (--gb-strict)*"])


EACH = """\
def test_gated_and_provisional(gb_expect):
    gb_expect.each([("host_copy_bandwidth_gbps", "node", 101.5, {}), ("step_time_s", "node", 1.5, {})])

def test_provisional_only(gb_expect):
    gb_expect.each([("step_time_s", "node", 1.5, {})])
"""


def test_a_provisional_measurement_beside_a_gated_one_does_not_hide_its_pass(lab: pytest.Pytester) -> None:
    lab.makepyfile(test_each=EACH)
    result = lab.runpytest(*lab_args(), "test_each.py")
    result.assert_outcomes(passed=1, skipped=1)
    report = json.loads((lab.path / "r.json").read_text())
    assert {t: [m["verdict"] for m in ms] for t, ms in by_test(report).items()} == {
        "test_gated_and_provisional": ["pass", "skip"],
        "test_provisional_only": ["skip"],
    }
    lab.runpytest(*lab_args("--gb-strict"), "test_each.py").assert_outcomes(failed=2)


COLLECTIVE_TESTS = {
    "test_all_reduce_busbw[in_place]": "all_reduce_busbw_gbps",
    "test_all_gather_busbw[in_place]": "all_gather_busbw_gbps",
    "test_all_gather_busbw[out_of_place]": "all_gather_busbw_gbps",
    "test_reduce_scatter_busbw[in_place]": "reduce_scatter_busbw_gbps",
    "test_reduce_scatter_busbw[out_of_place]": "reduce_scatter_busbw_gbps",
    "test_alltoall_busbw[out_of_place]": "alltoall_busbw_gbps",
    "test_broadcast_busbw[in_place]": "broadcast_busbw_gbps",
}
CPU_SWEEP = ["8B", "16B", "32B", "64B", "128B", "256B", "512B", "1KiB", "2KiB", "4KiB", "8KiB", "16KiB", "32KiB"]
CPU_SWEEP += ["64KiB", "128KiB", "256KiB", "512KiB", "1MiB", "2MiB", "4MiB"]


def test_suites_run_on_the_cpu_sku_end_to_end(pytester: pytest.Pytester) -> None:
    # The data-movement suites; health, topology and pretraining have end-to-end tests of their own.
    suites = [str(SUITES / f"test_{name}.py") for name in ("bandwidth", "collectives", "reference_tools")]
    result = pytester.runpytest(*suites, "--gb-sku=cpu", *XUNIT1, "--gb-report=r.json", "-p", "no:cacheprovider", "-rs")
    # host copy, host GEMM and 7 collective sweeps; per-GPU checks and reference tools do not apply to cpu, and
    # pairs of nodes need several nodes
    result.assert_outcomes(passed=9, skipped=16)
    result.stdout.fnmatch_lines(
        ["SKIPPED [[]5[]] *test_bandwidth.py: needs NVIDIA GPUs; this run checks the cpu SKU, which has none"]
    )
    cases = junit_cases(pytester.path / "r.xml")
    props = dict(cases["test_host_copy_bandwidth"]["props"])
    assert props["gb_metric"] == "host_copy_bandwidth_gbps" and props["gb_verdict"] in ("pass", "warn")
    assert float(props["gb_value"]) > 0
    assert dict(cases["test_host_gemm_bf16_tflops"]["props"])["gb_metric"] == "host_gemm_bf16_tflops"
    root = ET.parse(pytester.path / "r.xml").getroot()
    suite_props = {p.get("name"): p.get("value") for p in root.iterfind("testsuite/properties/property")}
    assert suite_props["gb_sku"] == "cpu" and suite_props["gb_torch"]

    report = json.loads((pytester.path / "r.json").read_text())
    tests = by_test(report)
    (copy,) = tests["test_host_copy_bandwidth"]
    assert copy["value"] == pytest.approx(float(props["gb_value"]))
    assert copy["details"]["iterations"] >= 10 and len(copy["details"]["samples_gbps"]) >= 10
    for name, metric in COLLECTIVE_TESTS.items():
        # every measured size is in the JSON report and in JUnit, gated at the baseline's sizes only
        records = tests[name]
        assert [r["scope"] for r in records if r["verdict"] == "info"] == [
            s for s in CPU_SWEEP if "MiB" not in s or s == "2MiB"
        ]
        gated = {r["scope"]: r for r in records if r["verdict"] != "info"}
        assert sorted(gated) == ["1MiB", "4MiB"] and all(r["verdict"] in ("pass", "warn") for r in gated.values())
        assert all(r["metric"] == metric and r["value"] > 0 and r["details"]["wrong"] == 0 for r in records)
        assert {r["details"]["size_bytes"] for r in records} == {8 * 2**i for i in range(20)}
        junit_scopes = [v for k, v in cases[name]["props"] if k == "gb_scope"]
        assert sorted(junit_scopes) == sorted(CPU_SWEEP)
    (plot,) = report["plots"]
    assert Path(plot["path"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and suite_props["gb_busbw_plot"] == plot["path"]
    assert report["settings"]["timeout_s"] == {"value": 30.0, "source": "default for a CPU-only SKU"}
    result.stdout.fnmatch_lines(
        [
            "*gbvalidate: collectives, per message size (nccl-tests columns)*",
            "all_reduce_busbw_gbps (pytest-gbvalidate; GB/s with GB = 1e9 bytes)",
            "*size*count*type*in_place:time_us*algbw*busbw*#wrong*gate",
            "*4MiB*1048576*float*0*(expected 1.544)",  # PASS, or WARN on a busy machine
        ]
    )


@pytest.mark.usefixtures("cpu_only_node")
def test_auto_detects_cpu_without_gpus_and_records_where_it_came_from(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(gb_target):\n    assert gb_target.sku == 'cpu'\n")
    result = pytester.runpytest()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["gbvalidate: SKU cpu (no NVIDIA GPU or driver on this node); baseline *cpu.yaml*"])


@pytest.mark.usefixtures("cpu_only_node")  # where the built-in detector would say cpu
def test_a_site_hook_answers_before_the_built_in_detector(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        """
        from pytest_gbvalidate.sku import Detection
        def pytest_gbvalidate_detect_sku(config, baselines):
            assert "ND_GB200_v6" in [b.sku for b in baselines]
            return Detection("ND_H100_v5", "site rack database")
        """
    )
    pytester.makepyfile("def test_x(gb_target):\n    assert gb_target.baseline.sku == 'ND_H100_v5'\n")
    result = pytester.runpytest()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["gbvalidate: SKU ND_H100_v5 (site rack database)*"])


def test_gpu_marker_skips_on_cpu(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest
        @pytest.mark.gb_gpu
        def test_needs_gpu(gb_expect):
            raise AssertionError("must not run on cpu")
        """
    )
    result = pytester.runpytest("--gb-sku=cpu", "--strict-markers", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*needs NVIDIA GPUs; this run checks the cpu SKU, which has none*"])


# --- bad input: a usage error (exit 4), one line, no traceback ------------------------------------------------


def assert_usage_error(result: pytest.RunResult, *lines: str) -> None:
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(list(lines))
    assert "Traceback" not in result.stderr.str() + result.stdout.str()


def test_unknown_sku(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--gb-sku=NOPE")
    assert_usage_error(
        result,
        "ERROR: unknown SKU 'NOPE' (--gb-sku on the command line); known SKUs in *: ND96asr_v4, ND_GB200_v6, "
        "ND_H100_v5, ND_H200_v5, cpu. To bring up a new SKU, record a baseline on a golden node: pytest --gb-sku=NOPE "
        "--gb-record=*NOPE.yaml suites/",
    )


def test_unknown_sku_from_the_environment_says_so(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GBVALIDATE_SKU", "NOPE")
    assert_usage_error(pytester.runpytest(), "ERROR: unknown SKU 'NOPE' (GBVALIDATE_SKU in the environment)*")


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--gb-report=out"], "ERROR: --gb-report on the command line: 'out': is a directory: *out"),
        (
            ["--gb-report=notes.txt/r.json"],
            "ERROR: --gb-report on the command line: 'notes.txt/r.json': is under a file, not a directory: *notes.txt",
        ),
        (["--gb-record=out"], "ERROR: --gb-record on the command line: 'out': is a directory: *out"),
    ],
)
def test_a_report_path_that_cannot_be_written_stops_the_run_at_once(
    lab: pytest.Pytester, args: list[str], error: str
) -> None:
    (lab.path / "out").mkdir()
    (lab.path / "notes.txt").write_text("a regular file\n")
    result = lab.runpytest("--gb-sku=LAB", "--gb-baselines=baselines", *args)
    assert_usage_error(result, error)
    result.stdout.no_fnmatch_line("*test_checks.py*")  # before any test ran


def test_a_missing_report_directory_is_created_and_said_so(lab: pytest.Pytester) -> None:
    result = lab.runpytest("--gb-sku=LAB", "--gb-baselines=baselines", "--gb-report=runs/nightly/r.json", "-k", "pass")
    result.assert_outcomes(passed=1, deselected=5)
    result.stdout.fnmatch_lines(["gbvalidate: --gb-report on the command line: creating missing directory *runs"])
    report = json.loads((lab.path / "runs" / "nightly" / "r.json").read_text())
    assert report["settings"]["created_directories"] == [
        {"path": str(lab.path / "runs"), "for": "--gb-report on the command line"}
    ]
    assert report["settings"]["report"] == {
        "value": str(lab.path / "runs" / "nightly" / "r.json"),
        "source": "--gb-report on the command line",
    }


@pytest.mark.parametrize("name", ["SKU", "STRICT"])
def test_an_empty_environment_variable_is_a_usage_error(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setenv(f"GBVALIDATE_{name}", "")
    pytester.makepyfile("def test_x(gb_target):\n    pass\n")
    assert_usage_error(
        pytester.runpytest(),
        f"ERROR: GBVALIDATE_{name} in the environment: '': set but empty: give a value, or leave it unset for the "
        "default",
    )


@pytest.mark.usefixtures("cpu_only_node")
def test_an_empty_ini_value_means_unset(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ngb_sku =\ngb_strict =\n")  # pytest reads these as it reads absent keys
    pytester.makepyfile("def test_x(gb_target):\n    assert gb_target.sku == 'cpu'\n")
    result = pytester.runpytest()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["gbvalidate: SKU cpu (no NVIDIA GPU or driver on this node); *"])


def test_bad_ini_value_names_the_ini_file(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ngb_baselines = missing_dir\n")
    assert_usage_error(pytester.runpytest(), "ERROR: gb_baselines in *tox.ini: 'missing_dir': no such directory: *")


def test_missing_baselines_directory(pytester: pytest.Pytester) -> None:
    assert_usage_error(
        pytester.runpytest("--gb-baselines=nowhere"),
        "ERROR: --gb-baselines on the command line: 'nowhere': no such directory: *nowhere",
    )


# Nested aliases: six levels of nine, half a million strings once expanded (nine levels took 54 s and 5.9 GB).
ALIAS_BOMB = (
    "[&a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol], "
    + ", ".join(f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 7))
    + "]"
)


@pytest.mark.parametrize(
    ("corruption", "error"),
    [
        (("    unit: GB/s\n", "    unit: [GB/s\n"), "ERROR: bad baseline: *LAB.yaml:*:*: YAML syntax error: *"),
        (
            ("    direction: lower\n", "    direction: sideways\n"),
            "ERROR: bad baseline: *LAB.yaml:25: metrics.step_time_s.direction: 'sideways' is not one of higher, lower",
        ),
        (
            ("    unit: s\n", "    unit: fortnights\n"),
            "ERROR: bad baseline: *LAB.yaml:24: metrics.step_time_s.unit: unknown unit 'fortnights' (known: *)",
        ),
        (
            ("description: a lab SKU", "description: " + ALIAS_BOMB),
            "ERROR: bad baseline: *LAB.yaml:3: alias 'a2': aliases stand for more than 1000 nodes (a baseline needs *)",
        ),
        (
            ("    expected: 100\n", "    expected: -10.9\n"),
            "ERROR: bad baseline: *LAB.yaml:10: metrics.host_copy_bandwidth_gbps.expected: -10.9: must be above 0 *",
        ),
    ],
)
def test_corrupted_baseline(lab: pytest.Pytester, corruption: tuple[str, str], error: str) -> None:
    path = lab.path / "baselines" / "LAB.yaml"
    path.write_text(path.read_text().replace(*corruption))
    assert_usage_error(lab.runpytest("--gb-sku=LAB", "--gb-baselines=baselines"), error)


def test_a_baseline_that_is_not_utf8_is_a_usage_error(lab: pytest.Pytester) -> None:
    path = lab.path / "baselines" / "LAB.yaml"
    path.write_bytes(path.read_bytes().replace(b"a lab SKU", b"a lab SKU \xff"))
    assert_usage_error(
        lab.runpytest("--gb-sku=LAB", "--gb-baselines=baselines"),
        "ERROR: bad baseline: *LAB.yaml:3: not UTF-8 text (byte 0xff at offset 50)",
    )


@pytest.mark.usefixtures("cpu_only_node")
def test_corrupted_baseline_stops_auto_detection_too(pytester: pytest.Pytester) -> None:
    shutil.copytree(REPO / "baselines", pytester.path / "b")
    (pytester.path / "b" / "ND_H100_v5.yaml").write_text("schema_version: 1\nsku: ND_H100_v5\nmetrics:\n  - oops\n")
    pytester.makepyfile("def test_x(gb_target):\n    pass\n")
    assert_usage_error(
        pytester.runpytest("--gb-baselines=b"), "ERROR: bad baseline: *ND_H100_v5.yaml:3: metrics: must be a mapping*"
    )


def test_list_skus(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--gb-list-skus")
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        [
            "ND_GB200_v6 *Azure ND GB200 v6 (4x NVIDIA GB200, 2x Grace)*provisional*",
            "cpu *measured*",
            "(baselines in *)",
        ]
    )


# --- record mode --------------------------------------------------------------------------------------------


def test_record_on_cpu_then_pass_against_the_recording(pytester: pytest.Pytester) -> None:
    shutil.copytree(REPO / "baselines", pytester.path / "b")
    some = [str(SUITES / "test_bandwidth.py"), str(SUITES / "test_collectives.py"), "-k", "host_copy or all_reduce"]
    first = pytester.runpytest(*some, "--gb-sku=cpu", "--gb-baselines=b", "--gb-record=b/golden.yaml")
    first.assert_outcomes(passed=2, skipped=1, deselected=13)  # pairs of nodes: skipped on one node
    first.stdout.fnmatch_lines(["recorded baseline: *golden.yaml"])
    text = (pytester.path / "b" / "golden.yaml").read_text()
    assert "sku: golden" in text and "status: measured" in text and "measured on " in text
    assert "      1MiB:" in text and "      4MiB:" in text and "2MiB" not in text  # the gated sizes only
    second = pytester.runpytest(*some, "--gb-sku=golden", "--gb-baselines=b", "--gb-report=r.json")
    second.assert_outcomes(passed=2, skipped=1, deselected=13)
    gated = [m for m in json.loads((pytester.path / "r.json").read_text())["measurements"] if m["verdict"] != "info"]
    assert [m["scope"] for m in gated] == ["node", "1MiB", "4MiB"]
    for m in gated:  # compared with the recording (a busy machine may land in the warn band; never below fail)
        assert m["verdict"] in ("pass", "warn") and m["status"] == "measured"
        assert m["provenance"].startswith("measured on ") and m["expected"] > 0


def test_record_a_sku_that_has_no_baseline_yet(lab: pytest.Pytester) -> None:
    result = lab.runpytest(
        "--gb-sku=NEW", "--gb-baselines=baselines", "--gb-record=baselines/NEW.yaml", "-k", "pass or size"
    )
    result.assert_outcomes(passed=2)  # nothing to compare against: measured, recorded, not failed
    text = (lab.path / "baselines" / "NEW.yaml").read_text()
    assert "host_copy_bandwidth_gbps:" in text and "1GiB:" in text and "2GiB:" in text
    assert lab.runpytest("--gb-sku=NEW", "--gb-baselines=baselines", "-k", "pass").ret == 0


# --- nothing lost -------------------------------------------------------------------------------------------


def test_ctrl_c_still_writes_the_report(lab: pytest.Pytester) -> None:
    lab.makepyfile(
        test_checks="""
        def test_a(gb_expect):
            gb_expect("host_copy_bandwidth_gbps", 101.0)
        def test_b(gb_expect):
            raise KeyboardInterrupt
        def test_c(gb_expect):
            gb_expect("host_copy_bandwidth_gbps", 99.0)
        """
    )
    result = lab.runpytest_subprocess(*lab_args())
    assert result.ret == pytest.ExitCode.INTERRUPTED
    report = json.loads((lab.path / "r.json").read_text())
    assert report["status"] == "interrupted" and report["exit_status"] == 2
    assert [m["value"] for m in report["measurements"]] == [101.0]


def test_a_crashed_run_leaves_what_it_measured(lab: pytest.Pytester) -> None:
    lab.makepyfile(
        test_checks="""
        import os
        def test_a(gb_expect):
            gb_expect("host_copy_bandwidth_gbps", 101.0)
        def test_b(gb_expect):
            os._exit(3)  # as a segfault in a driver call would end the process
        """
    )
    result = lab.runpytest_subprocess(*lab_args())
    assert result.ret == 3
    report = json.loads((lab.path / "r.json").read_text())
    assert report["status"] == "running" and report["end_time"] is None  # says it is partial
    assert [m["value"] for m in report["measurements"]] == [101.0]


def test_under_xdist_the_controller_reports_every_worker(lab: pytest.Pytester) -> None:
    result = lab.runpytest_subprocess(*lab_args("-n", "2"))
    result.assert_outcomes(passed=2, failed=1, skipped=3)
    report = json.loads((lab.path / "r.json").read_text())
    assert sorted(by_test(report)) == sorted(
        [
            "test_pass",
            "test_warn",
            "test_fail",
            "test_per_size",
            "test_provisional_without_value",
            "test_not_in_baseline",
        ]
    )
    assert report["status"] == "finished" and report["sku"]["name"] == "LAB"
    cases = junit_cases(lab.path / "r.xml")
    assert dict(cases["test_pass"]["props"])["gb_verdict"] == "pass"
    root = ET.parse(lab.path / "r.xml").getroot()
    assert {p.get("name") for p in root.iterfind("testsuite/properties/property")} >= {"gb_sku", "gb_hostname"}


# --- free when unused ---------------------------------------------------------------------------------------


def test_importing_the_plugin_imports_nothing_heavy() -> None:
    code = (
        "import sys, importlib.metadata as md\n"
        "[ep.load() for ep in md.entry_points(group='pytest11') if ep.name == 'gbvalidate']\n"
        "print(sorted(m for m in ('torch', 'pynvml', 'numpy', 'matplotlib', 'psutil') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_an_unrelated_test_run_does_nothing(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    # Our plugin alone: other plugins installed where the tests run (an NGC container has several) may import
    # numpy or torch themselves, which says nothing about ours.
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makeconftest(
        """
        import sys
        def pytest_unconfigure(config):
            heavy = sorted(m for m in ("torch", "pynvml", "numpy", "psutil", "yaml") if m in sys.modules)
            print("OURS:", config.pluginmanager.has_plugin("pytest_gbvalidate.plugin"), "HEAVY:", heavy)
            print("MODULES:", sorted(m for m in sys.modules if m.startswith("pytest_gbvalidate.")))
        """
    )
    pytester.makepyfile("def test_x():\n    pass\n", "def test_y():\n    assert False\n")
    result = pytester.runpytest_subprocess("-p", "pytest_gbvalidate.plugin", "-s", "--junitxml=r.xml")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["OURS: True HEAVY: []"])
    # Only what deciding to do nothing takes: no target, baselines, report, metrics or Llama configs.
    loaded = "'pytest_gbvalidate.hooks', 'pytest_gbvalidate.plugin', 'pytest_gbvalidate.ranks', "
    loaded += "'pytest_gbvalidate.ranks.world', 'pytest_gbvalidate.session', 'pytest_gbvalidate.settings'"
    result.stdout.fnmatch_lines([f"MODULES: [[]{loaded}[]]"])
    result.stdout.no_fnmatch_line("gbvalidate*")
    assert "gb_sku" not in (pytester.path / "r.xml").read_text()


def test_the_report_is_valid_json_while_the_run_is_going(lab: pytest.Pytester) -> None:
    lab.makepyfile(
        test_checks=textwrap.dedent(
            """
            import json, os
            def test_a(gb_expect):
                gb_expect("host_copy_bandwidth_gbps", 101.0)
            def test_b():
                with open("r.json") as f:
                    report = json.load(f)
                assert report["status"] == "running"
                assert [m["value"] for m in report["measurements"]] == [101.0]
            """
        )
    )
    lab.runpytest(*lab_args()).assert_outcomes(passed=2)
    assert not [p for p in os.listdir(lab.path) if p.endswith(".tmp")]


def test_an_operator_s_run_from_the_checkout_reports_library_warnings_and_passes() -> None:
    """The suites run with the checkout's pytest settings (its pyproject.toml is their rootdir's): a library's
    warning or unclosed resource is reported, not made an error that fails a healthy node. (The plugin's own tests
    treat warnings as errors, in tests/conftest.py.)"""
    plugins = ["-p", "tests.stray_warnings", "-p", "no:cacheprovider"]
    shown = ["-W", "default::ResourceWarning"]  # Python hides them by default
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "--gb-sku=cpu", "suites/test_topology.py", *plugins, *shown],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"rootdir: {REPO}" in run.stdout and "configfile: pyproject.toml" in run.stdout
    assert "a library's deprecation notice" in run.stdout and "unclosed scandir iterator" in run.stdout
