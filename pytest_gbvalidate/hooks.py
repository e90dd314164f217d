"""Hooks pytest-gbvalidate adds; a site plugin or conftest implements them to extend the tool. And the warning
category of a WARN, which a run's warning filters name (here, where the plugin is loaded anyway: pytest imports a
filter's category for every test, of any run)."""

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


class GbValidateWarning(UserWarning):
    """A measurement in its SKU's warn band: the test passes, the reports mark it (`pytest_gbvalidate.expect.
    GbValidateWarning`, as the docs name it, is this class)."""
