"""CUDA's device order in the plugin's own process, through pytester: set before anything in the process touches
CUDA, or the operator's kept."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.helpers.fakenode import nd_gb200_v6


@pytest.mark.parametrize("operator_order", [None, "FASTEST_FIRST"])
def test_the_plugin_numbers_gpus_by_pci_bus_before_it_first_touches_cuda(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, operator_order: str | None
) -> None:
    """The plugin's own process: its first CUDA call (torch.cuda.is_available() for the node facts of a GPU SKU's
    header) finds the order set, or the operator's kept."""
    nd_gb200_v6().install(monkeypatch, tmp_path)
    if operator_order is not None:
        monkeypatch.setenv("CUDA_DEVICE_ORDER", operator_order)
    seen: list[str | None] = []

    def is_available() -> bool:
        seen.append(os.environ.get("CUDA_DEVICE_ORDER"))
        return False

    monkeypatch.setattr(torch.cuda, "is_available", is_available)
    pytester.makepyfile("def test_x(gb_target):\n    assert gb_target.is_gpu\n")
    result = pytester.runpytest("--gb-sku=ND_GB200_v6", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert seen and set(seen) == {operator_order or "PCI_BUS_ID"}
