"""Generation with the KV cache: the same greedy tokens as recomputing the whole sequence every step, and the
model left as it was for training. (The inference check end to end: e2e/test_inference_suite.py.)"""

from __future__ import annotations

import pytest
import torch

from pytest_gbvalidate.workloads.llama.config import LLAMA3_TINY
from pytest_gbvalidate.workloads.llama.generate import generate
from pytest_gbvalidate.workloads.llama.model import build, causal_attention


def test_cached_decoding_chooses_what_recomputing_the_whole_sequence_chooses() -> None:
    model = build(LLAMA3_TINY, torch.device("cpu"), seed=3)
    prompts = torch.randint(LLAMA3_TINY.vocab_size, (3, 12), generator=torch.Generator().manual_seed(1))
    run = generate(model, prompts, new_tokens=10)
    assert run.tokens.shape == (3, 10) and run.new_tokens == 30 and run.prefill_s > 0 and run.decode_s > 0

    sequence = prompts
    with torch.no_grad():
        for _ in range(10):
            model.set_positions(torch.arange(sequence.shape[1]))
            sequence = torch.cat([sequence, model(sequence)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(run.tokens, sequence[:, 12:])


def test_decoding_makes_no_tensor_per_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each step's position is a view of one device tensor made before timing: a new host tensor per token would
    be copied over with a stream synchronisation each time (on a GPU, the decode rate would time the host)."""
    model = build(LLAMA3_TINY, torch.device("cpu"), seed=3)
    seen: list[torch.Tensor] = []
    set_positions = model.set_positions

    def recording(positions: torch.Tensor) -> None:
        seen.append(positions)
        set_positions(positions)

    monkeypatch.setattr(model, "set_positions", recording)
    generate(model, torch.zeros(2, 5, dtype=torch.long), new_tokens=6)
    during = seen[:-1]  # the last call gives the model back its own positions
    assert len(during) == 1 + 5  # the prefill, then 5 decoded steps (the prefill chose the first token)
    storages = {p.untyped_storage().data_ptr() for p in during}
    assert len(storages) == 1 and all(p._base is not None for p in during)
    assert [p.tolist() for p in during[1:]] == [[5], [6], [7], [8], [9]]


def test_decoding_reads_the_cached_keys_without_copying_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """Grouped-query attention in the kernel (SDPA's enable_gqa): repeating the KV heads would copy the cached
    prefix in every layer at every step."""
    model = build(LLAMA3_TINY, torch.device("cpu"), seed=3)

    def no_copies(*args: object, **kwargs: object) -> torch.Tensor:
        raise AssertionError("the KV heads were repeated")

    monkeypatch.setattr(torch.Tensor, "repeat_interleave", no_copies)
    assert LLAMA3_TINY.n_heads > LLAMA3_TINY.n_kv_heads  # grouped-query attention, as Llama 3's
    generate(model, torch.zeros(2, 5, dtype=torch.long), new_tokens=4)


def test_generation_gives_the_model_back_as_it_was() -> None:
    model = build(LLAMA3_TINY, torch.device("cpu"), seed=3)
    positions = model.positions.clone()
    generate(model, torch.zeros(1, 4, dtype=torch.long), new_tokens=3)
    assert model.attend is causal_attention and torch.equal(model.positions, positions)
