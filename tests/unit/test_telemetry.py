"""Unit tests of the telemetry sampler (pytest_gbvalidate/node/telemetry.py): timing, summaries, failing
sources; the CPU source for real and the NVML source over the fake library."""

from __future__ import annotations

import threading
import time
from typing import NamedTuple

import numpy as np
import pytest

from pytest_gbvalidate.node import nvml, telemetry
from tests.helpers.fakenvml import HW_THERMAL_SLOWDOWN, SW_POWER_CAP, FakeGpu, FakeNvmlLib, install


class Counter:
    """A source whose value goes up by one per read; it can be told to fail."""

    def __init__(self, name: str = "counter") -> None:
        self.name = name
        self.reads = 0
        self.fail_with: Exception | None = None

    def read(self) -> dict[str, float]:
        if self.fail_with is not None:
            raise self.fail_with
        self.reads += 1
        return {f"{self.name}.value": float(self.reads)}


def test_it_samples_at_its_interval_from_start_to_stop() -> None:
    source = Counter()
    with telemetry.Sampler([source], interval_s=0.02) as sampler:
        time.sleep(0.3)
    samples = sampler.samples
    periods = sampler.duration_s / 0.02
    assert periods / 2 <= len(samples) <= periods + 3  # one per period, plus the one taken on stopping
    assert [s.values["counter.value"] for s in samples] == list(range(1, len(samples) + 1))
    assert [s.t_s for s in samples] == sorted(s.t_s for s in samples) and samples[-1].t_s >= 0.3  # one on stopping
    assert sampler.duration_s >= 0.3
    assert not any(t.name == "gbvalidate-telemetry" for t in threading.enumerate())
    n = len(sampler.samples)
    time.sleep(0.05)
    assert len(sampler.samples) == n  # stopped means stopped


def test_a_sampler_runs_once() -> None:
    sampler = telemetry.Sampler([Counter()], interval_s=0.01)
    sampler.stop()  # never started: nothing to do
    with sampler:
        pass
    sampler.stop()
    assert len(sampler.samples) >= 2  # one on starting, one on stopping
    with pytest.raises(RuntimeError, match="already run"):
        sampler.start()
    with pytest.raises(ValueError, match="interval_s"):
        telemetry.Sampler([], interval_s=0)


def test_summary_is_mean_and_percentiles_like_numpy() -> None:
    values = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0, 5.0, 3.0, 5.0]
    summaries = telemetry.summarize({"x": values, "only_nan": [float("nan")]})
    assert list(summaries) == ["x"]
    summary = summaries["x"]
    assert summary["mean"] == pytest.approx(np.mean(values), rel=1e-5)
    assert summary["p5"] == pytest.approx(np.percentile(values, 5), rel=1e-5)
    assert summary["p95"] == pytest.approx(np.percentile(values, 95), rel=1e-5)
    assert telemetry.percentile([7.0], 95) == 7.0


def test_a_failing_source_is_noted_once_and_the_others_go_on() -> None:
    broken, healthy = Counter("broken"), Counter()
    broken.fail_with = OSError("sensor gone")
    with telemetry.Sampler([broken, healthy], interval_s=0.01) as sampler:
        time.sleep(0.05)
    assert sampler.errors == ["broken: sensor gone"]
    assert healthy.reads == len(sampler.samples) >= 2


def test_as_dict_aligns_series_on_time() -> None:
    flaky = Counter("flaky")
    with telemetry.Sampler([flaky, Counter()], interval_s=0.01) as sampler:
        time.sleep(0.03)
        flaky.fail_with = OSError("gone")
        time.sleep(0.03)
    record = sampler.as_dict()
    values = record["series"]["flaky.value"]
    assert len(values) == len(record["t_s"]) == len(record["series"]["counter.value"]) == record["sample_count"]
    assert values[: flaky.reads] == [float(i) for i in range(1, flaky.reads + 1)]
    assert set(values[flaky.reads :]) == {None}  # no value once it failed
    assert record["summary"]["flaky.value"]["mean"] > 0 and record["errors"] == ["flaky: gone"]


def test_cpu_source_reads_this_machine() -> None:
    source = telemetry.CpuSource()
    sum(range(200_000))  # some CPU time between the reads
    values = source.read()
    assert 0.0 <= values["cpu.utilization_pct"] <= 100.0
    assert 0.0 < values["cpu.memory_used_gib"] < 1e4


class CpuTimes(NamedTuple):
    """What psutil.cpu_times() returns on Linux (a subset of its fields)."""

    user: float
    nice: float
    system: float
    idle: float
    iowait: float
    guest: float


def test_cpu_utilization_stays_a_percentage_when_counters_step_back(monkeypatch: pytest.MonkeyPatch) -> None:
    import psutil

    readings = iter(
        [
            CpuTimes(100.0, 0.0, 50.0, 1000.0, 30.0, 0.0),
            CpuTimes(103.0, 0.0, 51.0, 1000.5, 20.0, 2.0),  # iowait went back; guest time is part of user time
            CpuTimes(103.0, 0.0, 51.0, 1002.5, 20.0, 2.0),
        ]
    )
    monkeypatch.setattr(psutil, "cpu_times", lambda: next(readings))
    source = telemetry.CpuSource()
    assert source.read()["cpu.utilization_pct"] == pytest.approx(100 * 4 / 4.5)  # busy 3 + 1, idle 0.5
    assert source.read()["cpu.utilization_pct"] == 0.0


def test_nvml_source_reads_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu(utilization_pct=87, power_usage_mw=612_500, clocks_event_reasons=SW_POWER_CAP)
    install(monkeypatch, FakeNvmlLib([gpu]))
    with nvml.session():
        source = telemetry.NvmlSource(0, nvml.handle(0))
        assert source.read() == {
            "gpu0.utilization_pct": 87.0,
            "gpu0.memory_used_gib": 0.5,
            "gpu0.sm_clock_mhz": 1980,
            "gpu0.power_w": 612.5,
            "gpu0.temperature_c": 31,
            "gpu0.slowdown": 0.0,
            "gpu0.power_capped": 1.0,
        }
        gpu.clocks_event_reasons = HW_THERMAL_SLOWDOWN
        assert source.read()["gpu0.slowdown"] == 1.0
