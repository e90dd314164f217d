"""Every GPU of a node copying host to device at once, each from pinned host memory on its own NUMA node: the
node's aggregate host-to-device bandwidth (on Grace systems the NVLink-C2C links all busy together). No pytest.

Each rank binds and allocates as the per-GPU copy does (`near_device`), warms up, waits at a barrier, then copies
`iterations` times. The node's figure is every rank's bytes over the window from the first start to the last end
(the monotonic clock a node's processes share): a rank that starts late or runs slow widens the window.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from pytest_gbvalidate.bench.copy import DataIntegrityError, _pattern
from pytest_gbvalidate.bench.on_rank import HOST, near_device
from pytest_gbvalidate.ranks.gang import RankContext


@dataclass(frozen=True)
class RankCopies:
    """One rank's share of a concurrent copy."""

    node_rank: int
    local_rank: int
    size_bytes: int
    iterations: int
    start_s: float  # time.monotonic()
    end_s: float
    host_binding: dict[str, str] = field(default_factory=dict)

    @property
    def bytes_copied(self) -> int:
        return self.size_bytes * self.iterations


@dataclass(frozen=True)
class NodeAggregate:
    node_rank: int
    gpus: int
    bandwidth_gbps: float  # all GPUs' bytes / (last end - first start), GB = 1e9 bytes
    window_s: float
    per_gpu_gbps: dict[int, float]  # each rank's own bytes / its own time, by local rank


def aggregate(copies: list[RankCopies]) -> list[NodeAggregate]:
    """One figure per node from its ranks' copies."""
    nodes: dict[int, list[RankCopies]] = {}
    for c in copies:
        nodes.setdefault(c.node_rank, []).append(c)
    result = []
    for node, ranks in sorted(nodes.items()):
        window_s = max(r.end_s for r in ranks) - min(r.start_s for r in ranks)
        if window_s <= 0:
            raise ValueError(f"node {node}: the copies' window is {window_s} s; the clock did not advance")
        total = sum(r.bytes_copied for r in ranks)
        per_gpu = {r.local_rank: r.bytes_copied / (r.end_s - r.start_s) / 1e9 for r in ranks}
        result.append(NodeAggregate(node, len(ranks), total / window_s / 1e9, window_s, per_gpu))
    return result


def concurrent_h2d_on_rank(ctx: RankContext, size_bytes: int, warmup: int, iterations: int) -> RankCopies:
    """For `gang.run` (every rank at once): this rank's host-to-device copies, started with the others'."""
    with near_device(ctx.device) as binding:
        src = _pattern(size_bytes)
        if ctx.device.type == "cuda":
            src = src.pin_memory()  # a host-to-device copy runs at full rate only from pinned memory
        dst = torch.empty(size_bytes, dtype=torch.uint8, device=ctx.device)
    for _ in range(warmup):
        dst.copy_(src, non_blocking=True)
    if ctx.device.type != "cpu":
        torch.accelerator.synchronize(ctx.device)
    dist.barrier()
    start_s = time.monotonic()
    for _ in range(iterations):
        dst.copy_(src, non_blocking=True)
    if ctx.device.type != "cpu":
        torch.accelerator.synchronize(ctx.device)
    end_s = time.monotonic()
    if not torch.equal(dst.to(HOST), src):
        raise DataIntegrityError(f"rank {ctx.rank}: host->{ctx.device} copy of {size_bytes} B arrived changed")
    return RankCopies(ctx.node_rank, ctx.local_rank, size_bytes, iterations, start_s, end_s, binding)
