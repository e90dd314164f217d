"""The fleet summary as JUnit XML (fleet.xml), for a CI system's test view: one <testsuite> per node, named by its
hostname, with one testcase per test of the node's report (a failure carries its message and, as its type, the
fault's category; the suite's `fault[<test id>]` properties say the disposition and action), a failing testcase
per outlier metric, an erroring one per figure too noisy to judge (no verdict on it), and one for a partial report.
Multi-node runs get a suite each; the reports not merged are testcases of a last suite (a corrupt report an error,
another SKU's or a superseded one skipped). Valid xunit2, as the plugin's own file."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from pytest_gbvalidate.fleet.findings import SESSION_CHECK, Suspect, failed_checks
from pytest_gbvalidate.fleet.reports import CORRUPT, NO_VERDICT, Report
from pytest_gbvalidate.fleet.summary import Summary
from pytest_gbvalidate.fleet.text import one_line
from pytest_gbvalidate.report.records import TestRecord

# Characters XML 1.0 does not allow (a traceback's terminal colour codes): a parser refuses the whole file.
_NOT_XML = re.compile(r"[^\x09\x0a\x0d\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_RANK = {"passed": 0, "skipped": 1, "failed": 2}  # a test reported at several phases: its worst outcome counts
NOT_MERGED_SUITE = "reports not merged"


def fleet_junit(summary: Summary) -> str:
    root = ET.Element("testsuites", name=f"gbvalidate fleet {summary.sku}")
    for node in summary.nodes:
        suite = _report_suite(node.hostname, node.report, root)
        _property(suite.find("properties"), "drain", "yes" if node.drain else "no")
        for o in node.outliers:
            ET.SubElement(_case(suite, "fleet.outliers", o.metric.key.label), "failure", message=o.describe())
        for u in node.unjudged:  # no verdict on the figure: an error, as a run that gave none is
            ET.SubElement(_case(suite, "fleet.too_noisy", u.metric.key.label), "error", message=u.describe())
        _suspect_cases(suite, node.suspected)
    for host, found in summary.unreported_suspects.items():
        suite = ET.SubElement(root, "testsuite", name=host, hostname=host)
        _property(ET.SubElement(suite, "properties"), "drain", "yes")
        _suspect_cases(suite, found)
    for run in summary.multi_node:
        _report_suite(f"multi-node {run.hostname} ({run.nodes} nodes)", run, root)
    if summary.not_merged:
        suite = ET.SubElement(root, "testsuite", name=NOT_MERGED_SUITE)
        for r in summary.not_merged:
            case = _case(suite, "fleet.reports", str(r.path))
            ET.SubElement(case, "error" if r.kind == CORRUPT else "skipped", message=f"{r.kind}: {r.reason}")
    for suite in root.findall("testsuite"):
        _count(suite)
    for element in root.iter():
        element.text = None if element.text is None else _NOT_XML.sub("", element.text)
        for name, value in element.attrib.items():
            element.set(name, _NOT_XML.sub("", value))
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _report_suite(name: str, report: Report, root: ET.Element | None = None) -> ET.Element:
    suite = ET.Element("testsuite", name=name, hostname=report.hostname)
    if report.data.get("start_time"):
        suite.set("timestamp", str(report.data["start_time"]))
    properties = ET.SubElement(suite, "properties")
    for key in ("status", "exit_status"):
        _property(properties, key, report.data.get(key))
    _property(properties, "sku", report.sku)
    _property(properties, "report", str(report.path))
    for key, value in report.data["node"].items():
        if isinstance(value, (str, int, float)):
            _property(properties, f"node.{key}", value)
    by_test: dict[str, list[TestRecord]] = {}
    for test in report.tests:
        by_test.setdefault(str(test.get("test_id")), []).append(test)
    for test_id, records in by_test.items():
        _test_case(suite, test_id, records)
    if any(c.test_id == SESSION_CHECK for c in failed_checks(report)):
        case = _case(suite, "fleet.report", "pytest session")
        # An error, not a failure, where the run's own failure left no verdict on the node (reports.NO_VERDICT).
        kind = "error" if report.verdict == NO_VERDICT else "failure"
        ET.SubElement(case, kind, message=f"pytest exit status {report.data.get('exit_status')}")
    if not report.finished:
        case = _case(suite, "fleet.report", "report finished")
        ET.SubElement(case, "failure", message=f"status {report.status}: the run did not finish")
    if root is not None:
        root.append(suite)
    return suite


def _test_case(suite: ET.Element, test_id: str, records: list[TestRecord]) -> None:
    module, *rest = test_id.split("::")
    classname = ".".join([module.removesuffix(".py").replace("/", "."), *rest[:-1]])
    case = _case(suite, classname, rest[-1] if rest else module)
    case.set("time", f"{sum(float(r.get('duration_s') or 0) for r in records):.3f}")
    worst = max(records, key=lambda r: _RANK.get(str(r.get("outcome")), 0))
    message = one_line(str(worst.get("message") or ""))
    if worst.get("outcome") == "failed":
        fault = worst.get("fault") if isinstance(worst.get("fault"), dict) else None
        failure = ET.SubElement(case, "failure", message=message)
        if fault is not None:
            # xunit2 has no properties on a testcase: the category is the failure's type, and the suite's
            # properties say the rest, as the plugin's own JUnit file does.
            if fault.get("category"):
                failure.set("type", str(fault["category"]))
            summary = f"{fault.get('category')} ({fault.get('disposition')}): {fault.get('action')}"
            _property(suite.find("properties"), f"fault[{test_id}]", summary)
        failure.text = str(worst.get("text") or worst.get("message") or "")
    elif worst.get("outcome") == "skipped":
        ET.SubElement(case, "skipped", message=message)


def _suspect_cases(suite: ET.Element, suspects: list[Suspect]) -> None:
    """A failing testcase per finding of a multi-node run about this node."""
    for s in suspects:
        case = _case(suite, "fleet.multi_node", f"{s.test_id} ({s.run})")
        failure = ET.SubElement(case, "failure", message=one_line(s.why))
        if s.category:
            failure.set("type", s.category)


def _case(suite: ET.Element, classname: str, name: str) -> ET.Element:
    return ET.SubElement(suite, "testcase", classname=classname, name=name)


def _property(properties: ET.Element | None, name: str, value: object) -> None:
    if properties is not None and value is not None:
        ET.SubElement(properties, "property", name=name, value=str(value))


def _count(element: ET.Element) -> None:
    cases = list(element.iter("testcase"))
    element.set("tests", str(len(cases)))
    for tag, attribute in (("failure", "failures"), ("error", "errors"), ("skipped", "skipped")):
        element.set(attribute, str(sum(1 for c in cases if c.find(tag) is not None)))
    element.set("time", f"{sum(float(c.get('time', 0)) for c in cases):.3f}")
