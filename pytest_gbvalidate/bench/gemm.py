"""Dense GEMM throughput: 2*m*n*k floating-point operations per matmul / time, TFLOPS = 1e12 FLOP/s. The same
function runs a bf16 matmul on a GPU or on the CPU; fp8 (`torch._scaled_mm`) runs where the GPU has fp8 tensor
cores. A result that is wrong (checked against an fp32 matmul of a few rows) fails however fast it was."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from pytest_gbvalidate.bench.timing import median, time_op_s
from pytest_gbvalidate.node import neighbours

DTYPES = ("bf16", "fp8")
CHECKED_ROWS = 8
# bf16 and fp8 products of unit-variance data against an fp32 reference: rounding stays within a few percent
# of the largest output; a broken kernel (zeros, garbage, NaN) is off by order 1.
MAX_RELATIVE_ERROR = 0.05


class GemmResultError(AssertionError):
    """The matmul's output is not the product of its inputs."""


@dataclass(frozen=True)
class GemmResult:
    device: str
    dtype: str
    m: int
    n: int
    k: int
    iterations: int
    tflops: float  # median over the timed iterations
    samples_tflops: list[float]
    relative_error: float  # max |out - reference| / max |reference| over the checked rows
    cpu_wait_share: float | None = None  # on the CPU: the share of its timed time it waited for a CPU (neighbours)


def fp8_speedup_x(bf16: GemmResult | None, fp8: GemmResult) -> float | None:
    """How much faster the fp8 GEMM ran than the bf16 one of the same GPU at the same shape; None where no bf16
    GEMM ran at that shape (deselected, or other params)."""
    return None if bf16 is None or (bf16.m, bf16.n, bf16.k) != (fp8.m, fp8.n, fp8.k) else fp8.tflops / bf16.tflops


def fp8_supported(device: torch.device) -> bool:
    """CUDA-only: fp8 tensor cores start with compute capability 8.9 (Ada, Hopper, Blackwell). The CPU's
    `_scaled_mm` is a slow reference path, not something to measure."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def gemm_tflops(
    device: torch.device, dtype: str, m: int, n: int, k: int, *, warmup: int = 5, iterations: int = 20
) -> GemmResult:
    generator = torch.Generator().manual_seed(0)
    a32 = torch.randn(m, k, generator=generator)
    b32 = torch.randn(k, n, generator=generator)
    op, a_used, b_used = _matmul(device, dtype, a32, b32)
    before = neighbours.read() if device.type == "cpu" else None
    seconds = time_op_s(device, op, warmup=warmup, iterations=iterations)
    waited = neighbours.waited_share(before, neighbours.read() if device.type == "cpu" else None)
    reference = a_used[:CHECKED_ROWS].float() @ b_used.float()
    error = float((op()[:CHECKED_ROWS].float() - reference).abs().max() / reference.abs().max())
    if not error <= MAX_RELATIVE_ERROR:  # also catches NaN
        raise GemmResultError(
            f"{dtype} {m}x{n}x{k} matmul on {device}: relative error {error:.3g} against an fp32 reference "
            f"(limit {MAX_RELATIVE_ERROR:g})"
        )
    samples = [2.0 * m * n * k / s / 1e12 for s in seconds]
    return GemmResult(str(device), dtype, m, n, k, iterations, median(samples), samples, error, waited)


def _matmul(
    device: torch.device, dtype: str, a32: torch.Tensor, b32: torch.Tensor
) -> tuple[Callable[[], torch.Tensor], torch.Tensor, torch.Tensor]:
    """The timed operation (returning its output) and the inputs as it sees them (after rounding)."""
    if dtype == "bf16":
        a = a32.to(device=device, dtype=torch.bfloat16)
        b = b32.to(device=device, dtype=torch.bfloat16)
        out = torch.empty(a.shape[0], b.shape[1], device=device, dtype=torch.bfloat16)
        return (lambda: torch.matmul(a, b, out=out)), a, b
    if dtype == "fp8":  # CUDA-only: e4m3 inputs, unit scales, bf16 output; cuBLASLt wants the second column-major
        a = a32.to(device=device, dtype=torch.float8_e4m3fn)
        b = b32.t().contiguous().to(device=device, dtype=torch.float8_e4m3fn).t()
        scale = torch.ones((), device=device, dtype=torch.float32)
        return (lambda: torch._scaled_mm(a, b, scale_a=scale, scale_b=scale, out_dtype=torch.bfloat16)), a, b
    raise ValueError(f"unknown GEMM dtype {dtype!r} (known: {', '.join(DTYPES)})")
