"""The Llama 3 building blocks against values worked out by hand, and the 8B model's size."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from pytest_gbvalidate.workloads.llama import flops
from pytest_gbvalidate.workloads.llama.config import LLAMA3_8B, LLAMA3_TINY, LlamaConfig
from pytest_gbvalidate.workloads.llama.data import ACTIVE_TOKENS, SUCCESSORS, SyntheticTokens
from pytest_gbvalidate.workloads.llama.model import (
    RMSNorm,
    apply_rope,
    build,
    causal_attention,
    count_params,
    repeat_kv,
    rope_tables,
)

pytestmark = pytest.mark.torch_version  # probes torch.ops.aten for the operators it names


def test_rmsnorm_matches_hand_computed_values() -> None:
    norm = RMSNorm(2, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([2.0, 0.5]))
    # mean of squares of (3, 4) = (9 + 16) / 2 = 12.5
    rms = math.sqrt(12.5 + 1e-5)
    out = norm(torch.tensor([[3.0, 4.0]]))[0]
    assert out.tolist() == pytest.approx([3 / rms * 2.0, 4 / rms * 0.5], rel=1e-6)


def test_rmsnorm_of_bf16_activations() -> None:
    norm = RMSNorm(4, eps=1e-5)
    x = torch.full((1, 4), 300.0, dtype=torch.bfloat16)
    out = norm(x)
    assert out.dtype == torch.float32  # bf16 normalised value times the fp32 weight, as autocast leaves it
    assert out[0].tolist() == pytest.approx([1.0, 1.0, 1.0, 1.0], abs=1e-2)


def test_rope_rotates_each_pair_by_position_times_its_frequency() -> None:
    # head dim 4, theta 100: pair 0 turns by p * 100^0 = p radians, pair 1 by p * 100^(-2/4) = p / 10.
    cos, sin = rope_tables(4, torch.arange(3), theta=100.0)
    x = torch.tensor([1.0, 0.0, 0.0, 1.0]).expand(1, 3, 1, 4)  # (bs, seq, heads, hd): pairs (1, 0) and (0, 1)
    out = apply_rope(x, cos, sin)[0, :, 0]
    expected = [
        [1.0, 0.0, 0.0, 1.0],  # position 0: no rotation
        [math.cos(1), math.sin(1), -math.sin(0.1), math.cos(0.1)],
        [math.cos(2), math.sin(2), -math.sin(0.2), math.cos(0.2)],
    ]
    for row, want in zip(out.tolist(), expected, strict=True):
        assert row == pytest.approx(want, abs=1e-6)


def test_rope_uses_llama3_theta_and_depends_only_on_relative_position() -> None:
    cfg = LLAMA3_8B
    assert (cfg.rope_theta, cfg.head_dim) == (500000.0, 128)
    cos, sin = rope_tables(cfg.head_dim, torch.tensor([8191]), cfg.rope_theta)
    slowest = 8191 * 500000.0 ** (-126 / 128)  # the last pair's angle at the last position of an 8192 sequence
    assert math.atan2(sin[0, -1].item(), cos[0, -1].item()) == pytest.approx(slowest, rel=1e-4)
    # Rotary embeddings make q . k a function of the distance between the two positions.
    cos, sin = rope_tables(8, torch.arange(16), theta=500000.0)
    generator = torch.Generator().manual_seed(0)  # vectors for which the inequality below holds
    q, k = torch.randn(1, 1, 1, 8, generator=generator), torch.randn(1, 1, 1, 8, generator=generator)

    def score(m: int, n: int) -> float:
        qm = apply_rope(q, cos[m : m + 1], sin[m : m + 1])
        kn = apply_rope(k, cos[n : n + 1], sin[n : n + 1])
        return float((qm * kn).sum())

    assert score(5, 2) == pytest.approx(score(13, 10), rel=1e-5)
    assert score(5, 2) != pytest.approx(score(5, 3), rel=1e-3)


def test_gqa_query_heads_share_kv_heads_in_groups() -> None:
    # 4 query heads, 2 KV heads: heads 0 and 1 read KV head 0, heads 2 and 3 read KV head 1.
    kv = torch.tensor([10.0, 20.0]).view(1, 2, 1, 1)
    assert repeat_kv(kv, 2).flatten().tolist() == [10.0, 10.0, 20.0, 20.0]
    # Zero queries give every visible key the same weight: position 0 sees its own value, position 1 the mean
    # of the first two, position 2 of all three (causal).
    q = torch.zeros(1, 4, 3, 1)
    k = torch.randn(1, 2, 3, 1)
    v = torch.tensor([[1.0, 2.0, 6.0], [100.0, 200.0, 600.0]]).view(1, 2, 3, 1)
    out = causal_attention(q, k, v)[0, :, :, 0]  # (heads, seq)
    kv0, kv1 = [1.0, 1.5, 3.0], [100.0, 150.0, 300.0]
    assert out.tolist() == [pytest.approx(kv0), pytest.approx(kv0), pytest.approx(kv1), pytest.approx(kv1)]


def test_llama3_8b_has_8_03_billion_parameters_counted_without_allocating() -> None:
    n = count_params(LLAMA3_8B)  # on the meta device
    assert n == flops.param_count(LLAMA3_8B) == 8_030_261_248
    assert round(n / 1e9, 2) == 8.03


def test_flops_per_token_is_6n_plus_attention() -> None:
    cfg = LlamaConfig("toy", n_layers=2, dim=8, n_heads=2, n_kv_heads=1, ffn_dim=16, vocab_size=10, seq_len=4)
    # per layer: wq 64 + wo 64 + wk 32 + wv 32 + FFN 3*8*16 = 384 + norms 16 = 592; x2 = 1184;
    # + embedding 80 + output 80 + final norm 8 = 1352 parameters, 1272 without the embedding.
    assert flops.param_count(cfg) == count_params(cfg) == 1352
    assert flops.train_flops_per_token(cfg) == 6 * 1272 + 12 * 2 * 8 * 4
    assert flops.train_flops_per_token(LLAMA3_8B) / 1e9 == pytest.approx(57.91, abs=0.01)
    peak = flops.Peak(2.0, "a test's peak")
    assert flops.mfu_pct(flops.model_tflops_per_gpu(cfg, 1e12 / 8400), peak) == pytest.approx(50.0)
    assert peak.describe() == "2 TFLOPS per GPU (a test's peak)"


def test_the_tiny_model_maps_tokens_to_logits() -> None:
    model = build(LLAMA3_TINY, torch.device("cpu"), seed=0)
    tokens = SyntheticTokens(LLAMA3_TINY.vocab_size, LLAMA3_TINY.seq_len, seed=0).batch(0, 3)
    assert tokens.shape == (3, LLAMA3_TINY.seq_len + 1) and int(tokens.max()) < ACTIVE_TOKENS
    logits = model(tokens[:, :-1])
    assert logits.shape == (3, LLAMA3_TINY.seq_len, LLAMA3_TINY.vocab_size)


def test_synthetic_tokens_follow_their_successor_table_and_repeat_per_step() -> None:
    data = SyntheticTokens(vocab_size=512, seq_len=32, seed=3)
    batch = data.batch(5, 4)
    assert torch.equal(batch, SyntheticTokens(512, 32, seed=3).batch(5, 4))
    assert not torch.equal(batch, data.batch(6, 4))
    for row in batch.tolist():
        for cur, nxt in itertools.pairwise(row):
            assert nxt in data.successors[cur].tolist()
    assert data.successors.shape == (ACTIVE_TOKENS, SUCCESSORS)
