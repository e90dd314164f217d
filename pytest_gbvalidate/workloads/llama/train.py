"""The built-in training engine: Llama 3 on synthetic tokens, in any valid layout, timed per optimizer step.

`train_worker(ctx, request)` is the SPMD function every rank of a gang runs; `summarize` turns the ranks'
results into the step time, throughput, MFU and loss curve the suite checks. On one rank, `train(request,
device)` runs the same steps without any process group (the reference the parallel layouts are tested against).
"""

from __future__ import annotations

import dataclasses
import gc
import math
import resource
import socket
import statistics
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.tensor import DTensor

from pytest_gbvalidate.bench.timing import Stopwatch, time_op_s
from pytest_gbvalidate.ranks.gang import RankContext
from pytest_gbvalidate.workloads.llama import flops
from pytest_gbvalidate.workloads.llama.config import LlamaConfig
from pytest_gbvalidate.workloads.llama.data import SyntheticTokens
from pytest_gbvalidate.workloads.llama.loss import linear_cross_entropy
from pytest_gbvalidate.workloads.llama.model import call_block, loss_fn
from pytest_gbvalidate.workloads.llama.parallel import Layout, LayoutError, validate
from pytest_gbvalidate.workloads.llama.parallelize import (
    RankGroups,
    average_gradients,
    build_groups,
    build_rank_model,
    context_parallel_positions,
)

if TYPE_CHECKING:
    from torch.distributed.pipelining.schedules import Schedule1F1B

# The loss must end (mean of the last LOSS_TAIL_STEPS steps) more than this far below the first step's loss.
# Shrinking the initial random logits alone brings the loss down to about ln(vocab), a few percent; learning
# the synthetic data's structure takes it far below (see data.py). The NeMo engines train on uniformly random
# mock tokens, which cannot take the loss below ln(vocab): with them the loss need only fall.
MIN_LOSS_DROP_PCT = 10.0
MIN_LOSS_DROP_PCT_RANDOM_TOKENS = 0.0
LOSS_TAIL_STEPS = 3
ADAMW_BETAS = (0.9, 0.95)
WEIGHT_DECAY = 0.1
GIB = 2**30


@dataclass(frozen=True)
class EngineOptions:
    """The engine's speed levers (benchmarks/pretrain_engine.py measures each against the others off)."""

    # torch.compile each transformer block (its recomputation too); the warm-up steps absorb the compilation.
    # Off unless asked for: the suite compiles where the SKU's baseline says so (`pretrain.compile`).
    compile: bool = False
    # torch.compile's backend: Inductor's generated kernels. Dynamo's tracing, guards and recompile accounting
    # are the same whatever the backend; the tests that check those choose "eager", which compiles in seconds.
    compile_backend: str = "inductor"
    chunked_loss: bool = True  # the head and the cross entropy chunk by chunk (loss.py): no whole logits
    fused_adamw: bool = True  # AdamW's single fused kernel rather than its multi-tensor (foreach) ones


@dataclass(frozen=True)
class TrainRequest:
    cfg: LlamaConfig
    layout: Layout
    warmup_steps: int
    timed_steps: int
    learning_rate: float
    seed: int = 0
    options: EngineOptions = EngineOptions()

    @property
    def steps(self) -> int:
        return self.warmup_steps + self.timed_steps


@dataclass(frozen=True)
class MemoryPeak:
    what: str  # "device max allocated" on an accelerator; "host RSS peak" (the whole process) on the CPU
    gib: float


@dataclass(frozen=True)
class RankResult:
    rank: int
    stage: int
    step_times_s: list[float]  # the timed steps
    losses: list[float] | None  # every step's global-batch loss; on ranks of the last pipeline stage only
    memory: MemoryPeak
    node: str = ""  # "node<rank of the node> (<hostname>)": which node of a torchrun / srun world
    # The timed steps' work before the gradient sync (forward, backward and the pipeline's own sends): a rank
    # the others wait for at the sync shows here, where every rank's step time is the slowest one's.
    compute_times_s: list[float] = field(default_factory=list)


