"""Local scratch storage (pytest_gbvalidate/bench/storage.py): sequential write and read throughput of the scratch
directory (--gb-scratch: the node's NVMe volume; a temporary directory on `cpu`), with direct I/O where the file
system allows it, and the time to write a checkpoint-sized tensor file and read it back, each the best of
storage.PASSES passes (every pass in the details). Sizes: the metric's `params.size_bytes`, else the defaults
below. The files are removed afterwards, whatever happened."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_gbvalidate.bench import storage
from pytest_gbvalidate.expect import Expect, Measured
from pytest_gbvalidate.reference_tools import fio, runner
from pytest_gbvalidate.target import ReferenceTools, Target

pytestmark = pytest.mark.gb_level("standard")

# Larger than a GPU node's page cache is not asked of a default: direct I/O keeps the cache out of the figure.
SEQUENTIAL_BYTES = {"gpu": 8 * 2**30, "cpu": 256 * 2**20}  # cpu: 16 blocks, each a sample
CHECKPOINT_BYTES = {"gpu": 4 * 2**30, "cpu": 32 * 2**20}


def _size(target: Target, metric: str, default: dict[str, int]) -> int:
    return int(target.params(metric).get("size_bytes", default["gpu" if target.is_gpu else "cpu"]))


def test_scratch_throughput(gb_target: Target, gb_expect: Expect, gb_scratch: Path) -> None:
    size = _size(gb_target, "scratch_write_gbps", SEQUENTIAL_BYTES)

    def measure() -> list[Measured]:
        try:
            passes = storage.sequential_passes(gb_scratch, size)
        except storage.StorageError as exc:
            pytest.fail(f"scratch {gb_scratch}: {exc}", pytrace=False)
        write, read = [p.write_gbps for p in passes], [p.read_gbps for p in passes]
        details: dict[str, Any] = {
            "directory": str(gb_scratch),
            "size_bytes": passes[0].size_bytes,
            "direct_io": all(p.direct_io for p in passes),
            "rule": f"best of {len(passes)} passes",
            "write_gbps_passes": write,
            "read_gbps_passes": read,
        }
        # `passes`: each pass's figure of this metric; `samples_gbps`: the best pass's blocks, whose spread is the
        # figure's own error (rules/noise.py)
        best_write, best_read = max(passes, key=lambda p: p.write_gbps), max(passes, key=lambda p: p.read_gbps)
        return [
            Measured(
                "scratch_write_gbps",
                best_write.write_gbps,
                "node",
                details | {"passes": write, "samples_gbps": list(best_write.write_block_gbps)},
            ),
            Measured(
                "scratch_read_gbps",
                best_read.read_gbps,
                "node",
                details | {"passes": read, "samples_gbps": list(best_read.read_block_gbps)},
            ),
        ]

    gb_expect.each(measure(), again=measure)  # about to fail or regress: as many passes again, the best counting


def test_checkpoint_write_and_read(gb_target: Target, gb_expect: Expect, gb_scratch: Path) -> None:
    size = _size(gb_target, "checkpoint_write_s", CHECKPOINT_BYTES)

    def measure() -> list[Measured]:
        try:
            passes = storage.checkpoint_passes(gb_scratch, size)
        except storage.StorageError as exc:
            pytest.fail(f"scratch {gb_scratch}: {exc}", pytrace=False)
        write, read = [p.write_s for p in passes], [p.read_s for p in passes]
        details: dict[str, Any] = {
            "directory": str(gb_scratch),
            "size_bytes": passes[0].size_bytes,
            "rule": f"best of {len(passes)} passes",
            "write_s_passes": write,
            "read_s_passes": read,
        }
        return [
            Measured("checkpoint_write_s", min(write), "node", details | {"passes": write}),
            Measured("checkpoint_read_s", min(read), "node", details | {"passes": read}),
        ]

    gb_expect.each(measure(), again=measure)


def test_fio_scratch_throughput(
    gb_target: Target, gb_expect: Expect, gb_scratch: Path, gb_reference_tools: ReferenceTools
) -> None:
    """fio's sequential write and read of the same size, beside ours (--gb-reference-tools, fio on PATH): the same
    metrics, `details.tool: fio`, against the same baseline."""
    if not gb_reference_tools.enabled:
        pytest.skip(gb_reference_tools.reason)
    binary = runner.find(fio.FIO)
    if binary is None:
        pytest.skip("fio is not on PATH")
    size = _size(gb_target, "scratch_write_gbps", SEQUENTIAL_BYTES)
    measured = []
    try:
        with storage.work_dir(gb_scratch) as directory:
            direct = storage.direct_io_supported(directory)
            for metric, rw in (("scratch_write_gbps", "write"), ("scratch_read_gbps", "read")):
                command = fio.fio_command(binary, str(directory / "fio.bin"), size_bytes=size, rw=rw, direct=direct)
                text = runner.run(command, env={}, timeout_s=gb_reference_tools.timeout_s)
                details = {"tool": fio.FIO, "directory": str(gb_scratch), "size_bytes": size, "direct_io": direct}
                measured.append(Measured(metric, fio.parse_fio(text, rw), "node", details))
    except (storage.StorageError, runner.ToolError) as exc:
        pytest.fail(f"scratch {gb_scratch}: {exc}", pytrace=False)
    gb_expect.each(measured)
