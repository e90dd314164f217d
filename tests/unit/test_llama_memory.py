"""The engine's memory estimate (pure Python) against peaks measured on GPUs, and its shape: what each lever,
stage and parallel split changes."""

from __future__ import annotations

import dataclasses

import pytest

from pytest_gbvalidate.workloads.llama.config import LLAMA3_8B
from pytest_gbvalidate.workloads.llama.memory import busiest, estimate, stage_params, usable_gib
from pytest_gbvalidate.workloads.llama.parallel import Layout

FOUR_LAYERS = dataclasses.replace(LLAMA3_8B, n_layers=4)
SIXTEEN_LAYERS = dataclasses.replace(LLAMA3_8B, n_layers=16)


@pytest.mark.parametrize(
    ("cfg", "layout", "measured_gib"),
    [
        # The engine before the chunked loss (whole logits, as these runs had), bf16 autocast, seq 8192, one GPU,
        # torch 2.11, max allocated: an H100 80GB HBM3 at Llama 3 8B's block shape with 4 layers ...
        (FOUR_LAYERS, Layout(mbs=1, gbs=4), 51.1),
        (FOUR_LAYERS, Layout(mbs=2, gbs=4), 71.0),
        (FOUR_LAYERS, Layout(mbs=2, gbs=4, activation_checkpointing="full"), 56.4),
        # ... and an H200 with one pipeline stage of ND GB200 v6's check (16 layers, embedding and head, MBS 4).
        (SIXTEEN_LAYERS, Layout(mbs=4, gbs=8, activation_checkpointing="full"), 131.4),
    ],
    ids=["h100-mbs1", "h100-mbs2", "h100-mbs2-ac", "h200-gb200-stage"],
)
def test_the_estimate_is_within_4_percent_of_measured_peaks(cfg: object, layout: Layout, measured_gib: float) -> None:
    assert isinstance(cfg, type(LLAMA3_8B))
    (rank,) = estimate(cfg, layout, chunked_loss=False, compiled=False)
    assert rank.total_gib == pytest.approx(measured_gib, rel=0.04), rank.line()


# benchmarks/pretrain_engine.py on an H200 (torch 2.11.0+cu130), one case per lever, max allocated in GiB:
# (layers, MBS, GBS, recomputation, precision, chunked loss, compiled blocks, measured peak).
LEVER_PEAKS = {
    "off": (4, 1, 4, "none", "bf16", False, False, 51.14),
    "chunked-loss": (4, 1, 4, "none", "bf16", True, False, 46.47),
    "compile": (4, 1, 4, "none", "bf16", False, True, 48.27),
    "all": (4, 1, 4, "none", "bf16", True, True, 42.61),
    "all-full-ac": (4, 1, 4, "full", "bf16", True, True, 36.61),
    "all-selective-ac": (4, 1, 4, "selective", "bf16", True, True, 39.24),
    "all-fp8": (4, 1, 4, "none", "fp8", True, True, 39.62),
    "gb200-stage": (16, 4, 8, "full", "bf16", True, True, 84.62),
}


@pytest.mark.parametrize("case", LEVER_PEAKS)
def test_the_estimate_is_within_4_percent_of_each_lever_s_measured_peak(case: str) -> None:
    layers, mbs, gbs, recompute, precision, chunked, compiled, measured_gib = LEVER_PEAKS[case]
    cfg = dataclasses.replace(LLAMA3_8B, n_layers=layers)
    layout = Layout(mbs=mbs, gbs=gbs, precision=precision, activation_checkpointing=recompute)
    (rank,) = estimate(cfg, layout, chunked_loss=chunked, compiled=compiled)
    assert rank.total_gib == pytest.approx(measured_gib, rel=0.04), rank.line()


def test_the_chunked_loss_drops_the_whole_logits() -> None:
    layout = Layout(mbs=4, gbs=8, activation_checkpointing="full")
    (whole,) = estimate(SIXTEEN_LAYERS, layout, chunked_loss=False, compiled=False)
    (chunked,) = estimate(SIXTEEN_LAYERS, layout, chunked_loss=True, compiled=False)
    # 4 x 8192 tokens x 128,256 logits x 14 bytes, against the head's and hidden state's fp32 gradients, the
    # head's bf16 copy and one chunk of 4096 tokens' logits
    assert whole.logits_gib == pytest.approx(4 * 8192 * 128256 * 14 / 2**30)
    head_copy = 2 * 128256 * 4096
    assert chunked.logits_gib == pytest.approx(
        (4 * (4 * 8192 + 128256) * 4096 + head_copy + 10 * 4096 * 128256) / 2**30
    )
    assert chunked.total_gib < whole.total_gib - 45


def test_gb200_s_check_fits_with_recomputation_and_its_busiest_rank_is_the_first_stage() -> None:
    layout = Layout(mbs=4, gbs=128, pp=2, dp=2, activation_checkpointing="full")
    first, last = estimate(LLAMA3_8B, layout, chunked_loss=True, compiled=True)
    # 1F1B: the first stage holds both microbatches' block inputs in flight, the last one microbatch's
    assert first.activations_gib == pytest.approx(2 * last.activations_gib)
    assert first.logits_gib == 0 and last.logits_gib > 0
    assert busiest([first, last]) is first
    assert first.total_gib == pytest.approx(81.8, abs=0.1)
    modes = {
        m: busiest(
            estimate(
                LLAMA3_8B, dataclasses.replace(layout, activation_checkpointing=m), chunked_loss=True, compiled=True
            )
        )
        for m in ("none", "selective", "full")
    }
    assert modes["none"].total_gib > modes["selective"].total_gib > modes["full"].total_gib


def test_tensor_parallel_ranks_hold_a_share_of_each_block_s_matmuls() -> None:
    one, two = (stage_params(LLAMA3_8B, Layout(mbs=1, gbs=8, tp=tp), 0) for tp in (1, 2))
    embedding_head_norms = 2 * 128256 * 4096 + 4096 + 32 * 2 * 4096  # replicated
    assert one - embedding_head_norms == 2 * (two - embedding_head_norms)
    # the whole model on one rank: about 8.03 B parameters
    assert one == pytest.approx(8.03e9, rel=0.001)


def test_context_parallel_ranks_hold_a_share_of_each_sequence_s_activations() -> None:
    (one,) = estimate(LLAMA3_8B, Layout(mbs=1, gbs=8), chunked_loss=True, compiled=True)
    (half,) = estimate(LLAMA3_8B, Layout(mbs=1, gbs=8, cp=2), chunked_loss=True, compiled=True)
    assert half.activations_gib == pytest.approx(one.activations_gib / 2)


def test_a_gpu_leaves_headroom_for_what_the_estimate_does_not_count() -> None:
    """The CUDA context, NCCL's and cuBLAS's buffers (a fixed allowance), then fragmentation (a share)."""
    assert usable_gib(80.0) == pytest.approx((80.0 - 2.0) * 0.9) == pytest.approx(70.2)
    assert usable_gib(139.0) == pytest.approx(123.3)
    assert usable_gib(1.5) == 0.0
