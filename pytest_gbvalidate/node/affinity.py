"""Binding the calling thread to a set of CPUs and a NUMA node's memory, as `numactl --physcpubind=... --membind=N`
does, for host<->device copies that must use host memory near the GPU; a PCI device's CPUs and node from sysfs.
`bound_to` takes a plain CPU list, so any source of locality can feed it. No pytest, no torch."""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from pytest_gbvalidate.node.topology import format_cpulist, parse_cpulist

MPOL_DEFAULT, MPOL_BIND = 0, 2
# set_mempolicy/get_mempolicy have no glibc wrapper (they live in libnuma, which a node may lack): call the
# system calls by number. Numbers from the kernel's syscall tables for the architectures GPU nodes use.
_SYSCALLS = {"x86_64": (238, 239), "aarch64": (237, 236)}  # (set_mempolicy, get_mempolicy)
_MASK_WORDS = 16  # room for 1024 NUMA nodes
_WORD_BITS = 8 * ctypes.sizeof(ctypes.c_ulong)


@dataclass(frozen=True)
class Locality:
    """Where a PCI device sits: its NUMA node (None when the platform does not say) and the CPUs near it."""

    numa_node: int | None
    cpus: tuple[int, ...]


def pci_locality(bdf: str, sysfs: Path = Path("/sys")) -> Locality:
    """The NUMA node and local CPUs of the PCI device `bdf` (e.g. '0000:1b:00.0') from sysfs."""
    device = sysfs / "bus" / "pci" / "devices" / bdf.lower()
    node = int((device / "numa_node").read_text().strip())
    cpus = parse_cpulist((device / "local_cpulist").read_text())
    return Locality(None if node < 0 else node, tuple(cpus))


@contextlib.contextmanager
def bound_to(cpus: Sequence[int], numa_node: int | None = None) -> Iterator[dict[str, str]]:
    """Run the body with the calling thread on `cpus` and, when `numa_node` is given, its new memory (pinned
    buffers included) bound to that node. Both are restored afterwards. Yields what was applied, for reports."""
    applied = {"cpus": format_cpulist(cpus)}
    old_cpus = os.sched_getaffinity(0)
    old_policy = None
    os.sched_setaffinity(0, cpus)
    try:
        if numa_node is not None:
            if (old_policy := _get_mempolicy()) is None:
                applied["memory"] = f"not bound (no memory policy system call on {platform.machine()})"
            else:
                _set_mempolicy(MPOL_BIND, [numa_node])
                applied["memory"] = f"bound to NUMA node {numa_node}"
        yield applied
    finally:
        if old_policy is not None:
            mode, nodes = old_policy
            _set_mempolicy(mode, nodes)
        os.sched_setaffinity(0, old_cpus)


def current_mempolicy() -> tuple[int, list[int]] | None:
    """(mode, nodes) of the calling thread's memory policy, or None where it cannot be read."""
    return _get_mempolicy()


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _get_mempolicy() -> tuple[int, list[int]] | None:
    if (numbers := _SYSCALLS.get(platform.machine())) is None:
        return None
    mode = ctypes.c_int(0)
    mask = (ctypes.c_ulong * _MASK_WORDS)()
    rc = _libc().syscall(numbers[1], ctypes.byref(mode), mask, ctypes.c_ulong(_MASK_WORDS * _WORD_BITS), None, 0)
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"get_mempolicy: {os.strerror(err)}")
    nodes = [n for n in range(_MASK_WORDS * _WORD_BITS) if mask[n // _WORD_BITS] >> (n % _WORD_BITS) & 1]
    return mode.value, nodes


def _set_mempolicy(mode: int, nodes: Sequence[int]) -> None:
    numbers = _SYSCALLS[platform.machine()]
    mask = (ctypes.c_ulong * _MASK_WORDS)()
    for n in nodes:
        mask[n // _WORD_BITS] |= 1 << (n % _WORD_BITS)
    # The kernel reads maxnode - 1 bits; MPOL_DEFAULT takes no node mask.
    mask_arg = None if mode == MPOL_DEFAULT else mask
    rc = _libc().syscall(numbers[0], mode, mask_arg, ctypes.c_ulong(_MASK_WORDS * _WORD_BITS + 1))
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"set_mempolicy({mode}, nodes {list(nodes)}): {os.strerror(err)}")
