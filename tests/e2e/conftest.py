"""Fixtures of the end-to-end tests."""

from __future__ import annotations

import pytest

from tests.helpers.runs import BASELINE, CHECKS


@pytest.fixture
def lab(pytester: pytest.Pytester) -> pytest.Pytester:
    """A project with a LAB baseline directory and a test file of checks against it."""
    (pytester.path / "baselines").mkdir()
    (pytester.path / "baselines" / "LAB.yaml").write_text(BASELINE)
    pytester.makepyfile(test_checks=CHECKS)
    return pytester
