"""A compact Llama 3 (grouped-query attention, rotary embeddings, RMSNorm, SwiGLU, untied embeddings) for every
layout: a pipeline stage removes layers, TP shards its linear layers, CP swaps its attention function. Shapes: seq
the sequence this rank holds, heads / kv_heads the query and key-value heads it holds, hd head dim."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from contextlib import AbstractContextManager

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from pytest_gbvalidate.workloads.llama.config import LlamaConfig

# attend(q, k, v) -> out: q (bs, heads, seq, hd), k and v (bs, kv_heads, seq, hd), out like q.
AttendFn = Callable[[Tensor, Tensor, Tensor], Tensor]
INIT_STD = 0.02


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, over the last dimension."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        # In fp32 whatever the autocast dtype: the mean of squares is where bf16 loses precision.
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def rope_tables(head_dim: int, positions: Tensor, theta: float) -> tuple[Tensor, Tensor]:
    """cos and sin of the rotary angles, each (seq, hd/2): pair i at position p turns by p * theta^(-2i/hd)."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim)
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]  # (seq, hd/2)
    return angles.cos(), angles.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate each adjacent pair (x[2i], x[2i+1]) of every head by its angle (Meta's Llama layout: one complex
    number). x: (bs, seq, heads, hd); cos, sin: (seq, hd/2)."""
    pairs = x.float().reshape(*x.shape[:-1], -1, 2)  # (bs, seq, heads, hd/2, 2)
    x0, x1 = pairs.unbind(-1)  # (bs, seq, heads, hd/2) each
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]  # (1, seq, 1, hd/2)
    rotated = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)  # (bs, seq, heads, hd/2, 2)
    return rotated.flatten(-2).type_as(x)


def repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """(bs, kv_heads, seq, hd) -> (bs, kv_heads * n_rep, seq, hd): query head h reads KV head h // n_rep."""
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=1)


