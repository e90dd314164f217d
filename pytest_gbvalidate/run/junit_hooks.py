"""What the plugin adds to pytest's own JUnit XML (pytest's junitxml plugin), and a failed test's text as that
file and the JSON report give it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # an unrelated test run imports none of the report's modules
    from pytest_gbvalidate.report.records import MeasurementRecord


def junit_path(config: pytest.Config) -> Path | None:
    """Where --junitxml writes, or None."""
    xmlpath = config.getoption("xmlpath", None)
    return None if not xmlpath else Path(config.invocation_params.dir) / str(xmlpath)


def has_testcase_properties(config: pytest.Config) -> bool:
    """Only the xunit1 (legacy) family has properties on a testcase. xunit2, pytest's default, allows them on
    the suite only; the Jenkins xUnit plugin validates a file against that schema and skips one that fails."""
    return str(config.getini("junit_family")) in ("xunit1", "legacy")


def add_suite_properties(config: pytest.Config, properties: Mapping[str, str]) -> None:
    from _pytest.junitxml import xml_key  # what record_testsuite_property uses; it has no public form

    xml = config.stash.get(xml_key, None)
    if xml is not None:
        from pytest_gbvalidate.labels import text_safe

        for name, value in properties.items():  # text from the system may hold bytes that were not UTF-8
            xml.add_global_property(text_safe(f"gb_{name}"), text_safe(value) if isinstance(value, str) else value)


def add_testcase_output(config: pytest.Config, report: pytest.TestReport, records: Sequence[MeasurementRecord]) -> None:
    """A testcase's measurements as its `system-out` (the terminal's table), which CI systems show in either family.
    Called with the teardown's report, before junitxml closes the testcase."""
    from _pytest.junitxml import bin_xml_escape, xml_key  # as pytest escapes a test's captured output

    xml = config.stash.get(xml_key, None)
    if xml is None or not records:
        return
    from xml.etree import ElementTree as ET

    from pytest_gbvalidate.report.terminal import terminal_table

    output = ET.Element("system-out")
    output.text = bin_xml_escape("\n".join(["gbvalidate: measured vs baseline", *terminal_table(records)]) + "\n")
    xml.node_reporter(report).append(output)


def unresolved_as_error(config: pytest.Config, report: pytest.TestReport) -> None:
    """A test that failed only for figures too noisy to judge is written as an `<error type="unresolved">`, not a
    `<failure>`: JUnit's error is a test that could not give its verdict, which CI systems show apart from failures.
    The suite's counts move with it. Called with the teardown's report, before junitxml closes the testcase."""
    from _pytest.junitxml import xml_key

    xml = config.stash.get(xml_key, None)
    if xml is None:
        return
    for node in xml.node_reporter(report).nodes:
        if node.tag == "failure":
            node.tag = "error"
            node.set("type", "unresolved")
            xml.stats["failure"] -= 1
            xml.stats["error"] += 1


def stop_writing(config: pytest.Config) -> None:
    """No JUnit XML from this process (a rank of a torchrun / srun world other than rank 0)."""
    from _pytest.junitxml import xml_key

    xml = config.stash.get(xml_key, None)
    if xml is not None:
        del config.stash[xml_key]
        config.pluginmanager.unregister(xml)


def keep_last_good(config: pytest.Config, lost: dict[str, str]) -> None:
    """pytest's JUnit XML written as the plugin writes its own files (files.atomic_write_by), not opened for writing
    first: a write that fails leaves the last good file and goes in `lost` by its path. What XML cannot hold is
    escaped as pytest escapes it elsewhere in the file."""
    from _pytest.junitxml import bin_xml_escape, xml_key

    xml = config.stash.get(xml_key, None)
    if xml is None:
        return
    from pytest_gbvalidate.files import OutputError, atomic_write_by

    write_xml = xml.pytest_sessionfinish

    def pytest_sessionfinish() -> None:
        final = xml.logfile

        def write(name: str) -> None:
            xml.logfile = name
            try:
                write_xml()
            finally:
                xml.logfile = final
            # pytest escapes what XML cannot hold in texts and properties, not in the suite's `hostname`.
            text = Path(name).read_text(encoding="utf-8")
            if (held := bin_xml_escape(text)) != text:
                Path(name).write_text(held, encoding="utf-8")

        try:
            atomic_write_by(Path(final), write)
        except OutputError as exc:
            lost[final] = f"JUnit XML NOT written: {exc}; the last good file, if any, left as it was"

    # pluggy holds the hook as the plugin had it when registered: registered again, with the kept writer.
    name = config.pluginmanager.get_name(xml)
    config.pluginmanager.unregister(xml)
    setattr(xml, "pytest_sessionfinish", pytest_sessionfinish)  # noqa: B010 (an instance's hook, not the class's)
    config.pluginmanager.register(xml, name)


def failure_text(report: pytest.TestReport) -> tuple[str, str]:
    """(the first line of what went wrong, as JUnit's message attribute starts; the whole text the terminal
    shows). A failed test's exception is in its crash line, not in the traceback's last line."""
    if report.skipped and isinstance(report.longrepr, tuple):
        reason = str(report.longrepr[2])
        return reason, reason
    text = report.longreprtext.strip()
    crash = getattr(report.longrepr, "reprcrash", None)
    first = str(crash.message) if crash is not None else text
    return (first.strip().splitlines() or [report.outcome])[0], text