class Trainer:
    """One rank's model, optimizer and (under PP) pipeline schedule; `step(i)` trains on global batch i."""

    def __init__(self, request: TrainRequest, device: torch.device, groups: RankGroups | None) -> None:
        cfg, layout = request.cfg, request.layout
        validate(cfg, layout)
        if layout.engine != "native":
            raise LayoutError(f"the built-in trainer runs the native engine, not {layout.engine!r}")
        if groups is None and layout.world_size != 1:
            raise LayoutError(f"layout {layout.label} needs {layout.world_size} ranks; train_worker builds them")
        self.request, self.device, self.groups = request, device, groups
        self.at = groups.at if groups is not None else None
        options = request.options
        self.model = build_rank_model(cfg, layout, groups, device, request.seed)
        # (the last stage's output, labels) -> the mean loss
        self.loss_fn: Callable[[Tensor, Tensor], Tensor] = loss_fn
        if options.chunked_loss and self.model.output is not None:
            head = self.model.output
            self.model.head_in_loss = True
            # A closure over the head, not over self: the trainer -> loss function -> head, no cycle.
            self.loss_fn = lambda h, labels: linear_cross_entropy(h, head.weight, labels)
        if options.compile:
            # Every block of every run goes through one code object, whose dynamo cache keeps an entry per guard
            # set seen: a recomputation mode, a precision, a head width, a first change of a tensor shape, and so on.
            # A long-lived rank trains many runs (a layout sweep); past torch._dynamo.config.recompile_limit (8)
            # entries dynamo stops compiling and runs the blocks eager with only a warning, and later runs would
            # time an uncompiled engine. So each compiled run starts with dynamo's caches empty: it compiles for
            # itself (the warm-up steps absorb that; Inductor's on-disk cache keeps a repeated shape cheap), and
            # nothing an earlier run compiled stays referenced. Raising the limit would only postpone the fallback.
            torch._dynamo.reset()
            # Held by the model (model.py, call_block): no reference back to any block.
            self.model.call_block = torch.compile(call_block, backend=options.compile_backend)
        self.optimizer = adamw(self.model, request.learning_rate, fused=options.fused_adamw)
        self.compute = Stopwatch(device)
        self.is_last_stage = self.at is None or self.at.pp == layout.pp - 1
        self.schedule = self._pipeline() if layout.pp > 1 else None
        self.batches = self._batches()

    def _pipeline(self) -> Schedule1F1B:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B

        assert self.groups is not None
        layout = self.request.layout
        if dist.get_backend(self.groups.pp_group) == "gloo" and torch_release() < (2, 10):
            raise LayoutError(
                f"pipeline parallelism (PP={layout.pp}) over gloo needs torch >= 2.10; this is torch "
                f"{torch.__version__}, whose pipeline schedule opens each stage's links by sending an int64 into a "
                "float32 buffer, which gloo aborts on (NCCL, on GPUs, is not affected)"
            )
        stage = PipelineStage(self.model, self.groups.at.pp, layout.pp, self.device, group=self.groups.pp_group)
        # The schedule averages gradients over microbatches (scale_grads), as the single-rank loop below does.
        return Schedule1F1B(stage, layout.microbatches, loss_fn=self.loss_fn)

    def _batches(self) -> list[tuple[Tensor, Tensor]]:
        """This rank's share of every step's global batch, made before timing starts: (inputs, labels)."""
        cfg, layout = self.request.cfg, self.request.layout
        data = SyntheticTokens(cfg.vocab_size, cfg.seq_len, self.request.seed)
        dp_rank = self.at.dp if self.at is not None else 0
        cp_rank = self.at.cp if self.at is not None else 0
        positions = context_parallel_positions(cfg.seq_len, layout.cp, cp_rank) if layout.cp > 1 else None
        out = []
        for i in range(self.request.steps):
            mine = data.batch(i, layout.gbs).chunk(layout.dp)[dp_rank]  # (gbs / dp, seq + 1)
            inputs, labels = mine[:, :-1], mine[:, 1:]  # (gbs / dp, seq) each
            if positions is not None:
                inputs, labels = inputs[:, positions], labels[:, positions]  # (gbs / dp, seq / cp)
            # Contiguous: pipelining up to torch 2.11 records a stage's input strides from a contiguous copy and
            # rejects a strided slice of the batch on every later step.
            out.append((inputs.contiguous().to(self.device), labels.contiguous().to(self.device)))
        return out

    def autocast(self) -> AbstractContextManager[Any]:
        if self.request.layout.precision in ("bf16", "fp8"):
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return nullcontext()

    def step(self, index: int) -> Tensor | None:
        """One optimizer step on global batch `index`; the global batch's loss on the last pipeline stage, left
        on the device (reading it would make the host wait for the step)."""
        inputs, labels = self.batches[index]
        layout = self.request.layout
        self.compute.start()
        with self.autocast():
            if self.schedule is not None:
                losses: list[Tensor] = []
                if self.groups is not None and self.groups.is_first_stage:
                    self.schedule.step(inputs)
                elif self.is_last_stage:
                    self.schedule.step(target=labels, losses=losses)
                else:
                    self.schedule.step()
                loss = torch.stack(losses).mean().detach() if self.is_last_stage else None
            else:
                loss = torch.zeros((), device=self.device)
                for x, y in zip(inputs.chunk(layout.microbatches), labels.chunk(layout.microbatches), strict=True):
                    microbatch_loss = self.loss_fn(self.model(x), y) / layout.microbatches
                    microbatch_loss.backward()  # type: ignore[no-untyped-call]
                    loss += microbatch_loss.detach()
        self.compute.stop()
        replicas = self.groups.replica_group if self.groups is not None else None
        average_gradients(self.model, replicas)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if loss is None:
            return None
        if replicas is not None and dist.get_world_size(replicas) > 1:
            dist.all_reduce(loss, group=replicas)
            loss /= dist.get_world_size(replicas)
        return loss


