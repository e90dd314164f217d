"""Collective measurements: the nccl-tests formulas, the sweep plan a baseline gives, and real sweeps on a gang of
3 ranks (odd, so the split collectives round) whose data check catches a rank that returns wrong data."""

from __future__ import annotations

import gc
import math
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from pytest_gbvalidate import baselines as bl
from pytest_gbvalidate.bench.collectives import (
    BACK_TO_BACK_BELOW_BYTES,
    BACK_TO_BACK_CALLS,
    COLLECTIVES,
    IN_PLACE,
    OUT_OF_PLACE,
    RankSizeResult,
    _Case,
    algbw_gbps,
    busbw_factor,
    bytes_needed,
    calls_per_sample,
    element_count,
    summarize,
    sweep_on_rank,
)
from pytest_gbvalidate.bench.timing import time_op_s
from pytest_gbvalidate.ranks.gang import LocalGang, RankContext
from pytest_gbvalidate.sweeps import SweepPlan, expect_sweep, sweep_plan
from pytest_gbvalidate.target import Target, require_ranks
from tests.helpers import gang_functions as f
from tests.helpers import rank_faults

pytestmark = (
    pytest.mark.torch_version
)  # getattr(dist, ...) picks the collective's API; torch.accelerator; bench/timing.py


@pytest.mark.parametrize(
    ("collective", "factors"),
    [
        ("all_reduce", {2: 1.0, 4: 1.5, 8: 1.75}),  # 2(n-1)/n
        ("all_gather", {2: 0.5, 4: 0.75, 8: 0.875}),  # (n-1)/n
        ("reduce_scatter", {2: 0.5, 4: 0.75, 8: 0.875}),
        ("alltoall", {2: 0.5, 4: 0.75, 8: 0.875}),
        ("broadcast", {2: 1.0, 4: 1.0, 8: 1.0}),
    ],
)
def test_busbw_factors_are_nccl_tests(collective: str, factors: dict[int, float]) -> None:
    assert {n: busbw_factor(collective, n) for n in factors} == factors


def test_algbw_is_bytes_per_second_in_1e9() -> None:
    assert algbw_gbps(8 * 2**30, 0.0125) == pytest.approx(687.19476736)


def test_unknown_collective() -> None:
    with pytest.raises(ValueError, match="unknown collective 'gather'"):
        busbw_factor("gather", 4)


@pytest.mark.parametrize(
    ("collective", "size", "ranks", "count"),
    [
        ("all_reduce", 8, 3, 2),
        ("all_gather", 8, 3, 0),  # 2 elements cannot be split 3 ways
        ("all_gather", 64, 3, 15),  # 16 elements round down to 15
        ("alltoall", 2**33, 8, 2**31),
        ("broadcast", 12, 4, 3),
    ],
)
def test_element_counts(collective: str, size: int, ranks: int, count: int) -> None:
    assert element_count(collective, size, ranks) == count


def test_summarize_averages_ranks_per_iteration_then_takes_the_median() -> None:
    rank0 = [RankSizeResult(2**20, 2**18, [1e-3, 2e-3, 4e-3, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3], 0)]
    rank1 = [RankSizeResult(2**20, 2**18, [3e-3, 2e-3, 4e-3, 3e-3, 3e-3, 3e-3, 3e-3, 3e-3, 3e-3, 3e-3], 5)]
    (row,) = summarize("all_reduce", "in_place", [rank0, rank1])
    assert row.time_s == pytest.approx(2e-3)  # per-iteration means are 2, 2, 4, 2, ... ms
    assert row.algbw_gbps == pytest.approx(2**20 / 2e-3 / 1e9)
    assert row.busbw_gbps == pytest.approx(row.algbw_gbps * 1.0)  # 2(n-1)/n with n = 2
    assert (row.label, row.bytes, row.count, row.iterations) == ("1MiB", 2**20, 2**18, 10)
    assert (row.wrong, row.wrong_by_rank) == (5, {1: 5})


