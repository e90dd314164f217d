"""Collective bus bandwidth over a sweep of message sizes, measured and computed as nccl-tests does (see
pytest_gbvalidate/bench/collectives.py): every size is reported, the sizes the SKU's baseline names are gated
one by one (never an average over the sweep), and a wrong result at any size fails the test however fast it was.

A collective needs two ranks: on a 1-GPU node these checks skip, saying so. A size that cannot fit in the GPUs'
free memory is not run: a gated one fails saying what it needed and what was free, any other is listed as not
run. The sweep doubles from 8 B to 8 GiB on GPUs (further where the baseline gates a larger size) and to 16 MiB on
the CPU; a baseline's `params` (min_bytes, max_bytes, warmup, iterations) override that per collective.
Under torchrun / srun the gang is the whole world, so this measures the collectives across nodes.

all_reduce pinned to NVLS (NVLink SHARP) is a case of its own beside the baseline's (Ring-pinned on ND GB200 v6),
on a communicator of its own built with ``NCCL_ALGO=NVLS``; NCCL's own log says which algorithm ran, and the check
fails where NCCL did not run NVLS, however good the bandwidth. Across the VMs of one NVLink domain (torchrun /
srun), all_reduce over multi-node NVLink is gated on a metric of its own, NCCL's log proving the communicator runs
over MNNVL and that no connection between nodes went over the network (bench/nccl_case.py, bench/nccl_log.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pytest

from pytest_gbvalidate.bench import nccl_log, pairwise
from pytest_gbvalidate.bench.collectives import COLLECTIVES, IN_PLACE, MIN_RANKS, SizeRow, summarize, sweep_on_rank
from pytest_gbvalidate.bench.nccl_case import MNNVL_METRIC, NVLS_METRIC, RankCase, sweep_with_nccl_log_on_rank
from pytest_gbvalidate.expect import Expect, Measured
from pytest_gbvalidate.labels import size_label
from pytest_gbvalidate.ranks.gang import Gang
from pytest_gbvalidate.ranks.world_gang import WorldGang
from pytest_gbvalidate.sweeps import WARMUP, SweepPlan, expect_sweep, one_size_plan, sweep_plan
from pytest_gbvalidate.target import Target, require_ranks

pytestmark = pytest.mark.gb_level("standard")

# The message size of the pairwise check when the baseline's params give none: the size GPU collectives are
# quoted at (sweeps.DEFAULT_GATES), and on the CPU a size the multi-node tests run in seconds.
PAIRWISE_BYTES = {"gpu": 2**30, "cpu": 2**20}
# Timed samples per pair in each of its repeats (bench/pairwise.REPEATS in the first pass, RECHECK_REPEATS in each
# second-pass round): on cpu enough that a pair 25% slower stands beyond two errors of its median where one sample
# spreads about 60% (docs/noise.md, behind the constants); a GPU pair's samples agree far closer.
PAIRWISE_ITERATIONS = {"gpu": 10, "cpu": 40}
# The NVLS case's communicator: NCCL_ALGO names the one algorithm (NCCL then refuses a call it cannot run with it,
# src/enqueue.cc "No algorithm/protocol available"; an older NCCL may run another silently: the log says which).
NVLS_ENV = {"NCCL_ALGO": "NVLS"}
NVLS_SETTINGS = ("NCCL_ALGO", "NCCL_NVLS_ENABLE")
# What selects multi-node NVLink: NCCL_MNNVL_ENABLE (src/init.cc; default 2, on where the fabric supports it) and
# the IMEX channels; recorded with each measurement as the ranks have them.
MNNVL_SETTINGS = ("NCCL_MNNVL_ENABLE", "NCCL_NVLS_ENABLE", "NCCL_ALGO", "NCCL_MNNVL_UUID", "NCCL_MNNVL_CLIQUE_ID")


def check_collective(
    collective: str, placement: str, target: Target, gang: Gang, gb_expect: Expect, plan: SweepPlan | None = None
) -> None:
    """Sweep a collective as the baseline plans it (or as `plan` says), gate the gated sizes, check every result."""
    metric = COLLECTIVES[collective].metric
    require_ranks(target, gang.world_size, MIN_RANKS, f"{collective} {placement}")
    plan = sweep_plan(target, metric) if plan is None else plan
    problems: list[str] = []

    def measure(sizes: list[int]) -> list[tuple[str, float, dict[str, object]]]:
        per_rank = gang.run(sweep_on_rank, collective, placement, sizes, plan.warmup, plan.iterations)
        rows = summarize(collective, placement, per_rank)
        if any(row.wrong for row in rows):
            problems.append(wrong_data_message(collective, placement, rows))
        return [(row.label, row.busbw_gbps, row.details()) for row in rows]

    # Measured again, only the gated sizes: the others are reported, never judged (sweeps.expect_sweep).
    gated = [size for size in plan.sizes if size_label(size) in plan.gates]
    expect_sweep(
        gb_expect, metric, plan, measure(plan.sizes), problems, again=(lambda: measure(gated)) if gated else None
    )


def wrong_data_message(collective: str, placement: str, rows: list[SizeRow]) -> str:
    bad = [
        f"{row.label}: {row.wrong} wrong of {row.count} elements "
        f"({', '.join(f'rank {rank}: {n}' for rank, n in sorted(row.wrong_by_rank.items()))})"
        for row in rows
        if row.wrong
    ]
    return f"{collective} {placement} returned wrong data at {len(bad)} of {len(rows)} sizes: " + "; ".join(bad)


@pytest.mark.gb_level("quick")
def test_all_reduce_one_size(gb_target: Target, gb_gang: Gang, gb_expect: Expect) -> None:
    """The quick level's collective: one mid-size all_reduce, in place, gated against the baseline and its data
    checked -- the smallest size the baseline gates (128 MiB with the default GPU gates, 16 MiB on the CPU)."""
    plan = one_size_plan(sweep_plan(gb_target, COLLECTIVES["all_reduce"].metric))
    check_collective("all_reduce", IN_PLACE, gb_target, gb_gang, gb_expect, plan)


@pytest.mark.parametrize("placement", COLLECTIVES["all_reduce"].placements)
def test_all_reduce_busbw(placement: str, gb_target: Target, gb_gang: Gang, gb_expect: Expect) -> None:
    check_collective("all_reduce", placement, gb_target, gb_gang, gb_expect)


@pytest.mark.parametrize("placement", COLLECTIVES["all_gather"].placements)
def test_all_gather_busbw(placement: str, gb_target: Target, gb_gang: Gang, gb_expect: Expect) -> None:
    check_collective("all_gather", placement, gb_target, gb_gang, gb_expect)


@pytest.mark.parametrize("placement", COLLECTIVES["reduce_scatter"].placements)
def test_reduce_scatter_busbw(placement: str, gb_target: Target, gb_gang: Gang, gb_expect: Expect) -> None:
    check_collective("reduce_scatter", placement, gb_target, gb_gang, gb_expect)


@pytest.mark.parametrize("placement", COLLECTIVES["alltoall"].placements)
def test_alltoall_busbw(placement: str, gb_target: Target, gb_gang: Gang, gb_expect: Expect) -> None:
    check_collective("alltoall", placement, gb_target, gb_gang, gb_expect)


@pytest.mark.parametrize("placement", COLLECTIVES["broadcast"].placements)
def test_broadcast_busbw(placement: str, gb_target: Target, gb_gang: Gang, gb_expect: Expect) -> None:
    check_collective("broadcast", placement, gb_target, gb_gang, gb_expect)


def test_pairwise_all_reduce_busbw(gb_target: Target, gb_gang: Gang, gb_expect: Expect) -> None:
    """Under torchrun / srun across nodes: all_reduce between pairs of nodes, even/odd then shifted
    (bench/pairwise.py). Fails naming the node that is slow, or returns wrong data, in every pair it joins, and
    the pair that returns wrong data no node explains; those nodes go into the report's `suspects` for the fleet
    summary's drain list. Each pair's busbw is reported, and gated where the baseline has a value for it."""
    metric = "pairwise_all_reduce_busbw_gbps"
    if not isinstance(gb_gang, WorldGang):
        pytest.skip("pairs of nodes need a torchrun / srun world across nodes; this run is one node")
    params = gb_target.params(metric)
    kind = "gpu" if gb_target.is_gpu else "cpu"
    size_bytes = int(params.get("size_bytes", PAIRWISE_BYTES[kind]))
    warmup, iterations = int(params.get("warmup", WARMUP)), int(params.get("iterations", PAIRWISE_ITERATIONS[kind]))
    slow_pct = float(params.get("slow_pct", pairwise.SLOW_PCT))
    run = pairwise.summarize(gb_gang.run(pairwise.pairwise_on_rank, size_bytes, warmup, iterations, slow_pct))
    if not run.rows:
        pytest.skip(f"pairs of nodes need two nodes; this world of {gb_gang.world_size} rank(s) is on one")
    blame = pairwise.blame(run.rows, run.node_of_rank, slow_pct, run.rechecks)
    problems = []
    for node, why in blame.nodes.items():
        problems.append(f"node{node} ({run.hosts[node]}): {why}")
        gb_expect.suspect(run.hosts[node], why)
    for (a, b), why in blame.pairs.items():
        problems.append(f"node{a}+node{b} ({run.hosts[a]}, {run.hosts[b]}): {why}")
        gb_expect.suspect(run.hosts[a], why)
        gb_expect.suspect(run.hosts[b], why)
    problems.sort(key=lambda p: "wrong data" not in p)  # the first line, which the fault table reads, is the worst
    measured = []
    for row in run.rechecks:  # the second pass, reported beside the first: what the verdict on a suspect read
        a, b = row.nodes
        details = {"hosts": [run.hosts[a], run.hosts[b]], "size": size_label(size_bytes), "size_bytes": size_bytes}
        details |= {"error_pct": round(row.error_pct, 3), "second_pass": True}
        gb_expect.record(
            metric, row.busbw_gbps, f"node{a}+node{b} (second pass, round {row.round + 1})", details=details
        )
    for row in run.rows:
        a, b = row.nodes
        scope = f"node{a}+node{b}"
        details = {
            "hosts": [run.hosts[a], run.hosts[b]],
            "size": size_label(size_bytes),
            "size_bytes": size_bytes,
            "wrong_by_rank": {str(rank): n for rank, n in row.wrong_by_rank.items()},
            "error_pct": round(row.error_pct, 3),  # of its median, from its samples: a slow pair must exceed it
        }
        ref = gb_target.reference(metric, scope)
        if ref is not None and ref.has_reference:
            measured.append(Measured(metric, row.busbw_gbps, scope, details))
        else:
            gb_expect.record(metric, row.busbw_gbps, scope, details=details)
    gb_expect.each(measured, [f"pairwise all_reduce: {p}" for p in problems])


def check_nccl_case(
    metric: str,
    case_env: Mapping[str, str],
    settings: tuple[str, ...],
    problem: Callable[[nccl_log.NcclLog], str | None],
    target: Target,
    gang: Gang,
    gb_expect: Expect,
) -> None:
    """all_reduce swept as the baseline plans `metric`, on a communicator built with `case_env`, NCCL's log
    captured on every rank. Every size records the NCCL environment (`settings` as ``unset`` where they are not),
    the algorithms NCCL ran it with, and how many of the communicator's connections ran over each transport
    (``{"P2P/MNNVL": 64}``). The test fails with `problem`'s line first (the line the fault table reads) where
    NCCL's log does not show what the metric is of, and on a call that raised, a gate missed or wrong data."""
    require_ranks(target, gang.world_size, MIN_RANKS, metric)
    plan = sweep_plan(target, metric)
    cases: list[RankCase] = gang.run(
        sweep_with_nccl_log_on_rank, "all_reduce", IN_PLACE, plan.sizes, plan.warmup, plan.iterations, dict(case_env)
    )
    log = nccl_log.merge(c.log for c in cases if c.log is not None)  # no rank's log: an empty one, 0 lines
    why = problem(log)
    # A log that does not say (no algorithm, connection or init line) cannot tell: after the gates, unresolved.
    untold = why if why is not None and why.startswith(nccl_log.NOT_CONFIRMED) else None
    problems = [why] if why and untold is None else []
    errors = sorted({c.error for c in cases if c.error})
    problems += [f"all_reduce failed on the ranks: {e}" for e in errors]
    if errors:
        gb_expect.each([], problems)
        return
    rows = summarize("all_reduce", IN_PLACE, [c.results for c in cases])
    if any(row.wrong for row in rows):
        problems.append(wrong_data_message("all_reduce", IN_PLACE, rows))
    function = nccl_log.NCCL_FUNCTION["all_reduce"]
    env = {**nccl_log.shown_env(cases[0].env, settings), **cases[0].env}
    transports = log.transports()  # the communicator's connections, set up for the whole sweep
    measured = [
        (
            row.label,
            row.busbw_gbps,
            row.details()
            | {
                "nccl_env": env,
                "nccl_algorithms": log.algorithms(function, row.bytes),
                "nccl_transports": transports,
            },
        )
        for row in rows
    ]
    expect_sweep(gb_expect, metric, plan, measured, problems)
    if untold is not None:  # no failure of its own: neither a pass nor the node's fault (faults.yaml, unresolved)
        pytest.fail(f"UNRESOLVED: {untold}", pytrace=False)


