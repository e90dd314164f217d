"""STREAM Triad per NUMA node: the byte count and the rate, the last-level cache and NUMA nodes read from a fake
sysfs tree, every thread bound and unbound, and a wrong result refused. The triads themselves run for real."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from pytest_gbvalidate.bench import triad
from pytest_gbvalidate.bench.triad import (
    TriadError,
    cpu_numa_nodes,
    default_array_bytes,
    every_thread_on,
    last_level_cache_bytes,
    triad_bytes,
    triad_gbps,
    triad_on_node,
)

pytestmark = pytest.mark.torch_version  # bench/on_rank.py calls torch.accelerator


def test_bytes_are_counted_as_stream_counts_them() -> None:
    # Two arrays read and one written, 8-byte words: 24 bytes an element (STREAM's Triad row).
    assert triad_bytes(1000, 8) == 24_000
    assert triad_bytes(1000, 4) == 12_000
    assert triad_gbps(10**9, 8, 2.0) == pytest.approx(12.0)


class FakeClock:
    """time.perf_counter moving 0.5 s a call: each timed triad takes 0.5 s."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 0.5
        return self.now


def test_the_rate_is_stream_bytes_over_the_time_and_the_best_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "perf_counter", FakeClock())
    cpus = sorted(os.sched_getaffinity(0))
    node = next(iter(cpu_numa_nodes()))
    result = triad_on_node(node, cpus, 2**20, warmup=1, iterations=10)
    assert len(result.samples_gbps) == 10  # the warm-up run left out
    assert result.samples_gbps == [pytest.approx(24 * 2**20 / 0.5 / 1e9)] * 10
    assert result.bandwidth_gbps == max(result.samples_gbps) and result.dtype == "float64"
    assert result.threads == len(cpus) and result.binding["cpus"]


def test_a_real_triad_on_each_cpu_node_is_positive_and_puts_the_threads_back() -> None:
    threads_before = torch.get_num_threads()
    affinity_before = os.sched_getaffinity(0)
    results = triad.triads_on_rank(None, 8 * 2**20, 1, 10)
    assert [r.numa_node for r in results] == list(cpu_numa_nodes())
    assert all(r.bandwidth_gbps >= r.median_gbps > 0 and r.elements == 2**20 for r in results)
    assert torch.get_num_threads() == threads_before and os.sched_getaffinity(0) == affinity_before


def test_a_wrong_sum_fails_naming_the_node(monkeypatch: pytest.MonkeyPatch) -> None:
    real_add = torch.add

    def off_by_one(*args: Any, **kwargs: Any) -> Any:
        out = real_add(*args, **kwargs)
        out[7] += 1
        return out

    monkeypatch.setattr(torch, "add", off_by_one)
    node = next(iter(cpu_numa_nodes()))
    with pytest.raises(TriadError, match=rf"NUMA node {node}: 1 of 65536 elements are not 5.0"):
        triad_on_node(node, sorted(os.sched_getaffinity(0)), 65536, iterations=10)


def test_too_few_timed_runs_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 10 timed iterations"):
        triad_on_node(0, [0], 1024, iterations=3)


def cache(sysfs: Path, cpu: int, index: int, level: int, kind: str, size: str, shared: str) -> None:
    d = sysfs / f"devices/system/cpu/cpu{cpu}/cache/index{index}"
    d.mkdir(parents=True)
    for name, text in (("level", str(level)), ("type", kind), ("size", size), ("shared_cpu_list", shared)):
        (d / name).write_text(text + "\n")


def test_the_last_level_cache_is_the_highest_level_counted_once_per_instance(tmp_path: Path) -> None:
    for cpu in range(4):
        cache(tmp_path, cpu, 0, 1, "Instruction", "64K", str(cpu))
        cache(tmp_path, cpu, 1, 2, "Unified", "1024K", str(cpu))
        cache(tmp_path, cpu, 2, 3, "Unified", "32768K", "0-1" if cpu < 2 else "2-3")
    assert last_level_cache_bytes([0, 1, 2, 3], tmp_path) == 2 * 32 * 2**20
    assert last_level_cache_bytes([0, 1], tmp_path) == 32 * 2**20
    assert default_array_bytes([0, 1], tmp_path) == 4 * 32 * 2**20  # STREAM: 4x the cache
    assert last_level_cache_bytes([0], tmp_path / "none") is None
    assert default_array_bytes([0], tmp_path / "none") == triad.MIN_ARRAY_BYTES


def test_only_numa_nodes_with_cpus_are_measured(tmp_path: Path) -> None:
    mine = sorted(os.sched_getaffinity(0))
    nodes = tmp_path / "devices/system/node"
    for node, cpus in (("node0", str(mine[0])), ("node1", str(mine[-1])), ("node2", ""), ("node3", "4096")):
        (nodes / node).mkdir(parents=True)
        (nodes / node / "cpulist").write_text(cpus + "\n")
    # node2: a Grace system's GPU memory (no CPUs); node3: CPUs this process may not use.
    found = cpu_numa_nodes(tmp_path)
    assert found[0] == (mine[0],) and found[1] == (mine[-1],) and set(found) == {0, 1}


def test_every_thread_is_bound_and_put_back() -> None:
    started, stop = threading.Event(), threading.Event()
    native: list[int] = []

    def worker() -> None:
        native.append(threading.get_native_id())
        started.set()
        stop.wait(30)

    t = threading.Thread(target=worker)
    t.start()
    started.wait(30)
    try:
        before = os.sched_getaffinity(native[0])
        one = [min(os.sched_getaffinity(0))]
        with every_thread_on(one):
            assert os.sched_getaffinity(native[0]) == set(one) == os.sched_getaffinity(0)
        assert os.sched_getaffinity(native[0]) == before
    finally:
        stop.set()
        t.join()


def test_the_arrays_are_cut_to_the_time_budget_never_below_the_floor() -> None:
    """A VM may claim its host's whole last-level cache: 4x that streams for seconds a run on a busy VM. The warm-up's
    pace says how much fits TIMED_BUDGET_S; never fewer than MIN_ARRAY_BYTES, never more than allocated."""
    from pytest_gbvalidate.bench.triad import MIN_ARRAY_BYTES, TIMED_BUDGET_S, within_budget

    elements = 2**28  # 2 GiB of float64
    assert within_budget(elements, None, 10, 8) == elements  # no warm-up: nothing known
    assert within_budget(elements, TIMED_BUDGET_S / 10, 10, 8) == elements  # fits exactly
    assert within_budget(elements, TIMED_BUDGET_S / 5, 10, 8) == elements // 2  # twice the budget: half
    assert within_budget(elements, 100.0, 10, 8) == MIN_ARRAY_BYTES // 8  # never below the floor
    assert within_budget(MIN_ARRAY_BYTES // 16, 100.0, 10, 8) == MIN_ARRAY_BYTES // 16  # nor above what there is
