"""What the built-in pretraining engine's machinery costs: the same small Llama 3, the same data and batch, as a
plain single-process PyTorch training loop and through the engine (one rank in-process; PP=2 and DP=2 on two
CPU ranks over gloo), median step times side by side in one run.

    python benchmarks/pretrain_overhead.py [--rounds 3] [--precision fp32|bf16]

Each round runs every case once (2 warm-up + 10 timed steps), so all cases see the same machine load; the
figures are the medians over rounds of each case's median step. The plain loop and the one-rank engine use
every core; the two-rank cases give each rank half of them, as the suite's gang does.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from pytest_gbvalidate.bench.timing import time_op_s
from pytest_gbvalidate.ranks.gang import LocalGang
from pytest_gbvalidate.workloads.llama.config import LlamaConfig
from pytest_gbvalidate.workloads.llama.data import SyntheticTokens
from pytest_gbvalidate.workloads.llama.model import build, loss_fn
from pytest_gbvalidate.workloads.llama.parallel import Layout
from pytest_gbvalidate.workloads.llama.train import (
    ADAMW_BETAS,
    WEIGHT_DECAY,
    RankResult,
    Trainer,
    TrainRequest,
    train_worker,
)

# Small enough for a 2-core machine, big enough that a step is matmul work rather than Python overhead.
SMALL = LlamaConfig(
    "llama3_small", n_layers=4, dim=256, n_heads=8, n_kv_heads=4, ffn_dim=704, vocab_size=4096, seq_len=256
)
GBS, MBS, WARMUP, TIMED, LR = 16, 4, 2, 10, 3e-3


def plain_loop_step_s(precision: str) -> float:
    """The model trained the textbook way: one process, gradient accumulation over microbatches, AdamW."""
    cpu = torch.device("cpu")
    model = build(SMALL, cpu, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=ADAMW_BETAS, weight_decay=WEIGHT_DECAY)
    data = SyntheticTokens(SMALL.vocab_size, SMALL.seq_len, seed=0)
    batches = [data.batch(i, GBS) for i in range(WARMUP + TIMED)]
    step = iter(range(WARMUP + TIMED))
    n_micro = GBS // MBS

    def one_step() -> None:
        tokens = batches[next(step)]
        for chunk in tokens.chunk(n_micro):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
                loss = loss_fn(model(chunk[:, :-1]), chunk[:, 1:]) / n_micro
            loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return statistics.median(time_op_s(cpu, one_step, warmup=WARMUP, iterations=TIMED))


def engine_one_rank_step_s(precision: str) -> float:
    cpu = torch.device("cpu")
    trainer = Trainer(request(Layout(mbs=MBS, gbs=GBS, precision=precision)), cpu, None)
    step = iter(range(WARMUP + TIMED))
    return statistics.median(time_op_s(cpu, lambda: trainer.step(next(step)), warmup=WARMUP, iterations=TIMED))


def engine_gang_step_s(gang: LocalGang, layout: Layout) -> float:
    results: list[RankResult] = gang.run(train_worker, request(layout), timeout_s=600)
    per_step: list[float] = [max(steps) for steps in zip(*(r.step_times_s for r in results), strict=True)]
    return statistics.median(per_step)


def request(layout: Layout) -> TrainRequest:
    return TrainRequest(SMALL, layout, warmup_steps=WARMUP, timed_steps=TIMED, learning_rate=LR)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    torch.set_num_threads(cores)
    cases: dict[str, list[float]] = {
        f"plain PyTorch loop, 1 process x {cores} threads": [],
        f"built-in engine, 1 rank x {cores} threads": [],
        f"built-in engine, PP=2 (1F1B), 2 ranks x {max(1, cores // 2)} threads": [],
        f"built-in engine, DP=2, 2 ranks x {max(1, cores // 2)} threads": [],
    }
    plain, one_rank, pp2, dp2 = cases.values()
    gang = LocalGang(2, device_type="cpu")
    started = time.perf_counter()
    try:
        for _ in range(args.rounds):
            plain.append(plain_loop_step_s(args.precision))
            one_rank.append(engine_one_rank_step_s(args.precision))
            pp2.append(engine_gang_step_s(gang, Layout(mbs=MBS, gbs=GBS, pp=2, precision=args.precision)))
            dp2.append(engine_gang_step_s(gang, Layout(mbs=MBS, gbs=GBS, dp=2, precision=args.precision)))
    finally:
        gang.close()
    tokens = GBS * SMALL.seq_len
    reference = statistics.median(plain)
    print(
        f"{SMALL.name} ({SMALL.n_layers} layers, dim {SMALL.dim}, seq {SMALL.seq_len}), GBS {GBS}, MBS {MBS}, "
        f"{args.precision}; {WARMUP} warm-up + {TIMED} timed steps; median of {args.rounds} rounds "
        f"({time.perf_counter() - started:.0f} s)"
    )
    print(f"  {'case':<58} {'step':>9} {'tokens/s':>9} {'vs plain':>9}")
    for name, samples in cases.items():
        step_s = statistics.median(samples)
        print(f"  {name:<58} {step_s * 1e3:7.1f}ms {tokens / step_s:9.0f} {(step_s / reference - 1) * 100:+8.1f}%")


if __name__ == "__main__":
    main()
