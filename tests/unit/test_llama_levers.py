"""The built-in engine's speed levers as pure functions, on the CPU: the chunked head + cross entropy against the
textbook one, the fp8 matmul against the fp32 one, gradient-accumulation fusion against autograd's own adding, and
the one-pass softmax gradient against the in-place one."""

from __future__ import annotations

import re

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F

from pytest_gbvalidate.workloads.llama import fp8 as fp8_module
from pytest_gbvalidate.workloads.llama.fp8 import E4M3, Float8Linear, to_fp8
from pytest_gbvalidate.workloads.llama.grad_accumulation import (
    FusedGradLinear,
    accumulate_,
    fuse_gradient_accumulation,
    gemm_adds_into_fp32,
)
from pytest_gbvalidate.workloads.llama.loss import linear_cross_entropy, softmax_grad, softmax_grad_one_pass

pytestmark = pytest.mark.torch_version  # compile, fp8's torch._scaled_mm, the engine's torch-version checks


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


def _fused(layer: torch.nn.Linear) -> torch.nn.Linear:
    """A copy of `layer` whose weight gradient its backward adds into .grad (a model of one layer, fused)."""
    copy = type(layer)(layer.in_features, layer.out_features, bias=False)
    copy.weight.data.copy_(layer.weight.data)
    assert fuse_gradient_accumulation(torch.nn.Sequential(copy), torch.device("cpu")) is False  # the CPU: no in-GEMM
    return copy


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp8"])
def test_a_fused_layer_adds_each_weight_gradient_into_grad_as_autograd_would(precision: str) -> None:
    """Two backward passes (two microbatches): the fused layer's .grad, the same tensor throughout, holds what
    autograd's cast-and-add gives, bit for bit on the CPU (the bf16 product is added as autograd adds it); the
    input's gradient is the same too, in the input's dtype."""
    torch.manual_seed(0)
    reference = (Float8Linear if precision == "fp8" else torch.nn.Linear)(64, 48, bias=False)
    fused = _fused(reference)
    assert isinstance(fused, FusedGradLinear) and fused.fused
    buffer = fused.weight.grad
    assert buffer is not None and buffer.dtype == torch.float32 and not buffer.any()
    for _ in range(2):
        x = torch.randn(2, 16, 64)
        inputs = x.clone().requires_grad_(), x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision != "fp32"):
            outs = reference(inputs[0]), fused(inputs[1])
        grad_out = torch.randn_like(outs[0])
        for out in outs:
            out.backward(grad_out)
        assert torch.equal(inputs[1].grad, inputs[0].grad)  # type: ignore[arg-type]
        assert inputs[1].grad is not None and inputs[1].grad.dtype == torch.float32
    assert fused.weight.grad is buffer
    assert torch.equal(buffer, reference.weight.grad)  # type: ignore[arg-type]


def test_the_chunked_loss_adds_the_head_gradient_scaled_into_the_one_it_is_given() -> None:
    torch.manual_seed(0)
    h = torch.randn(2, 6, 16, requires_grad=True)  # (bs, seq, dim)
    weight = torch.randn(40, 16, requires_grad=True)  # (vocab, dim)
    labels = torch.randint(0, 40, (2, 6))
    _, expected = torch.autograd.grad(textbook(h, weight, labels) * 3.0, (h, weight))
    main_grad = torch.zeros_like(weight)
    for _ in range(2):
        (linear_cross_entropy(h, weight, labels, 5, main_grad=main_grad) * 3.0).backward()  # type: ignore[no-untyped-call]
    assert weight.grad is None  # autograd was handed nothing to add
    torch.testing.assert_close(main_grad, 2 * expected, rtol=1e-5, atol=1e-6)


def test_a_fused_layer_whose_grad_was_dropped_says_how_to_keep_it() -> None:
    fused = _fused(torch.nn.Linear(8, 4, bias=False))
    fused.weight.grad = None
    with pytest.raises(RuntimeError, match=r"zero the gradients in place \(optimizer.zero_grad\(set_to_none=False\)\)"):
        fused(torch.randn(2, 8))


