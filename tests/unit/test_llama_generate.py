"""Generation with the KV cache: the same greedy tokens as recomputing the whole sequence every step, and the
model left as it was for training. (The inference check end to end: e2e/test_inference_suite.py.)"""

from __future__ import annotations

import pytest
import torch

from pytest_gbvalidate.workloads.llama.config import LLAMA3_TINY
from pytest_gbvalidate.workloads.llama.generate import generate
from pytest_gbvalidate.workloads.llama.model import build, causal_attention

pytestmark = pytest.mark.torch_version  # generation's torch.accelerator calls


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


def test_decoding_steps_have_the_same_shapes_and_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a CUDA graph replays: each decode step's position is one device tensor advanced in place (a new host
    tensor per token would also be copied over with a stream synchronisation each time), and the model sees the
    same shapes every step."""
    model = build(LLAMA3_TINY, torch.device("cpu"), seed=3)
    seen: list[tuple[int, list[int]]] = []
    set_positions = model.set_positions

    def recording(positions: torch.Tensor) -> None:
        seen.append((positions.untyped_storage().data_ptr(), positions.tolist()))
        set_positions(positions)

    monkeypatch.setattr(model, "set_positions", recording)
    shapes: list[tuple[int, ...]] = []
    forward = model.forward

    def recording_shapes(x: torch.Tensor) -> torch.Tensor:
        shapes.append(tuple(x.shape))
        return forward(x)

    monkeypatch.setattr(model, "forward", recording_shapes)
    generate(model, torch.zeros(2, 5, dtype=torch.long), new_tokens=6)
    steps = seen[1:-1]  # after the prefill; the last call gives the model back its own positions
    assert [positions for _, positions in steps] == [[5], [6], [7], [8], [9]]
    assert len({storage for storage, _ in steps}) == 1
    assert shapes == [(2, 5)] + [(2, 1)] * 5


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
