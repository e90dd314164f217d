"""SPMD functions the gang tests run on every rank (module level, so spawned ranks can import them)."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from pytest_gbvalidate.dist.gang import RankContext


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
