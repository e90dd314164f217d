"""Fixtures of the end-to-end tests."""

from __future__ import annotations

import pytest

from tests.helpers.runs import BASELINE, CHECKS, lab_project


@pytest.fixture
def lab(pytester: pytest.Pytester) -> pytest.Pytester:
    """A project with a LAB baseline directory and a test file of checks against it."""
    return lab_project(pytester, BASELINE, CHECKS)
