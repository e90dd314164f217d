"""The GPU smoke script's (benchmarks/gpu_smoke.py) CPU-checkable parts: the seed baseline it records over, the MFU
peaks it knows, the sweep memory lines it prints. (A whole run: e2e/test_gpu_smoke_run.py.)"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from pytest_gbvalidate import baselines as bl
from tests.helpers.scripts import gpu_smoke


@pytest.fixture(scope="module")
def smoke() -> ModuleType:
    return gpu_smoke()


@pytest.mark.parametrize(
    ("gpus", "count", "name"),
    [(["NVIDIA H100 80GB HBM3"] * 2, 2, "NVIDIA H100 80GB HBM3"), ([], 0, None)],
)
def test_the_seed_baseline_names_the_gpus_and_holds_no_figures(
    smoke: ModuleType, tmp_path: Path, gpus: list[str], count: int, name: str | None
) -> None:
    path = tmp_path / "SMOKE.yaml"
    path.write_text(smoke.seed_baseline(gpus))
    baseline = bl.load_baseline(path)
    assert (baseline.detect.gpu_count, baseline.detect.gpu_name_contains, baseline.metrics) == (count, name, {})


def test_mfu_peaks_are_matched_on_the_device_name(smoke: ModuleType) -> None:
    h100 = smoke.peak_tflops("NVIDIA H100 80GB HBM3")
    assert h100 is not None and h100.tflops_per_gpu == 989.0 and "dgxc-benchmarking" in h100.source
    gb200 = smoke.peak_tflops("NVIDIA GB200")
    assert gb200 is not None and gb200.tflops_per_gpu == 2450.0  # not B200's, which its name also contains
    assert smoke.peak_tflops("NVIDIA RTX 6000 Ada Generation") is None
    assert smoke.peak_tflops("NVIDIA H100 PCIe") is None  # lower peaks than the SXM parts': asked for
    assert smoke.peak_tflops("NVIDIA H100 NVL") is None and smoke.peak_tflops("NVIDIA H200 NVL") is None


def test_sweep_memory_lines_name_the_peak_and_the_sizes_not_run(smoke: ModuleType) -> None:
    def size(scope: str, **details: object) -> dict[str, object]:
        return {"metric": "all_reduce_busbw_gbps", "scope": scope, "scope_kind": "message_size", "details": details}

    report = {
        "measurements": [
            size("1GiB", placement="in_place", peak_memory_bytes=3 * 2**30),
            size("8GiB", placement="in_place", peak_memory_bytes=17 * 2**30),
            size("16GiB", placement="in_place", not_run="memory: needs 33.0 GiB per rank, 20.0 GiB free"),
            size("8GiB", placement="in_place", tool="nccl-tests"),  # a reference tool's figure: not ours
        ]
    }
    assert smoke.sweep_memory_lines(report) == [
        "all_reduce_busbw_gbps in_place: peak device memory 17.00 GiB (at 8GiB); not run (memory): 16GiB"
    ]
    assert smoke.sweep_memory_lines({"measurements": []}) == ["no collective sweeps in the report"]
