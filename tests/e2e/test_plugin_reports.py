"""End-to-end runs of the plugin through pytester, reading back the JUnit XML and JSON report they write: the
verdicts, the cpu SKU's suites, record mode, and a report that survives Ctrl-C, a crash and xdist."""

from __future__ import annotations

import json
import os
import shutil
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch  # noqa: F401 -- in-process pytester runs drop modules they imported, and torch cannot load twice

from pytest_gbvalidate.report.node_verdict import EXIT_UNRESOLVED
from pytest_gbvalidate.workloads.llama.train import torch_release
from tests.helpers.cpu_run import CpuRun
from tests.helpers.runs import COLLECTIVE_TESTS, REPO, SUITES, by_test, junit_cases, lab_args


def test_verdicts_land_in_the_test_junit_and_json(lab: pytest.Pytester) -> None:
    result = lab.runpytest(*lab_args("-rfs"))
    result.assert_outcomes(passed=2, failed=1, skipped=3, warnings=0)  # a WARN is the run's verdict (below)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "gbvalidate: SKU LAB (--gb-sku on the command line); level full; "
            "baseline *LAB.yaml (--gb-baselines on the command line); *torch *",
            "host_copy_bandwidth_gbps [[]node[]]: measured 40 GB/s, expected 100 GB/s, fail limit 50 GB/s, "
            "warn limit 90 GB/s, delta -60.0%, higher is better -> FAIL (measured baseline: the plugin's tests)",
            "FAILED test_checks.py::test_fail - Failed: host_copy_bandwidth_gbps*",
            "SKIPPED [[]1[]] test_checks.py:14: LAB baseline for step_time_s is provisional with no reference value *",
            "SKIPPED [[]1[]] test_checks.py:18: LAB baseline has no h2d_bandwidth_gbps",
        ]
    )
    # The verdict last: after pytest's short test summary, the run, then measured vs baseline, then the failures
    # by fault category, and then only pytest's closing line.
    result.stdout.fnmatch_lines(
        [
            "*= short test summary info =*",
            "FAILED test_checks.py::test_fail - *",
            "*= gbvalidate: LAB run =*",
            "level full: full *.* s (*.* s of its 900 s budget)",  # the site's checks have no level: full
            "skipped: 1 check: LAB baseline has no h2d_bandwidth_gbps",
            "JSON report: */r.json",
            "*= gbvalidate: LAB measured vs baseline =*",
            "test *metric *scope *measured *verdict",
            "test_pass *host_copy_bandwidth_gbps *node *101.5 *100 *50 *GB/s *+1.5% *PASS",
            "test_warn *host_copy_bandwidth_gbps *node *80 *100 *50 *GB/s *-20.0% *WARN",
            "WARN test_checks.py::test_warn: host_copy_bandwidth_gbps [[]node[]]: measured 80 GB/s*-> WARN*",
            "*= gbvalidate: failures by fault category, with the operator's action =*",
            "performance (MONITOR): investigate performance *",
            "  test_checks.py::test_fail: Failed: host_copy_bandwidth_gbps [[]node[]]: measured 40 GB/s*",
            "*= gbvalidate: node verdict =*",
            "FAIL: 1 check(s) failed on the node",
            "*= 1 failed, 2 passed, 3 skipped in *",
        ]
    )
    assert result.outlines[-2] == "FAIL: 1 check(s) failed on the node"  # the node's verdict, last before pytest's

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
        "gb_resolution_pct": "",  # a figure without samples has no resolution: taken at its value
        "gb_resolution_needed_pct": "",
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
from pytest_gbvalidate.expect import Measured

def test_gated_and_provisional(gb_expect):
    gb_expect.each([Measured("host_copy_bandwidth_gbps", 101.5, "node", {}), Measured("step_time_s", 1.5, "node", {})])

def test_provisional_only(gb_expect):
    gb_expect.each([Measured("step_time_s", 1.5, "node", {})])
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


CPU_SWEEP = ["8B", "16B", "32B", "64B", "128B", "256B", "512B", "1KiB", "2KiB", "4KiB", "8KiB", "16KiB", "32KiB"]
CPU_SWEEP += ["64KiB", "128KiB", "256KiB", "512KiB", "1MiB", "2MiB", "4MiB", "8MiB", "16MiB"]
CPU_GATES = ["16MiB"]