def torch_release(version: str = torch.__version__) -> tuple[int, int]:
    """(major, minor) of a torch version, pre-release and local parts aside: 2.10.0a0+b558c986e8.nv25.11 -> (2, 10)."""
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def adamw(model: torch.nn.Module, learning_rate: float, *, fused: bool) -> torch.optim.AdamW:
    """AdamW with its fused kernel or its multi-tensor (foreach) ones, the same on every device so the CPU runs
    the GPU's code. Neither can mix DTensors (tensor-parallel weights) and plain tensors in one call, hence one
    parameter group each."""
    params = list(model.parameters())
    sharded = [p for p in params if isinstance(p, DTensor)]
    plain = [p for p in params if not isinstance(p, DTensor)]
    groups = [{"params": group} for group in (sharded, plain) if group]
    kernel = {"fused": True} if fused else {"foreach": True}
    return torch.optim.AdamW(groups, lr=learning_rate, betas=ADAMW_BETAS, weight_decay=WEIGHT_DECAY, **kernel)


def train(request: TrainRequest, device: torch.device, groups: RankGroups | None = None) -> RankResult:
    """Train `request.steps` steps on this rank; time the steps after the warm-up ones."""
    if device.type != "cpu":
        torch.accelerator.reset_peak_memory_stats(device)
    trainer = Trainer(request, device, groups)
    losses: list[Tensor | None] = []

    def one_step() -> None:
        losses.append(trainer.step(len(losses)))

    times_s = time_op_s(device, one_step, warmup=request.warmup_steps, iterations=request.timed_steps)
    known = [float(x) for x in losses if x is not None]
    return RankResult(
        rank=dist.get_rank() if groups is not None else 0,
        stage=trainer.at.pp if trainer.at is not None else 0,
        step_times_s=times_s,
        losses=known if len(known) == len(losses) else None,
        memory=memory_peak(device),
        compute_times_s=trainer.compute.intervals_s()[request.warmup_steps :],
    )


def train_worker(ctx: RankContext, request: TrainRequest) -> RankResult:
    """The SPMD entry point: every rank of a gang (whose default process group is up) calls this."""
    # A long-lived rank (a layout sweep) trains run after run: whatever of an earlier run only the cyclic collector
    # frees goes before this one allocates. (Seen: an eager context-parallel run's weights are freed only by the
    # collector, on torch 2.13; where the cycle is, ours or torch's, is not known.)
    gc.collect()
    groups = build_groups(request.layout, ctx.device) if request.layout.world_size > 1 else None
    result = train(request, ctx.device, groups)
    return dataclasses.replace(result, node=f"node{ctx.node_rank} ({socket.gethostname()})")


