"""The host side of a Grace system: each CPU's memory bandwidth (`[numa0]`, `[numa1]`: STREAM Triad, threads and
memory on one NUMA node) and every GPU's host-to-device copy at once (the NVLink-C2C links together, one figure
per node). On other SKUs the triad checks whatever NUMA nodes with CPUs the machine has.

The triad runs on local rank 0 while the other ranks wait (one NUMA node after another); the aggregate copy
runs on every rank at once. Both are asserted against the SKU's baseline with gb_expect.
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_gbvalidate.bench.aggregate import aggregate, concurrent_h2d_on_rank
from pytest_gbvalidate.bench.triad import TriadResult, triads_on_rank
from pytest_gbvalidate.expect import Expect, Measured
from pytest_gbvalidate.labels import numa_label
from pytest_gbvalidate.node import neighbours
from pytest_gbvalidate.ranks.gang import Gang, run_on_local_rank
from pytest_gbvalidate.target import Target

pytestmark = pytest.mark.gb_level("standard")

TRIAD_WARMUP, TRIAD_ITERATIONS = 1, 10  # STREAM's NTIMES is 10, the first of them excluded
COPY_SIZE_BYTES = 512 * 2**20  # as the per-GPU copies (nvbandwidth's default buffer)
COPY_WARMUP, COPY_ITERATIONS = 3, 20


def _node_prefix(node_rank: int, nodes: int) -> str:
    """Nothing on one node; `node1/` where several nodes' results sit side by side."""
    return "" if nodes == 1 else f"node{node_rank}/"


def _triad_details(host: str, rank: int, r: TriadResult) -> dict[str, Any]:
    return {
        "host": host,
        "rank": rank,
        "elements": r.elements,
        "dtype": r.dtype,
        "iterations": r.iterations,
        "threads": r.threads,
        "median_gbps": r.median_gbps,
        "samples_gbps": r.samples_gbps,
        "passes": r.samples_gbps,  # the figure is the best of them: their spread is its noise (rules/noise.py)
        "cpu_wait_pct": neighbours.as_pct(r.cpu_wait_share),
        "binding": r.binding,
        "rule": "STREAM: best of the timed runs, 3 arrays counted per element, first run excluded",
    } | ({} if r.allocated is None else {"allocated_elements": r.allocated, "cut_to": "the time budget"})


def test_host_memory_triad(gb_target: Target, gb_gang: Gang, gb_expect: Expect) -> None:
    """STREAM Triad per NUMA node with CPUs: a Grace (or any CPU socket) whose memory runs slow."""
    metric = "host_memory_triad_gbps"
    params = gb_target.params(metric)
    array_bytes = int(params["array_bytes"]) if "array_bytes" in params else None
    warmup = int(params.get("warmup", TRIAD_WARMUP))
    iterations = int(params.get("iterations", TRIAD_ITERATIONS))

    def measure() -> list[Measured]:
        results = run_on_local_rank(gb_gang, 0, triads_on_rank, array_bytes, warmup, iterations)
        if not any(r.value for r in results):
            pytest.fail("no NUMA node with CPUs this process may run on: nothing to measure")
        return [
            Measured(
                metric,
                t.bandwidth_gbps,
                _node_prefix(r.node_rank, len(results)) + numa_label(t.numa_node),
                _triad_details(r.host, r.rank, t),
            )
            for r in results
            for t in r.value
        ]

    # A neighbour streaming memory for the whole of the timed runs slows every one of them: measured again
    # before a verdict against it (gb_expect.each's `again`), the better pass counting.
    gb_expect.each(measure(), again=measure)


@pytest.mark.gb_gpu
def test_h2d_aggregate_bandwidth(gb_target: Target, gb_gang: Gang, gb_expect: Expect) -> None:
    """Every GPU's host-to-device copy at once, each from pinned memory on its own NUMA node."""
    metric = "h2d_aggregate_bandwidth_gbps"
    params = gb_target.params(metric)
    size = int(params.get("size_bytes", COPY_SIZE_BYTES))
    warmup = int(params.get("warmup", COPY_WARMUP))
    iterations = int(params.get("iterations", COPY_ITERATIONS))
    copies = gb_gang.run(concurrent_h2d_on_rank, size, warmup, iterations)
    nodes = aggregate(copies)
    gb_expect.each(
        [
            Measured(
                metric,
                n.bandwidth_gbps,
                "node" if len(nodes) == 1 else f"node{n.node_rank}",
                {
                    "gpus": n.gpus,
                    "size_bytes": size,
                    "iterations": iterations,
                    "window_s": n.window_s,
                    "per_gpu_gbps": {f"gpu{k}": v for k, v in n.per_gpu_gbps.items()},
                },
            )
            for n in nodes
        ]
    )
