"""Inference throughput: offline generation with the built-in Llama on every GPU at once (on `cpu`, on the gang's
ranks): a fixed batch of prompts, prefill, then greedy decoding with a KV cache
(pytest_gbvalidate/workloads/llama/generate.py). Tokens generated per second, per GPU, against the baseline.

Not MLPerf inference and not a serving benchmark: random weights, greedy decoding, eager PyTorch, one fixed batch;
the node-level cousin of those runs, the same work on every GPU."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_gbvalidate.expect import Expect, Measured
from pytest_gbvalidate.ranks.gang import Gang
from pytest_gbvalidate.target import Target, rank_labels
from pytest_gbvalidate.workloads.llama.generate import InferenceRequest, inference_on_rank

pytestmark = pytest.mark.gb_level("full")

METRIC = "inference_tokens_per_s"
# Generations per rank, the best counting, as the storage checks take theirs: interference slows a pass, a degraded
# GPU every one; one generation is one figure with no noise of its own (docs/noise.md, behind the constants).
PASSES = 3
# Llama 3 8B in bf16 fits one GPU of every GPU SKU; a batch of 8 prompts of 1024 tokens and 128 new ones each.
DEFAULTS: dict[str, dict[str, Any]] = {
    "gpu": {"model": "llama3_8b", "batch": 8, "prompt_len": 1024, "new_tokens": 128, "precision": "bf16"},
    "cpu": {"model": "llama3_tiny", "batch": 4, "prompt_len": 32, "new_tokens": 32, "precision": "bf16"},
}


def test_inference_tokens_per_s(gb_target: Target, gb_gang: Gang, gb_expect: Expect) -> None:
    params = DEFAULTS["gpu" if gb_target.is_gpu else "cpu"] | gb_target.params(METRIC)
    request = InferenceRequest(
        str(params["model"]),
        int(params["batch"]),
        int(params["prompt_len"]),
        int(params["new_tokens"]),
        str(params["precision"]),
    )

    def measure() -> list[Measured]:
        passes = [gb_gang.run(inference_on_rank, request) for _ in range(PASSES)]
        measured = []
        for rank, label in enumerate(rank_labels(gb_target, gb_gang)):
            figures = [results[rank].tokens_per_s for results in passes]
            best = max((results[rank] for results in passes), key=lambda r: r.tokens_per_s)
            details = {
                **vars(request),
                "rule": f"best of {PASSES} passes",
                "passes": figures,  # their spread is the figure's noise (rules/noise.py)
                "prefill_tokens_per_s": best.prefill_tokens_per_s,
                "decode_tokens_per_s": best.decode_tokens_per_s,
                "prefill_s": best.prefill_s,
                "decode_s": best.decode_s,
                "peak_memory_gib": best.peak_memory_gib,
            }
            measured.append(Measured(METRIC, best.tokens_per_s, label, details))
        return measured

    # About to fail, warn or regress: as many passes again, the best counting.
    gb_expect.each(measure(), again=measure)
