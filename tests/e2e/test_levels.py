"""End-to-end runs of --gb-level through pytester: which checks a level runs, where the level shows (header, JSON
report, JUnit), what each level's checks took, and a marker or setting that names no level."""

from __future__ import annotations

import json
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch  # noqa: F401 -- in-process pytester runs drop modules they imported, and torch cannot load twice

from pytest_gbvalidate.levels import LEVELS, runs
from pytest_gbvalidate.run import markers
from tests.helpers.runs import REPO, SUITES, assert_usage_error

CHECKS = """\
import pytest

pytestmark = pytest.mark.gb_level("standard")


@pytest.mark.gb_level("quick")
def test_quick(gb_target):
    pass


def test_standard(gb_target):
    pass


@pytest.mark.gb_level("full")
def test_full(gb_target):
    pass


@pytest.mark.gb_level("quick")
class TestQuickClass:
    def test_in_class(self, gb_target):
        pass
"""


def _suite_properties(path: Path) -> dict[str, str]:
    suite = ET.parse(path).getroot().find("testsuite")
    assert suite is not None
    return {p.get("name", ""): p.get("value", "") for p in suite.iter("property")}


def test_a_level_runs_its_checks_and_those_below_and_says_so_everywhere(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_checks=CHECKS, test_unmarked="def test_unmarked(gb_target):\n    pass\n")
    monkeypatch.setenv("GBVALIDATE_LEVEL", "standard")
    result = pytester.runpytest("--gb-sku=cpu", "--gb-report=r.json", "--junitxml=r.xml", "-v")
    result.assert_outcomes(passed=3, deselected=2)
    ran = {line.split("::", 1)[1].split(" ")[0] for line in result.outlines if " PASSED" in line}
    assert ran == {"test_quick", "test_standard", "TestQuickClass::test_in_class"}
    result.stdout.fnmatch_lines(["gbvalidate: SKU cpu (*); level standard (GBVALIDATE_LEVEL in the environment); *"])
    report = json.loads((pytester.path / "r.json").read_text())
    assert (report["level"], report["level_budget_s"]) == ("standard", 600.0)
    assert report["settings"]["level"] == {"value": "standard", "source": "GBVALIDATE_LEVEL in the environment"}
    levels = {t["test_id"].split("::", 1)[1]: t["level"] for t in report["tests"]}
    assert levels == {"test_quick": "quick", "test_standard": "standard", "TestQuickClass::test_in_class": "quick"}
    times = report["level_times"]
    assert sorted(times) == ["quick", "standard"]
    assert (times["quick"]["tests"], times["standard"]["tests"]) == (2, 1)
    assert all(t["duration_s"] > 0 for t in times.values())
    assert _suite_properties(pytester.path / "r.xml")["gb_level"] == "standard"


def test_the_default_level_is_full_and_runs_every_check(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_checks=CHECKS, test_unmarked="def test_unmarked(gb_target):\n    pass\n")
    result = pytester.runpytest("--gb-sku=cpu", "--gb-report=r.json")
    result.assert_outcomes(passed=5)
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["level"] == "full"
    assert {t["test_id"].rsplit("::", 1)[-1]: t["level"] for t in report["tests"]}["test_unmarked"] == "full"


@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["alone", "xdist"])
def test_a_marker_that_names_no_level_fails_collection_naming_the_check(
    pytester: pytest.Pytester, xdist: list[str]
) -> None:
    """The same one line and exit status with and without pytest-xdist (whose workers collect: a usage error raised
    there was an INTERNALERROR naming nothing). A usage error: the suite's mistake is no verdict about the node."""
    pytester.makepyfile(
        test_checks='import pytest\n\n@pytest.mark.gb_level("quik")\ndef test_x(gb_target):\n    pass\n'
        "pytestmark = []\n\n@pytest.mark.gb_level()\ndef test_y():\n    pass\n"
    )
    result = pytester.runpytest_subprocess("--gb-sku=cpu", "--gb-level=quick", "-p", "no:cacheprovider", *xdist)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stdout.fnmatch_lines(
        [
            "*ERROR collecting test_checks.py*",
            "gbvalidate usage error: test_checks.py::test_x: @pytest.mark.gb_level('quik'): not a level: one of "
            "passive, quick, standard, full",
            "test_checks.py::test_y: @pytest.mark.gb_level(): not a level: one of passive, quick, standard, full",
        ]
    )
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


