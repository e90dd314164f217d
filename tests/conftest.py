"""Fixtures that keep the plugin's tests independent of the machine running them."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

# PyYAML and the baseline code, loaded once before any test: in-process pytester runs drop the modules they
# import, and a baseline loader built on one copy of PyYAML must not meet the exceptions of another.
import yaml  # noqa: F401

import pytest_gbvalidate.baselines  # noqa: F401
from tests.fakenode import point_detection_at, write_detection_sysfs
from tests.fakenvml import install

# Variables of the host's environment that change what the plugin does: NCCL_* are reported and passed to the
# ranks; CUDA_* pick and number the GPUs; torchrun's and Slurm's make the plugin join their world instead of
# starting its own ranks; GBVALIDATE_* are our own settings. PYTEST_XDIST_* when these tests run under -n: the
# pytester runs they start are no xdist workers (pytest-benchmark, if installed, would think they were and warn,
# which the warnings-as-errors setting turns into an internal error of the inner run).
_HOST_VARIABLES = {"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"}
_HOST_VARIABLES |= {"LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"}
_HOST_PREFIXES = ("NCCL_", "SLURM_", "GBVALIDATE_", "PYTEST_XDIST_")


@pytest.fixture(scope="session", autouse=True)
def environment_of_no_particular_host() -> Iterator[None]:
    """So that a developer on a GPU workstation, inside an NGC container (which sets NCCL_VERSION and other
    NCCL_* and CUDA_* variables) or inside an srun allocation (SLURM_PROCID, SLURM_NTASKS, ...) runs pytest
    green: the tests start from an environment without the variables above, in this process and in every
    process they start (pytester subprocesses, torchrun agents, gang ranks inherit os.environ). A test that
    needs one sets it itself."""
    with pytest.MonkeyPatch.context() as mp:
        for name in list(os.environ):
            if name in _HOST_VARIABLES or name.startswith(_HOST_PREFIXES):
                mp.delenv(name)
        yield


@pytest.fixture
def cpu_only_node(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """This test's node has no NVIDIA GPU, whatever the host has: no NVIDIA driver (NVML's library is not
    found), no NVIDIA device on the PCI bus, and not an Azure VM. SKU auto-detection says `cpu` on it."""
    install(monkeypatch, None)
    sysfs = tmp_path / "cpu-only-node-sys"
    write_detection_sysfs(sysfs, [])
    point_detection_at(monkeypatch, sysfs)
