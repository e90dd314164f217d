"""The built-in pretraining engine against a plain PyTorch training loop and with each of its speed levers, side by
side in one run, on the device present (CUDA if there is one, else the CPU): the first step's time (compilation
included), step time, tokens/s, MFU, peak memory and the engine's own memory estimate for the case, and the loss
after the last step. A line per case goes to stderr as it ends; the table, to stdout, at the end.

    python benchmarks/pretrain_engine.py [--shape h100|gb200-stage|small|tiny] [--layers N] [--rounds 1] [--steps 3+10]
                                         [--peak-tflops 989] [--cases plain,off,...] [--eager]
                                         [--profile all,...]

Shapes: `h100` is Llama 3 8B's block shape with 4 layers at seq 8192, MBS 1, GBS 4, bf16 (the shape the engine's
MFU targets were set at on one H100; the CUDA default); `small` 4 layers of dim 256 at seq 256, GBS 16, MBS 4 (the
CPU default); `gb200-stage` one pipeline stage of the ND GB200 v6 check (16 blocks with the embedding and the
head, MBS 4, GBS 8: it needs an H200's memory with `all-full-ac`, the check's levers); `tiny` the cpu SKU's
model, for the tests. Each round runs every case once with a fresh model, so
all cases see the same machine load; the figures are medians over rounds of each case's median step. Cases:

    plain            the textbook loop: the same model module, whole logits, fused AdamW, autocast
    plain-compile    the same with torch.compile(model)
    off              the engine with every lever off: whole logits, foreach AdamW, eager
    fused-adamw      the engine with only AdamW's fused kernel
    chunked-loss     the engine with only the chunked head + loss (loss.py)
    compile          the engine with only compiled blocks
    all              the engine with its default levers on (compiled blocks and loss, chunked loss, fused AdamW)
    all-full-ac      those, every block recomputed in the backward pass
    all-selective-ac those, each block's elementwise work recomputed (matmuls and attention kept)
    all-fp8          those, fp8 matmuls in the blocks (a GPU of compute capability 8.9 or later, or the CPU)
    all-fp8-exact    the same with the forward GEMMs' exact accumulation, not Hopper's fast one (what it buys)
    all-grad-fusion  those, and each weight gradient added into its fp32 .grad by the backward pass, in the GEMM
                     itself on CUDA (grad_accumulation.py; the case's line says which way it ran)
    all-fp8-grad-fusion  the same in fp8
    all-one-pass-loss    those, and the compiled loss's softmax gradient written in one pass
                         (loss.softmax_grad_one_pass; the same as all with --eager)
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from unittest import mock

import torch
import torch._dynamo
from torch.profiler import DeviceType

from pytest_gbvalidate.bench.timing import time_op_s
from pytest_gbvalidate.workloads.llama import flops, fp8, memory
from pytest_gbvalidate.workloads.llama.config import LLAMA3_8B, LLAMA3_TINY, LlamaConfig
from pytest_gbvalidate.workloads.llama.data import SyntheticTokens
from pytest_gbvalidate.workloads.llama.grad_accumulation import gemm_adds_into_fp32
from pytest_gbvalidate.workloads.llama.model import build, loss_fn
from pytest_gbvalidate.workloads.llama.parallel import Layout
from pytest_gbvalidate.workloads.llama.request import EngineOptions, TrainRequest
from pytest_gbvalidate.workloads.llama.train import ADAMW_BETAS, WEIGHT_DECAY, Trainer, memory_peak

LR = 3e-4
PROFILE_ROWS = 25


@dataclass(frozen=True)
class Shape:
    cfg: LlamaConfig
    mbs: int
    gbs: int
    precision: str


SHAPES = {
    "h100": Shape(dataclasses.replace(LLAMA3_8B, n_layers=4), mbs=1, gbs=4, precision="bf16"),
    "small": Shape(
        LlamaConfig(
            "llama3_small", n_layers=4, dim=256, n_heads=8, n_kv_heads=4, ffn_dim=704, vocab_size=4096, seq_len=256
        ),
        mbs=4,
        gbs=16,
        precision="fp32",
    ),
    "tiny": Shape(LLAMA3_TINY, mbs=2, gbs=4, precision="fp32"),
    # One pipeline stage of the ND GB200 v6 check (16 of Llama 3 8B's 32 blocks, MBS 4) on one GPU, with the
    # embedding and the head both (each real stage holds one of them); GBS 8 keeps it to two microbatches a step.
    "gb200-stage": Shape(dataclasses.replace(LLAMA3_8B, n_layers=16), mbs=4, gbs=8, precision="bf16"),
}
OFF = EngineOptions(compile=False, chunked_loss=False, fused_adamw=False)
ALL = EngineOptions(compile=True, chunked_loss=True, fused_adamw=True)
# case -> (engine options, activation checkpointing, precision override); None for the plain loops
ENGINE_CASES: dict[str, tuple[EngineOptions, str, str | None]] = {
    "off": (OFF, "none", None),
    "fused-adamw": (dataclasses.replace(OFF, fused_adamw=True), "none", None),
    "chunked-loss": (dataclasses.replace(OFF, chunked_loss=True), "none", None),
    "compile": (dataclasses.replace(OFF, compile=True), "none", None),
    "all": (ALL, "none", None),
    "all-full-ac": (ALL, "full", None),
    "all-selective-ac": (ALL, "selective", None),
    "all-fp8": (ALL, "none", "fp8"),
    "all-fp8-exact": (ALL, "none", "fp8"),  # the same with the forward GEMM's exact accumulation (fp8.py)
    "all-grad-fusion": (dataclasses.replace(ALL, grad_accumulation_fusion=True), "none", None),
    "all-fp8-grad-fusion": (dataclasses.replace(ALL, grad_accumulation_fusion=True), "none", "fp8"),
    "all-one-pass-loss": (dataclasses.replace(ALL, loss_grad_one_pass=True), "none", None),
}
CASES = ("plain", "plain-compile", *ENGINE_CASES)


@dataclass
class Sample:
    first_step_s: float  # the first warm-up step alone: compilation, allocator growth, kernel choices
    step_s: float
    peak_gib: float | None
    estimate_gib: float | None
    loss: float


def plain_loop(shape: Shape, device: torch.device, warmup: int, timed: int, compiled: bool) -> Sample:
    """The model trained the textbook way: one process, gradient accumulation over microbatches, AdamW."""
    model = build(shape.cfg, device, seed=0)
    step_model: Callable[[torch.Tensor], torch.Tensor] = torch.compile(model) if compiled else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=ADAMW_BETAS, weight_decay=WEIGHT_DECAY, fused=True)
    data = SyntheticTokens(shape.cfg.vocab_size, shape.cfg.seq_len, seed=0)
    batches = [data.batch(i, shape.gbs).to(device) for i in range(warmup + timed)]
    n_micro = shape.gbs // shape.mbs
    losses: list[torch.Tensor] = []

    def one_step() -> None:
        tokens = batches[len(losses)]
        total = torch.zeros((), device=device)
        for chunk in tokens.chunk(n_micro):
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=shape.precision != "fp32"):
                loss = loss_fn(step_model(chunk[:, :-1]), chunk[:, 1:]) / n_micro
            loss.backward()  # type: ignore[no-untyped-call]
            total += loss.detach()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(total)

    first_s, times = time_steps(device, one_step, warmup, timed)
    return Sample(first_s, statistics.median(times), _peak_gib(device), None, float(losses[-1]))


def profile_step(device: torch.device, step: Callable[[], None], rows: int = PROFILE_ROWS) -> str:
    """One more step under torch's profiler: what took the most time, as lines of ms per step and the share of the
    step's total (on a GPU, the kernels and copies on the device; on the CPU, the operators' own CPU time); then the
    matmuls by shape, with the rate each ran at."""
    on_device = device.type != "cpu"
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities, record_shapes=True) as profiler:
        step()
        if on_device:
            torch.accelerator.synchronize(device)
    events = profiler.key_averages()
    # On the device, kernels and copies only: an operator's device time is its kernels', listed themselves, and a
    # range (optimizer.step's) has a device-side twin of the same name that spans kernels listed already.
    on_host = {event.key for event in events if event.device_type == DeviceType.CPU}
    times_us: dict[str, float] = {}
    for event in events:
        if on_device and (event.key in on_host or event.is_user_annotation):
            continue
        spent_us = event.self_device_time_total if on_device else event.self_cpu_time_total
        times_us[event.key] = times_us.get(event.key, 0.0) + spent_us
    total_us = sum(times_us.values()) or 1.0
    top = sorted(times_us.items(), key=lambda item: -item[1])[:rows]
    lines = [f"  {'device' if on_device else 'CPU'} time in the step: {total_us / 1e3:.1f} ms"]
    lines += [f"  {us / 1e3:8.2f} ms {us / total_us * 100:5.1f}%  {name[:110]}" for name, us in top]
    lines.append("  matmuls by shape (an operator's own kernels; under torch.compile too):")
    by_shape = matmuls_by_shape(profiler.key_averages(group_by_input_shape=True), on_device)
    for name, flop, calls, spent_us in by_shape[:rows]:
        lines.append(f"  {spent_us / 1e3:8.2f} ms {calls:4d} calls {flop * calls / spent_us / 1e6:8.3g} TFLOPS  {name}")
    return "\n".join(lines)


MATMULS = ("aten::mm", "aten::addmm", "aten::_scaled_mm")


def matmuls_by_shape(events: Any, on_device: bool) -> list[tuple[str, float, int, float]]:
    """(the operator and its operands' shapes, FLOPs of one call, calls, time in us), the longest first: a matmul of
    (m, k) by (k, n) is 2mkn FLOPs. `events`: the profiler's averages grouped by input shape."""
    found = []
    for event in events:
        if event.key not in MATMULS or event.device_type != DeviceType.CPU:
            continue
        shapes = [shape for shape in event.input_shapes if len(shape) == 2]  # addmm's bias and scalars aside
        spent_us = event.self_device_time_total if on_device else event.self_cpu_time_total
        if len(shapes) < 2 or spent_us <= 0:
            continue
        (m, k), (_, n) = shapes[0], shapes[1]
        name = f"{event.key} {shapes[0]} x {shapes[1]}"
        found.append((name, 2.0 * m * k * n, event.count, spent_us))
    return sorted(found, key=lambda row: -row[3])


def engine(
    shape: Shape, device: torch.device, warmup: int, timed: int, case: str, eager: bool, profile: bool = False
) -> Sample:
    options, checkpointing, precision = ENGINE_CASES[case]
    options = dataclasses.replace(options, compile=options.compile and not eager)
    layout = Layout(
        mbs=shape.mbs, gbs=shape.gbs, precision=precision or shape.precision, activation_checkpointing=checkpointing
    )
    request = TrainRequest(shape.cfg, layout, warmup, timed, LR, options=options)
    estimate = memory.busiest(
        memory.estimate(shape.cfg, layout, chunked_loss=options.chunked_loss, compiled=options.compile)
    ).total_gib
    trainer = Trainer(request, device, None)
    if options.grad_accumulation_fusion:
        way = "by the GEMM, in fp32" if gemm_adds_into_fp32(device) else "in place after each GEMM"
        print(f"{case}: weight gradients added into .grad {way}", file=sys.stderr, flush=True)
    losses: list[torch.Tensor | None] = []
    with mock.patch.object(fp8, "FORWARD_FAST_ACCUM", case != "all-fp8-exact"):
        first_s, times = time_steps(device, lambda: losses.append(trainer.step(len(losses))), warmup, timed)
        if profile:  # one step past the timed ones (the batches are made for these only: the last one again)
            report = profile_step(device, lambda: losses.append(trainer.step(len(losses) - 1)))
            print(f"{case}, one step profiled:\n{report}", file=sys.stderr, flush=True)
            losses.pop()
    return Sample(first_s, statistics.median(times), _peak_gib(device), estimate, float(losses[-1] or 0.0))


def time_steps(device: torch.device, step: Callable[[], None], warmup: int, timed: int) -> tuple[float, list[float]]:
    """(the first warm-up step's seconds on the host clock, each timed step's seconds)."""
    if warmup < 1:
        raise ValueError(f"at least one warm-up step is needed (it compiles), got {warmup}")
    started = time.perf_counter()
    step()
    if device.type != "cpu":
        torch.accelerator.synchronize(device)
    first_s = time.perf_counter() - started
    return first_s, time_op_s(device, step, warmup=warmup - 1, iterations=timed)


def _peak_gib(device: torch.device) -> float | None:
    return None if device.type == "cpu" else memory_peak(device).gib


def has_fp8(device: torch.device) -> bool:
    return device.type == "cpu" or (device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9))


