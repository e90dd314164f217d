"""Timing that works the same on every device: events on an accelerator, the host clock on the CPU."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

MIN_TIMED_ITERATIONS = 10


def time_op_s(
    device: torch.device, op: Callable[[], object], *, warmup: int, iterations: int, calls_per_sample: int = 1
) -> list[float]:
    """Seconds per call of `op` on `device`, `iterations` samples after `warmup` untimed calls. Each sample times
    `calls_per_sample` calls back to back between two marks and divides, as nccl-tests times its loop: for a short op
    (a small message's collective) events around each call would time its launch as well."""
    if iterations < MIN_TIMED_ITERATIONS:
        raise ValueError(f"at least {MIN_TIMED_ITERATIONS} timed iterations are needed, got {iterations}")
    if calls_per_sample < 1:
        raise ValueError(f"a sample is at least one call, got {calls_per_sample}")
    for _ in range(warmup):
        op()
    if device.type == "cpu":  # no events on the CPU, and its ops are synchronous: the host clock brackets the work
        samples = []
        for _ in range(iterations):
            start = time.perf_counter()
            for _ in range(calls_per_sample):
                op()
            samples.append((time.perf_counter() - start) / calls_per_sample)
        return samples
    torch.accelerator.synchronize(device)
    stream = torch.accelerator.current_stream(device)  # where `op` is issued; events must be recorded there
    starts = [torch.Event(device=device, enable_timing=True) for _ in range(iterations)]
    ends = [torch.Event(device=device, enable_timing=True) for _ in range(iterations)]
    for start_event, end_event in zip(starts, ends, strict=True):
        start_event.record(stream)
        for _ in range(calls_per_sample):
            op()
        end_event.record(stream)
    torch.accelerator.synchronize(device)
    return [s.elapsed_time(e) / 1e3 / calls_per_sample for s, e in zip(starts, ends, strict=True)]


class Stopwatch:
    """Intervals inside an op that time_op_s times (a step's work before its gradient sync): `start()` and
    `stop()` around the part, once per call; events on an accelerator, the host clock on the CPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._marks: list[tuple[Any, Any]] = []
        self._start: Any = None

    def _now(self) -> Any:
        if self.device.type == "cpu":
            return time.perf_counter()
        event = torch.Event(device=self.device, enable_timing=True)
        event.record(torch.accelerator.current_stream(self.device))
        return event

    def start(self) -> None:
        self._start = self._now()

    def stop(self) -> None:
        self._marks.append((self._start, self._now()))

    def intervals_s(self) -> list[float]:
        """Seconds of every start-stop interval so far, in order."""
        if self.device.type == "cpu":
            return [end - start for start, end in self._marks]
        torch.accelerator.synchronize(self.device)
        return [start.elapsed_time(end) / 1e3 for start, end in self._marks]


def median(samples: list[float]) -> float:
    return statistics.median(samples)
