"""The JUnit XML file is valid for the family it claims: pytest's default, xunit2, against that family's schema
(which the Jenkins xUnit plugin applies before it reads a file); xunit1 keeps each measurement as properties of
its testcase, which that schema rejects."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from tests.helpers.runs import schema_errors

ARGS = ("--gb-sku=LAB", "--gb-baselines=baselines", "--junitxml=r.xml", "--gb-report=r.json")


def test_the_default_family_is_valid_xunit2_with_the_measurements_in_the_json_report(lab: pytest.Pytester) -> None:
    result = lab.runpytest(*ARGS)
    result.assert_outcomes(passed=2, failed=1, skipped=3, warnings=0)
    root = ET.parse(lab.path / "r.xml").getroot()
    assert root.find("testsuite").get("name") == "pytest"  # type: ignore[union-attr]
    assert schema_errors(lab.path / "r.xml") == []
    assert not root.findall(".//testcase/properties")
    suite = {p.get("name"): p.get("value") for p in root.iterfind("testsuite/properties/property")}
    assert suite["gb_sku"] == "LAB"
    # a failure's fault category and action: a suite property under xunit2 (no testcase properties there)
    fault = suite["gb_fault[test_checks.py::test_fail]"] or ""
    assert fault.startswith("performance (MONITOR): investigate performance")
    failure = root.find(".//testcase[@name='test_fail']/failure")
    assert failure is not None and "host_copy_bandwidth_gbps [node]: measured 40 GB/s" in failure.get("message", "")
    measured = json.loads((lab.path / "r.json").read_text())["measurements"]
    assert {m["test_id"].rsplit("::", 1)[-1] for m in measured} >= {"test_pass", "test_warn", "test_fail"}


def test_xunit1_keeps_the_measurements_on_the_testcase_which_xunit2_rejects(lab: pytest.Pytester) -> None:
    lab.runpytest(*ARGS, "-o", "junit_family=xunit1").assert_outcomes(passed=2, failed=1, skipped=3, warnings=0)
    root = ET.parse(lab.path / "r.xml").getroot()
    case = root.find(".//testcase[@name='test_fail']")
    assert case is not None
    metrics = [p.get("value") for p in case.iterfind("properties/property[@name='gb_metric']")]
    assert metrics == ["host_copy_bandwidth_gbps"]
    # (xunit1 also gives each testcase file and line attributes, which xunit2 has not either)
    assert any("Unexpected child with tag 'properties'" in e for e in schema_errors(lab.path / "r.xml"))


@pytest.mark.parametrize("family", ["xunit2", "xunit1"])
def test_a_ci_reader_sees_each_test_s_figures_under_either_family(lab: pytest.Pytester, family: str) -> None:
    """junitparser, as a CI system reads the file: each measuring testcase's output is the terminal's table of its
    figures (xunit2 has no testcase properties); xunit1 keeps them as properties too."""
    from junitparser import JUnitXml

    lab.runpytest(*ARGS, "-o", f"junit_family={family}").assert_outcomes(passed=2, failed=1, skipped=3, warnings=0)
    cases = {case.name: case for suite in JUnitXml.fromfile(str(lab.path / "r.xml")) for case in suite}
    failed = cases["test_fail"]
    assert failed.system_out is not None and failed.system_out.startswith("gbvalidate: measured vs baseline\n")
    header, row = failed.system_out.splitlines()[1:3]
    assert header.split()[:4] == ["test", "metric", "scope", "measured"]
    assert row.split()[:5] == ["test_fail", "host_copy_bandwidth_gbps", "node", "40", "100"]
    assert row.rstrip().endswith("FAIL")
    assert cases["test_warn"].system_out is not None and "WARN" in cases["test_warn"].system_out
    case = ET.parse(lab.path / "r.xml").getroot().find(".//testcase[@name='test_fail']")
    assert case is not None
    metrics = [p.get("value") for p in case.iterfind("properties/property[@name='gb_metric']")]
    assert metrics == (["host_copy_bandwidth_gbps"] if family == "xunit1" else [])
    if family == "xunit2":
        assert schema_errors(lab.path / "r.xml") == []
