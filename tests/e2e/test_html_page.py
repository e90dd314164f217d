"""pytest-html's page of a cpu run (`--html=node.html --self-contained-html`): the node's verdict and the
measured-vs-baseline table on top, each test's measurements and pictures beside it, every untrusted text shown as
text, one file that opens offline. Read with Python's html.parser, and rendered by a headless Chromium (its
scripts run) where one is installed."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import torch  # noqa: F401 -- in-process pytester runs drop modules they imported, and torch cannot load twice

from tests.helpers.llama_functions import needs_pipelining_over_gloo
from tests.helpers.runs import SUITES, assert_usage_error

EVIL = "<script>alert(1)</script>"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# What pytest will remove (Config.inicfg, deprecated in 9.1) is an error: a page made with it warned on every run.
# (pytest 8, the oldest admitted, has no such warning yet.)
REMOVED_API = "PytestRemovedIn10Warning"
NO_REMOVED_API = ("-W", f"error::pytest.{REMOVED_API}") if hasattr(pytest, REMOVED_API) else ()
HTML_ARGS = ("--gb-sku=cpu", "--html=node.html", "--self-contained-html", "-p", "no:cacheprovider", *NO_REMOVED_API)
# A failing check whose message and the node's hostname carry markup: both must show as text.
EVIL_CHECK = f"""
import socket

def test_evil(gb_expect):
    gb_expect.record("host_copy_bandwidth_gbps", 1.0, "node")
    raise AssertionError({EVIL!r})
"""


class Page(HTMLParser):
    """What a page is made of: its tags with their attributes, the text inside each element with an id or a
    class we look for, and the data pytest-html's script renders its results table from."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.open: list[tuple[str, str]] = []  # (tag, its id or class), innermost last
        self.texts: dict[str, list[str]] = {}
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = dict(attrs)
        self.tags.append((tag, named))
        if tag not in ("img", "input", "br", "meta", "link", "source"):  # void elements have no end tag
            self.open.append((tag, named.get("id") or named.get("class") or ""))

    def handle_endtag(self, tag: str) -> None:
        while self.open and self.open.pop()[0] != tag:
            pass

    def handle_data(self, data: str) -> None:
        for _, name in self.open:
            if name:
                self.texts.setdefault(name, []).append(data)

    def text(self, name: str) -> str:
        return "".join(self.texts.get(name, []))

    def count(self, tag: str) -> int:
        return sum(1 for t, _ in self.tags if t == tag)

    def fetched(self) -> list[str]:
        """What opening the page would load from elsewhere: every src and stylesheet href not inline."""
        urls = [a.get("src") or "" for _, a in self.tags if "src" in a] + [
            a.get("href") or "" for t, a in self.tags if t == "link"
        ]
        return [u for u in urls if u and not u.startswith("data:")]

    def results(self) -> dict[str, Any]:
        (blob,) = [a["data-jsonblob"] for _, a in self.tags if a.get("data-jsonblob")]
        data: dict[str, Any] = json.loads(blob or "{}")
        return data


def png_of(extra: dict[str, Any]) -> bytes:
    """The picture of an extra: an image inline at its own size, not one of pytest-html's cropped thumbnails."""
    prefix = "data:image/png;base64,"
    ((tag, attrs),) = Page(extra["content"]).tags
    assert tag == "img" and (attrs.get("src") or "").startswith(prefix) and "max-width: 100%" in (attrs["style"] or "")
    return base64.b64decode((attrs["src"] or "")[len(prefix) :], validate=True)


