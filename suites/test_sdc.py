"""Silent data corruption: the same seeded computation on every GPU of the node (on `cpu`, on the gang's ranks),
bit-identical across them and between two passes, and within tolerance of a CPU reference
(pytest_gbvalidate/workloads/sdc.py). Fails naming the GPU that is off."""

from __future__ import annotations

import pytest

from pytest_gbvalidate.ranks.gang import Gang
from pytest_gbvalidate.target import Target, rank_labels
from pytest_gbvalidate.workloads import sdc

pytestmark = pytest.mark.gb_level("standard")

# GEMM shape (m, n, k): on a GPU, enough output tiles to occupy every SM of the largest GPUs; on the CPU, small.
SHAPE = {"gpu": (4096, 4096, 1024), "cpu": (256, 256, 256)}


def test_silent_data_corruption(gb_target: Target, gb_gang: Gang) -> None:
    m, n, k = SHAPE["gpu" if gb_target.is_gpu else "cpu"]
    per_rank = gb_gang.run(sdc.sdc_on_rank, m, n, k)
    labels = rank_labels(gb_target, gb_gang)
    found = sdc.problems(labels, per_rank, sdc.cpu_reference(m, n, k))
    assert not found, f"silent data corruption check ({m}x{n}x{k} GEMMs, {sdc.MODEL.name} pass): " + "; ".join(found)