def test_nvls_all_reduce_busbw(gb_target: Target, gb_gang: Gang, gb_expect: Expect) -> None:
    """all_reduce over NVLS beside the Ring-pinned sweep (test_all_reduce_busbw), on its own metric: NCCL's log must
    show every all_reduce call ran NVLS (a silent fallback to Ring fails, however fast), then each gated size is
    gated as the baseline says."""
    if not gb_target.is_gpu:
        pytest.skip("NVLS is an NCCL algorithm over NVLink switches; this SKU's collectives run on gloo")
    check_nccl_case(
        NVLS_METRIC,
        NVLS_ENV,
        NVLS_SETTINGS,
        lambda log: nccl_log.nvls_problem(log, nccl_log.NCCL_FUNCTION["all_reduce"]),
        gb_target,
        gb_gang,
        gb_expect,
    )


def test_mnnvl_all_reduce_busbw(gb_target: Target, gb_gang: Gang, gb_expect: Expect) -> None:
    """Under torchrun / srun across the VMs of one NVLink domain: all_reduce over multi-node NVLink, its own
    metric; NCCL's log must say the communicator runs over MNNVL (``MNNVL 1``) and show its connections, none
    between nodes over the network (``via NET/IB/...`` where ``via P2P/MNNVL`` was due), else the test fails saying
    so."""
    if not isinstance(gb_gang, WorldGang):
        pytest.skip(
            "multi-node NVLink needs a torchrun / srun world across the VMs of an NVLink domain; this run is one node"
        )
    if len(gb_gang.hosts) < 2:
        pytest.skip(f"multi-node NVLink needs two nodes; this world of {gb_gang.world_size} rank(s) is on one")
    if not gb_target.is_gpu:
        pytest.skip("multi-node NVLink is NCCL over NVLink between nodes; this SKU's collectives run on gloo")
    check_nccl_case(MNNVL_METRIC, {}, MNNVL_SETTINGS, nccl_log.mnnvl_problem, gb_target, gb_gang, gb_expect)
