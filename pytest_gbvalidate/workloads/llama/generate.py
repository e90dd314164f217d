"""Offline generation with the built-in Llama: prefill a fixed batch of prompts, then greedily decode a fixed number
of tokens with a KV cache (the model's `attend`). Fixed work, timed: neither a serving benchmark nor MLPerf."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from pytest_gbvalidate.ranks.gang import RankContext
from pytest_gbvalidate.workloads.llama.config import LlamaConfig
from pytest_gbvalidate.workloads.llama.model import Transformer


class KVCache:
    """The model's `attend` while generating: the prompt (`position` None) fills the cache's start; a decoded token
    is written at `position`, advanced in place, and attends over the whole cache under a mask (fixed shapes)."""

    def __init__(self, cfg: LlamaConfig, batch: int, max_len: int, device: torch.device, dtype: torch.dtype) -> None:
        shape = (cfg.n_layers, batch, cfg.n_kv_heads, max_len, cfg.head_dim)  # (layers, bs, kv_heads, len, hd)
        # Zeros, not empty: a decoded token attends over every slot, masked ones with weight 0, and 0 x NaN is NaN.
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.slots = torch.arange(max_len, device=device)  # (len,)
        self.position: Tensor | None = None  # (1,) the decoded token's position; None while the prompt runs
        self.n_layers = cfg.n_layers
        self.layer = 0  # the layer whose call comes next

    def __call__(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        # q: (bs, heads, new, hd); k, v: (bs, kv_heads, new, hd)
        keys, values = self.k[self.layer], self.v[self.layer]  # (bs, kv_heads, len, hd)
        self.layer = (self.layer + 1) % self.n_layers
        if self.position is None:
            prompt_len = k.shape[2]
            keys[:, :, :prompt_len], values[:, :, :prompt_len] = k, v
            # enable_gqa: query head h reads KV head h // (heads / kv_heads) without copying the KV heads.
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # (bs, heads, new, hd)
        keys.index_copy_(2, self.position, k)
        values.index_copy_(2, self.position, v)
        # The query heads that share a KV head go in as its queries (no copy of the cache), seeing slots up to here.
        bs, heads, _, hd = q.shape
        grouped = q.reshape(bs, keys.shape[1], heads // keys.shape[1], hd)  # (bs, kv_heads, heads / kv_heads, hd)
        visible = (self.slots <= self.position)[None, :]  # (1, len): SDPA wants a mask of two dimensions or more
        out = F.scaled_dot_product_attention(grouped, keys, values, attn_mask=visible)
        return out.reshape(bs, heads, 1, hd)


@dataclass(frozen=True)
class Generation:
    tokens: Tensor  # (bs, new_tokens) greedy choices
    prefill_s: float
    decode_s: float

    @property
    def new_tokens(self) -> int:
        return int(self.tokens.numel())


@torch.no_grad()
def generate(model: Transformer, prompts: Tensor, new_tokens: int) -> Generation:
    """Greedy generation of `new_tokens` after `prompts` (bs, prompt_len), timed on the host clock around device
    synchronisation: prefill (the prompt and the first token), then decode, a step at a time, on a GPU as a CUDA graph
    (launched op by op, its dozens of small kernels a layer would time the host)."""
    device = prompts.device
    batch, prompt_len = prompts.shape
    cache = KVCache(model.cfg, batch, prompt_len + new_tokens, device, next(model.parameters()).dtype)
    saved = model.attend, model.positions
    model.attend = cache
    try:
        _synchronize(device)
        start = time.perf_counter()
        model.set_positions(cache.slots[:prompt_len])
        token = model(prompts)[:, -1].argmax(-1)  # (bs,)
        _synchronize(device)
        prefill_s = time.perf_counter() - start
        chosen = torch.empty((batch, new_tokens), dtype=token.dtype, device=device)
        chosen[:, 0] = token
        position = torch.full((1,), prompt_len, device=device)
        cache.position = position

        def step() -> None:
            model.set_positions(position)
            token.copy_(model(token[:, None])[:, -1].argmax(-1))  # (bs, 1) -> (bs,)
            position.add_(1)

        decode = _replayed(step, device, changes=(token, position))
        _synchronize(device)
        start = time.perf_counter()
        for i in range(1, new_tokens):
            decode()
            chosen[:, i] = token
        _synchronize(device)
        decode_s = time.perf_counter() - start
    finally:
        model.attend = saved[0]
        model.set_positions(saved[1])
    return Generation(chosen, prefill_s, decode_s)


def _replayed(step: Callable[[], None], device: torch.device, changes: tuple[Tensor, ...]) -> Callable[[], None]:
    """On a CUDA device, `step` captured as a CUDA graph, whose replay runs it; elsewhere `step` itself. The capture
    follows one call on a side stream (CUDA graphs' rule), after which `changes` (besides the cache) are put back."""
    if device.type != "cuda":
        return step
    before = [t.clone() for t in changes]
    side = torch.cuda.Stream(device)  # type: ignore[no-untyped-call, unused-ignore]
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream(device).wait_stream(side)
    for tensor, value in zip(changes, before, strict=True):
        tensor.copy_(value)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


def _synchronize(device: torch.device) -> None:
    if device.type != "cpu":
        torch.accelerator.synchronize(device)


@dataclass(frozen=True)
class InferenceRequest:
    model: str  # a name of config.CONFIGS
    batch: int
    prompt_len: int
    new_tokens: int
    precision: str  # bf16 | fp32


@dataclass(frozen=True)
class InferenceResult:
    tokens_per_s: float  # generated tokens / (prefill + decode)
    prefill_tokens_per_s: float  # prompt tokens / prefill
    decode_tokens_per_s: float  # tokens decoded one step at a time / decode
    prefill_s: float
    decode_s: float
    peak_memory_gib: float | None  # device max allocated; None on the CPU


DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def inference_on_rank(ctx: RankContext, request: InferenceRequest) -> InferenceResult:
    """The request on this rank's device: seeded weights and prompts, a short untimed generation, then the timed one."""
    from pytest_gbvalidate.workloads.llama.config import CONFIGS

    cfg, device = CONFIGS[request.model], ctx.device
    with torch.device("meta"):
        model = Transformer(cfg)
    model.to(DTYPES[request.precision]).materialize(device, seed=0)
    model.eval()
    generator = torch.Generator().manual_seed(0)
    prompts = torch.randint(cfg.vocab_size, (request.batch, request.prompt_len), generator=generator).to(device)
    generate(model, prompts, 2)  # the timed prompt's shape: its prefill must not pay first-use costs
    if device.type != "cpu":
        torch.accelerator.reset_peak_memory_stats(device)
    run = generate(model, prompts, request.new_tokens)
    peak = None if device.type == "cpu" else torch.accelerator.max_memory_allocated(device) / 2**30
    return InferenceResult(
        tokens_per_s=run.new_tokens / (run.prefill_s + run.decode_s),
        prefill_tokens_per_s=request.batch * request.prompt_len / run.prefill_s,
        decode_tokens_per_s=request.batch * (request.new_tokens - 1) / run.decode_s if run.decode_s else 0.0,
        prefill_s=run.prefill_s,
        decode_s=run.decode_s,
        peak_memory_gib=peak,
    )