def test_summarize_keeps_a_size_that_was_not_run_without_inventing_numbers() -> None:
    not_run = [RankSizeResult(2**30, 2**28, [], 0, not_run="memory: needs 1.8 GiB per rank, 1.0 GiB free")]
    (row,) = summarize("all_reduce", "in_place", [not_run, not_run])
    assert row.not_run == "memory: needs 1.8 GiB per rank, 1.0 GiB free"
    assert math.isnan(row.busbw_gbps) and math.isnan(row.time_s)
    assert row.details() == {
        "collective": "all_reduce",
        "placement": "in_place",
        "size_bytes": 2**30,
        "count": 2**28,
        "dtype": "float",
        "not_run": "memory: needs 1.8 GiB per rank, 1.0 GiB free",
    }


@pytest.mark.parametrize(
    ("collective", "placement", "buffers"),
    [
        ("all_reduce", IN_PLACE, 1.0),
        ("broadcast", IN_PLACE, 1.0),
        ("all_gather", IN_PLACE, 1.0),
        ("all_gather", OUT_OF_PLACE, 1.25),  # the full output and one rank's quarter
        ("reduce_scatter", OUT_OF_PLACE, 1.25),
        ("alltoall", OUT_OF_PLACE, 2.0),
    ],
)
def test_memory_a_size_needs_is_its_buffers_and_the_check_temporaries(
    collective: str, placement: str, buffers: float
) -> None:
    count = 2**30  # 4 GiB of float32
    needed = bytes_needed(collective, placement, count, 4)
    check = needed - buffers * count * 4
    assert 0 < check <= 2**30  # the data check works chunk by chunk: bounded, whatever the size
    assert bytes_needed(collective, placement, 1024, 4) < 2**20


def test_a_size_s_buffers_are_freed_without_the_cyclic_collector() -> None:
    """A buffer referenced from a cycle lives until the cyclic collector runs, which a long-lived rank may not
    do for many sizes: on a GPU that held tens of GiB and ran a 16 GiB sweep out of memory."""
    ctx = RankContext(rank=0, world_size=2, local_rank=0, device=torch.device("cpu"), backend="gloo")
    gc.disable()
    try:
        for collective, placement in [(c, p) for c in COLLECTIVES for p in COLLECTIVES[c].placements]:
            case = _Case(ctx, collective, placement, 1024)
            buffers = [weakref.ref(case.input), weakref.ref(case.output)]
            del case
            assert [ref() for ref in buffers] == [None, None], (collective, placement)
    finally:
        gc.enable()


def test_a_sample_times_its_calls_back_to_back_and_divides() -> None:
    calls: list[int] = []
    samples = time_op_s(torch.device("cpu"), lambda: calls.append(1), warmup=2, iterations=10, calls_per_sample=5)
    assert len(calls) == 2 + 10 * 5 and len(samples) == 10
    with pytest.raises(ValueError, match="a sample is at least one call, got 0"):
        time_op_s(torch.device("cpu"), lambda: None, warmup=0, iterations=10, calls_per_sample=0)


def test_small_messages_on_an_accelerator_are_timed_in_back_to_back_loops_as_nccl_tests_does() -> None:
    """Below about 1 MiB a collective's kernel is no longer than its launch: events around each call would time
    the launch too, which nccl-tests' loop does not. On the CPU calls are synchronous: nothing to hide."""
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert calls_per_sample(4096, cuda) == calls_per_sample(BACK_TO_BACK_BELOW_BYTES - 4, cuda) == BACK_TO_BACK_CALLS
    assert calls_per_sample(BACK_TO_BACK_BELOW_BYTES, cuda) == 1
    assert calls_per_sample(4096, cpu) == 1


def test_one_rank_measures_no_collective() -> None:
    ctx = RankContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo")
    with pytest.raises(ValueError, match="a collective needs at least 2 ranks, this gang has 1"):
        sweep_on_rank(ctx, "broadcast", "in_place", [8], 1, 10)


def test_a_one_gpu_sku_skips_collectives_and_a_node_short_of_its_gpus_fails(tmp_path: Path) -> None:
    one_gpu = target(tmp_path / "one", 1, "  {}\n")
    skip = "all_reduce in_place needs at least 2 ranks; this run's gang has 1"
    with pytest.raises(pytest.skip.Exception, match=skip):
        require_ranks(one_gpu, 1, 2, "all_reduce in_place")
    eight_gpus = target(tmp_path / "eight", 8, "  {}\n")
    with pytest.raises(pytest.fail.Exception, match="LAB promises 8 GPUs per node, but the gang has 1 rank"):
        require_ranks(eight_gpus, 1, 2, "all_reduce in_place")
    require_ranks(eight_gpus, 8, 2, "all_reduce in_place")  # enough: nothing raised


