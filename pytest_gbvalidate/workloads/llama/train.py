"""The built-in training engine: Llama 3 on synthetic tokens, in any valid layout, timed per optimizer step, by
`train_worker` on every rank of a gang, or by `train` on one without a process group (the layouts' reference)."""

from __future__ import annotations

import dataclasses
import gc
import resource
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.tensor import DTensor

from pytest_gbvalidate import labels
from pytest_gbvalidate.bench.timing import Stopwatch, time_op_s
from pytest_gbvalidate.ranks.gang import RankContext
from pytest_gbvalidate.workloads.llama.data import SyntheticTokens
from pytest_gbvalidate.workloads.llama.grad_accumulation import fuse_gradient_accumulation, main_grad
from pytest_gbvalidate.workloads.llama.loss import linear_cross_entropy, softmax_grad, softmax_grad_one_pass
from pytest_gbvalidate.workloads.llama.model import call_block, loss_fn
from pytest_gbvalidate.workloads.llama.parallel import LayoutError, validate
from pytest_gbvalidate.workloads.llama.parallelize import (
    RankGroups,
    average_gradients,
    build_groups,
    build_rank_model,
    context_parallel_positions,
)
from pytest_gbvalidate.workloads.llama.request import TrainRequest
from pytest_gbvalidate.workloads.llama.results import GIB, MemoryPeak, RankResult

if TYPE_CHECKING:
    from torch.distributed.pipelining.schedules import Schedule1F1B

ADAMW_BETAS = (0.9, 0.95)
WEIGHT_DECAY = 0.1


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
        self.fused_grads = options.grad_accumulation_fusion
        in_gemm = False
        if self.fused_grads:
            if layout.tp > 1:
                raise LayoutError(f"gradient-accumulation fusion takes plain weights, not TP={layout.tp}'s shards")
            if layout.pp > 1:
                # torch's pipeline schedule (2.13) learns its stages' gradient shapes from a backward pass of its own
                # (autograd.grad for the inputs only), which would add into the weights' gradients here.
                raise LayoutError(f"gradient-accumulation fusion runs without pipeline stages, not PP={layout.pp}")
            in_gemm = fuse_gradient_accumulation(self.model, device)
        # (the last stage's output, labels) -> the mean loss
        self.loss_fn: Callable[[Tensor, Tensor], Tensor] = loss_fn
        if options.compile:
            # Every run's blocks share one code object: past dynamo's recompile_limit (8) guard sets a long-lived rank
            # (a layout sweep) would run them eager, with only a warning. The warm-up absorbs the recompile.
            torch._dynamo.reset()
            self.model.call_block = torch.compile(call_block, backend=options.compile_backend)
        if options.chunked_loss and self.model.output is not None:
            head = self.model.output
            self.model.head_in_loss = True
            chunk_grad = softmax_grad
            if options.compile:  # with the blocks: one fused pass or two over each chunk's logits, not several
                one_pass = softmax_grad_one_pass if options.loss_grad_one_pass else softmax_grad
                chunk_grad = torch.compile(one_pass, backend=options.compile_backend)
            fused_grads = self.fused_grads

            # A closure over the head, not over self: the trainer -> loss function -> head, no cycle.
            def head_loss(h: Tensor, labels: Tensor) -> Tensor:
                grad = main_grad(head.weight) if fused_grads else None
                return linear_cross_entropy(
                    h, head.weight, labels, chunk_grad=chunk_grad, main_grad=grad, in_gemm=in_gemm
                )

            self.loss_fn = head_loss
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
        dp_rank, cp_rank = (self.at.dp, self.at.cp) if self.at is not None else (0, 0)
        positions = context_parallel_positions(cfg.seq_len, layout.cp, cp_rank) if layout.cp > 1 else None
        out = []
        for i in range(self.request.steps):
            mine = data.batch(i, layout.gbs).chunk(layout.dp)[dp_rank]  # (gbs / dp, seq + 1)
            inputs, labels = mine[:, :-1], mine[:, 1:]  # (gbs / dp, seq) each
            if positions is not None:
                inputs, labels = inputs[:, positions], labels[:, positions]  # (gbs / dp, seq / cp)
            # Contiguous: pipelining up to torch 2.11 rejects a strided slice of the batch after the first step.
            out.append((inputs.contiguous().to(self.device), labels.contiguous().to(self.device)))
        return out

    def autocast(self) -> AbstractContextManager[Any]:
        if self.request.layout.precision in ("bf16", "fp8"):
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return nullcontext()

    def step(self, index: int) -> Tensor | None:
        """One optimizer step on global batch `index`; its loss on the last pipeline stage, left on the device."""
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
        self.optimizer.zero_grad(set_to_none=not self.fused_grads)
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
    """AdamW with its fused kernel or its multi-tensor (foreach) ones, the same on every device so the CPU runs the
    GPU's code; DTensors (TP's weights) and plain tensors in a group each, as neither kernel mixes them."""
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
    # A long-lived rank (a layout sweep) trains run after run: what of an earlier run only the cyclic collector frees
    # (an eager context-parallel run's weights, torch 2.13) goes before this one allocates.
    gc.collect()
    groups = build_groups(request.layout, ctx.device) if request.layout.world_size > 1 else None
    result = train(request, ctx.device, groups)
    return dataclasses.replace(result, node=f"node{ctx.node_rank} ({labels.hostname()})")


def memory_peak(device: torch.device) -> MemoryPeak:
    if device.type != "cpu":
        return MemoryPeak("device max allocated", torch.accelerator.max_memory_allocated(device) / GIB)
    # The CPU has no allocator statistics: the process's resident set peak (torch itself included) stands in.
    rss_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return MemoryPeak("host RSS peak", rss_peak * (1 if sys.platform == "darwin" else 1024) / GIB)
