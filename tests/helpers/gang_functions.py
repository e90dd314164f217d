"""SPMD functions the gang tests run on every rank (module level, so spawned ranks can import them)."""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable
from typing import Any

import psutil
import torch
import torch.distributed as dist

from pytest_gbvalidate.bench import collectives
from pytest_gbvalidate.ranks.gang import RankContext


def all_reduce_rank(ctx: RankContext, scale: int) -> tuple[int, int, float]:
    t = torch.tensor([float(ctx.rank + 1) * scale], device=ctx.device)
    dist.all_reduce(t)
    return ctx.rank, ctx.world_size, float(t.item())


def pid(ctx: RankContext) -> int:
    return os.getpid()


def crash_on(ctx: RankContext, bad_rank: int) -> None:
    if ctx.rank == bad_rank:
        os._exit(7)  # as a segfault in a driver would end the process
    dist.barrier()


def hang_on(ctx: RankContext, bad_rank: int) -> None:
    if ctx.rank == bad_rank:
        time.sleep(3600)
    dist.barrier()


def raise_on(ctx: RankContext, bad_rank: int) -> None:
    if ctx.rank == bad_rank:
        raise ValueError(f"wrong data on rank {ctx.rank}")
    dist.barrier()


def rank_and_device(ctx: RankContext, tag: str) -> tuple[int, str, str]:
    return ctx.rank, str(ctx.device), tag


def nccl_environment(ctx: RankContext) -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if name.startswith("NCCL_")}


def memory_growth_of_sweeps(ctx: RankContext, sweeps: int, size_bytes: int) -> int:
    """Bytes this rank's resident memory grows over `sweeps` all_reduce sweeps of one size, with Python's cyclic
    collector off (as it may stay off for a long time in a busy rank): what the sweeps leave behind."""
    collectives.sweep_on_rank(ctx, "all_reduce", "in_place", [4096], 0, 10)  # the backend's own first allocations
    gc.collect()
    gc.disable()
    try:
        before = psutil.Process().memory_info().rss
        for _ in range(sweeps):
            collectives.sweep_on_rank(ctx, "all_reduce", "in_place", [size_bytes], 0, 10)
        return int(psutil.Process().memory_info().rss - before)
    finally:
        gc.enable()


def with_free_bytes(ctx: RankContext, free_by_rank: dict[int, int], fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(ctx, *args)` with the free memory the sweep sees on the ranks named in `free_by_rank` set to a value."""
    real = collectives._free_bytes
    collectives._free_bytes = lambda c: free_by_rank.get(c.rank, real(c))  # type: ignore[assignment]
    try:
        return fn(ctx, *args)
    finally:
        collectives._free_bytes = real


def spin_beside_neighbours(ctx: RankContext, neighbours: int) -> None:
    """Busy work on every rank beside `neighbours` processes spinning on the host's CPUs, started by rank 0, each
    ending once rank 0 has (the gang's teardown kills the ranks: no spinner outlives the test)."""
    import subprocess
    import sys

    if ctx.rank == 0:
        spin = f"import os\nwhile os.getppid() == {os.getpid()}:\n    pass\n"
        for _ in range(neighbours):
            subprocess.Popen([sys.executable, "-c", spin])
    end = time.monotonic() + 3600
    while time.monotonic() < end:  # progress, on a CPU that others want too
        sum(range(10_000))
