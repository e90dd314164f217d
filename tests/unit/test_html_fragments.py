"""The HTML page's fragments (report/html_fragments.py): the node's verdict and a test's figures, every text escaped."""

from __future__ import annotations

import sys
from html.parser import HTMLParser
from typing import Any

import pytest

from pytest_gbvalidate.report import html_fragments
from pytest_gbvalidate.report.records import RunReportRecord
from tests.helpers.reports import minimal_report

EVIL = "<script>alert(1)</script>"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class Page(HTMLParser):
    """The tags and the text a browser would see in a fragment."""

    def __init__(self, fragment: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.text: list[str] = []
        self.feed(fragment)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    @property
    def all_text(self) -> str:
        return "".join(self.text)


def failed_run() -> RunReportRecord:
    report: Any = minimal_report()
    report["node"]["hostname"] = f"node{EVIL}"
    report["level"] = "quick"
    report["level_budget_s"] = 60.0
    report["level_times"] = {"quick": {"tests": 2, "duration_s": 1.5}}
    fault = {"category": "link", "title": "link", "action": f"reseat {EVIL}", "disposition": "ISOLATE", "why": None}
    report["tests"].append(
        {
            "test_id": "t.py::test_bad",
            "when": "call",
            "outcome": "failed",
            "duration_s": 1.0,
            "message": f"measured {EVIL}",
            "text": "",
            "fault": fault,
        }
    )
    report["exit_status"] = 1
    return report  # type: ignore[no-any-return]


def test_the_verdict_names_the_node_and_its_faults_and_escapes_them() -> None:
    fragment = html_fragments.verdict_html(failed_run())
    page = Page(fragment)
    assert page.tags.count("script") == 0  # the hostile texts stay text
    text = page.all_text
    assert "gbvalidate: node FAIL" in text
    assert f"SKU cpu; level quick; host node{EVIL}; exit status 1" in text.replace("  ", " ")
    assert f"link (ISOLATE): reseat {EVIL}" in text
    assert f"t.py::test_bad: measured {EVIL}" in text
    assert "level quick: quick 1.5 s (1.5 s of its 60 s budget)" in text
    assert "host_copy_bandwidth_gbps" in text and "PASS" in text  # the measured-vs-baseline table
    assert page.tags.count("tr") == 2  # its header and one gated measurement


def test_characters_that_do_not_print_reach_the_page_as_escapes_and_letters_as_they_are() -> None:
    """A hostname with a control character and a terminal's colour code reached the page raw; a bidirectional
    override would reorder what a reader sees. Letters of any script are shown as they are."""
    report: Any = failed_run()
    report["node"]["hostname"] = "nœud\x01\x1b[31m\u202e"
    text = Page(html_fragments.verdict_html(report)).all_text
    assert "host nœud\\x01\\x1b[31m\\u202e;" in text
    assert not any(c in text for c in "\x01\x1b\u202e")


def test_a_passed_run_is_pass() -> None:
    report: Any = minimal_report()
    page = Page(html_fragments.verdict_html(report))
    assert "gbvalidate: node PASS" in page.all_text and "Failures" not in page.all_text


def sweep(size_bytes: int, scope: str) -> dict[str, Any]:
    return {
        "test_id": "t.py::test_sweep",
        "metric": "all_reduce_busbw_gbps",
        "scope": scope,
        "scope_kind": "message_size",
        "value": 1.5,
        "unit": "GB/s",
        "direction": "higher",
        "details": {"placement": "in_place", "size_bytes": size_bytes, "wrong": 0},
        "verdict": "info",
        "message": EVIL,
    }


def test_a_tests_extras_are_its_rows_its_telemetry_and_its_pictures() -> None:
    report: Any = minimal_report()
    report["measurements"] += [sweep(1024, f"1KiB{EVIL}"), sweep(2048, "2KiB")]
    step = dict(report["measurements"][0], test_id="t.py::test_train", metric="step_time_s", unit="s")
    step["details"] = {"loss_curve": [10.4, 9.1, 7.0, float("nan")]}
    report["measurements"].append(step)
    report["telemetry"] = [
        {
            "test_id": "t.py::test_train",
            "label": "",
            "interval_s": 0.1,
            "duration_s": 2.0,
            "sample_count": 20,
            "sources": ["cpu"],
            "errors": [f"nvml: {EVIL}"],
            "summary": {"cpu.utilization_pct": {"mean": 50.0, "p5": 10.0, "p95": 90.0}},
            "t_s": [],
            "series": {},
        }
    ]
    (rows, busbw) = html_fragments.test_extras("t.py::test_sweep", report)
    assert rows.name == "measurements" and rows.html is not None
    page = Page(rows.html)
    assert "script" not in page.tags and f"1KiB{EVIL}" in page.all_text
    assert page.tags.count("tr") == 3  # a header, two sizes
    assert busbw.name == "busbw" and (busbw.png or b"").startswith(PNG_MAGIC)

    (rows, telemetry, loss) = html_fragments.test_extras("t.py::test_train", report)
    assert telemetry.html is not None
    summary = Page(telemetry.html)
    assert "20 samples over 2.0 s, every 0.1 s" in summary.all_text and f"nvml: {EVIL}" in summary.all_text
    assert "cpu.utilization_pct501090" in summary.all_text  # mean, p5, p95
    assert "script" not in summary.tags
    assert loss.name == "loss curve" and (loss.png or b"").startswith(PNG_MAGIC)
    assert html_fragments.test_extras("t.py::test_none", report) == []


@pytest.mark.parametrize("curve", [["a", "b"], [], "1,2", [True, 1.0], None])
def test_a_loss_curve_that_is_not_numbers_is_not_drawn(curve: Any) -> None:
    report: Any = minimal_report()
    report["measurements"][0]["details"] = {"loss_curve": curve}
    assert html_fragments.loss_curve(report["measurements"][0]) is None
    assert [e.name for e in html_fragments.test_extras("t.py::test_x", report)] == ["measurements"]


def test_without_matplotlib_the_pictures_are_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    report: Any = minimal_report()
    report["measurements"] += [sweep(1024, "1KiB")]
    assert [e.name for e in html_fragments.test_extras("t.py::test_sweep", report)] == ["measurements"]


def test_a_pass_with_a_warned_figure_is_marked_warn_at_a_glance() -> None:
    """The badge says WARN (amber), not a green PASS, and the table's WARN cell is coloured as the terminal's is."""
    report: Any = minimal_report()
    report["measurements"][0] |= {"verdict": "warn", "message": "past its warn limit"}
    fragment = html_fragments.verdict_html(report)
    assert '<span class="verdict verdict-warn">WARN</span>' in fragment
    assert '<td class="cell-warn">WARN</td>' in fragment
    assert "gbvalidate: node WARN" in Page(fragment).all_text


def test_the_badge_reads_the_one_rule_for_what_a_report_says_of_its_node() -> None:
    """A failed run is FAIL (red); a run whose only failures were figures too noisy to judge is UNRESOLVED, never a
    PASS or a FAIL; a finished run with exit status 1 and no failed test is NO VERDICT."""
    assert '<span class="verdict verdict-fail">FAIL</span>' in html_fragments.verdict_html(failed_run())
    unresolved: Any = failed_run()
    unresolved["tests"][-1]["fault"] |= {"category": "unresolved"}
    assert '<span class="verdict verdict-unresolved">UNRESOLVED</span>' in html_fragments.verdict_html(unresolved)
    assert "<p>UNRESOLVED: this run could not tell: 1 check(s) too noisy to judge and none failed; not a fault of " in (
        html_fragments.verdict_html(unresolved)
    )
    no_verdict: Any = minimal_report()
    no_verdict["exit_status"] = 1
    assert '<span class="verdict verdict-no-verdict">NO VERDICT</span>' in html_fragments.verdict_html(no_verdict)
