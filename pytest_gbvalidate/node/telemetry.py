"""A background sampler of node telemetry, to wrap around any workload:

    with Sampler([NvmlSource(0, handle), CpuSource()]) as sampler:
        workload()
    sampler.summary()  # {"gpu0.power_w": {"mean": 612.0, "p5": 590.5, "p95": 650.1}, ...}

A source is any object with a `name` and a `read()` returning {series name: value}, called about every `interval_s`
on a thread of its own, and at start and stop (a short workload still has both ends); one that fails is noted in
`errors` and the others go on. No pytest here; psutil and NVML only in the sources that need them."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pytest_gbvalidate.node import nvml

DEFAULT_INTERVAL_S = 0.1  # 10 Hz: NVML refreshes most of its sensors at about this rate
GIB = 2**30


class Source(Protocol):
    name: str

    def read(self) -> dict[str, float]: ...


@dataclass(frozen=True)
class Sensors:
    """What a telemetry sampler reads from one GPU, about ten times a second."""

    utilization_pct: float  # of the last sample period in which a kernel ran
    memory_used_bytes: int
    sm_clock_mhz: int
    power_w: float
    temperature_c: int
    clocks_event_reasons: int


def sensors(h: Any) -> Sensors:
    import pynvml

    return Sensors(
        utilization_pct=float(nvml.call("nvmlDeviceGetUtilizationRates", h).gpu),
        memory_used_bytes=int(nvml.call("nvmlDeviceGetMemoryInfo", h).used),
        sm_clock_mhz=int(nvml.call("nvmlDeviceGetClockInfo", h, pynvml.NVML_CLOCK_SM)),
        power_w=int(nvml.call("nvmlDeviceGetPowerUsage", h)) / 1000.0,
        temperature_c=int(nvml.call("nvmlDeviceGetTemperature", h, pynvml.NVML_TEMPERATURE_GPU)),
        clocks_event_reasons=nvml.clocks_event_reasons(h),
    )


class NvmlSource:
    """One GPU (a lost one leaves the others sampled): `gpu<index>.<what>_<unit>` series, and whether its clocks are
    held by a slowdown (nvml.SLOWDOWN_REASONS) or the power cap as 1 or 0 (the mean: the fraction of the time)."""

    def __init__(self, index: int, handle: Any) -> None:
        self.name = f"gpu{index}"
        self.handle = handle

    def read(self) -> dict[str, float]:
        s = sensors(self.handle)
        prefix = self.name + "."
        return {
            prefix + "utilization_pct": s.utilization_pct,
            prefix + "memory_used_gib": s.memory_used_bytes / GIB,
            prefix + "sm_clock_mhz": s.sm_clock_mhz,
            prefix + "power_w": s.power_w,
            prefix + "temperature_c": s.temperature_c,
            prefix + "slowdown": float(bool(nvml.slowdown_reasons(s.clocks_event_reasons))),
            prefix + "power_capped": float(bool(s.clocks_event_reasons & nvml.SW_POWER_CAP)),
        }


class CpuSource:
    """The host: CPU utilization since the previous read (its own counters: samplers at once do not disturb each
    other), memory used, and the CPU clock where the kernel reports one."""

    name = "cpu"

    def __init__(self) -> None:
        import psutil

        self._last = psutil.cpu_times()

    def read(self) -> dict[str, float]:
        import psutil

        now = psutil.cpu_times()
        # Linux counters sometimes step back (iowait notably): a negative delta counts as none, as top does it.
        delta = {f: max(0.0, getattr(now, f) - getattr(self._last, f)) for f in now._fields}
        self._last = now
        # Guest time is already counted in user and nice time; waiting for I/O is idle time, as top counts it.
        total = sum(delta.values()) - delta.get("guest", 0.0) - delta.get("guest_nice", 0.0)
        busy = max(0.0, total - delta["idle"] - delta.get("iowait", 0.0))
        values = {
            "cpu.utilization_pct": 100.0 * busy / total if total > 0 else 0.0,
            "cpu.memory_used_gib": psutil.virtual_memory().used / GIB,
        }
        freq = psutil.cpu_freq()
        if freq is not None and freq.current > 0:
            values["cpu.freq_mhz"] = float(freq.current)
        return values


@dataclass(frozen=True)
class Sample:
    t_s: float  # since the sampler started
    values: dict[str, float]


class Sampler:
    def __init__(self, sources: Sequence[Source], interval_s: float = DEFAULT_INTERVAL_S) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be above 0, got {interval_s}")
        self.sources = list(sources)
        self.interval_s = interval_s
        self._samples: list[Sample] = []
        self._errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0
        self._t_end: float | None = None

    def __enter__(self) -> Sampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Sampler:
        if self._thread is not None:
            raise RuntimeError("this sampler has already run; make a new one")
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="gbvalidate-telemetry", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sampling (after one last sample). Safe to call more than once, or on a sampler never started."""
        if self._thread is None or self._t_end is not None:
            return
        self._stop.set()
        self._thread.join()
        self._t_end = time.monotonic()

    @property
    def started(self) -> bool:
        return self._thread is not None

    def _run(self) -> None:
        deadline = self._t0
        while True:
            self._sample()
            deadline += self.interval_s
            if self._stop.wait(max(0.0, deadline - time.monotonic())):
                break
        self._sample()

    def _sample(self) -> None:
        t_s = time.monotonic() - self._t0
        values: dict[str, float] = {}
        for source in self.sources:
            try:
                values.update(source.read())
            except Exception as exc:  # a sensor that fails must not end the sampling of the others
                message = f"{source.name}: {exc}"
                with self._lock:
                    if message not in self._errors:
                        self._errors.append(message)
        with self._lock:
            self._samples.append(Sample(t_s, values))

    @property
    def samples(self) -> list[Sample]:
        with self._lock:
            return list(self._samples)

    @property
    def errors(self) -> list[str]:
        with self._lock:
            return list(self._errors)

    @property
    def duration_s(self) -> float:
        if self._thread is None:
            return 0.0
        return (self._t_end if self._t_end is not None else time.monotonic()) - self._t0

    def series(self) -> dict[str, list[float]]:
        """Series name -> its values, in time order (a sample in which its source failed has none)."""
        out: dict[str, list[float]] = {}
        for sample in self.samples:
            for name, value in sample.values.items():
                out.setdefault(name, []).append(value)
        return out

    def summary(self) -> dict[str, dict[str, float]]:
        """Series name -> mean, 5th and 95th percentile (see `summarize`)."""
        return summarize(self.series())

    def as_dict(self) -> dict[str, Any]:
        """Everything, for a report: the summary and the raw series (aligned on `t_s`; None where missing)."""
        samples = self.samples
        names = sorted({name for s in samples for name in s.values})
        return {
            "interval_s": self.interval_s,
            "duration_s": round(self.duration_s, 3),
            "sample_count": len(samples),
            "sources": [s.name for s in self.sources],
            "errors": self.errors,
            "summary": self.summary(),
            "t_s": [round(s.t_s, 4) for s in samples],
            "series": {name: [_json_number(s.values.get(name)) for s in samples] for name in names},
        }


def summarize(series: Mapping[str, Sequence[float]]) -> dict[str, dict[str, float]]:
    """Series name -> mean, 5th and 95th percentile of its finite values (a series with none is left out)."""
    out = {}
    for name, values in series.items():
        if finite := sorted(v for v in values if math.isfinite(v)):
            out[name] = {
                "mean": _round(sum(finite) / len(finite)),
                "p5": _round(percentile(finite, 5)),
                "p95": _round(percentile(finite, 95)),
            }
    return out


def percentile(sorted_values: Sequence[float], pct: float) -> float:
    """The `pct`th percentile of sorted values, linear between the closest ranks (numpy's default method)."""
    if not sorted_values:
        raise ValueError("no values")
    position = (len(sorted_values) - 1) * pct / 100.0
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


def _round(x: float) -> float:
    return float(f"{x:.6g}")


def _json_number(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else x