# --- the sweep a baseline asks for --------------------------------------------------------------------------


def target(tmp_path: Path, gpu_count: int, metric_yaml: str) -> Target:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "LAB.yaml").write_text(
        f"schema_version: 1\nsku: LAB\ndetect: {{gpu_count: {gpu_count}}}\nmetrics:\n{metric_yaml}"
    )
    return Target("LAB", "test", tmp_path, bl.load_baseline(tmp_path / "LAB.yaml"))


def test_a_gpu_sweep_reaches_every_gated_size(tmp_path: Path) -> None:
    t = target(
        tmp_path,
        8,
        "  all_reduce_busbw_gbps:\n    unit: GB/s\n    direction: higher\n    scope: message_size\n"
        "    status: provisional\n    provenance: test\n"
        "    values:\n      8GiB: {fail: 400}\n      16GiB: {fail: 460}\n",
    )
    plan = sweep_plan(t, "all_reduce_busbw_gbps")
    assert plan.sizes[0] == 8 and plan.sizes[-1] == 16 * 2**30 and len(plan.sizes) == 32
    assert plan.gates == {"8GiB", "16GiB"} and (plan.warmup, plan.iterations) == (5, 20)
    default = sweep_plan(t, "all_gather_busbw_gbps")  # no baseline entry: gated where public figures are quoted
    assert default.gates == {"128MiB", "1GiB", "8GiB"} and default.max_bytes == 8 * 2**30


def test_baseline_params_override_the_sweep(tmp_path: Path) -> None:
    t = target(
        tmp_path,
        0,
        "  broadcast_busbw_gbps:\n    unit: GB/s\n    direction: higher\n    scope: message_size\n"
        "    status: provisional\n    provenance: test\n"
        "    params: {min_bytes: 1024, max_bytes: 4096, iterations: 10, warmup: 1}\n"
        "    values:\n      64KiB: {fail: 0.001}\n",
    )
    plan = sweep_plan(t, "broadcast_busbw_gbps")
    assert plan.sizes == [1024, 2048, 4096, 65536]
    assert (plan.gates, plan.warmup, plan.iterations) == (frozenset({"64KiB"}), 1, 10)
    cpu_default = sweep_plan(t, "all_reduce_busbw_gbps")
    assert cpu_default.max_bytes == 16 * 2**20 and cpu_default.gates == {"16MiB"}

    # A min_bytes alone, above the CPU's default top (16 MiB), sweeps from there (and the default gated sizes)
    # rather than raising in the check.
    alone = target(
        tmp_path / "alone",
        0,
        "  broadcast_busbw_gbps:\n    status: provisional\n    provenance: test\n    params: {min_bytes: 33554432}\n",
    )
    assert sweep_plan(alone, "broadcast_busbw_gbps").sizes == [16 * 2**20, 32 * 2**20]


class _Gates:
    """gb_expect as expect_sweep uses it, keeping what each() was handed."""

    def __init__(self) -> None:
        self.failures: list[str] = []

    def record(self, *args: object, **kwargs: object) -> None:
        pass

    def not_measured(self, *args: object, **kwargs: object) -> None:
        pass

    def each(self, measured: list[object], failures: list[str]) -> None:
        self.failures = failures


def test_a_gated_size_the_sweep_has_no_result_for_fails_rather_than_passing_on_nothing() -> None:
    plan = SweepPlan(8, 8, [8], frozenset({"8B"}), 1, 10)
    gates = _Gates()
    expect_sweep(gates, "broadcast_busbw_gbps", plan, [])  # type: ignore[arg-type]  # the part it uses
    assert gates.failures == ["broadcast_busbw_gbps at 8B: gated, and no result at that size"]


# --- real sweeps on three ranks -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gang() -> Iterator[LocalGang]:
    g = LocalGang(3, start_timeout_s=120, call_timeout_s=120)
    yield g
    g.close()


