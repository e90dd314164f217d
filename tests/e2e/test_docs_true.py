"""What the documentation states that the code can check, checked, so that it cannot drift: the example run of the
README and the docs' front page (every suite's tests, file by file), the levels page's counts, the health check's
line, and the report page's sections against the report's schema. (The settings table: unit/test_settings.py; the
levels of each check: e2e/test_levels.py.)"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import cast

import pytest

from pytest_gbvalidate.levels import LEVELS, Level, runs
from tests.helpers.runs import REPO

EXAMPLE_PAGES = ("README.md", "docs/index.md")


@pytest.fixture(scope="module")
def suite_items(suite_checks: list[tuple[str, str, str]]) -> list[tuple[str, str]]:
    """(file, level) of every test the shipped suites collect on the cpu SKU, in order (the session's collection,
    tests/helpers/cpu_run.py)."""
    return [(file, level) for file, _, level in suite_checks]


@pytest.mark.parametrize("page", EXAMPLE_PAGES)
def test_the_example_run_shows_every_test_of_every_suite(page: str, suite_items: list[tuple[str, str]]) -> None:
    text = (REPO / page).read_text()
    example = text.split("```", 2)[1]
    collected = re.search(r"^collected (\d+) items$", example, re.MULTILINE)
    assert collected is not None and int(collected[1]) == len(suite_items), f"{page}: 'collected N items'"
    per_file = {m[1]: len(m[2]) for m in re.finditer(r"^suites/(test_\w+\.py) ([.sFE]+)\s", example, re.MULTILINE)}
    assert per_file == dict(Counter(file for file, _ in suite_items)), f"{page}: the progress lines, file by file"
    summary = re.search(r" (\d+) passed, (\d+) skipped", example)
    assert summary is not None and int(summary[1]) + int(summary[2]) == len(suite_items), f"{page}: the last line"
    assert int(summary[2]) == sum(line.count("s") for line in re.findall(r"^suites/\S+ ([.sFE]+)", example, re.M))


def test_the_levels_page_counts_each_level_s_tests(suite_items: list[tuple[str, str]]) -> None:
    page = (REPO / "docs" / "levels.md").read_text()
    rows = dict(re.findall(r"^\| (passive|quick|standard|full) \| [^|]+ \| [^|]+ \| (\d+) \|$", page, re.MULTILINE))
    counted = {level: sum(1 for _, own in suite_items if runs(level, cast(Level, own))) for level in LEVELS}
    assert {level: int(n) for level, n in rows.items()} == counted


def test_the_health_check_s_documented_line_counts_its_level(suite_items: list[tuple[str, str]]) -> None:
    found = 0
    for page in ("docs/integrations.md", "contrib/slurm/README.md"):
        text = (REPO / page).read_text()
        for level, passed, skipped in re.findall(r"(passive|quick) level, (\d+) passed, (\d+) skipped", text):
            counted = sum(1 for _, own in suite_items if runs(cast(Level, level), cast(Level, own)))
            assert int(passed) + int(skipped) == counted, f"{page}: {passed} passed, {skipped} skipped"
            found += 1
    assert found >= 2


def test_the_report_page_names_every_section_of_the_schema_and_no_other() -> None:
    schema = json.loads((REPO / "pytest_gbvalidate" / "report" / "report.schema.json").read_text())
    page = (REPO / "docs" / "report.md").read_text()
    tables = page.split("## Top-level sections", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"^\| `(\w+)` \|", tables, re.MULTILINE))
    header_row = re.search(r"^\| run header \|(.*)$", tables, re.MULTILINE)
    assert header_row is not None
    header = set(re.findall(r"`(\w+)`", header_row[1])) & set(schema["properties"])
    assert named | header == set(schema["properties"]), "docs/report.md: the sections, as the schema has them"
    for dotted in re.findall(r"`(\w+)\.(\w+)`", page):
        section, field = dotted
        if section in schema["properties"] and "$ref" in schema["properties"][section]:
            record = schema["$defs"][schema["properties"][section]["$ref"].rsplit("/", 1)[-1]]
            assert field in record.get("properties", {}), f"docs/report.md: `{section}.{field}` is no field"


def test_the_worked_example_of_a_site_s_own_check_runs_from_its_page(pytester: pytest.Pytester) -> None:
    """docs/writing-checks.md's worked example, as a site engineer copies it: each file its block names, then its
    command. The check passes against its floor, with its samples' spread read as its noise."""
    page = (REPO / "docs" / "writing-checks.md").read_text()
    example = page.split("## A worked example", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```(\w+)\n(.*?)^```$", example, re.MULTILINE | re.DOTALL)
    files = {body.split("\n", 1)[0].removeprefix("# "): body for kind, body in blocks if kind in ("yaml", "python")}
    assert sorted(files) == ["baselines/SITE_LAB.yaml", "checks/test_site_read.py"], sorted(files)
    for name, body in files.items():
        (pytester.path / name).parent.mkdir(exist_ok=True)
        (pytester.path / name).write_text(body)
    (command,) = [body.strip() for kind, body in blocks if kind == "bash"]
    args = command.split()
    assert args[0] == "pytest", command
    result = pytester.runpytest_subprocess(*args[1:], "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["gbvalidate: SKU SITE_LAB (--gb-sku on the command line); level full; baseline *"])
    (measured,) = json.loads((pytester.path / "site.json").read_text())["measurements"]
    assert (measured["metric"], measured["unit"], measured["verdict"]) == ("site_file_read_gbps", "GB/s", "pass")
    assert measured["noise"]["count"] == 10 and measured["resolution"]["needed_pct"] == 60