@needs_pipelining_over_gloo  # the real pretraining check draws the loss curve
def test_the_page_of_a_cpu_run_carries_the_verdict_and_each_tests_figures(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("socket.gethostname", lambda: f"node{EVIL}")
    pytester.makepyfile(test_evil=EVIL_CHECK)
    for suite in ("collectives", "pretrain", "bandwidth"):  # beside it: test ids as the page shows them
        shutil.copy(SUITES / f"test_{suite}.py", pytester.path)
    result = pytester.runpytest(*HTML_ARGS, "-k", "all_reduce_busbw or pretrain or h2d or evil")
    # NVLS and MNNVL skip on cpu, as do h2d per GPU and against its siblings
    result.assert_outcomes(passed=2, failed=1, skipped=5, deselected=17)
    page = Page((pytester.path / "node.html").read_text())

    assert page.fetched() == []  # one file: styles, script and pictures inline
    assert page.count("script") == 1  # pytest-html's own; the hostile texts stay text
    verdict = page.text("gbvalidate-verdict")
    assert "gbvalidate: node FAIL" in verdict
    assert f"SKU cpu; level full; host node{EVIL}; exit status 1" in verdict
    assert re.search(
        r"level full: quick \d+\.\d s, standard \d+\.\d s, full \d+\.\d s \(.* of its 900 s budget\)", verdict
    )
    assert "unclassified (" in verdict and f"test_evil.py::test_evil: AssertionError: {EVIL}" in verdict
    assert "skipped: 1 check: pairs of nodes need a torchrun / srun world across nodes" in verdict
    for row in ("test_all_reduce_busbw[in_place]all_reduce_busbw_gbps16MiB", "test_pretrainllama3_tiny_step_time_s"):
        assert row in verdict  # the measured-vs-baseline table, cell after cell

    # failed, then passed, then skipped; the skipped rows collapsed like the passed (their reasons are on top)
    data = page.results()
    assert [rows[0]["result"] for rows in data["tests"].values()] == ["Failed"] + ["Passed"] * 2 + ["Skipped"] * 5
    assert (data["initialSort"], data["renderCollapsed"]) == ("original", ["passed", "skipped"])
    tests = {test_id: rows[0] for test_id, rows in data["tests"].items()}
    extras = {test_id: {(e["name"], e["format_type"]): e for e in t["extras"]} for test_id, t in tests.items()}
    reduce = extras["test_collectives.py::test_all_reduce_busbw[in_place]"]
    rows = Page(reduce[("measurements", "html")]["content"])
    assert rows.text("gbvalidate").startswith("Measurements") and rows.count("tr") == 23  # a header, 22 sizes
    assert png_of(reduce[("busbw", "html")]).startswith(PNG_MAGIC)
    pretrain = extras["test_pretrain.py::test_pretrain"]
    assert png_of(pretrain[("loss curve", "html")]).startswith(PNG_MAGIC)
    measured, telemetry = (
        Page(pretrain[(name, "html")]["content"]).text("gbvalidate") for name in ("measurements", "telemetry")
    )
    assert "llama3_tiny_step_time_s" in measured and "Telemetry" in telemetry and "gpu" not in telemetry
    assert "cpu.utilization_pct" in telemetry
    evil = tests["test_evil.py::test_evil"]
    assert EVIL in Page(evil["log"]).text("") or EVIL in html_text(evil["log"])
    assert extras["test_bandwidth.py::test_h2d_bandwidth[nogpu]"] == {}  # skipped: nothing measured
    # a skipped row's log is its reason, not the (path, line, reason) tuple pytest-html would show
    skipped_log = html_text(tests["test_bandwidth.py::test_h2d_bandwidth[nogpu]"]["log"])
    assert skipped_log.startswith("Skipped: needs NVIDIA GPUs") and str(pytester.path) not in skipped_log


def html_text(fragment: str) -> str:
    """The text a browser shows for a fragment."""
    page = Page(f'<div class="all">{fragment}</div>')
    assert page.count("script") == 0
    return page.text("all")


CHECKS = f"""
import pytest

def test_copy(gb_expect):
    gb_expect("host_copy_bandwidth_gbps", 11.0)

@pytest.mark.parametrize("tag", ["<img src=x onerror=alert(1)>"])
def test_named(tag):
    pass

def test_slowish(gb_expect):  # past the cpu baseline's warn limit (0.96 s), short of its fail limit (1.92 s)
    gb_expect("llama3_tiny_step_time_s", 1.2, "native-bf16-mbs2-gbs16-tp1-pp2-cp1-dp1-seq64")

def test_sweep(gb_expect):
    for size, label in ((2**20, "1MiB"), (2**21, "2MiB")):
        details = {{"collective": "all_reduce", "placement": "in_place", "size_bytes": size, "wrong": 0}}
        gb_expect.record("all_reduce_busbw_gbps", 1.6, label, details=details)

def test_absent():
    pytest.skip("nothing of the kind on this node")

{EVIL_CHECK}
"""


@pytest.mark.outside
@pytest.mark.skipif(
    shutil.which("chromium") is None,
    reason="Chromium is not installed: the page is not rendered in a browser (apt-get install -y chromium)",
)
def test_a_browser_shows_the_verdict_and_the_figures_offline(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr("socket.gethostname", lambda: f"node{EVIL}")
    pytester.makepyfile(test_checks=CHECKS)
    pytester.runpytest(*HTML_ARGS).assert_outcomes(passed=4, failed=1, skipped=1)
    # Headless, no network (every host name resolves to nothing), a profile of its own; the DOM after the
    # page's script has built the results table.
    command = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
    command += ["--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path}"]
    command += ["--host-resolver-rules=MAP * ~NOTFOUND", "--dump-dom", (pytester.path / "node.html").as_uri()]
    shown = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True).stdout
    dom = Page(shown)

    assert dom.count("script") == 1  # the page's own: the hostile texts stayed text
    verdict = dom.text("gbvalidate-verdict")
    assert "gbvalidate: node FAIL" in verdict and f"host node{EVIL}" in verdict
    assert "test_copyhost_copy_bandwidth_gbpsnode1110.9" in verdict  # the measured-vs-baseline table
    assert f"test_checks.py::test_evil: AssertionError: {EVIL}" in verdict
    rows = dom.texts["col-testId"]  # the results table, built by the page's script, in its order
    # read from the top: what failed, what warned, what passed (as they ran), what did not run
    named = "test_checks.py::test_named[<img src=x onerror=alert(1)>]"  # a test id is text too
    expected = ["evil", "slowish", "copy", named, "sweep", "absent"]
    assert rows == [e if "::" in e else f"test_checks.py::test_{e}" for e in expected]
    assert not any(t == "img" and a.get("src") == "x" for t, a in dom.tags)
    # A WARN is marked apart from the PASS rows, in its result cell: the one amber cell, for the one warning.
    # (Its text stays pytest-html's "Passed": another word hid the row, as the page's filters know results by name.)
    marked = [a for t, a in dom.tags if t == "td" and "#9a6700" in (a.get("style") or "")]
    assert len(marked) == 1 and (marked[0].get("title") or "").startswith("passed, with a measurement past its warn")
    assert "Measurements" in dom.text("extraHTML") and "1MiB" in dom.text("extraHTML")
    assert EVIL in dom.text("log")
    # the busbw plot inline at its own size (up to the page's width), not one of pytest-html's cropped thumbnails
    (plot,) = [a for t, a in dom.tags if t == "img" and (a.get("src") or "").startswith("data:image/png;base64,")]
    assert plot.get("alt") == "busbw" and "max-width: 100%" in (plot.get("style") or "")


def test_without_pytest_html_or_html_a_run_is_unaffected(pytester: pytest.Pytester) -> None:
    conftest = [
        "from pathlib import Path",
        "def pytest_unconfigure(config):",
        "    page = config.pluginmanager.get_plugin('gbvalidate-html')",
        "    Path(f'registered-{page is not None}').touch()",
    ]
    pytester.makeconftest("\n".join(conftest))
    pytester.makepyfile(test_checks="def test_copy(gb_expect):\n    gb_expect('host_copy_bandwidth_gbps', 11.0)\n")
    pytester.runpytest("--gb-sku=cpu", "-p", "no:html").assert_outcomes(passed=1)
    pytester.runpytest("--gb-sku=cpu").assert_outcomes(passed=1)
    assert sorted(p.name for p in pytester.path.glob("registered-*")) == ["registered-False"]


def test_the_page_may_not_replace_the_json_report(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_checks="def test_copy(gb_expect):\n    gb_expect('host_copy_bandwidth_gbps', 11.0)\n")
    (pytester.path / "r.json").write_text("kept")
    assert_usage_error(
        pytester.runpytest("--gb-sku=cpu", "--gb-report=r.json", "--html=r.json"),
        "ERROR: --gb-report on the command line: */r.json is also --html on the command line: an output must be a "
        "file of its own",
    )
    assert (pytester.path / "r.json").read_text() == "kept"


def test_the_operator_s_own_sort_and_collapse_stand(pytester: pytest.Pytester) -> None:
    """An `initial_sort` or `render_collapsed` the operator set in the ini file is pytest-html's to apply."""
    pytester.makeini("[pytest]\ninitial_sort = duration\nrender_collapsed = failed\n")
    pytester.makepyfile(test_checks="def test_a():\n    pass\n\ndef test_b():\n    raise AssertionError('b')\n")
    pytester.runpytest(*HTML_ARGS).assert_outcomes(passed=1, failed=1)
    data = Page((pytester.path / "node.html").read_text()).results()
    assert (data["initialSort"], data["renderCollapsed"]) == ("duration", ["failed"])
    assert list(data["tests"]) == ["test_checks.py::test_a", "test_checks.py::test_b"]
