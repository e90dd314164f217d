"""A layout applied to the model on one rank: its pipeline stage (PP), tensor parallel linear layers (TP), context
parallel attention (CP). DP replicas average gradients after the whole backward (`average_gradients`), not bucketed
and overlapped with it as DDP and Megatron do: a multi-rank step pays the all-reduce, and its MFU is lower by that."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from pytest_gbvalidate.workloads.llama.config import LlamaConfig
from pytest_gbvalidate.workloads.llama.fp8 import convert_blocks_to_fp8
from pytest_gbvalidate.workloads.llama.model import Transformer, repeat_kv
from pytest_gbvalidate.workloads.llama.parallel import Layout, check_world

# Ranks are numbered DP outermost, TP innermost (not in SIZES' order): a TP group, talking in every layer, is one
# NVLink domain, and a node holds whole pipelines, so weak-scaled over N nodes each trains what it would alone (only
# the gradient sync crosses nodes) and a slow node shows in its own ranks. (Megatron puts PP outermost.)
MESH_DIMS = ("dp", "pp", "cp", "tp")
# The dimensions whose ranks hold the same weights: their gradients are averaged over them together.
REPLICA_DIMS = ("dp", "cp")


@dataclass(frozen=True)
class Coordinates:
    """Where a rank sits in the layout."""

    pp: int = 0
    dp: int = 0
    cp: int = 0
    tp: int = 0


def coordinates(rank: int, layout: Layout) -> Coordinates:
    sizes, at = layout.sizes(), {}
    for dim in reversed(MESH_DIMS):  # the innermost first
        rank, at[dim] = divmod(rank, sizes[dim])
    return Coordinates(**at)


@dataclass
class RankGroups:
    """This rank's coordinates and the process groups it talks in. None of them exists on a single rank."""

    at: Coordinates
    pp_group: dist.ProcessGroup | None = None
    tp_mesh: DeviceMesh | None = None
    cp_group: dist.ProcessGroup | None = None
    replica_group: dist.ProcessGroup | None = None  # DP x CP: same weights, gradients averaged

    @property
    def is_first_stage(self) -> bool:
        return self.at.pp == 0


def build_groups(layout: Layout, device: torch.device) -> RankGroups:
    """The process groups of `layout` over the initialised default group (every rank calls this)."""
    check_world(layout, dist.get_world_size())
    sizes = layout.sizes()
    shape = tuple(sizes[dim] for dim in MESH_DIMS)
    mesh = init_device_mesh(device.type, shape, mesh_dim_names=MESH_DIMS)
    # One group per place in the other dimensions: the grid's REPLICA_DIMS moved last and flattened.
    others = [dim for dim in MESH_DIMS if dim not in REPLICA_DIMS]
    order = [MESH_DIMS.index(dim) for dim in (*others, *REPLICA_DIMS)]
    together = math.prod(sizes[dim] for dim in REPLICA_DIMS)
    replicas = torch.arange(layout.world_size).reshape(shape).permute(order).reshape(-1, together).tolist()
    replica_group, _ = dist.new_subgroups_by_enumeration(replicas)  # type: ignore[no-untyped-call, unused-ignore]
    if not isinstance(replica_group, dist.ProcessGroup):  # every rank is in one of the groups enumerated
        raise RuntimeError(f"rank {dist.get_rank()} is in no gradient replica group of {replicas}")
    return RankGroups(
        at=coordinates(dist.get_rank(), layout),
        pp_group=mesh["pp"].get_group(),
        tp_mesh=mesh["tp"],
        cp_group=mesh["cp"].get_group(),
        replica_group=replica_group,
    )


def keep_stage(model: Transformer, pp: int, stage: int) -> None:
    """Cut `model` down to pipeline stage `stage` of `pp`: its layers, the embedding first, norm and head last."""
    per_stage = model.cfg.n_layers // pp
    keep = {str(i) for i in range(stage * per_stage, (stage + 1) * per_stage)}
    for name in [n for n in model.layers if n not in keep]:
        del model.layers[name]
    if stage > 0:
        model.tok_embeddings = None
    if stage < pp - 1:
        model.norm = None
        model.output = None


