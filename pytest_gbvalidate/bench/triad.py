"""Host memory bandwidth per NUMA node, as STREAM's Triad measures it: a = b + s * c over float64 arrays, every
thread of the process on the node's CPUs and the arrays in the node's memory.

STREAM's rules (stream.c, J. McCalpin), kept here: each array at least 4 times the last-level cache (cut to what the
timed runs stream within TIMED_BUDGET_S, never below MIN_ARRAY_BYTES: a VM may claim a cache it shares); bytes counted
as STREAM counts them, 3 arrays of 8-byte words per element (a write-allocate's extra read not counted); the first
run excluded; the rate reported the best of the timed runs, GB = 1e9 bytes (the median kept beside it).

torch rather than numpy: `torch.add(b, c, alpha=s, out=a)` is one fused pass on every thread of torch's pool (numpy's
`b + s * c` makes two passes and a temporary, on one thread). No pytest.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from pytest_gbvalidate.bench.timing import MIN_TIMED_ITERATIONS, median
from pytest_gbvalidate.node import neighbours
from pytest_gbvalidate.node.affinity import bound_to
from pytest_gbvalidate.node.topology import SYSFS_ROOT, format_cpulist, numa_nodes, parse_cpulist

ARRAYS_PER_ELEMENT = 3  # STREAM's count for Triad: b and c read, a written
SCALAR = 3.0  # STREAM's scalar
B_VALUE, C_VALUE = 2.0, 1.0  # so every element of a must be 5.0 afterwards
_SIZE_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30}  # of sysfs's cache sizes
CACHE_MULTIPLE = 4  # STREAM: each array at least 4x the last-level cache
MIN_ARRAY_BYTES = 64 * 2**20  # where sysfs gives no cache size, and the least an array is cut to (TIMED_BUDGET_S)
# What one node's timed runs may take: a VM may claim its host's whole last-level cache (480 MiB: 1.9 GiB arrays),
# which a busy 2-vCPU VM streams in seconds a run, past the cpu SKU's 30 s --gb-timeout.
TIMED_BUDGET_S = 3.0


class TriadError(AssertionError):
    """The triad wrote something other than b + s * c: a fast wrong kernel must not pass."""


@dataclass(frozen=True)
class TriadResult:
    numa_node: int
    elements: int  # per array
    dtype: str
    iterations: int
    bandwidth_gbps: float  # best of the timed runs, as STREAM reports
    median_gbps: float
    samples_gbps: list[float]
    threads: int
    binding: dict[str, str] = field(default_factory=dict)
    cpu_wait_share: float | None = None  # the share of the timed runs' time it waited for a CPU (neighbours)
    allocated: int | None = None  # elements per array allocated, where the timed runs used fewer (TIMED_BUDGET_S)


def triad_bytes(elements: int, itemsize: int) -> int:
    """Bytes one triad moves, counted as STREAM counts them."""
    return ARRAYS_PER_ELEMENT * elements * itemsize


def triad_gbps(elements: int, itemsize: int, seconds: float) -> float:
    return triad_bytes(elements, itemsize) / seconds / 1e9


def cpu_numa_nodes(sysfs: Path = SYSFS_ROOT) -> dict[int, tuple[int, ...]]:
    """NUMA nodes with CPUs (a Grace system's GPU-memory nodes have none), with the CPUs of each this process may
    run on. A node none of whose CPUs this process may use is left out."""
    allowed = os.sched_getaffinity(0)
    found = {n.node: tuple(c for c in n.cpus if c in allowed) for n in numa_nodes(sysfs).values() if n.cpus}
    return {node: cpus for node, cpus in sorted(found.items()) if cpus}


def last_level_cache_bytes(cpus: Sequence[int], sysfs: Path = SYSFS_ROOT) -> int | None:
    """The sum of the distinct highest-level caches `cpus` share (one instance per shared_cpu_list), from sysfs;
    None where sysfs does not say."""
    seen: dict[str, int] = {}
    level_found = 0
    for cpu in cpus:
        for index in (sysfs / f"devices/system/cpu/cpu{cpu}/cache").glob("index[0-9]*"):
            try:
                level = int((index / "level").read_text())
                kind = (index / "type").read_text().strip()
                text = (index / "size").read_text().strip()  # e.g. 32768K
                size = int(text[:-1]) * _SIZE_UNITS[text[-1]] if text[-1:] in _SIZE_UNITS else int(text)
                shared = format_cpulist(parse_cpulist((index / "shared_cpu_list").read_text()))
            except (OSError, ValueError):
                continue
            if kind == "Instruction" or level < level_found:
                continue
            if level > level_found:
                level_found, seen = level, {}
            seen[shared] = size
    return sum(seen.values()) or None


def default_array_bytes(cpus: Sequence[int], sysfs: Path = SYSFS_ROOT) -> int:
    llc = last_level_cache_bytes(cpus, sysfs)
    return max(MIN_ARRAY_BYTES, CACHE_MULTIPLE * llc) if llc else MIN_ARRAY_BYTES


@contextlib.contextmanager
def every_thread_on(cpus: Sequence[int]) -> Iterator[None]:
    """Every thread of this process (torch's intra-op pool included, which a binding of the calling thread alone
    would leave where it was) on `cpus`; each thread's own CPU set is restored afterwards."""
    before: dict[int, set[int]] = {}
    for tid in [int(p.name) for p in Path("/proc/self/task").iterdir() if p.name.isdigit()]:
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            before[tid] = os.sched_getaffinity(tid)
            os.sched_setaffinity(tid, cpus)
    try:
        yield
    finally:
        for tid, old in before.items():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, old)


