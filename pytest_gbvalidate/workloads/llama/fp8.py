"""fp8 training matmuls for the built-in engine: `torch._scaled_mm` (which torchao's float8 training calls) with
dynamic per-tensor scaling (torchao's "tensorwise", Transformer Engine's "current scaling"): operands cast to fp8
scaled by their absolute maximum, activations and weights in e4m3 (precision), gradients in e5m2 (range); weights
stay fp32. It runs on GPUs of compute capability 8.9 up and, slowly, on the CPU (so the cpu SKU's tests run it).
Shapes: tokens = bs * seq, in_dim and out_dim the layer's."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from pytest_gbvalidate.workloads.llama.grad_accumulation import FusedGradLinear, main_grad

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2
# Autocast's dtype on a GPU; the matmuls' output dtype wherever autocast is off (the CPU's fp32 tests included).
OUTPUT_DTYPE = torch.bfloat16
# Hopper's fast fp8 accumulation for the forward GEMM (`_mm`), as torchao's float8 training takes it: on an H200
# it was 0.2% to 2.2% faster than exact accumulation in each of four runs (Llama 3 8B blocks, the whole step), with
# no loss change beyond fp8's run-to-run spread. benchmarks/pretrain_engine.py's `all-fp8-exact` case measures it.
FORWARD_FAST_ACCUM = True


def to_fp8(x: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """(x scaled so its absolute maximum is the format's largest value and cast, the inverse scale); no host sync."""
    amax = x.abs().amax().float().clamp(min=1e-12)
    scale = torch.finfo(dtype).max / amax
    return (x.float() * scale).clamp(-torch.finfo(dtype).max, torch.finfo(dtype).max).to(dtype), scale.reciprocal()


def _column_major(x: Tensor) -> Tensor:
    """The same matrix laid out column by column: `_scaled_mm` wants its second operand so."""
    return x.t().contiguous().t()


def _mm(a: Tensor, a_inv: Tensor, b: Tensor, b_inv: Tensor, *, fast_accum: bool = False) -> Tensor:
    """a @ b in fp8, a row-major, b column-major; `fast_accum` as FORWARD_FAST_ACCUM (the CPU's kernel ignores it)."""
    return torch._scaled_mm(a, b, scale_a=a_inv, scale_b=b_inv, out_dtype=OUTPUT_DTYPE, use_fast_accum=fast_accum)


class _Float8Matmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, main_grad: Tensor | None) -> Tensor:
        x2 = x.reshape(-1, x.shape[-1])  # (tokens, in_dim)
        x8, x_inv = to_fp8(x2, E4M3)
        w8, w_inv = to_fp8(weight, E4M3)  # (out_dim, in_dim)
        ctx.save_for_backward(x8, x_inv, w8, w_inv)
        ctx.x_shape, ctx.x_dtype, ctx.w_dtype = x.shape, x.dtype, weight.dtype
        ctx.main_grad = main_grad  # grad_accumulation.py: the weight's .grad to add into, or None
        out = _mm(x8, x_inv, w8.t(), w_inv, fast_accum=FORWARD_FAST_ACCUM)  # (tokens, out_dim)
        return out.view(*x.shape[:-1], -1)

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor, Tensor | None, None]:
        x8, x_inv, w8, w_inv = ctx.saved_tensors
        g8, g_inv = to_fp8(grad_out.reshape(-1, grad_out.shape[-1]), E5M2)  # (tokens, out_dim)
        grad_x = _mm(g8, g_inv, _column_major(w8), w_inv)  # (tokens, out_dim) @ (out_dim, in_dim)
        grad_w = _mm(g8.t().contiguous(), g_inv, _column_major(x8), x_inv)  # (out_dim, tokens) @ (tokens, in_dim)
        grad_x = grad_x.view(ctx.x_shape).to(ctx.x_dtype)
        if ctx.main_grad is None:
            return grad_x, grad_w.to(ctx.w_dtype), None
        # The scaled GEMM cannot add into an fp32 matrix: its bf16 product is added in place, no fp32 copy made.
        ctx.main_grad.add_(grad_w)
        return grad_x, None, None


class Float8Linear(FusedGradLinear):
    """nn.Linear without bias whose three matmuls run in fp8 (once fused, grad_accumulation.py's, into .grad)."""

    def forward(self, x: Tensor) -> Tensor:
        grad = main_grad(self.weight) if self.fused else None
        out: Tensor = _Float8Matmul.apply(x, self.weight, grad)  # type: ignore[no-untyped-call, unused-ignore]
        return out


def convert_blocks_to_fp8(model: nn.Module) -> int:
    """How many of the transformer blocks' nn.Linear were swapped for a Float8Linear (same weight; not the head)."""
    swapped = 0
    for block in model.get_submodule("layers").children():
        for module in block.modules():
            if type(module) is nn.Linear and module.bias is None:
                module.__class__ = Float8Linear  # same parameters, fp8 forward
                swapped += 1
    return swapped