def test_a_setting_that_names_no_level_is_a_usage_error_naming_where_it_came_from(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ngb_level = nightly\n")
    assert_usage_error(
        pytester.runpytest(),
        "ERROR: gb_level in *tox.ini: 'nightly': not a level: one of passive, quick, standard, full",
    )


def _documented_levels() -> dict[str, str]:
    """`file::test` -> level, from the table of docs/levels.md: a row names tests of one file (`file::test`, then
    bare `test` names of the same file), or a whole file (`file.py`: its tests no other row names)."""
    page = (REPO / "docs" / "levels.md").read_text()
    table = page.split("<!-- levels-table:start -->")[1].split("<!-- levels-table:end -->")[0]
    named: dict[str, str] = {}
    whole_files: dict[str, str] = {}
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2:
            continue
        what, level = cells
        current = ""
        for token in re.findall(r"`([^`]+)`", what):
            if token.endswith(".py"):
                whole_files[token] = level
            elif "::" in token:
                current, test = token.split("::")
                named[f"{current}::{test}"] = level
            else:
                named[f"{current}::{token}"] = level
    return {**{f"{file}::*": level for file, level in whole_files.items()}, **named}


def test_the_levels_page_says_which_level_each_suite_check_belongs_to(
    suite_checks: list[tuple[str, str, str]],
) -> None:
    # the session's collection of the suites on the cpu SKU (tests/helpers/cpu_run.py), each check with its level
    collected = {f"{file}::{test}": level for file, test, level in suite_checks}
    assert len(collected) > 30, suite_checks
    documented = _documented_levels()
    for check, level in sorted(collected.items()):
        file = check.split("::")[0]
        assert documented.get(check, documented.get(f"{file}::*")) == level, f"docs/levels.md: {check} is {level}"


def test_a_suite_module_without_a_check_at_the_level_is_not_imported_and_passive_loads_no_torch(
    suite_checks: list[tuple[str, str, str]], pytester: pytest.Pytester
) -> None:
    """A module left uncollected holds no check the level runs (its source read against the session's collection of
    every suite); a passive run of the shipped suites, as slurmd's hooks start it, never imports torch."""
    modules = sorted(SUITES.glob("test_*.py"))
    for path in modules:
        levels = [level for file, _, level in suite_checks if file == path.name]
        assert levels, path  # every shipped suite module holds checks
        for run_level in LEVELS:
            if markers.holds_no_check_at(path, run_level):
                assert not any(runs(run_level, level) for level in levels), (path.name, run_level)  # type: ignore[arg-type]
    assert [p.name for p in modules if not markers.holds_no_check_at(p, "passive")] == [
        "test_health.py",
        "test_nic.py",
        "test_topology.py",
    ]
    pytester.makepyfile(
        torch_probe="import sys\n\ndef pytest_sessionfinish():\n    print('torch imported:', 'torch' in sys.modules)\n"
    )
    args = ("--pyargs", "pytest_gbvalidate.suites", "--gb-sku=cpu", "--gb-level=passive", "-p", "torch_probe")
    result = pytester.runpytest_subprocess(*args)
    assert result.ret == 0 and "torch imported: False" in result.stdout.str(), result.stdout.str()


def test_a_baseline_is_recorded_only_from_every_check(pytester: pytest.Pytester) -> None:
    shutil.copytree(REPO / "baselines", pytester.path / "b")
    before = (pytester.path / "b" / "cpu.yaml").read_text()
    result = pytester.runpytest("--gb-baselines=b", "--gb-record=b/cpu.yaml", "--gb-level=quick")
    assert_usage_error(
        result,
        "ERROR: --gb-record on the command line: a baseline is recorded from every check, at --gb-level full; "
        "--gb-level on the command line asks for quick",
    )
    assert (pytester.path / "b" / "cpu.yaml").read_text() == before


@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["alone", "xdist"])
def test_a_usage_error_met_where_the_checks_are_collected_is_one_line_under_xdist_too(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, xdist: list[str]
) -> None:
    """A run that no option engaged engages where a check first needs it, at collection: under pytest-xdist in a
    worker, where a usage error was an INTERNALERROR. Here torchrun's RANK without its WORLD_SIZE."""
    monkeypatch.setenv("RANK", "1")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    pytester.makepyfile(test_checks="def test_x(gb_target):\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *xdist)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stdout.fnmatch_lines(["gbvalidate usage error: RANK=1 is set without WORLD_SIZE: *"])
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


def test_checks_that_start_ranks_are_refused_under_more_than_one_xdist_worker(pytester: pytest.Pytester) -> None:
    """Two workers each started a gang on the same node at once: four ranks on a two-rank SKU, the figures halved,
    exit 0. A usage error now, naming the checks (at collection, where the workers see them); checks that start
    no ranks still run under -n."""
    pytester.makepyfile(test_checks="def test_ranks(gb_gang):\n    pass\n\ndef test_target(gb_target):\n    pass\n")
    result = pytester.runpytest_subprocess("--gb-sku=cpu", "-p", "no:cacheprovider", "-n", "2")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stdout.fnmatch_lines(
        [
            "*gbvalidate usage error: test_checks.py::test_ranks start ranks on the node's GPUs, and pytest-xdist "
            "runs 2 workers, each of which would start a gang of its own at once: run them without -n (or with -n 0)*"
        ]
    )
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    (pytester.path / "test_checks.py").write_text("def test_target(gb_target):\n    pass\n")
    alone = pytester.runpytest_subprocess("--gb-sku=cpu", "-p", "no:cacheprovider", "-n", "2")
    assert alone.ret == pytest.ExitCode.OK, alone.stdout.str()
