"""The check levels (levels.py): names, and which level's checks a run takes on."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gbvalidate.levels import BUDGET_S, LEVELS, LevelError, parse_level, runs
from pytest_gbvalidate.run.markers import holds_no_check_at


def test_each_level_runs_its_own_checks_and_those_below() -> None:
    assert [check for check in LEVELS if runs("passive", check)] == ["passive"]
    assert [check for check in LEVELS if runs("quick", check)] == ["passive", "quick"]
    assert [check for check in LEVELS if runs("standard", check)] == ["passive", "quick", "standard"]
    assert [check for check in LEVELS if runs("full", check)] == ["passive", "quick", "standard", "full"]


def test_names_are_read_as_written_by_hand() -> None:
    assert parse_level(" Quick ") == "quick"


@pytest.mark.parametrize("given", ["", "quik", "level1", 1, None, ("quick",)])
def test_anything_else_is_refused_naming_the_levels(given: object) -> None:
    with pytest.raises(LevelError, match=r"^not a level: one of passive, quick, standard, full$"):
        parse_level(given)


def test_every_level_has_a_budget_and_a_higher_level_a_longer_one() -> None:
    assert list(BUDGET_S) == list(LEVELS)
    assert sorted(BUDGET_S.values()) == list(BUDGET_S.values())


@pytest.mark.parametrize(
    ("source", "uncollected_at"),
    [
        (
            'import pytest\npytestmark = pytest.mark.gb_level("standard")\n\n'
            '@pytest.mark.gb_level("quick")\ndef test_a():\n    pass\n',
            ["passive"],
        ),
        ("def test_unmarked():\n    pass\n", ["passive", "quick", "standard"]),  # a check with no level is full
        ("import pytest\nLEVEL = 'full'\n\n@pytest.mark.gb_level(LEVEL)\ndef test_a():\n    pass\n", []),
        ('import pytest\n\n@pytest.mark.gb_level("nightly")\ndef test_a():\n    pass\n', []),  # named at collection
        ("def test_a(:\n", []),  # pytest's collection error says what is wrong
    ],
    ids=["marked", "unmarked", "not-a-literal", "not-a-level", "no-python"],
)
def test_a_module_is_left_uncollected_only_where_its_source_says_no_check_runs(
    tmp_path: Path, source: str, uncollected_at: list[str]
) -> None:
    module = tmp_path / "test_m.py"
    module.write_text(source)
    assert [level for level in LEVELS if holds_no_check_at(module, level)] == uncollected_at