def test_a_fused_embedding_adds_its_rows_into_grad_as_autograd_would() -> None:
    torch.manual_seed(0)
    reference = torch.nn.Embedding(50, 16)
    fused = torch.nn.Embedding(50, 16)
    fused.weight.data.copy_(reference.weight.data)
    fuse_gradient_accumulation(fused, torch.device("cpu"))
    buffer = fused.weight.grad
    for _ in range(2):
        ids = torch.randint(0, 50, (2, 30))  # repeated ids among them
        grad_out = torch.randn(2, 30, 16)
        reference(ids).backward(grad_out)
        fused(ids).backward(grad_out)
    assert fused.weight.grad is buffer
    torch.testing.assert_close(buffer, reference.weight.grad, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    ("layer", "name"),
    [
        (type("Other", (torch.nn.Linear,), {})(8, 4, bias=False), "Other(in_features=8"),
        (torch.nn.Linear(8, 4), "Linear(in_features=8, out_features=4, bias=True)"),
        (torch.nn.Embedding(10, 8, padding_idx=0), "Embedding(10, 8, padding_idx=0)"),
    ],
    ids=["a subclass", "a bias", "a padding index"],
)
def test_fusion_refuses_a_layer_it_does_not_know(layer: torch.nn.Module, name: str) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8, bias=False), layer)
    with pytest.raises(ValueError, match=re.escape(f"gradient-accumulation fusion does not know 1's layer: {name}")):
        fuse_gradient_accumulation(model, torch.device("cpu"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the in-GEMM accumulation is CUDA's")
def test_on_cuda_the_gemm_adds_into_fp32_without_rounding_to_bf16() -> None:
    device = torch.device("cuda")
    if not gemm_adds_into_fp32(device):
        pytest.skip(f"torch {torch.__version__}'s addmm(out_dtype=float32) takes no fp32 addend")
    torch.manual_seed(0)
    a, b = torch.randn(48, 256, device=device), torch.randn(256, 64, device=device)
    start = torch.randn(48, 64, device=device)
    exact = start + a.bfloat16().float() @ b.bfloat16().float()
    total = start.clone()
    accumulate_(total, a.bfloat16(), b.bfloat16(), True)
    rounded = start + (a.bfloat16() @ b.bfloat16()).float()
    assert (total - exact).abs().max() < (rounded - exact).abs().max()


def test_the_one_pass_softmax_gradient_is_the_in_place_one_bit_for_bit() -> None:
    torch.manual_seed(0)
    logits, labels = torch.randn(24, 40).bfloat16(), torch.randint(0, 40, (24,))
    want = softmax_grad(logits, labels, tokens=48)
    got = softmax_grad_one_pass(logits, labels, tokens=48)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert got[1].dtype == torch.bfloat16


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_compiled_the_one_pass_softmax_gradient_holds_no_fp32_copy_of_the_chunk() -> None:
    """What the variant is for: Inductor writes its gradient in the pass that computes it, where softmax_grad's
    index_put makes it write the whole fp32 softmax first (a (chunk, vocab) float32 buffer in the generated code)."""
    from torch._inductor.utils import run_and_get_code

    torch.manual_seed(0)
    logits, labels = torch.randn(24, 40).bfloat16(), torch.randint(0, 40, (24,))
    fp32_chunk = re.compile(r"empty_strided_\w+\(\(24, 40\), \(40, 1\), torch\.float32\)")
    buffers = {}
    for fn in (softmax_grad, softmax_grad_one_pass):
        torch._dynamo.reset()
        (_, grad), code = run_and_get_code(torch.compile(fn), logits, labels, 48)
        buffers[fn.__name__] = len(fp32_chunk.findall("\n".join(code)))
        torch.testing.assert_close(grad, softmax_grad(logits, labels, 48)[1], rtol=1e-2, atol=1e-6)
    assert buffers == {"softmax_grad": 1, "softmax_grad_one_pass": 0}
