"""What our collective measurement costs against a minimal hand-written torch.distributed loop.

On the CPU with 2 ranks (gloo), in one run and interleaved so both see the same machine load:
- busbw of a 64 MiB float32 all_reduce measured by our code (the session gang, `sweep_on_rank`, `summarize`)
  and by a hand-written loop (spawn, init_process_group, 5 warm-up and 20 timed `dist.all_reduce` calls with
  the host clock, median); the goal is ours within 10% of the hand loop;
- the fixed cost of each: starting the gang and running its first collective, against spawning the processes,
  initialising the process group and running a first all_reduce by hand.

    python benchmarks/collectives_overhead.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from pytest_gbvalidate.bench.collectives import busbw_factor, summarize, sweep_on_rank
from pytest_gbvalidate.ranks.gang import LocalGang, RankContext

RANKS = 2
SIZE_BYTES = 64 * 2**20
WARMUP, ITERATIONS = 5, 20


def first_all_reduce(ctx: RankContext) -> None:
    dist.all_reduce(torch.ones(1))


def ours() -> tuple[float, float]:
    """(seconds to start the gang and run its first collective, busbw in GB/s at 64 MiB)."""
    start = time.perf_counter()
    gang = LocalGang(RANKS)
    try:
        gang.run(first_all_reduce)
        fixed_s = time.perf_counter() - start
        per_rank = gang.run(sweep_on_rank, "all_reduce", "in_place", [SIZE_BYTES], WARMUP, ITERATIONS)
    finally:
        gang.close()
    (row,) = summarize("all_reduce", "in_place", per_rank)
    return fixed_s, row.busbw_gbps


def _hand_rank(rank: int, init_file: str, started: float, out: mp.Queue) -> None:  # type: ignore[type-arg]
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=RANKS, timeout=timedelta(seconds=120)
    )
    dist.all_reduce(torch.ones(1))
    fixed_s = time.time() - started
    buf = torch.ones(SIZE_BYTES // 4)
    for _ in range(WARMUP):
        dist.all_reduce(buf)
    times = []
    for _ in range(ITERATIONS):
        t = time.perf_counter()
        dist.all_reduce(buf)
        times.append(time.perf_counter() - t)
    out.put((rank, fixed_s, times))
    dist.destroy_process_group()


def hand() -> tuple[float, float]:
    """The same measurement by a minimal hand-written loop: (fixed seconds, busbw in GB/s)."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        started = time.time()
        procs = [
            ctx.Process(target=_hand_rank, args=(r, os.path.join(tmp, "rendezvous"), started, out))
            for r in range(RANKS)
        ]
        for p in procs:
            p.start()
        results = sorted(out.get(timeout=300) for _ in procs)
        for p in procs:
            p.join()
    fixed_s = max(r[1] for r in results)
    t = statistics.median(statistics.fmean(ts) for ts in zip(*(r[2] for r in results), strict=True))
    return fixed_s, SIZE_BYTES / t / 1e9 * busbw_factor("all_reduce", RANKS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    runs: dict[str, list[tuple[float, float]]] = {"hand-written loop": [], "pytest-gbvalidate": []}
    for _ in range(args.rounds):
        runs["hand-written loop"].append(hand())
        runs["pytest-gbvalidate"].append(ours())
    print(
        f"all_reduce float32 {SIZE_BYTES // 2**20} MiB, {RANKS} ranks (gloo, CPU), {WARMUP} warm-up + {ITERATIONS} "
        f"timed iterations, median; {args.rounds} interleaved rounds; torch {torch.__version__}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
    )
    print(f"{'':20} {'busbw GB/s':>11} {'fixed cost s':>13}   per round (busbw; fixed)")
    medians = {}
    for name, rs in runs.items():
        busbw = statistics.median(b for _, b in rs)
        fixed = statistics.median(f for f, _ in rs)
        medians[name] = busbw
        rounds = ", ".join(f"{b:.3f}; {f:.2f}" for f, b in rs)
        print(f"{name:20} {busbw:11.3f} {fixed:13.2f}   {rounds}")
    ratio = medians["pytest-gbvalidate"] / medians["hand-written loop"]
    verdict = "within" if abs(ratio - 1) <= 0.10 else "NOT within"
    print(f"ratio ours / hand-written: {ratio:.3f} ({verdict} the 10% goal)")
    print("fixed cost: gang start + first collective, against spawn + init_process_group + first all_reduce")


if __name__ == "__main__":
    main()
