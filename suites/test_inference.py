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
        results = gb_gang.run(inference_on_rank, request)
        return [
            Measured(
                METRIC,
                r.tokens_per_s,
                label,
                {
                    **vars(request),
                    "prefill_tokens_per_s": r.prefill_tokens_per_s,
                    "decode_tokens_per_s": r.decode_tokens_per_s,
                    "prefill_s": r.prefill_s,
                    "decode_s": r.decode_s,
                    "peak_memory_gib": r.peak_memory_gib,
                },
            )
            for label, r in zip(rank_labels(gb_target, gb_gang), results, strict=True)
        ]

    # One generation per rank is one figure: a second pass before a verdict against it (the better counts).
    gb_expect.each(measure(), again=measure)