def memory_peak(device: torch.device) -> MemoryPeak:
    if device.type != "cpu":
        return MemoryPeak("device max allocated", torch.accelerator.max_memory_allocated(device) / GIB)
    # The CPU has no allocator statistics: the process's resident set peak (torch itself included) stands in.
    rss_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return MemoryPeak("host RSS peak", rss_peak * (1 if sys.platform == "darwin" else 1024) / GIB)


# --- the run's figures --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PretrainResult:
    model: str
    layout: Layout
    seq_len: int
    warmup_steps: int
    timed_steps: int
    step_time_s: float  # median over the timed steps of the slowest rank's step
    step_times_s: list[float]
    tokens_per_step: int
    tokens_per_s_per_gpu: float
    model_tflops_per_gpu: float
    flops_per_token: int
    mfu_pct: float | None  # None where the baseline gives no peak
    peak_tflops_per_gpu: float | None
    losses: list[float]
    vocab_size: int
    memory: list[MemoryPeak] = field(default_factory=list)  # per rank; empty where the engine reports none
    # Per node, its slowest rank's median step time (the built-in engine; a node's own figure across nodes).
    per_node_step_time_s: dict[str, float] = field(default_factory=dict)
    # Per rank, its median step time: about the same on every rank, as the gradient sync waits for the slowest.
    per_rank_step_time_s: list[float] = field(default_factory=list)
    # Per rank and per node (its slowest rank), the median time of the work before the gradient sync: where a
    # straggler shows.
    per_rank_compute_s: list[float] = field(default_factory=list)
    per_node_compute_s: dict[str, float] = field(default_factory=dict)
    # (slowest - fastest) / fastest of the ranks' medians of that work, within a pipeline stage (stages differ by
    # design: the last one runs the head and the loss); the largest of the stages'.
    rank_spread_pct: float | None = None

    @property
    def scope(self) -> str:
        """The label a baseline keeps this run's figures under: engine, precision, layout, sequence length."""
        return f"{self.layout.label}-seq{self.seq_len}"

    @property
    def loss_drop_pct(self) -> float:
        tail = statistics.fmean(self.losses[-LOSS_TAIL_STEPS:])
        return 100.0 * (self.losses[0] - tail) / self.losses[0]

    @property
    def loss_decreased(self) -> bool:
        return all(math.isfinite(x) for x in self.losses) and self.loss_drop_pct > self.min_loss_drop_pct

    @property
    def min_loss_drop_pct(self) -> float:
        native = self.layout.engine == "native"
        return MIN_LOSS_DROP_PCT if native else MIN_LOSS_DROP_PCT_RANDOM_TOKENS

    def loss_message(self) -> str:
        curve = ", ".join(f"{x:.4g}" for x in self.losses)
        return (
            f"{self.model} {self.layout.label}: loss fell {self.loss_drop_pct:.1f}% from the first step to the mean "
            f"of the last {LOSS_TAIL_STEPS} (needs more than {self.min_loss_drop_pct:g}%); ln(vocab) = "
            f"{math.log(self.vocab_size):.3f}; loss per step: {curve}"
        )

    def details(self) -> dict[str, Any]:
        """Everything a report keeps about the run."""
        return {
            "model": self.model,
            "layout": self.scope,
            "engine": self.layout.engine,
            "precision": self.layout.precision,
            "mbs": self.layout.mbs,
            "gbs": self.layout.gbs,
            "tp": self.layout.tp,
            "pp": self.layout.pp,
            "cp": self.layout.cp,
            "dp": self.layout.dp,
            "seq_len": self.seq_len,
            "warmup_steps": self.warmup_steps,
            "timed_steps": self.timed_steps,
            "step_time_s": self.step_time_s,
            "step_times_s": self.step_times_s,
            "tokens_per_step": self.tokens_per_step,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "model_tflops_per_gpu": self.model_tflops_per_gpu,
            "flops_per_token": self.flops_per_token,
            "mfu_pct": self.mfu_pct,
            "peak_tflops_per_gpu": self.peak_tflops_per_gpu,
            "loss_curve": self.losses,
            "loss_drop_pct": self.loss_drop_pct,
            "peak_memory": [{"rank": i, "what": m.what, "gib": m.gib} for i, m in enumerate(self.memory)],
            "per_node_step_time_s": self.per_node_step_time_s,
            "per_rank_step_time_s": self.per_rank_step_time_s,
            "per_node_compute_s": self.per_node_compute_s,
            "per_rank_compute_s": self.per_rank_compute_s,
            "rank_spread_pct": self.rank_spread_pct,
        }


