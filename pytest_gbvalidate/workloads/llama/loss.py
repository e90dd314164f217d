"""The output head and the cross-entropy loss in one, over chunks of tokens, so the (tokens, vocab) logits are never
held whole (the plain head's backward peaks at 14 bytes a logit, memory.py: 59 GB for Llama 3's 4 x 8192 tokens).
A chunk's logits live only while its share of the loss and of both gradients is computed, in the forward pass (as
in Liger Kernel's fused linear cross entropy, in plain PyTorch). Shapes: tokens = bs * seq, chunk CHUNK_TOKENS."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from pytest_gbvalidate.workloads.llama.grad_accumulation import accumulate_
from pytest_gbvalidate.workloads.llama.memory import CHUNK_TOKENS


def softmax_grad(logits: Tensor, labels: Tensor, tokens: int) -> tuple[Tensor, Tensor]:
    """One chunk's cross entropy summed over its tokens (fp32), and d(mean loss)/d(logits) = (softmax -
    one_hot(label)) / tokens in the logits' dtype. logits (chunk, vocab), labels (chunk,)."""
    x = logits.float()  # (chunk, vocab); the same tensor when the logits are fp32
    lse, loss = _logsumexp_and_loss(x, labels)
    grad = x.sub_(lse[:, None]).exp_()  # softmax, in place of the fp32 logits
    grad[torch.arange(labels.numel(), device=labels.device), labels] -= 1.0
    return loss, grad.div_(tokens).to(logits.dtype)


def softmax_grad_one_pass(logits: Tensor, labels: Tensor, tokens: int) -> tuple[Tensor, Tensor]:
    """softmax_grad for compiling (EngineOptions.loss_grad_one_pass): the label's one taken off by comparing column
    indices, not by indexing, whose index_put makes Inductor write the whole fp32 softmax first and read it back (an
    fp32 (chunk, vocab) buffer more, in its generated code). Eager, it holds more temporaries: compiled only."""
    x = logits.float()  # (chunk, vocab)
    lse, loss = _logsumexp_and_loss(x, labels)
    is_label = torch.arange(x.shape[1], device=x.device)[None, :] == labels[:, None]  # (chunk, vocab)
    grad = ((x - lse[:, None]).exp() - is_label.float()) / tokens
    return loss, grad.to(logits.dtype)


def _logsumexp_and_loss(x: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """x (chunk, vocab) fp32 logits -> (their logsumexp (chunk,), the chunk's summed cross entropy)."""
    lse = torch.logsumexp(x, dim=-1)  # (chunk,)
    return lse, (lse - x.gather(1, labels[:, None]).squeeze(1)).sum()


SoftmaxGrad = Callable[[Tensor, Tensor, int], tuple[Tensor, Tensor]]


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        h: Tensor,
        weight: Tensor,
        labels: Tensor,
        chunk_tokens: int,
        chunk_grad: SoftmaxGrad,
        main_grad: Tensor | None,
        in_gemm: bool,
    ) -> Tensor:
        device_type = h.device.type
        # The matmuls in autocast's dtype where it is on (as nn.Linear would run); the softmax and loss in fp32.
        dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else h.dtype
        with torch.autocast(device_type, enabled=False):
            h2 = h.reshape(-1, h.shape[-1])  # (tokens, dim)
            y = labels.reshape(-1)  # (tokens,)
            w = weight.to(dtype)  # (vocab, dim)
            tokens = y.numel()
            loss = torch.zeros((), dtype=torch.float32, device=h.device)
            grad_h = torch.empty_like(h2)  # (tokens, dim)
            grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)  # (vocab, dim)
            for start in range(0, tokens, chunk_tokens):
                hc, yc = h2[start : start + chunk_tokens].to(dtype), y[start : start + chunk_tokens]
                # logits in, their gradient out: (chunk, vocab)
                chunk_loss, grad_logits = chunk_grad(hc @ w.t(), yc, tokens)
                loss += chunk_loss
                grad_h[start : start + chunk_tokens] = grad_logits @ w  # (chunk, dim)
                # In place: no fp32 copy of a (vocab, dim) matrix (in the GEMM itself where `in_gemm`).
                accumulate_(grad_w, grad_logits.t(), hc, in_gemm)  # (vocab, dim)
                # Freed now, not when the next chunk's gradient replaces it: one chunk's logits at a time.
                del grad_logits
        ctx.save_for_backward(grad_h.view_as(h), grad_w.to(weight.dtype))
        ctx.main_grad = main_grad  # grad_accumulation.py: the head's .grad to add into, or None
        return loss / tokens

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor) -> tuple[Tensor, Tensor | None, None, None, None, None, None]:
        grad_h, grad_w = ctx.saved_tensors
        if ctx.main_grad is None:
            return grad_h * grad_loss, grad_w * grad_loss, None, None, None, None, None
        ctx.main_grad.addcmul_(grad_w, grad_loss)  # scaled as it is added: one pass over the (vocab, dim) matrix
        return grad_h * grad_loss, None, None, None, None, None, None


def linear_cross_entropy(
    h: Tensor,
    weight: Tensor,
    labels: Tensor,
    chunk_tokens: int = CHUNK_TOKENS,
    chunk_grad: SoftmaxGrad = softmax_grad,
    main_grad: Tensor | None = None,
    in_gemm: bool = False,
) -> Tensor:
    """`cross_entropy((h @ weight.T).float(), labels)` up to rounding, chunk by chunk. h (bs, seq, dim), weight (vocab,
    dim), labels (bs, seq); `main_grad`, `in_gemm`: the weight's .grad to add into, as in grad_accumulation.py."""
    # Function.apply is untyped up to torch 2.14, typed from 2.15.
    loss: Tensor = _LinearCrossEntropy.apply(h, weight, labels, chunk_tokens, chunk_grad, main_grad, in_gemm)  # type: ignore[no-untyped-call, unused-ignore]
    return loss
