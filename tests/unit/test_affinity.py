"""NUMA binding: sysfs locality of a PCI device (a fake sysfs tree) and the real affinity / memory policy calls,
which must be undone when the body ends."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import pytest
import torch

from pytest_gbvalidate.node.affinity import (
    MPOL_BIND,
    Locality,
    bound_to,
    current_mempolicy,
    pci_locality,
)
from pytest_gbvalidate.node.topology import parse_cpulist


def test_parse_cpulist_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="not a CPU list: 'a-b'"):
        parse_cpulist("a-b")


def fake_pci_device(sysfs: Path, bdf: str, numa_node: str, cpulist: str) -> None:
    device = sysfs / "bus" / "pci" / "devices" / bdf
    device.mkdir(parents=True)
    (device / "numa_node").write_text(numa_node + "\n")
    (device / "local_cpulist").write_text(cpulist + "\n")


def test_pci_locality_from_sysfs(tmp_path: Path) -> None:
    fake_pci_device(tmp_path, "0000:1b:00.0", "1", "36-71,108-143")
    fake_pci_device(tmp_path, "0009:01:00.0", "-1", "0-3")  # a platform that does not say
    assert pci_locality("0000:1B:00.0", tmp_path) == Locality(1, (*range(36, 72), *range(108, 144)))
    assert pci_locality("0009:01:00.0", tmp_path) == Locality(None, (0, 1, 2, 3))
    with pytest.raises(FileNotFoundError):
        pci_locality("0000:99:00.0", tmp_path)


needs_mempolicy = pytest.mark.skipif(
    current_mempolicy() is None, reason=f"no memory policy system call known on {platform.machine()}"
)


def allowed_memory_node() -> int:
    """A NUMA node this process may allocate on: not always node 0 (a Slurm job's cgroup, or a container's,
    can be confined to the NUMA nodes of its CPUs)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Mems_allowed_list:"):
            return min(parse_cpulist(line.split(":", 1)[1]))  # the same list format as CPUs
    return 0


@needs_mempolicy
def test_bound_to_binds_cpus_and_memory_then_restores_both() -> None:
    cpus_before, policy_before = os.sched_getaffinity(0), current_mempolicy()
    cpu, node = min(cpus_before), allowed_memory_node()
    with bound_to([cpu], numa_node=node) as applied:
        assert os.sched_getaffinity(0) == {cpu}
        assert current_mempolicy() == (MPOL_BIND, [node])
        assert applied == {"cpus": str(cpu), "memory": f"bound to NUMA node {node}"}
    assert os.sched_getaffinity(0) == cpus_before
    assert current_mempolicy() == policy_before


def test_bound_to_restores_after_an_error_and_leaves_memory_alone_without_a_node() -> None:
    cpus_before, policy_before = os.sched_getaffinity(0), current_mempolicy()
    seen: dict[str, str] = {}

    def body() -> None:
        with bound_to(sorted(cpus_before)) as applied:
            seen.update(applied, policy=str(current_mempolicy()))
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        body()
    assert seen["cpus"] == (f"{min(cpus_before)}-{max(cpus_before)}" if len(cpus_before) > 1 else "0")
    assert "memory" not in seen and seen["policy"] == str(policy_before)
    assert os.sched_getaffinity(0) == cpus_before


@needs_mempolicy
def test_binding_to_a_node_that_does_not_exist_fails_and_restores() -> None:
    cpus_before, policy_before = os.sched_getaffinity(0), current_mempolicy()
    cpu = min(cpus_before)  # CPU 0 may not be this process's to run on (a Slurm job's or a container's cpuset)
    with pytest.raises(OSError, match=r"set_mempolicy\(2, nodes \[1000\]\)"), bound_to([cpu], numa_node=1000):
        pass
    assert os.sched_getaffinity(0) == cpus_before and current_mempolicy() == policy_before


def test_a_gpu_on_a_numa_node_without_cpus_is_copied_to_unbound(monkeypatch: pytest.MonkeyPatch) -> None:
    # Grace systems show GPU memory as CPU-less NUMA nodes: host buffers must not be bound there.
    from pytest_gbvalidate.bench import on_rank

    monkeypatch.setattr(on_rank, "_cuda_pci_address", lambda device: "0000:01:00.0")
    monkeypatch.setattr(on_rank, "pci_locality", lambda bdf: Locality(2, ()))
    before = os.sched_getaffinity(0)
    with on_rank.near_device(torch.device("cuda", 0)) as applied:
        assert applied == {"cpus": "not bound (sysfs gives the device no local CPUs)"}
        assert os.sched_getaffinity(0) == before
