"""The GEMM measurement's pure parts on the CPU: TFLOPS and the result check, and fp8's speedup over bf16 (whose
GEMMs themselves need a GPU with fp8 tensor cores)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from pytest_gbvalidate.bench.gemm import fp8_speedup_x, gemm_tflops

pytestmark = pytest.mark.torch_version  # torch._scaled_mm, a private API whose signature moves


def test_a_cpu_gemm_is_timed_and_checked() -> None:
    result = gemm_tflops(torch.device("cpu"), "bf16", 64, 64, 64, warmup=1, iterations=10)
    assert (result.dtype, result.m, result.n, result.k, result.iterations) == ("bf16", 64, 64, 64, 10)
    assert result.tflops > 0 and len(result.samples_tflops) == 10
    assert result.relative_error < 2e-2  # bf16 output: 8 bits of mantissa


def test_the_fp8_speedup_is_taken_against_the_bf16_gemm_of_the_same_shape_only() -> None:
    bf16 = dataclasses.replace(
        gemm_tflops(torch.device("cpu"), "bf16", 64, 64, 64, warmup=1, iterations=10), tflops=791.0
    )
    fp8 = dataclasses.replace(bf16, dtype="fp8", tflops=1465.0)
    assert fp8_speedup_x(bf16, fp8) == pytest.approx(1465 / 791)
    assert fp8_speedup_x(None, fp8) is None  # the bf16 GEMM was deselected
    assert fp8_speedup_x(dataclasses.replace(bf16, k=128), fp8) is None  # another shape: no ratio
