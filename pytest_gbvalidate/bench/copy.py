"""Copy bandwidth between host and device memory, measured as nvbandwidth reports it: bytes copied / time,
GB = 1e9 bytes, one direction. The same function runs host->host on the CPU and H2D/D2H/D2D on a GPU."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pytest_gbvalidate.bench.timing import median, time_op_s
from pytest_gbvalidate.node import neighbours


class DataIntegrityError(AssertionError):
    """The bytes that arrived are not the bytes that were sent: a fast wrong copy must not pass."""


@dataclass(frozen=True)
class CopyResult:
    src_device: str
    dst_device: str
    size_bytes: int
    iterations: int
    bandwidth_gbps: float  # median over the timed iterations
    samples_gbps: list[float]
    host_binding: dict[str, str] = field(default_factory=dict)  # CPUs / NUMA node the host side was bound to
    cpu_wait_share: float | None = None  # where host memory took part: the share of its time it waited for a CPU


def copy_bandwidth(
    src_device: torch.device, dst_device: torch.device, size_bytes: int, *, warmup: int = 3, iterations: int = 20
) -> CopyResult:
    # CUDA-only: a host<->device copy runs at full rate only from page-locked (pinned) host memory.
    pin = torch.cuda.is_available() and (src_device.type == "cpu") != (dst_device.type == "cpu")
    src = _pattern(size_bytes).to(src_device)
    dst = torch.empty(size_bytes, dtype=torch.uint8, device=dst_device)
    if pin:
        src, dst = (t.pin_memory() if t.device.type == "cpu" else t for t in (src, dst))
    # The copy runs on the source GPU's stream (the destination's for H2D): its events must be on that device.
    timed_device = src_device if src_device.type != "cpu" else dst_device
    host_side = "cpu" in (src_device.type, dst_device.type)  # a neighbour on the host can slow it
    before = neighbours.read() if host_side else None
    seconds = time_op_s(timed_device, lambda: dst.copy_(src, non_blocking=True), warmup=warmup, iterations=iterations)
    waited = neighbours.waited_share(before, neighbours.read() if host_side else None)
    if not torch.equal(dst.cpu(), src.cpu()):
        mismatched = int((dst.cpu() != src.cpu()).sum())
        raise DataIntegrityError(f"{src_device}->{dst_device} copy of {size_bytes} B: {mismatched} bytes differ")
    samples = [size_bytes / s / 1e9 for s in seconds]
    return CopyResult(
        str(src_device), str(dst_device), size_bytes, iterations, median(samples), samples, cpu_wait_share=waited
    )


def _pattern(size_bytes: int) -> torch.Tensor:
    """A non-constant byte pattern (period 251, prime), so a copy that drops or shifts blocks is caught."""
    return torch.arange(251, dtype=torch.uint8).repeat(-(-size_bytes // 251))[:size_bytes].contiguous()