def triad_on_node(
    numa_node: int,
    cpus: Sequence[int],
    elements: int,
    *,
    dtype: torch.dtype = torch.float64,
    warmup: int = 1,
    iterations: int = 10,
) -> TriadResult:
    """STREAM Triad on `numa_node`: the arrays first touched by the calling thread alone, its memory bound to the node
    (a page lands where its first writer is bound), then timed with one torch thread per CPU of the node."""
    if iterations < MIN_TIMED_ITERATIONS:
        raise ValueError(f"at least {MIN_TIMED_ITERATIONS} timed iterations are needed, got {iterations}")
    threads = torch.get_num_threads()
    with every_thread_on(cpus), bound_to(cpus, numa_node) as binding:
        try:
            torch.set_num_threads(1)
            a, b, c = (torch.empty(elements, dtype=dtype) for _ in range(3))
            a.fill_(0.0), b.fill_(B_VALUE), c.fill_(C_VALUE)
            torch.set_num_threads(len(cpus))
            seconds = []
            before: neighbours.Reading | None = None
            allocated, first_s = elements, None
            for i in range(warmup + iterations):
                if i == warmup:
                    elements = within_budget(elements, first_s, iterations, a.element_size())
                    a, b, c = a[:elements], b[:elements], c[:elements]
                    before = neighbours.read()
                start = time.perf_counter()
                torch.add(b, c, alpha=SCALAR, out=a)
                took_s = time.perf_counter() - start
                first_s = took_s if first_s is None else first_s
                if i >= warmup:
                    seconds.append(took_s)
            waited = neighbours.waited_share(before, neighbours.read())
            expected = B_VALUE + SCALAR * C_VALUE
            wrong = int((a != expected).sum())
        finally:
            torch.set_num_threads(threads)
    if wrong:
        raise TriadError(f"triad on NUMA node {numa_node}: {wrong} of {elements} elements are not {expected}")
    itemsize = torch.empty(0, dtype=dtype).element_size()
    samples = [triad_gbps(elements, itemsize, s) for s in seconds]
    name, bound = str(dtype).removeprefix("torch."), {**binding, "threads": "every thread of the rank's process"}
    cut = None if elements == allocated else allocated
    return TriadResult(
        numa_node, elements, name, iterations, max(samples), median(samples), samples, len(cpus), bound, waited, cut
    )


def within_budget(elements: int, first_s: float | None, iterations: int, itemsize: int) -> int:
    """The elements per array the timed runs use: as many as `iterations` runs at the warm-up's pace (`first_s`; None:
    unknown, all) fit in TIMED_BUDGET_S, never fewer than MIN_ARRAY_BYTES holds nor more than there are."""
    if first_s is None or first_s <= 0 or first_s * iterations <= TIMED_BUDGET_S:
        return elements
    return min(elements, max(int(elements * TIMED_BUDGET_S / (first_s * iterations)), MIN_ARRAY_BYTES // itemsize))


def triads_on_rank(ctx: object, array_bytes: int | None, warmup: int, iterations: int) -> list[TriadResult]:
    """For `run_on_local_rank`: the triad on each NUMA node with CPUs, one node after another (the rank has the
    node to itself while the others wait). `array_bytes` per array; None: 4x the node's last-level cache."""
    results = []
    for node, cpus in cpu_numa_nodes().items():
        size = array_bytes if array_bytes is not None else default_array_bytes(cpus)
        elements = size // torch.empty(0, dtype=torch.float64).element_size()
        results.append(triad_on_node(node, cpus, elements, warmup=warmup, iterations=iterations))
    return results