# Megatron's split: Q, K, V and SwiGLU's gate and up by output columns (whole heads, a slice of the FFN), attention's
# output and FFN's down by input rows (an all-reduce after each); embedding, norms and head stay replicated.
TP_PLAN = {
    "attention.wq": ColwiseParallel(),
    "attention.wk": ColwiseParallel(),
    "attention.wv": ColwiseParallel(),
    "attention.wo": RowwiseParallel(),
    "feed_forward.w1": ColwiseParallel(),
    "feed_forward.w3": ColwiseParallel(),
    "feed_forward.w2": RowwiseParallel(),
}


def context_parallel_positions(seq_len: int, cp: int, cp_rank: int) -> Tensor:
    """Positions of CP rank `cp_rank`'s tokens: chunks r and 2*CP-1-r of 2*CP, for an equal share of attention."""
    chunks = torch.arange(seq_len).chunk(2 * cp)
    return torch.cat((chunks[cp_rank], chunks[2 * cp - 1 - cp_rank]))


class _GatherSequence(torch.autograd.Function):
    """All-gather along dim 2 of (bs, heads, seq, hd); the backward sums every rank's copy's gradient and keeps this
    rank's slice (all_reduce: gloo has no reduce_scatter of tensor lists)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: dist.ProcessGroup) -> Tensor:
        ctx.group = group
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x, group=group)
        return torch.cat(parts, dim=2)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        mine = grad.chunk(dist.get_world_size(ctx.group), dim=2)[dist.get_rank(ctx.group)]
        return mine.contiguous(), None


class ContextParallelAttention:
    """Causal attention over a sequence split across a CP group by all-gathering keys and values (as Llama 3's
    training did), masked by the tokens' global positions. torch's experimental context_parallel (ring attention)
    does not run on the CPU (torch 2.13), so the cpu SKU could not run the lines a GPU runs; this runs on both."""

    def __init__(self, group: dist.ProcessGroup, seq_len: int, device: torch.device) -> None:
        cp, cp_rank = dist.get_world_size(group), dist.get_rank(group)
        q_positions = context_parallel_positions(seq_len, cp, cp_rank)
        kv_positions = torch.cat([context_parallel_positions(seq_len, cp, r) for r in range(cp)])
        self.group = group
        self.mask = (q_positions[:, None] >= kv_positions[None, :]).to(device)  # (seq / cp, seq)

    def __call__(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        # q (bs, heads, seq / cp, hd); k, v (bs, kv_heads, seq / cp, hd) -> gathered (bs, kv_heads, seq, hd)
        k = _GatherSequence.apply(k, self.group)  # type: ignore[no-untyped-call, unused-ignore]
        v = _GatherSequence.apply(v, self.group)  # type: ignore[no-untyped-call, unused-ignore]
        n_rep = q.shape[1] // k.shape[1]
        return F.scaled_dot_product_attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), attn_mask=self.mask)


def build_rank_model(
    cfg: LlamaConfig, layout: Layout, groups: RankGroups | None, device: torch.device, seed: int
) -> Transformer:
    """This rank's part of the seeded model, parallelised as `layout` says; a rank allocates only its stage."""
    with torch.device("meta"):
        model = Transformer(cfg)
    at = groups.at if groups is not None else Coordinates()
    if layout.pp > 1:
        keep_stage(model, layout.pp, at.pp)
    positions = context_parallel_positions(cfg.seq_len, layout.cp, at.cp) if layout.cp > 1 else None
    model.materialize(device, seed, positions)
    model.set_checkpointing(layout.activation_checkpointing)
    if layout.precision == "fp8":
        convert_blocks_to_fp8(model)
    if layout.tp > 1:
        assert groups is not None
        assert groups.tp_mesh is not None
        for block in model.layers.values():
            parallelize_module(block, groups.tp_mesh, TP_PLAN)
    if layout.cp > 1:
        assert groups is not None
        assert groups.cp_group is not None
        model.attend = ContextParallelAttention(groups.cp_group, cfg.seq_len, device)
    return model


def average_gradients(model: torch.nn.Module, group: dist.ProcessGroup | None) -> None:
    """Average gradients over the ranks holding the same weights (DP x CP); a DTensor's (TP's) by its local shard."""
    if group is None or dist.get_world_size(group) == 1:
        return
    n = dist.get_world_size(group)
    for param in model.parameters():
        if param.grad is None:
            continue
        grad = param.grad.to_local() if isinstance(param.grad, DTensor) else param.grad
        dist.all_reduce(grad, group=group)
        grad.div_(n)
