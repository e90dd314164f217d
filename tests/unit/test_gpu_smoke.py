"""The GPU smoke script's CPU-checkable parts: the seed baseline it records over, the MFU peaks it knows, the
sweep memory lines it prints, and one whole run on the CPU (no GPU assumed: `--device cpu`)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from pytest_gbvalidate import baselines as bl

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_smoke.py"


@pytest.fixture(scope="module")
def smoke() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_smoke", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
    assert smoke.peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert smoke.peak_tflops("NVIDIA GB200") == 2450.0  # not B200's, which its name also contains
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


def test_a_whole_smoke_run_on_the_cpu(smoke: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The script's main in this process (its suite runs are pytest processes of their own, as on a GPU node)."""
    out = tmp_path / "smoke"
    smoke.main(["--device", "cpu", "--out", str(out), "-k", "host_copy"])
    stdout = capsys.readouterr().out
    assert "record run: exit 0; check run: exit " in stdout, stdout
    assert "engine: llama3_tiny_4layers (dim 64, seq 64, vocab 512)" in stdout
    assert "MFU: no public peak known for this GPU (pass --peak-tflops)" in stdout
    recorded = bl.load_baseline(out / "SMOKE.yaml")
    expected = recorded.metrics["host_copy_bandwidth_gbps"].default.expected
    assert expected is not None and expected > 0
    assert (out / "check.json").is_file() and (out / "check.xml").is_file()
