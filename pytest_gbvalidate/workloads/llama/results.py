"""What a training run gives back, whatever engine ran it: each rank's `RankResult`, and the run's figures that the
suite checks, from the built-in engine's ranks (`summarize`) or any engine's step times. No torch here."""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_gbvalidate.labels import number
from pytest_gbvalidate.workloads.llama import flops
from pytest_gbvalidate.workloads.llama.parallel import Layout

if TYPE_CHECKING:
    from pytest_gbvalidate.workloads.llama.request import TrainRequest

# The loss must end (mean of the last LOSS_TAIL_STEPS) more than this far below the first step's: shrinking the initial
# logits alone brings it to ln(vocab), a few percent; learning data.py's structure takes it far below. NeMo's random
# mock tokens cannot take it below ln(vocab): with them the loss need only fall.
MIN_LOSS_DROP_PCT = 10.0
MIN_LOSS_DROP_PCT_RANDOM_TOKENS = 0.0
LOSS_TAIL_STEPS = 3
GIB = 2**30


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
    # The timed steps' work before the gradient sync: a straggler shows here, not in the step times (all the slowest's).
    compute_times_s: list[float] = field(default_factory=list)


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
    peak: flops.Peak | None  # what mfu_pct divides by
    losses: list[float]
    vocab_size: int
    memory: list[MemoryPeak] = field(default_factory=list)  # per rank; empty where the engine reports none
    # Medians per rank, and per node (its slowest rank's), of the step time and of the work before the gradient sync
    # (RankResult.compute_times_s), from the built-in engine.
    per_node_step_time_s: dict[str, float] = field(default_factory=dict)
    per_rank_step_time_s: list[float] = field(default_factory=list)
    per_rank_compute_s: list[float] = field(default_factory=list)
    per_node_compute_s: dict[str, float] = field(default_factory=dict)
    # (slowest - fastest) / fastest of the ranks' medians of that work within a pipeline stage (the last one runs the
    # head and the loss), the largest of the stages'.
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
        curve = ", ".join(number(x) for x in self.losses)
        return (
            f"{self.model} {self.layout.label}: loss fell {self.loss_drop_pct:.1f}% from the first step to the mean "
            f"of the last {LOSS_TAIL_STEPS} (needs more than {self.min_loss_drop_pct:g}%); ln(vocab) = "
            f"{math.log(self.vocab_size):.3f}; loss per step: {curve}"
        )

    def peak_details(self) -> dict[str, Any]:
        """The peak the MFU divides by, as every output that shows the MFU carries it."""
        if self.peak is None:
            return {"peak_tflops_per_gpu": None}
        return {"peak_tflops_per_gpu": self.peak.tflops_per_gpu, "peak_tflops_source": self.peak.source}

    def details(self) -> dict[str, Any]:
        """Everything a report keeps about the run."""
        return {
            "model": self.model,
            "layout": self.scope,
            "engine": self.layout.engine,
            "precision": self.layout.precision,
            **self.layout.sizes(),
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
            **self.peak_details(),
            "loss_curve": self.losses,
            "loss_drop_pct": self.loss_drop_pct,
            "peak_memory": [{"rank": i, "what": m.what, "gib": m.gib} for i, m in enumerate(self.memory)],
            "per_node_step_time_s": self.per_node_step_time_s,
            "per_rank_step_time_s": self.per_rank_step_time_s,
            "per_node_compute_s": self.per_node_compute_s,
            "per_rank_compute_s": self.per_rank_compute_s,
            "rank_spread_pct": self.rank_spread_pct,
        }


def summarize(request: TrainRequest, results: list[RankResult], peak: flops.Peak | None) -> PretrainResult:
    """The run's figures from every rank's results (in rank order): a step takes as long as its slowest rank."""
    per_step = [max(steps) for steps in zip(*(r.step_times_s for r in results), strict=True)]
    losses = next(r.losses for r in results if r.losses is not None)
    result = pretrain_result(request, per_step, losses, [r.memory for r in results], peak)
    per_rank = [statistics.median(r.step_times_s) for r in results]
    complete = all(r.compute_times_s for r in results)
    per_rank_compute = [statistics.median(r.compute_times_s) for r in results] if complete else []
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
    peak: flops.Peak | None,
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
        mfu_pct=None if peak is None else flops.mfu_pct(tflops, peak),
        peak=peak,
        losses=losses,
        vocab_size=cfg.vocab_size,
        memory=memory,
    )
