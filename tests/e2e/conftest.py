"""Fixtures of the end-to-end tests."""

from __future__ import annotations

import pytest

from tests.helpers.cpu_run import CpuRun, cpu_run, suite_levels
from tests.helpers.runs import BASELINE, CHECKS, lab_project


@pytest.fixture
def lab(pytester: pytest.Pytester) -> pytest.Pytester:
    """A project with a LAB baseline directory and a test file of checks against it."""
    return lab_project(pytester, BASELINE, CHECKS)


@pytest.fixture(scope="session")
def cpu_suites_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> CpuRun:
    """Every shipped suite run once on the cpu SKU this session (tests/helpers/cpu_run.py), shared by the xdist
    workers: what each suite's end-to-end test asserts on."""
    return cpu_run(request.config, tmp_path_factory)


@pytest.fixture(scope="session")
def suite_checks(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> list[tuple[str, str, str]]:
    """(file, test function, level) of every test the shipped suites collect on the cpu SKU, in order: one
    collection this session, shared by the xdist workers."""
    return suite_levels(request.config, tmp_path_factory)
