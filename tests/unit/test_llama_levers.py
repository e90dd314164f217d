"""The built-in engine's speed levers as pure functions, on the CPU: the chunked head + cross entropy against the
textbook one, and the fp8 matmul against the fp32 one."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pytest_gbvalidate.workloads.llama import fp8 as fp8_module
from pytest_gbvalidate.workloads.llama.fp8 import E4M3, Float8Linear, to_fp8
from pytest_gbvalidate.workloads.llama.loss import linear_cross_entropy


def textbook(h: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy((h @ weight.t()).flatten(0, 1).float(), labels.flatten())


@pytest.mark.parametrize("chunk_tokens", [1, 5, 12, 64])  # one token per chunk, uneven chunks, one, more than all
def test_chunked_head_and_loss_equal_the_textbook_ones_with_their_gradients(chunk_tokens: int) -> None:
    torch.manual_seed(0)
    h = torch.randn(2, 6, 16, requires_grad=True)  # (bs, seq, dim)
    weight = torch.randn(40, 16, requires_grad=True)  # (vocab, dim)
    labels = torch.randint(0, 40, (2, 6))
    expected = textbook(h, weight, labels)
    expected_grads = torch.autograd.grad(expected * 3.0, (h, weight))
    loss = linear_cross_entropy(h, weight, labels, chunk_tokens)
    grads = torch.autograd.grad(loss * 3.0, (h, weight))  # an upstream gradient other than 1 is applied
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=1e-6)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_chunked_loss_runs_its_matmuls_in_autocast_s_dtype() -> None:
    torch.manual_seed(0)
    h, weight, labels = torch.randn(1, 8, 16), torch.randn(40, 16), torch.randint(0, 40, (1, 8))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = linear_cross_entropy(h, weight, labels, chunk_tokens=3)
        expected = textbook(h, weight, labels)  # nn.Linear-style: a bf16 matmul, the loss in fp32
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, expected, rtol=1e-3, atol=1e-3)


def test_fp8_casting_puts_the_largest_magnitude_on_the_format_s_largest_value() -> None:
    x = torch.tensor([[0.5, -2.0], [1.0, 0.25]])
    x8, inverse_scale = to_fp8(x, E4M3)
    assert x8.dtype == E4M3
    assert x8.float().abs().max() == torch.finfo(E4M3).max  # 448
    torch.testing.assert_close(x8.float() * inverse_scale, x, rtol=0.07, atol=0)  # 3 mantissa bits


def test_fp8_linear_forward_and_gradients_stay_close_to_fp32() -> None:
    torch.manual_seed(0)
    reference = torch.nn.Linear(64, 48, bias=False)
    fp8 = Float8Linear(64, 48, bias=False)
    fp8.weight.data.copy_(reference.weight.data)
    x = torch.randn(4, 16, 64)  # (bs, seq, in_dim)
    x_ref, x_fp8 = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_ref, out_fp8 = reference(x_ref), fp8(x_fp8)
    assert out_fp8.dtype == torch.bfloat16 and out_fp8.shape == out_ref.shape
    grad_out = torch.randn_like(out_ref)
    out_ref.backward(grad_out)
    out_fp8.backward(grad_out)
    assert fp8.weight.grad is not None and reference.weight.grad is not None and x_fp8.grad is not None
    assert x_fp8.grad.dtype == torch.float32 and fp8.weight.grad.dtype == torch.float32

    def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
        return float((got.detach().float() - want.detach()).norm() / want.detach().norm())

    # e4m3 operands (3 mantissa bits) forward, e5m2 gradients (2 bits) backward: a few percent, not more
    assert relative_error(out_fp8, out_ref) < 0.05
    assert relative_error(x_fp8.grad, x_ref.grad) < 0.1  # type: ignore[arg-type]
    assert relative_error(fp8.weight.grad, reference.weight.grad) < 0.1


@pytest.mark.parametrize("fast", [True, False], ids=["default-fast-forward", "exact"])
def test_fp8_forward_takes_fast_accumulation_unless_turned_off_and_the_gradients_never(
    fast: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As torchao's float8 training: the forward GEMM with Hopper's fast fp8 accumulation, the two gradient GEMMs
    with exact fp32 accumulation; the forward's too where FORWARD_FAST_ACCUM is off (the benchmark's exact case)."""
    calls: list[bool] = []
    real = torch._scaled_mm

    def recording(*args: object, use_fast_accum: bool = False, **kwargs: object) -> torch.Tensor:
        calls.append(use_fast_accum)
        return real(*args, use_fast_accum=use_fast_accum, **kwargs)  # type: ignore[arg-type, misc]

    monkeypatch.setattr(torch, "_scaled_mm", recording)
    monkeypatch.setattr(fp8_module, "FORWARD_FAST_ACCUM", fast)
    layer = Float8Linear(64, 48, bias=False)
    layer(torch.randn(2, 16, 64, requires_grad=True)).sum().backward()
    assert calls == [fast, False, False]  # forward; input gradient, weight gradient
