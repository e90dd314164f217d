"""Offline generation with the built-in Llama: a fixed batch of prompts, prefill, then greedy decoding of a fixed
number of tokens with a KV cache. The cache plugs into the model as its `attend` function, so the model file is
the training one, unchanged.

What this is not: a serving benchmark (no request arrival, scheduling, continuous batching or paged attention),
nor MLPerf inference (no trained weights, no accuracy target, no tuned engine): it is the node-level cousin, the
same fixed work on every GPU, timed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from pytest_gbvalidate.ranks.gang import RankContext
from pytest_gbvalidate.workloads.llama.config import LlamaConfig
from pytest_gbvalidate.workloads.llama.model import Transformer


class KVCache:
    """The model's `attend` while generating: every layer's keys and values so far. The layers call it in order,
    once per forward pass; after the last one the cached length moves on by the tokens just seen."""

    def __init__(self, cfg: LlamaConfig, batch: int, max_len: int, device: torch.device, dtype: torch.dtype) -> None:
        shape = (cfg.n_layers, batch, cfg.n_kv_heads, max_len, cfg.head_dim)  # (layers, bs, kv_heads, len, hd)
        self.k = torch.empty(shape, device=device, dtype=dtype)
        self.v = torch.empty(shape, device=device, dtype=dtype)
        self.n_layers = cfg.n_layers
        self.length = 0  # tokens cached in every layer
        self.layer = 0  # the layer whose call comes next

    def __call__(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        # q: (bs, heads, new, hd); k, v: (bs, kv_heads, new, hd)
        end = self.length + k.shape[2]
        self.k[self.layer, :, :, self.length : end] = k
        self.v[self.layer, :, :, self.length : end] = v
        keys, values = self.k[self.layer, :, :, :end], self.v[self.layer, :, :, :end]  # (bs, kv_heads, end, hd)
        # The prompt attends causally within itself; a decoded token sees every position before it, itself last.
        # enable_gqa: query head h reads KV head h // (heads / kv_heads) in the kernel, where repeating the KV heads
        # would copy the whole cached prefix in every layer at every step.
        out = F.scaled_dot_product_attention(
            q, keys, values, is_causal=self.length == 0, enable_gqa=True
        )  # (bs, heads, new, hd)
        self.layer += 1
        if self.layer == self.n_layers:
            self.layer, self.length = 0, end
        return out


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
    synchronisation: prefill (the prompt, and the first token) and decode (the others, one at a time)."""
    device = prompts.device
    batch, prompt_len = prompts.shape
    dtype = next(model.parameters()).dtype
    cache = KVCache(model.cfg, batch, prompt_len + new_tokens, device, dtype)
    saved = model.attend, model.positions
    model.attend = cache
    # Every position made on the device once, before timing: a new host tensor per decoded token would copy it over
    # with a stream synchronisation each time, timing the host as much as the GPU. Each step takes a view.
    positions = torch.arange(prompt_len + new_tokens, device=device)
    try:
        _synchronize(device)
        start = time.perf_counter()
        model.set_positions(positions[:prompt_len])
        token = model(prompts)[:, -1].argmax(-1)  # (bs,)
        _synchronize(device)
        prefill_s = time.perf_counter() - start
        chosen = [token]
        start = time.perf_counter()
        for position in range(prompt_len, prompt_len + new_tokens - 1):
            model.set_positions(positions[position : position + 1])
            token = model(token[:, None])[:, -1].argmax(-1)  # (bs, 1) -> (bs,)
            chosen.append(token)
        _synchronize(device)
        decode_s = time.perf_counter() - start
    finally:
        model.attend = saved[0]
        model.set_positions(saved[1])
    return Generation(torch.stack(chosen, dim=1), prefill_s, decode_s)


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
    """The request on this rank's device: seeded weights in the request's precision, seeded prompts, one short
    untimed generation of the same prompts to warm the kernels, then the timed one."""
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