def causal_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal grouped-query attention over the whole sequence this rank holds."""
    n_rep = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), is_causal=True)


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.head_dim = cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, attend: AttendFn) -> Tensor:
        bs, seq, _ = x.shape  # (bs, seq, dim)
        # -1: under tensor parallelism the projections hold this rank's heads only.
        q = self.wq(x).view(bs, seq, -1, self.head_dim)  # (bs, seq, heads, hd)
        k = self.wk(x).view(bs, seq, -1, self.head_dim)  # (bs, seq, kv_heads, hd)
        v = self.wv(x).view(bs, seq, -1, self.head_dim)  # (bs, seq, kv_heads, hd)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))  # (bs, heads, seq, hd)
        out = out.transpose(1, 2).reshape(bs, seq, -1)  # (bs, seq, heads * hd)
        projected: Tensor = self.wo(out)  # (bs, seq, dim)
        return projected


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)  # gate
        self.w3 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)  # up
        self.w2 = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)  # down

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.w2(F.silu(self.w1(x)) * self.w3(x))  # (bs, seq, ffn) -> (bs, seq, dim)
        return out


# Selective activation checkpointing keeps what these produce (the costly matmuls and attention) and recomputes
# the rest of a block (norms, rotary embedding, SwiGLU gating, casts), as torchtitan's op-level policy does.
_KEPT_OPS = {
    getattr(torch.ops.aten, name).default
    for name in (
        "mm",
        "_scaled_mm",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
    )
    if hasattr(torch.ops.aten, name)
}


def _keep_matmuls(ctx: object, op: object, *args: object, **kwargs: object) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in _KEPT_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _selective_contexts() -> tuple[AbstractContextManager[None], AbstractContextManager[None]]:
    return create_selective_checkpoint_contexts(_keep_matmuls)  # type: ignore[no-untyped-call,no-any-return]


class TransformerBlock(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg)
        self.checkpointing = "none"  # parallel.CHECKPOINTING

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, attend: AttendFn) -> Tensor:
        # Inside the block, so that a compiled block compiles its recomputation with it.
        if self.checkpointing == "none":
            return self._forward(x, cos, sin, attend)
        if self.checkpointing == "selective":
            out: Tensor = checkpoint(
                self._forward, x, cos, sin, attend, use_reentrant=False, context_fn=_selective_contexts
            )
        else:
            out = checkpoint(self._forward, x, cos, sin, attend, use_reentrant=False)
        return out

    def _forward(self, x: Tensor, cos: Tensor, sin: Tensor, attend: AttendFn) -> Tensor:
        h: Tensor = x + self.attention(self.attention_norm(x), cos, sin, attend)
        out: Tensor = h + self.feed_forward(self.ffn_norm(h))
        return out


def call_block(block: nn.Module, x: Tensor, cos: Tensor, sin: Tensor, attend: AttendFn) -> Tensor:
    """One transformer block on x: what the model calls for each layer, and what the engine compiles."""
    out: Tensor = block(x, cos, sin, attend)
    return out


BlockFn = Callable[[nn.Module, Tensor, Tensor, Tensor, AttendFn], Tensor]


class Transformer(nn.Module):
    """The model or a pipeline stage of it; layers keep their global index as name, so weights match in any layout."""

    tok_embeddings: nn.Embedding | None
    norm: RMSNorm | None
    output: nn.Linear | None
    rope_cos: Tensor
    rope_sin: Tensor
    positions: Tensor

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(cfg) for i in range(cfg.n_layers)})
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.attend: AttendFn = causal_attention
        # `call_block`, or the engine's torch.compile of it (train.py): not nn.Module.compile, whose compiled method
        # references its own module, a cycle that kept every run's weights until the cyclic collector ran.
        self.call_block: BlockFn = call_block
        # The last stage returns the final norm's output and its loss applies the head (loss.linear_cross_entropy).
        self.head_in_loss = False
        # The positions of the tokens this rank holds: 0..seq-1, or its chunks under context parallelism.
        self.register_buffer("positions", torch.arange(cfg.seq_len), persistent=False)
        self.register_buffer("rope_cos", torch.empty(0), persistent=False)
        self.register_buffer("rope_sin", torch.empty(0), persistent=False)
        self.set_positions(self.positions)

    def set_positions(self, positions: Tensor) -> None:
        self.positions = positions
        self.rope_cos, self.rope_sin = rope_tables(self.cfg.head_dim, positions, self.cfg.rope_theta)

    def forward(self, x: Tensor) -> Tensor:
        # x: (bs, seq) token ids on the first stage, (bs, seq, dim) activations on the others
        h = self.tok_embeddings(x) if self.tok_embeddings is not None else x  # (bs, seq, dim)
        for layer in self.layers.values():
            h = self.call_block(layer, h, self.rope_cos, self.rope_sin, self.attend)
        if self.norm is not None:
            h = self.norm(h)
        if self.output is None or self.head_in_loss:
            return h
        logits: Tensor = self.output(h)  # (bs, seq, vocab) on the last stage
        return logits

    def set_checkpointing(self, mode: str) -> None:
        """What each block's backward recomputes: one of parallel.CHECKPOINTING."""
        for block in self.layers.values():
            assert isinstance(block, TransformerBlock)
            block.checkpointing = mode

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """Seeded weights, each from a generator keyed by its name (any stage or TP rank gets the whole model's):
        normal(0, 0.02), wo and w2 scaled down by sqrt(2 * layers) as in GPT-2, so the residual stream does not grow."""
        for name, param in self.named_parameters():
            generator = torch.Generator(device=param.device).manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
            if name.endswith("norm.weight"):
                param.fill_(1.0)
                continue
            std = INIT_STD
            if name.endswith(("attention.wo.weight", "feed_forward.w2.weight")):
                std /= (2 * self.cfg.n_layers) ** 0.5
            param.normal_(0.0, std, generator=generator)

    def materialize(self, device: torch.device, seed: int, positions: Tensor | None = None) -> None:
        """Give a model built on the meta device real storage on `device` and its seeded weights."""
        self.to_empty(device=device)
        self.set_positions((torch.arange(self.cfg.seq_len) if positions is None else positions).to(device))
        self.init_weights(seed)


def loss_fn(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean next-token cross entropy, in fp32. logits (bs, seq, vocab), labels (bs, seq)."""
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


def count_params(cfg: LlamaConfig) -> int:
    """Parameters of the whole model, counted on the meta device (nothing is allocated)."""
    with torch.device("meta"):
        model = Transformer(cfg)
    return sum(p.numel() for p in model.parameters())


def build(cfg: LlamaConfig, device: torch.device, seed: int) -> Transformer:
    """The whole model with seeded weights on `device`."""
    with torch.device("meta"):
        model = Transformer(cfg)
    model.materialize(device, seed)
    return model
