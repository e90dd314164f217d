"""The COLLECTIVES table of bench/collectives.py: one entry per collective metric the suites gate, nccl-tests'
busbw factors, and memory estimates that are the buffers a size really allocates."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from pytest_gbvalidate.bench.collectives import COLLECTIVES, IN_PLACE, _Case, bytes_needed
from pytest_gbvalidate.bench.nccl_case import MNNVL_METRIC, NVLS_METRIC
from pytest_gbvalidate.metrics import CATALOG
from pytest_gbvalidate.ranks.gang import RankContext
from pytest_gbvalidate.reference_tools.nccl_tests import NCCL_TESTS_BINARIES


def test_the_table_covers_every_collective_metric_and_nccl_tests_binary() -> None:
    per_size_busbw = {
        name for name, spec in CATALOG.items() if spec.scope_kind == "message_size" and name.endswith("_busbw_gbps")
    }
    # all_reduce pinned to NVLS and over multi-node NVLink are all_reduce measured on a communicator of their own
    assert {c.metric for c in COLLECTIVES.values()} | {NVLS_METRIC, MNNVL_METRIC} == per_size_busbw
    assert all(name == c.name for name, c in COLLECTIVES.items())
    assert set(NCCL_TESTS_BINARIES) == set(COLLECTIVES)  # each nccl-tests figure has ours beside it


# nccl-tests' getBw per collective (src/*.cu): busbw = algbw x this factor for n ranks.
NCCL_TESTS_FACTORS: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
}


@pytest.mark.parametrize("name", sorted(COLLECTIVES))
def test_busbw_factors_are_nccl_tests_for_every_world_size(name: str) -> None:
    ranks = [1, 2, 3, 4, 8, 16, 72, 576]
    assert [COLLECTIVES[name].busbw_factor(n) for n in ranks] == [NCCL_TESTS_FACTORS[name](n) for n in ranks]


def test_a_size_s_memory_estimate_is_the_buffers_it_allocates() -> None:
    """bytes_needed counts a size's buffers from the table, _Case allocates them: the two differ by the data
    check's temporaries only, the same for every collective and placement."""
    count, ranks = 3 * 1024, 4
    over_buffers = set()
    for name, collective in COLLECTIVES.items():
        for placement in collective.placements:
            ctx = RankContext(rank=2, world_size=ranks, local_rank=2, device=torch.device("cpu"), backend="gloo")
            case = _Case(ctx, name, placement, count)
            storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in (case.input, case.output)}
            over_buffers.add(bytes_needed(name, placement, count, ranks) - sum(storages.values()))
            if placement == IN_PLACE:
                assert len(storages) == 1, name  # in place: one buffer
    assert len(over_buffers) == 1 and over_buffers.pop() > 0


def test_in_place_the_smaller_buffer_is_this_rank_s_part_of_the_larger() -> None:
    """As nccl-tests' in-place offsets: all_gather sends from its own part of what it receives, reduce_scatter
    receives into its own part of what it sends; all_reduce and broadcast use one buffer both ways."""
    ctx = RankContext(rank=2, world_size=4, local_rank=2, device=torch.device("cpu"), backend="gloo")
    gather, scatter = _Case(ctx, "all_gather", IN_PLACE, 1024), _Case(ctx, "reduce_scatter", IN_PLACE, 1024)
    assert gather.input.numel() == scatter.output.numel() == 256
    assert gather.input.data_ptr() == gather.output.data_ptr() + 2 * 256 * 4
    assert scatter.output.data_ptr() == scatter.input.data_ptr() + 2 * 256 * 4
    reduce = _Case(ctx, "all_reduce", IN_PLACE, 1024)
    assert reduce.input is reduce.output and reduce.input.numel() == 1024


def test_the_busbw_plot_draws_one_point_per_size_the_last_measured() -> None:
    """The quick level's one all_reduce size (1 MiB) and the sweep's own 1 MiB: one point there, the sweep's, so
    the line does not go back and forth through two."""
    from pytest_gbvalidate.report.collective_tables import OUR_TOOL, busbw_series

    def record(size: int, busbw: float, placement: str = IN_PLACE) -> Any:
        return {"value": busbw, "details": {"size_bytes": size, "placement": placement}}

    one_size, sweep = [record(2**20, 1.9)], [record(2**19, 1.2), record(2**20, 1.5), record(2**21, 1.7)]
    series = busbw_series([*one_size, *sweep, record(2**20, 1.1, "out_of_place")])
    assert series == {
        (OUR_TOOL, IN_PLACE): [(2**19, 1.2), (2**20, 1.5), (2**21, 1.7)],
        (OUR_TOOL, "out_of_place"): [(2**20, 1.1)],
    }