def run_case(
    shape: Shape, device: torch.device, warmup: int, timed: int, case: str, eager: bool, profile: bool = False
) -> Sample:
    # Every case runs in this one process: each starts clean, so its peak is its own. Nothing of an earlier case
    # should be left (the engine keeps no reference cycle), but a cycle in the plain loops or in torch would hold
    # its tensors until the cyclic collector ran, and empty_cache cannot free what is still referenced; dynamo's
    # caches of earlier cases' compilations go too (the engine resets them itself, the plain loop does not).
    gc.collect()
    torch._dynamo.reset()
    if device.type != "cpu":
        torch.accelerator.empty_cache()
        torch.accelerator.reset_peak_memory_stats(device)
    if case.startswith("plain"):
        return plain_loop(shape, device, warmup, timed, compiled=case == "plain-compile")
    return engine(shape, device, warmup, timed, case, eager, profile)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--shape", choices=sorted(SHAPES), default=None)
    parser.add_argument("--layers", type=int, help="the shape with this many transformer blocks")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--steps", default="3+10", help="warm-up + timed steps per case")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the device's dense peak, for MFU")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--eager", action="store_true", help="compile nothing: leave out the compile cases")
    parser.add_argument("--profile", default="", help="engine cases to profile one step more of (to stderr)")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shape = SHAPES[args.shape or ("h100" if device.type == "cuda" else "small")]
    if args.layers is not None:
        if args.layers < 1:
            parser.error(f"--layers takes a positive number of blocks, not {args.layers}")
        # More blocks beside the same embedding, head and loss: what their share of a step does with depth.
        shape = dataclasses.replace(shape, cfg=dataclasses.replace(shape.cfg, n_layers=args.layers))
    warmup, timed = (int(x) for x in args.steps.split("+"))
    cases = [c for c in args.cases.split(",") if c]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        parser.error(f"unknown cases {', '.join(unknown)}; known: {', '.join(CASES)}")
    if args.eager:
        cases = [c for c in cases if c not in ("plain-compile", "compile")]
    fp8_cases = [c for c in cases if c.startswith("all-fp8")]
    if fp8_cases and not has_fp8(device):
        print(f"{', '.join(fp8_cases)} left out: {torch.cuda.get_device_name(device)} has no fp8 matmuls")
        cases = [c for c in cases if c not in fp8_cases]
    profiled = {c for c in args.profile.split(",") if c}
    if profiled - set(ENGINE_CASES):
        not_engine = ", ".join(sorted(profiled - set(ENGINE_CASES)))
        parser.error(f"--profile takes engine cases, not {not_engine}; engine cases: {', '.join(ENGINE_CASES)}")
    samples: dict[str, list[Sample]] = {case: [] for case in cases}
    started = time.perf_counter()
    for round_index in range(args.rounds):
        for case in cases:
            profile = case in profiled and round_index == 0
            sample = run_case(shape, device, warmup, timed, case, args.eager, profile)
            samples[case].append(sample)
            # A line per case as it ends: a run stopped part-way still leaves what it measured.
            print(f"{case}: {sample} at {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    cfg = shape.cfg
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    # The MFU says against what: the peak given, and that it is the one given on the command line.
    peak_given = None if args.peak_tflops is None else flops.Peak(args.peak_tflops, "--peak-tflops")
    print(
        f"{cfg.name} ({cfg.n_layers} layers, dim {cfg.dim}, vocab {cfg.vocab_size}, seq {cfg.seq_len}), MBS "
        f"{shape.mbs}, GBS {shape.gbs}, {shape.precision}, on {name}, torch {torch.__version__}; {warmup} warm-up + "
        f"{timed} timed steps; median of {args.rounds} round(s) ({time.perf_counter() - started:.0f} s); MFU "
        f"against {'no peak (pass --peak-tflops)' if peak_given is None else peak_given.describe()}"
    )
    columns = (
        ("first", 7),
        ("step", 10),
        ("tokens/s", 10),
        ("MFU", 7),
        ("peak GiB", 9),
        ("estimate", 9),
        ("est err", 8),
        ("loss", 8),
        ("vs plain", 9),
    )
    print(f"  {'case':<19} " + " ".join(f"{title:>{width}}" for title, width in columns))
    tokens = shape.gbs * cfg.seq_len
    reference = statistics.median(s.step_s for s in samples["plain"]) if "plain" in samples else None
    for case, runs in samples.items():
        step_s = statistics.median(s.step_s for s in runs)
        mfu = "-"
        if peak_given is not None:
            mfu = f"{flops.mfu_pct(flops.model_tflops_per_gpu(cfg, tokens / step_s), peak_given):.1f}%"
        peak, estimate = runs[-1].peak_gib, runs[-1].estimate_gib
        vs = f"{(step_s / reference - 1) * 100:+.1f}%" if reference else "-"
        error = "-" if peak is None or estimate is None else f"{(estimate / peak - 1) * 100:+.1f}%"
        print(
            f"  {case:<19} {runs[-1].first_step_s:6.1f}s {step_s * 1e3:8.1f}ms {tokens / step_s:10.0f} {mfu:>7} "
            f"{'-' if peak is None else f'{peak:.3g}':>9} {'-' if estimate is None else f'{estimate:.3g}':>9} "
            f"{error:>8} {runs[-1].loss:8.4f} {vs:>9}"
        )


if __name__ == "__main__":
    main()
