"""pytest-html's page (`--html=node.html --self-contained-html`) with the node's verdict and each test's figures.

Registered only where pytest-html is installed and enabled and this process writes the page (the xdist
controller, global rank 0), so a run without it is untouched. The fragments are made by report/html.py from the
JSON report's records; here they are handed to pytest-html: the verdict through its `pytest_html_results_summary`
hook, a test's figures as its extras (PNGs as base64, embedded in a self-contained page)."""

from __future__ import annotations

import base64
import html
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pytest_gbvalidate.run.session import GbSession


def register(config: pytest.Config, gb: GbSession) -> None:
    """Where pytest-html is enabled and this process writes its page (`--html` given: plugin.py asks)."""
    if gb.is_controller and config.pluginmanager.hasplugin("html"):
        config.pluginmanager.register(HtmlPage(gb), "gbvalidate-html")


ID_CELL = '<td class="col-testId">'  # pytest-html's cells of the test id and the result (basereport.py)
RESULT_CELL = '<td class="col-result">'
WARN_STYLE = "color: #9a6700; font-weight: bold"  # amber, as a warning is in the terminal
WARN_TITLE = "passed, with a measurement past its warn limit (WARN): see its figures"


class HtmlPage:
    def __init__(self, gb: GbSession) -> None:
        self.gb = gb

    # Between the session's (tryfirst), which puts the test's records in the report, and pytest-html's
    # (trylast), which reads every phase's extras when the teardown arrives.
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "teardown" or not self.gb.engaged:
            return
        from pytest_html import extras

        from pytest_gbvalidate.report.html_fragments import test_extras

        added = []
        for extra in test_extras(report.nodeid, self.gb.report.data):
            if extra.png is not None:
                added.append(extras.png(base64.b64encode(extra.png).decode("ascii"), name=extra.name))
            elif extra.html is not None:
                added.append(extras.html(extra.html) | {"name": extra.name})  # named: told apart on the page
        if added:
            report.extras = [*getattr(report, "extras", []), *added]  # type: ignore[attr-defined]

    @pytest.hookimpl(optionalhook=True)
    def pytest_html_results_table_row(self, report: pytest.TestReport, cells: list[str]) -> None:
        """The test id as text: pytest-html puts it in its row as markup, and a parameter's id (`test_x[<img
        src=x onerror=...>]`) would run in the page. A passed test whose measurement warned has its result cell
        marked apart (amber, with a title saying why): pytest-html knows only passed, and a WARN row looked like
        every PASS row."""
        test_id = report.nodeid if report.when == "call" else f"{report.nodeid}::{report.when}"
        warned = (
            self.gb.engaged
            and report.passed
            and any(
                m["test_id"] == report.nodeid and m["verdict"] == "warn" for m in self.gb.report.data["measurements"]
            )
        )
        for index, cell in enumerate(cells):
            if cell.startswith(ID_CELL):
                cells[index] = f"{ID_CELL}{html.escape(test_id)}</td>"
            elif cell.startswith(RESULT_CELL) and warned:
                # The text stays "Passed": pytest-html reads the cell back as the row's result, which its filters
                # and sorting know by name (another word would hide the row).
                cells[index] = f'{RESULT_CELL[:-1]} style="{WARN_STYLE}" title="{WARN_TITLE}">Passed</td>'

    @pytest.hookimpl(optionalhook=True)
    def pytest_html_results_table_html(self, report: pytest.TestReport, data: list[str]) -> None:
        """A skipped test's log is its reason: pytest-html shows the skip's (path, line, reason) tuple as text, an
        absolute path the reader has no use for."""
        if report.skipped and isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
            data[:1] = [html.escape(str(report.longrepr[2])) + "\n"]

    @pytest.hookimpl(optionalhook=True)
    def pytest_html_results_summary(
        self, prefix: list[str], summary: list[str], postfix: list[str], session: Any
    ) -> None:
        if not self.gb.engaged:
            return
        from pytest_gbvalidate.report.html_fragments import verdict_html

        prefix.append(verdict_html(self.gb.report.data))
