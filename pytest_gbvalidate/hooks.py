"""Hooks pytest-gbvalidate adds; a site plugin or conftest implements them to extend the tool."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pytest_gbvalidate.baselines import Baseline
    from pytest_gbvalidate.sku import Detection


@pytest.hookspec(firstresult=True)
def pytest_gbvalidate_detect_sku(config: pytest.Config, baselines: list[Baseline]) -> Detection | None:
    """Identify this node's SKU for ``--gb-sku=auto``; the first non-None result wins.

    ``baselines`` are every baseline in the baselines directory, for their ``detect`` sections. The built-in
    detector (Azure metadata, then NVML, then ``cpu``) runs last. Raise ``sku.DetectionError`` to stop the
    run with a usage error that names what was seen.
    """