CASES = [(c, p) for c in COLLECTIVES for p in COLLECTIVES[c].placements]


def test_every_collective_returns_the_right_data(gang: LocalGang) -> None:
    sizes = [8, 4096, 3 * 2**16]
    for collective, placement in CASES:
        per_rank = gang.run(sweep_on_rank, collective, placement, sizes, 1, 10)
        rows = summarize(collective, placement, per_rank)
        assert [r.label for r in rows] == ["8B", "4KiB", "192KiB"]
        if collective in ("all_gather", "reduce_scatter", "alltoall"):  # 2 elements cannot be split 3 ways
            too_small = rows.pop(0)
            assert too_small.not_run == "size: 8 B is less than one float element per rank (3 ranks)"
        assert [r.wrong for r in rows] == [0] * len(rows), (collective, placement)
        assert all(r.busbw_gbps > 0 and r.iterations == 10 and r.not_run is None for r in rows)
        # on the CPU each rank read how long it waited for a CPU while timed; the row, any rank's wait
        waits = [r.cpu_wait_share for r in rows]
        assert all(w is not None and 0 <= w <= 1 for w in waits), waits
        assert all(r.details()["cpu_wait_pct"] == round(r.cpu_wait_share * 100, 1) for r in rows if r.cpu_wait_share)


def test_a_rank_returning_wrong_data_is_caught_and_named(gang: LocalGang) -> None:
    for collective, placement in CASES:
        per_rank = gang.run(rank_faults.inject, "wrong", 1, sweep_on_rank, collective, placement, [4096], 1, 10)
        (row,) = summarize(collective, placement, per_rank)
        assert row.wrong_by_rank == {1: 1}, (collective, placement)


def test_sweeps_leave_no_memory_behind_with_the_collector_off(gang: LocalGang) -> None:
    # Above glibc's largest mmap threshold (32 MiB): a freed buffer leaves the resident set at once, and one left
    # behind by each of the four sweeps would add a third more than the allowance.
    size = 34 * 2**20
    growth = gang.run(f.memory_growth_of_sweeps, 4, size)
    assert all(g < 3 * size for g in growth), [f"{g / 2**20:.0f} MiB" for g in growth]


def test_a_size_that_does_not_fit_on_one_rank_is_not_run_on_any(gang: LocalGang) -> None:
    free = {1: 2 * 2**20}  # rank 1 has 2 MiB free: 4 KiB fits, 1 MiB (13 MiB with the check) does not
    per_rank = gang.run(f.with_free_bytes, free, sweep_on_rank, "all_reduce", "in_place", [4096, 2**20], 1, 10)
    small, large = summarize("all_reduce", "in_place", per_rank)
    assert small.not_run is None and small.busbw_gbps > 0 and small.wrong == 0
    assert large.not_run == "memory: needs 13.0 MiB per rank, 2.0 MiB free"
    assert [r[1].seconds for r in per_rank] == [[], [], []]  # every rank left it out: none waits for the others


def test_a_p2p_copy_hands_the_peer_s_cached_block_back_however_it_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    """The destination lives on the peer GPU, allocated by this rank's process: its caching allocator would keep
    the block there (on 8 GPUs, 7 ranks' blocks on each). No GPU here: the copy itself is stood in for."""
    from pytest_gbvalidate.bench import on_rank

    emptied: list[str] = []
    monkeypatch.setattr(torch.accelerator, "empty_cache", lambda: emptied.append("emptied"))
    ctx = RankContext(rank=0, world_size=2, local_rank=0, device=torch.device("cuda", 0), backend="nccl")

    def failing_copy(*args: object, **kwargs: object) -> None:
        raise RuntimeError("copy failed")

    monkeypatch.setattr(on_rank, "copy_bandwidth", lambda *args, **kwargs: "result")
    assert on_rank.p2p_on_rank(ctx, 1, 1024, 0, 10) == "result"  # type: ignore[comparison-overlap]
    monkeypatch.setattr(on_rank, "copy_bandwidth", failing_copy)
    with pytest.raises(RuntimeError, match="copy failed"):
        on_rank.p2p_on_rank(ctx, 1, 1024, 0, 10)
    assert emptied == ["emptied", "emptied"]
