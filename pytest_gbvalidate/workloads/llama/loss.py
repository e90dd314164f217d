"""The output head and the cross-entropy loss in one, over chunks of tokens: the (tokens, vocab) logits are never
held whole. For Llama 3's 128,256-wide vocabulary a microbatch of 4 x 8192 tokens has 4.2 G logits: 8.4 GB in
bf16, and the plain head + fp32 cross entropy holds about 14 bytes per logit at the peak of its backward pass
(59 GB). Here a chunk's logits live only while its share of the loss and of both gradients is computed, in the
forward pass: the backward pass only scales the gradients it was handed (the idea of Liger Kernel's fused linear
cross entropy, in plain PyTorch so every device runs it).

Shapes: tokens = bs * seq, dim model width, vocab vocabulary, chunk CHUNK_TOKENS.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from pytest_gbvalidate.workloads.llama.memory import CHUNK_TOKENS


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, h: Tensor, weight: Tensor, labels: Tensor, chunk_tokens: int) -> Tensor:
        device_type = h.device.type
        # The matmuls in autocast's dtype where it is on (as nn.Linear would run), in fp32 otherwise; the
        # softmax and the loss in fp32 always.
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
                logits = (hc @ w.t()).float()  # (chunk, vocab)
                lse = torch.logsumexp(logits, dim=-1)  # (chunk,)
                loss += (lse - logits.gather(1, yc[:, None]).squeeze(1)).sum()
                # d(mean loss)/d(logits) = (softmax - one_hot(label)) / tokens, in place of the logits
                grad_logits = logits.sub_(lse[:, None]).exp_()
                grad_logits[torch.arange(yc.numel(), device=yc.device), yc] -= 1.0
                grad_logits = grad_logits.div_(tokens).to(dtype)  # (chunk, vocab)
                grad_h[start : start + chunk_tokens] = grad_logits @ w  # (chunk, dim)
                grad_w += (grad_logits.t() @ hc).float()  # (vocab, dim)
        ctx.save_for_backward(grad_h.view_as(h), grad_w.to(weight.dtype))
        return loss / tokens

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor) -> tuple[Tensor, Tensor, None, None]:
        grad_h, grad_w = ctx.saved_tensors
        return grad_h * grad_loss, grad_w * grad_loss, None, None


def linear_cross_entropy(h: Tensor, weight: Tensor, labels: Tensor, chunk_tokens: int = CHUNK_TOKENS) -> Tensor:
    """Mean next-token cross entropy of the logits h @ weight.T, in fp32, chunk by chunk; equal to
    `cross_entropy((h @ weight.T).float(), labels)` up to rounding. h (bs, seq, dim), weight (vocab, dim),
    labels (bs, seq)."""
    # Function.apply is untyped up to torch 2.14, typed from 2.15.
    loss: Tensor = _LinearCrossEntropy.apply(h, weight, labels, chunk_tokens)  # type: ignore[no-untyped-call, unused-ignore]
    return loss
