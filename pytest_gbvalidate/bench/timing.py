"""Timing that works the same on every device: events on an accelerator, the host clock on the CPU."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

MIN_TIMED_ITERATIONS = 10


def time_op_s(device: torch.device, op: Callable[[], object], *, warmup: int, iterations: int) -> list[float]:
    """Seconds taken by each of `iterations` calls of `op` on `device`, after `warmup` untimed calls."""
    if iterations < MIN_TIMED_ITERATIONS:
        raise ValueError(f"at least {MIN_TIMED_ITERATIONS} timed iterations are needed, got {iterations}")
    for _ in range(warmup):
        op()
    if device.type == "cpu":
        # The CPU backend has no events, and its ops are synchronous: the host clock brackets the work.
        samples = []
        for _ in range(iterations):
            start = time.perf_counter()
            op()
            samples.append(time.perf_counter() - start)
        return samples
    torch.accelerator.synchronize(device)
    stream = torch.accelerator.current_stream(device)  # where `op` is issued; events must be recorded there
    starts = [torch.Event(device=device, enable_timing=True) for _ in range(iterations)]
    ends = [torch.Event(device=device, enable_timing=True) for _ in range(iterations)]
    for start_event, end_event in zip(starts, ends, strict=True):
        start_event.record(stream)
        op()
        end_event.record(stream)
    torch.accelerator.synchronize(device)
    return [s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends, strict=True)]


def median(samples: list[float]) -> float:
    return statistics.median(samples)
