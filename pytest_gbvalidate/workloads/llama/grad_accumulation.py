"""Gradient-accumulation fusion for the built-in engine (Megatron-LM's `gradient_accumulation_fusion`): the backward
pass adds each weight gradient into the weight's fp32 `.grad` itself, kept allocated and zeroed in place after each
optimizer step, instead of handing autograd a new gradient to add. Per parameter and microbatch under bf16 autocast,
autograd's way moves 18 bytes (6 for a step's first microbatch): the bf16 weight gradient is cast to a new fp32 tensor
(2 + 4) and added to `.grad` (4 + 4 + 4). Here, on CUDA, cuBLAS adds its fp32 accumulator into `.grad`
(`torch.addmm(..., out_dtype=torch.float32)`: 4 + 4, and 4 a step to zero it; never rounded to bf16); elsewhere the bf16
product is added in place (2 + 2 + 4 + 4), rounding as autograd's way does. Not with TP or PP (train.py says why).
Shapes: tokens = bs * seq, in_dim and out_dim the layer's."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def gemm_adds_into_fp32(device: torch.device) -> bool:
    """Whether this device's GEMM adds a bf16 product into an fp32 matrix in place: CUDA, on torch releases whose
    `addmm(..., out_dtype=torch.float32)` takes an fp32 addend (earlier ones want it in the operands' dtype)."""
    if device.type != "cuda":
        return False
    one = torch.ones(1, 1, dtype=torch.bfloat16, device=device)
    total = torch.ones(1, 1, dtype=torch.float32, device=device)
    try:
        torch.addmm(total, one, one, out_dtype=torch.float32, out=total)
    except (RuntimeError, TypeError):
        return False
    return float(total) == 2.0


# An operator declared to change main_grad in place, which a compiled backward graph calls on the buffer itself: as
# plain in-place torch, Inductor computes main_grad + a @ b into a new buffer and copies it back (torch 2.9, 2.13).
@torch.library.custom_op("gbvalidate::accumulate_matmul_", mutates_args=("main_grad",))
def accumulate_(main_grad: Tensor, a: Tensor, b: Tensor, in_gemm: bool) -> None:
    """main_grad += a @ b: main_grad fp32 (out_dim, in_dim), a (out_dim, tokens), b (tokens, in_dim) in the matmuls'
    dtype. `in_gemm` (gemm_adds_into_fp32): the GEMM adds into main_grad itself."""
    if in_gemm:
        torch.addmm(main_grad, a, b, out_dtype=main_grad.dtype, out=main_grad)
    else:
        main_grad.add_(a @ b)


class _LinearAccumulating(torch.autograd.Function):
    """x @ weight.T, as nn.Linear runs it under autocast; its backward adds the weight's gradient into main_grad."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, main_grad: Tensor, in_gemm: bool) -> Tensor:
        device_type = x.device.type
        dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else x.dtype
        with torch.autocast(device_type, enabled=False):
            x2 = x.reshape(-1, x.shape[-1]).to(dtype)  # (tokens, in_dim)
            w = weight.to(dtype)  # (out_dim, in_dim)
            out = F.linear(x2, w)  # (tokens, out_dim)
        ctx.save_for_backward(x2, w)
        # An attribute, not a saved tensor: other microbatches' backward passes change the buffer in place before this
        # one's, which saved tensors' version checks would refuse.
        ctx.main_grad, ctx.in_gemm, ctx.x_shape, ctx.x_dtype = main_grad, in_gemm, x.shape, x.dtype
        return out.view(*x.shape[:-1], -1)

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor, None, None, None]:
        x2, w = ctx.saved_tensors
        g2 = grad_out.reshape(-1, grad_out.shape[-1]).to(w.dtype)  # (tokens, out_dim)
        accumulate_(ctx.main_grad, g2.t(), x2, ctx.in_gemm)  # (out_dim, in_dim)
        grad_x = (g2 @ w).view(ctx.x_shape).to(ctx.x_dtype)  # (..., in_dim)
        return grad_x, None, None, None


class FusedGradLinear(nn.Linear):
    """nn.Linear without bias whose backward, once fused (fuse_gradient_accumulation), adds into `weight.grad`."""

    fused = False
    in_gemm = False  # gemm_adds_into_fp32

    def forward(self, x: Tensor) -> Tensor:
        if not self.fused:
            return super().forward(x)
        out: Tensor = _LinearAccumulating.apply(x, self.weight, main_grad(self.weight), self.in_gemm)  # type: ignore[no-untyped-call, unused-ignore]
        return out


class _EmbeddingAccumulating(torch.autograd.Function):
    """weight[ids]; its backward adds each token's gradient into main_grad's row for it, where autograd's would make
    a (vocab, dim) gradient and add it whole to `.grad`: two passes over the table for the few rows touched."""

    @staticmethod
    def forward(ctx: Any, ids: Tensor, weight: Tensor, main_grad: Tensor) -> Tensor:
        ctx.save_for_backward(ids)
        ctx.main_grad = main_grad  # an attribute, as _LinearAccumulating's
        return F.embedding(ids, weight)  # (..., dim)

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[None, None, None]:
        (ids,) = ctx.saved_tensors
        rows = grad_out.reshape(-1, grad_out.shape[-1]).to(ctx.main_grad.dtype)  # (tokens, dim)
        ctx.main_grad.index_add_(0, ids.reshape(-1), rows)
        return None, None, None


class FusedGradEmbedding(nn.Embedding):
    """nn.Embedding whose backward, once fused, adds its gradient's rows into `weight.grad`."""

    fused = False

    def forward(self, ids: Tensor) -> Tensor:
        if not self.fused:
            return super().forward(ids)
        out: Tensor = _EmbeddingAccumulating.apply(ids, self.weight, main_grad(self.weight))  # type: ignore[no-untyped-call, unused-ignore]
        return out


def _plain(layer: nn.Linear | nn.Embedding) -> bool:
    """Whether the layer's gradient is its weight's, dense (no bias, padding index, norm limit, sparse or scaling)."""
    if isinstance(layer, nn.Linear):
        return layer.bias is None
    return layer.padding_idx is None and layer.max_norm is None and not layer.sparse and not layer.scale_grad_by_freq


def main_grad(weight: Tensor) -> Tensor:
    """The weight's fp32 gradient buffer, which fuse_gradient_accumulation allocated."""
    if weight.grad is None:
        raise RuntimeError(
            "gradient-accumulation fusion adds into each weight's .grad, which is gone: zero the gradients in place "
            "(optimizer.zero_grad(set_to_none=False))"
        )
    return weight.grad


def fuse_gradient_accumulation(model: nn.Module, device: torch.device) -> bool:
    """Make the model's bias-free linear layers and embedding add their weight gradients into `.grad` (zeros, fp32);
    whether the GEMM itself adds (gemm_adds_into_fp32), for the chunked loss to add the head's that way too."""
    in_gemm = gemm_adds_into_fp32(device)
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear | nn.Embedding):
            continue
        fused_class = {nn.Linear: FusedGradLinear, nn.Embedding: FusedGradEmbedding}.get(type(module), type(module))
        if not issubclass(fused_class, FusedGradLinear | FusedGradEmbedding) or not _plain(module):
            raise ValueError(f"gradient-accumulation fusion does not know {name}'s layer: {module}")
        module.__class__ = fused_class
        assert isinstance(module, FusedGradLinear | FusedGradEmbedding)
        module.fused = True
        if isinstance(module, FusedGradLinear):
            module.in_gemm = in_gemm
        module.weight.grad = torch.zeros_like(module.weight)
    return in_gemm
