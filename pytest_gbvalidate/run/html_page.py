"""pytest-html's page (`--html=node.html --self-contained-html`) with the node's verdict and each test's figures:
report/html_fragments.py's fragments handed to pytest-html (the verdict through `pytest_html_results_summary`, a
test's figures as its extras), and the results table put in the order a person reads it. Registered only where
this process writes the page, so a run without it is untouched."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pytest_gbvalidate.run.session import GbSession


def register(config: pytest.Config, gb: GbSession) -> None:
    """Where pytest-html is enabled and this process writes its page (`--html` given: plugin.py asks)."""
    if gb.is_controller and config.pluginmanager.hasplugin("html"):
        config.pluginmanager.register(HtmlPage(gb), "gbvalidate-html")


def keep_last_good(config: pytest.Config, lost: dict[str, str]) -> None:
    """pytest-html's page written as the plugin writes its own files (files.atomic_write_text), not opened for
    writing first: a write that fails leaves the last good page and goes in `lost` by its path, until one succeeds."""
    from pytest_html.basereport import BaseReport

    from pytest_gbvalidate.files import OutputError, atomic_write_text

    for page in config.pluginmanager.get_plugins():
        if not isinstance(page, BaseReport) or not hasattr(page, "_write_report"):
            continue
        path = Path(page._report_path)

        def write_report(rendered: str, path: Path = path) -> None:
            try:
                atomic_write_text(path, rendered)
                lost.pop(str(path), None)
            except OutputError as exc:
                lost[str(path)] = f"HTML page NOT written: {exc}; the last good page, if any, left as it was"

        page._write_report = write_report  # pytest-html's one writer of the page (basereport.py)


ID_CELL = '<td class="col-testId">'  # pytest-html's cells of the test id and the result (basereport.py)
RESULT_CELL = '<td class="col-result">'
WARN_STYLE = "color: #9a6700; font-weight: bold"  # amber, as a warning is in the terminal
WARN_TITLE = "passed, with a measurement past its warn limit (WARN): see its figures"
PLOT_STYLE = 'style="display: block; max-width: 100%"'
# The rows' order from the top: failed, warned, passed, not run (pytest-html's puts skipped first, knows no WARN).
ROW_ORDER = ("error", "failed", "rerun", "xpassed", "warned", "passed", "xfailed", "skipped")


class HtmlPage:
    def __init__(self, gb: GbSession) -> None:
        self.gb = gb

    # Between the session's (tryfirst: the test's records) and pytest-html's (trylast: reads the extras at teardown).
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "teardown" or not self.gb.engaged:
            return
        from pytest_html import extras

        from pytest_gbvalidate.report.html_fragments import test_extras

        added = []
        for extra in test_extras(report.nodeid, self.gb.report.data):
            content = extra.html
            if extra.png is not None:
                # Inline at its own size: pytest-html's image extras are cropped thumbnails, unreadable until clicked.
                data = base64.b64encode(extra.png).decode("ascii")
                content = f'<img alt="{_escape(extra.name)}" src="data:image/png;base64,{data}" {PLOT_STYLE}>'
            if content is not None:
                added.append(extras.html(content) | {"name": extra.name})  # named: told apart on the page
        if added:
            report.extras = [*getattr(report, "extras", []), *added]  # type: ignore[attr-defined]

    @pytest.hookimpl(optionalhook=True)
    def pytest_html_results_table_row(self, report: pytest.TestReport, cells: list[str]) -> None:
        """The test id as text: pytest-html puts it in its row as markup, and a parameter's id (`test_x[<img
        src=x onerror=...>]`) would run in the page. A passed test whose measurement warned has its result cell
        marked apart (amber, with a title saying why): pytest-html knows only passed."""
        test_id = report.nodeid if report.when == "call" else f"{report.nodeid}::{report.when}"
        warned = report.passed and report.nodeid in self._warned()
        for index, cell in enumerate(cells):
            if cell.startswith(ID_CELL):
                cells[index] = f"{ID_CELL}{_escape(test_id)}</td>"
            elif cell.startswith(RESULT_CELL) and warned:
                # The text stays "Passed": pytest-html reads the cell back as the row's result, which its filters
                # and sorting know by name (another word would hide the row).
                cells[index] = f'{RESULT_CELL[:-1]} style="{WARN_STYLE}" title="{WARN_TITLE}">Passed</td>'

    @pytest.hookimpl(optionalhook=True)
    def pytest_html_results_table_html(self, report: pytest.TestReport, data: list[str]) -> None:
        """A skipped test's log is its reason, not the (path, line, reason) tuple pytest-html shows as text."""
        if report.skipped and isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
            data[:1] = [_escape(str(report.longrepr[2])) + "\n"]

    @pytest.hookimpl(optionalhook=True)
    def pytest_html_results_summary(
        self, prefix: list[str], summary: list[str], postfix: list[str], session: Any
    ) -> None:
        if not self.gb.engaged:
            return
        from pytest_gbvalidate.report.html_fragments import verdict_html

        prefix.append(verdict_html(self.gb.report.data))
        self._arrange_rows(session.config)

    def _warned(self) -> set[str]:
        """The tests with a measurement past its warn limit."""
        if not self.gb.engaged:
            return set()
        return {m["test_id"] for m in self.gb.report.data["measurements"] if m["verdict"] == "warn"}

    def _arrange_rows(self, config: pytest.Config) -> None:
        """The results table in ROW_ORDER, each group in the order the tests ran (the data's `original` order),
        unless the operator chose an `initial_sort`; the skipped rows collapsed as the passed ones are, unless the
        operator chose another `render_collapsed`. pytest-html has no public way to its data (its 4.x writer's
        ReportData): where it is not as expected, the page stays as pytest-html made it."""
        from pytest_html.basereport import BaseReport  # the page's writer, registered without a name

        page = next((p for p in config.pluginmanager.get_plugins() if isinstance(p, BaseReport)), None)
        data = getattr(getattr(page, "_report", None), "data", None)
        if not isinstance(data, dict):
            return
        tests = data.get("tests")
        # "Chosen": other than pytest-html's defaults (`result`, `passed`); getini cannot tell a default given.
        if config.getini("initial_sort") == "result" and isinstance(tests, dict):
            warned = self._warned()

            def place(item: tuple[str, Any]) -> int:
                test_id, rows = item
                results = {str(r.get("result", "")).lower() for r in rows if isinstance(r, dict)}
                if test_id in warned and results <= {"passed"}:
                    results = {"warned"}
                return min((ROW_ORDER.index(r) for r in results if r in ROW_ORDER), default=len(ROW_ORDER))

            if all(isinstance(rows, list) for rows in tests.values()):
                ordered = sorted(tests.items(), key=place)  # stable: each group as the tests ran
                tests.clear()
                tests.update(ordered)
                data["initialSort"] = "original"
        if data.get("renderCollapsed") == ["passed"]:
            data["renderCollapsed"] = ["passed", "skipped"]


def _escape(text: str) -> str:
    from pytest_gbvalidate.report.html_fragments import escape  # the page's one rule; imported where a page is made

    return escape(text)