@pytest.mark.torch_version
def test_suites_run_on_the_cpu_sku_end_to_end(cpu_suites_run: CpuRun) -> None:
    # The data-movement suites, read from the session's run of every suite (health, topology and pretraining have
    # end-to-end tests of their own, reading the same run).
    result = cpu_suites_run
    # host copy, host GEMM, the quick level's all_reduce and 7 collective sweeps; per-GPU checks and reference tools
    # (each GPU's own and against its siblings) do not apply to cpu, pairs of nodes need several nodes, NVLS and
    # multi-node NVLink need NCCL
    outcomes = [result.outcomes(f"test_{name}.py") for name in ("bandwidth", "collectives", "reference_tools")]
    assert {k: sum(o[k] for o in outcomes) for k in ("passed", "skipped", "failed")} == {
        "passed": 10,
        "skipped": 22,
        "failed": 0,
    }, result.stdout
    stdout = pytest.LineMatcher(result.stdout.splitlines())
    stdout.fnmatch_lines(
        ["SKIPPED [[]*[]] *test_bandwidth.py*: needs NVIDIA GPUs; this run checks the cpu SKU, which has none"]
    )
    cases = result.cases
    props = dict(cases["test_host_copy_bandwidth"]["props"])
    assert props["gb_metric"] == "host_copy_bandwidth_gbps" and props["gb_verdict"] in ("pass", "warn")
    assert float(props["gb_value"]) > 0
    assert dict(cases["test_host_gemm_bf16_tflops"]["props"])["gb_metric"] == "host_gemm_bf16_tflops"
    root = ET.parse(result.directory / "r.xml").getroot()
    suite_props = {p.get("name"): p.get("value") for p in root.iterfind("testsuite/properties/property")}
    assert suite_props["gb_sku"] == "cpu" and suite_props["gb_torch"]

    report = result.report
    tests = by_test(report)
    (copy,) = tests["test_host_copy_bandwidth"]
    assert copy["value"] == pytest.approx(float(props["gb_value"]))
    assert copy["details"]["iterations"] >= 10 and len(copy["details"]["samples_gbps"]) >= 10
    (one,) = tests["test_all_reduce_one_size"]  # the smallest gated size alone, gated, its data checked
    assert (one["scope"], one["details"]["wrong"]) == ("16MiB", 0) and one["verdict"] in ("pass", "warn")
    for name, metric in COLLECTIVE_TESTS.items():
        # every measured size is in the JSON report and in JUnit, gated at the baseline's sizes only
        records = tests[name]
        assert [r["scope"] for r in records if r["verdict"] == "info"] == [s for s in CPU_SWEEP if s not in CPU_GATES]
        gated = {r["scope"]: r for r in records if r["verdict"] != "info"}
        assert list(gated) == CPU_GATES and all(r["verdict"] in ("pass", "warn") for r in gated.values())
        assert all(r["metric"] == metric and r["value"] > 0 and r["details"]["wrong"] == 0 for r in records)
        assert {r["details"]["size_bytes"] for r in records} == {8 * 2**i for i in range(22)}
        junit_scopes = [v for k, v in cases[name]["props"] if k == "gb_scope"]
        assert sorted(junit_scopes) == sorted(CPU_SWEEP)
    (plot,) = report["plots"]
    assert Path(plot["path"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and suite_props["gb_busbw_plot"] == plot["path"]
    assert report["settings"]["timeout"] == {"value": 30.0, "source": "default for a CPU-only SKU"}
    # Without -v the per-size tables are in the report and the plot only, and one line says so.
    assert "collectives, per message size" not in result.stdout
    no_gpus = "needs NVIDIA GPUs; this run checks the cpu SKU, which has none"
    skipped = sum(case["message"] == no_gpus for case in cases.values())  # every suite's, counted once
    assert skipped >= 18
    stdout.fnmatch_lines(
        [
            "*gbvalidate: cpu run*",
            f"skipped: {skipped} checks: {no_gpus}",
            "JSON report: */r.json",
            "busbw plot: */r.busbw.png",
            "*gbvalidate: cpu measured vs baseline*",
            "(not shown: 147 measurements no baseline gates; -v shows the collectives' per-size tables; all are in the "
            "JSON report)",
        ]
    )


@pytest.mark.torch_version
def test_every_suite_runs_on_the_cpu_sku(cpu_suites_run: CpuRun) -> None:
    """Every shipped suite collects and runs on the cpu SKU (CI runs this on the oldest torch too): each file's tests
    are in the report, and a test fails only on a verdict of its own measurements, never on the harness."""
    report = cpu_suites_run.report
    assert {t["test_id"].split("::")[0] for t in report["tests"]} == {
        f"suites/{path.name}" for path in SUITES.glob("test_*.py")
    }, cpu_suites_run.stdout
    for test in report["tests"]:
        if test["outcome"] != "failed":
            continue
        if torch_release() < (2, 10) and "over gloo needs torch >= 2.10" in test["text"]:
            continue  # the pretraining check's PP=2 on torch 2.9: refused, saying why
        verdicts = {m["verdict"] for m in report["measurements"] if m["test_id"] == test["test_id"]}
        assert verdicts - {"pass", "warn", "info", "skip"}, test["text"]


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


def test_record_on_cpu_then_pass_against_the_recording(pytester: pytest.Pytester) -> None:
    shutil.copytree(REPO / "baselines", pytester.path / "b")
    some = [
        str(SUITES / "test_bandwidth.py"),
        str(SUITES / "test_collectives.py"),
        "-k",
        "host_copy or all_reduce_busbw",
    ]
    first = pytester.runpytest(*some, "--gb-sku=cpu", "--gb-baselines=b", "--gb-record=b/golden.yaml")
    first.assert_outcomes(passed=2, skipped=3, deselected=18)  # pairs of nodes, NVLS, MNNVL: skipped here
    first.stdout.fnmatch_lines(["recorded baseline: *golden.yaml*"])
    text = (pytester.path / "b" / "golden.yaml").read_text()  # written, whatever the machine's noise
    # A busy machine's figure too noisy to record is written not gated, each named on a line of its own; the run
    # fails only where it is one the cpu baseline gates.
    noisy = [line for line in first.stdout.lines if line.startswith("  ") and "against a recording as noisy" in line]
    assert "sku: golden" in text and "measured on " in text and "8MiB" not in text  # the gated sizes only
    assert ("status: measured" in text) == (len(noisy) < 1 + len(CPU_GATES))  # host copy, all_reduce at each gate
    assert ("figure(s) too noisy to record, written not gated" in first.stdout.str()) == bool(noisy)
    required = any("required by the SKU: " in line for line in noisy)
    assert first.ret == (pytest.ExitCode.TESTS_FAILED if required else pytest.ExitCode.OK)
    for size in CPU_GATES:
        assert (f"      {size}:" in text) != any(f"all_reduce_busbw_gbps [{size}]" in line for line in noisy)
    second = pytester.runpytest(*some, "--gb-sku=golden", "--gb-baselines=b", "--gb-report=r.json")
    judged = json.loads((pytester.path / "r.json").read_text())["measurements"]
    gated = [m for m in judged if m["verdict"] not in ("info", "skip")]  # not gated: reported, never judged
    assert [m["scope"] for m in gated] == [s for s in ("node", *CPU_GATES) if f"[{s}]" not in "".join(noisy)]
    for m in gated:  # judged against the recording; how a busy machine's next run fares is the benchmarks' to say
        assert m["verdict"] in ("pass", "warn", "unresolved", "fail") and m["status"] == "measured"
        assert m["provenance"].startswith("measured on ") and m["expected"] > 0 and "resolution" in m
    if gated:
        assert second.ret in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED, EXIT_UNRESOLVED)
    else:  # every figure written not gated: the run checked nothing, which is no verdict, never a pass
        assert second.ret == pytest.ExitCode.NO_TESTS_COLLECTED


def test_record_a_sku_that_has_no_baseline_yet(lab: pytest.Pytester) -> None:
    result = lab.runpytest(
        "--gb-sku=NEW", "--gb-baselines=baselines", "--gb-record=baselines/NEW.yaml", "-k", "pass or size"
    )
    result.assert_outcomes(passed=2)  # nothing to compare against: measured, recorded, not failed
    text = (lab.path / "baselines" / "NEW.yaml").read_text()
    assert "host_copy_bandwidth_gbps:" in text and "1GiB:" in text and "2GiB:" in text
    assert lab.runpytest("--gb-sku=NEW", "--gb-baselines=baselines", "-k", "pass").ret == 0


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


def test_a_warn_is_a_python_warning_only_where_the_operator_s_filters_name_it(lab: pytest.Pytester) -> None:
    """`-W error::...GbValidateWarning` fails a test on a WARN; an ini file's filter naming it applies as written."""
    strict = lab.runpytest(*lab_args("-k", "warn", "-W", "error::pytest_gbvalidate.expect.GbValidateWarning"))
    strict.assert_outcomes(failed=1, deselected=5)
    strict.stdout.fnmatch_lines(
        ["E *.GbValidateWarning: host_copy_bandwidth_gbps [[]node[]]: measured 80 GB/s*-> WARN*"]
    )
    lab.makeini("[pytest]\nfilterwarnings = default::pytest_gbvalidate.expect.GbValidateWarning\n")
    shown = lab.runpytest(*lab_args("-k", "warn"))
    shown.assert_outcomes(passed=1, deselected=5, warnings=1)