def summarize(request: TrainRequest, results: list[RankResult], peak_tflops_per_gpu: float | None) -> PretrainResult:
    """The run's figures from every rank's results (in rank order): a step takes as long as its slowest rank."""
    per_step = [max(steps) for steps in zip(*(r.step_times_s for r in results), strict=True)]
    losses = next(r.losses for r in results if r.losses is not None)
    result = pretrain_result(request, per_step, losses, [r.memory for r in results], peak_tflops_per_gpu)
    per_rank = [statistics.median(r.step_times_s) for r in results]
    per_rank_compute = [statistics.median(r.compute_times_s) for r in results if r.compute_times_s]
    if len(per_rank_compute) != len(results):
        per_rank_compute = []
    return dataclasses.replace(
        result,
        per_node_step_time_s=_slowest_per_node(results, per_rank),
        per_rank_step_time_s=per_rank,
        per_rank_compute_s=per_rank_compute,
        per_node_compute_s=_slowest_per_node(results, per_rank_compute) if per_rank_compute else {},
        rank_spread_pct=_spread_within_stages(results, per_rank_compute or per_rank),
    )


def _spread_within_stages(results: list[RankResult], per_rank_s: list[float]) -> float | None:
    by_stage: dict[int, list[float]] = {}
    for r, seconds in zip(results, per_rank_s, strict=True):
        by_stage.setdefault(r.stage, []).append(seconds)
    spreads = [(max(times) - min(times)) / min(times) * 100 for times in by_stage.values() if len(times) > 1]
    return round(max(spreads), 3) if spreads else None


def _slowest_per_node(results: list[RankResult], per_rank_s: list[float]) -> dict[str, float]:
    per_node: dict[str, float] = {}
    for r, seconds in zip(results, per_rank_s, strict=True):
        per_node[r.node] = max(per_node.get(r.node, 0.0), seconds)
    return per_node


def pretrain_result(
    request: TrainRequest,
    step_times_s: list[float],
    losses: list[float],
    memory: list[MemoryPeak],
    peak_tflops_per_gpu: float | None,
) -> PretrainResult:
    """The figures of a run whose timed steps took `step_times_s`, whatever engine ran it."""
    layout, cfg = request.layout, request.cfg
    step_time_s = statistics.median(step_times_s)
    tokens_per_step = layout.gbs * cfg.seq_len
    tokens_per_s_per_gpu = tokens_per_step / step_time_s / layout.world_size
    tflops = flops.model_tflops_per_gpu(cfg, tokens_per_s_per_gpu)
    return PretrainResult(
        model=cfg.name,
        layout=layout,
        seq_len=cfg.seq_len,
        warmup_steps=request.warmup_steps,
        timed_steps=request.timed_steps,
        step_time_s=step_time_s,
        step_times_s=step_times_s,
        tokens_per_step=tokens_per_step,
        tokens_per_s_per_gpu=tokens_per_s_per_gpu,
        model_tflops_per_gpu=tflops,
        flops_per_token=flops.train_flops_per_token(cfg),
        mfu_pct=None if peak_tflops_per_gpu is None else flops.mfu_pct(tflops, peak_tflops_per_gpu),
        peak_tflops_per_gpu=peak_tflops_per_gpu,
        losses=losses,
        vocab_size=cfg.vocab_size,
        memory=memory,
    )
