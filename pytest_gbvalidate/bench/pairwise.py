"""Pairwise all_reduce between the nodes of a torchrun / srun world: which node is slow (or wrong) in every pair it
joins. The nodes are paired even/odd (0-1, 2-3, ...), then shifted by one (1-2, 3-4, ..., last-0), as Meta's gcm and
Google's cluster-health-scanner pair them; a round's pairs run at the same time, the rounds in turn, REPEATS times
(each pair's samples pooled: what drifts over the seconds of the check moves every pair alike). In this first pass a
pair is slow only beyond the error of its median (rules/noise.py): a pair measured in a noisy moment spreads widely,
a pair with a slow node is slow in every sample. A node slow in every pair is a suspect -- but so is a healthy node
paired once with the slow one and once in a noisy moment. So, as cluster-health-scanner's second pass does, each
suspect is measured again RECHECKS times, each beside another node that passed (in turn where fewer passed, and the
verdict says so), while the other nodes that passed are paired among themselves at the same time as the reference:
it is named only if its pairs are slower than those beside them round after round, by more than the rounds scatter
(`shortfall`), evidence no slow partner can fake.

Bus bandwidth as nccl-tests computes it for all_reduce over the pair's ranks (bench/collectives.py)."""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from pytest_gbvalidate import labels
from pytest_gbvalidate.bench.collectives import COLLECTIVES, DTYPE, ELEMENT_BYTES, algbw_gbps
from pytest_gbvalidate.bench.timing import median, time_op_s
from pytest_gbvalidate.ranks.gang import RankContext
from pytest_gbvalidate.rules import noise

# Slow: each of a node's pairs this much below the median of the pairs it is not in (the metric's params override).
SLOW_PCT = 10.0
# How often the first pass measures each round, in turn, `iterations` samples per pair each time (the figure: their
# median); six make each median's error √2 smaller than three (docs/noise.md, behind the constants).
REPEATS = 6
RECHECK_REPEATS = 3  # each second-pass round's measurements: its verdict rests on how rounds scatter
# Second-pass rounds per suspect. A slowed node's rounds scatter about as widely as it falls short (pairs sharing cores:
# one's loss is the other's gain): its mean stands 1.25 x sqrt(rounds) standard errors below, 3.5 with eight
# (docs/noise.md, behind the constants).
RECHECKS = 8
# Standard errors of their mean a suspect's rounds must stand below the pairs beside them (`shortfall`): eight
# normal rounds reach it in 1% of cases (Student's t, 7 degrees of freedom; docs/noise.md, the second pass).
SHORTFALL_T = 3.0
# Pairs a verdict on one node needs: its own (one pair cannot tell which side is at fault), and as the reference
# for slowness the pairs without it (one such pair may just be two nodes on the same leaf switch).
MIN_PAIRS = 2


def node_pairs(nodes: int) -> list[list[tuple[int, int]]]:
    """Rounds of disjoint node pairs: even/odd, then shifted by one; with an odd count a third round pairs the last
    node with the first, so that every node joins two pairs."""
    rounds = [[(a, a + 1) for a in range(0, nodes - 1, 2)], [(a, (a + 1) % nodes) for a in range(1, nodes, 2)]]
    if nodes % 2:
        rounds.append([(nodes - 1, 0)])
    seen: set[frozenset[int]] = set()
    unique = []
    for pairs in rounds:
        kept = [p for p in pairs if p[0] != p[1] and frozenset(p) not in seen]
        seen |= {frozenset(p) for p in kept}
        if kept:
            unique.append(kept)
    return unique


@dataclass(frozen=True)
class PairResult:
    nodes: tuple[int, int]
    round: int  # of its pass: a pair measured twice in a pass is two rows
    rank: int
    busbw_gbps: float
    time_s: float
    wrong: int  # elements of this rank's result that differ from the expected sum
    spread_pct: float = 0.0  # of this rank's timed samples (noise.spread_pct; 0 where they cannot say)
    samples: int = 0  # timed samples the median is taken from (all repeats)


def pairwise_on_rank(
    ctx: RankContext, size_bytes: int, warmup: int, iterations: int, slow_pct: float = SLOW_PCT
) -> dict[str, Any]:
    """Every rank joins every pair's group creation (torch requires it) and measures its own node's pairs, round by
    round; then every rank learns every pair's figure and the suspects are measured again (`recheck_pairs`)."""
    node_of_rank: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(node_of_rank, (ctx.node_rank, labels.hostname()))
    hosts = {node: host for node, host in node_of_rank}
    ranks_of: dict[int, list[int]] = {}
    for rank, (node, _) in enumerate(node_of_rank):
        ranks_of.setdefault(node, []).append(rank)
    nodes = sorted(ranks_of)
    node_ranks = [node for node, _ in node_of_rank]
    data = torch.empty(size_bytes // ELEMENT_BYTES, dtype=DTYPE, device=ctx.device)
    # One group per set of ranks, made in the same order on every rank: a pair measured again keeps its communicator
    # (an NCCL one holds GPU buffers, and making one bootstraps over the network).
    made: dict[tuple[int, ...], Any] = {}

    def group_of(ranks: list[int]) -> Any:
        if tuple(ranks) not in made:
            made[tuple(ranks)] = dist.new_group(ranks)
        return made[tuple(ranks)]

    def measure_rounds(rounds: list[list[tuple[int, int]]], repeats: int) -> list[PairResult]:
        members = {pair: sorted(ranks_of[pair[0]] + ranks_of[pair[1]]) for pairs in rounds for pair in pairs}
        groups = [[(pair, group_of(members[pair])) for pair in pairs] for pairs in rounds]
        wrong: dict[tuple[int, tuple[int, int]], int] = {}
        samples: dict[tuple[int, tuple[int, int]], list[float]] = {}
        for repeat in range(repeats):
            for index, pairs in enumerate(groups):
                for pair, group in pairs:
                    if ctx.rank not in members[pair]:
                        continue
                    if repeat == 0:
                        wrong[index, pair] = _wrong_elements(ctx.rank, data, group, members[pair])
                    op = functools.partial(dist.all_reduce, data, group=group)
                    times = time_op_s(ctx.device, op, warmup=warmup if repeat == 0 else 0, iterations=iterations)
                    samples.setdefault((index, pair), []).extend(times)
                dist.barrier()
        results = []
        for (index, pair), times in samples.items():
            time_s = median(times)
            busbw = algbw_gbps(data.numel() * ELEMENT_BYTES, time_s)
            busbw *= COLLECTIVES["all_reduce"].busbw_factor(len(members[pair]))
            spread = noise.spread_pct(times) or 0.0
            results.append(PairResult(pair, index, ctx.rank, busbw, time_s, wrong[index, pair], spread, len(times)))
        return results

    results = measure_rounds([[(nodes[a], nodes[b]) for a, b in pairs] for pairs in node_pairs(len(nodes))], REPEATS)
    everyone: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(everyone, results)
    rows = pair_rows([r for answer in everyone for r in answer])
    rechecks = measure_rounds(recheck_pairs(rows, node_ranks, slow_pct), RECHECK_REPEATS)
    return {"node_of_rank": node_ranks, "hosts": hosts, "results": results, "rechecks": rechecks}


def _wrong_elements(rank: int, data: torch.Tensor, group: Any, members: list[int]) -> int:
    """The elements of this rank's result that are wrong, each rank contributing rank + 1 (checked once per pair)."""
    data.fill_(rank + 1)
    dist.all_reduce(data, group=group)
    wrong = int((data != float(sum(r + 1 for r in members))).sum().item())
    data.zero_()  # the timed sums stay 0: no overflow to inf however many calls (and ranks) sum into it
    return wrong


@dataclass(frozen=True)
class PairRow:
    nodes: tuple[int, int]
    busbw_gbps: float  # the pair's slowest rank
    wrong_by_rank: dict[int, int]
    error_pct: float = 0.0  # of its figure: the largest of its ranks' errors of the median (noise.median_error_pct)
    round: int = 0  # of its pass

    def slow_below(self, floor_gbps: float, reference_gbps: float) -> bool:
        """Below `floor_gbps`, and further below `reference_gbps` than the error of its own median allows."""
        allowed_pct = noise.margin_pct(self.error_pct)
        return self.busbw_gbps < floor_gbps and noise.beyond(self.busbw_gbps, reference_gbps, allowed_pct)


@dataclass(frozen=True)
class PairwiseRun:
    hosts: dict[int, str]  # node -> hostname
    node_of_rank: list[int]
    rows: list[PairRow]
    rechecks: list[PairRow]  # the second pass: each suspect beside a node that passed, and the reference pairs


def pair_rows(results: list[PairResult]) -> list[PairRow]:
    """One row per pair and round: its slowest rank's figure, every rank's wrong elements, its ranks' largest error."""
    by_pair: dict[tuple[int, tuple[int, int]], list[PairResult]] = {}
    for r in results:
        by_pair.setdefault((r.round, r.nodes), []).append(r)
    return [
        PairRow(
            pair,
            min(r.busbw_gbps for r in rs),
            {r.rank: r.wrong for r in rs if r.wrong},
            max(noise.median_error_pct(r.spread_pct, r.samples) for r in rs),
            round_,
        )
        for (round_, pair), rs in sorted(by_pair.items())
    ]


def summarize(per_rank: list[dict[str, Any]]) -> PairwiseRun:
    """The pairs' rows, first pass and second, from every rank's results."""
    first = pair_rows([r for answer in per_rank for r in answer["results"]])
    second = pair_rows([r for answer in per_rank for r in answer["rechecks"]])
    return PairwiseRun(per_rank[0]["hosts"], per_rank[0]["node_of_rank"], first, second)


@dataclass(frozen=True)
class Blame:
    nodes: dict[int, str]  # node -> why: wrong data, or slow, in every pair it joined
    pairs: dict[tuple[int, int], str]  # a pair whose wrong data no node's blame explains -> why


@dataclass(frozen=True)
class Suspect:
    pairs: list[PairRow]  # its pairs of the first pass, every one slow
    reference_gbps: float  # the median of the pairs it was not in
    floor_gbps: float  # below this a pair of it is slow


def first_pass(
    rows: list[PairRow], node_of_rank: list[int], slow_pct: float
) -> tuple[dict[int, str], dict[int, Suspect]]:
    """The nodes every pair of which returned wrong data (on any rank: what a node corrupts shows on the other side),
    node -> why; and the suspects: every pair of which was over `slow_pct` below the median of the pairs it was not in
    (which it cannot pull down), beyond its error (PairRow.slow_below). Each needs MIN_PAIRS pairs with, and without."""
    joined: dict[int, list[PairRow]] = {}
    for row in rows:
        for node in row.nodes:
            joined.setdefault(node, []).append(row)
    wrong: dict[int, str] = {}
    suspects: dict[int, Suspect] = {}
    for node, pairs in sorted(joined.items()):
        if len(pairs) < MIN_PAIRS:
            continue
        if all(p.wrong_by_rank for p in pairs):
            seen = sorted({rank for p in pairs for rank in p.wrong_by_rank})
            on = "its own" if all(node_of_rank[r] == node for r in seen) else "its and its partners'"
            wrong[node] = f"wrong data in all {len(pairs)} of its pairs (on {on} ranks: {', '.join(map(str, seen))})"
            continue
        others = [r.busbw_gbps for r in rows if node not in r.nodes]
        if len(others) < MIN_PAIRS:
            continue
        reference_gbps = statistics.median(others)
        floor_gbps = reference_gbps * (1 - slow_pct / 100)
        if all(p.slow_below(floor_gbps, reference_gbps) for p in pairs):
            suspects[node] = Suspect(pairs, reference_gbps, floor_gbps)
    return wrong, suspects


def recheck_pairs(rows: list[PairRow], node_of_rank: list[int], slow_pct: float) -> list[list[tuple[int, int]]]:
    """The second pass: each suspect paired RECHECKS times with a node that passed, in turn (suspect i's from the i-th
    on), in rounds of disjoint pairs filled out with pairs of the free nodes that passed: the reference, measured at
    the same time (a pair alone would have the fabric to itself). None where nothing is suspect or nothing passed."""
    wrong, suspects = first_pass(rows, node_of_rank, slow_pct)
    passed = [n for n in sorted({node for row in rows for node in row.nodes}) if n not in suspects and n not in wrong]
    if not passed or not suspects:
        return []
    rounds: list[list[tuple[int, int]]] = []
    for turn in range(RECHECKS):
        for i, suspect in enumerate(sorted(suspects)):
            pair = (suspect, passed[(i + turn) % len(passed)])
            free = [r for r in rounds if not {n for p in r for n in p} & set(pair)]  # no node twice in a round
            if free:
                free[0].append(pair)
            else:
                rounds.append([pair])
    for pairs in rounds:
        busy = {n for p in pairs for n in p}
        idle = [n for n in passed if n not in busy]
        pairs.extend(zip(idle[0::2], idle[1::2], strict=False))
    return rounds


def beside(row: PairRow, references: list[PairRow]) -> float:
    """The median of the `references` measured in `row`'s round (all of them where it has none): drift between rounds
    moves a round's pairs alike, by as much as a third on a 2-vCPU VM (docs/noise.md, behind the constants)."""
    same_round = [r.busbw_gbps for r in references if r.round == row.round]
    return statistics.median(same_round or [r.busbw_gbps for r in references])


@dataclass(frozen=True)
class Shortfall:
    """How far a suspect's second-pass pairs fell below the pairs beside them, round by round."""

    below_pct: float  # the median round's: how much slower than the pair(s) beside it
    t: float  # the rounds' mean log ratio in standard errors of it (negative: slower)
    rounds: int

    def slow(self, slow_pct: float) -> bool:
        return self.below_pct > slow_pct and self.t < -SHORTFALL_T


def shortfall(against: list[tuple[PairRow, float]]) -> Shortfall:
    """A suspect's second-pass pairs against the references beside them: the median shortfall, and the mean log ratio
    in standard errors of the rounds' scatter (never less than the pairs' own errors). A slow node is slow round after
    round; a healthy one is slow in some and fast in others, and its rounds scatter as widely as it falls short."""
    measured = [(row, gbps) for row, gbps in against if gbps > 0]
    if not measured:
        return Shortfall(0.0, 0.0, 0)
    logs = [math.log(max(row.busbw_gbps, 1e-12) / gbps) for row, gbps in measured]
    scatter = statistics.stdev(logs) if len(logs) > 1 else 0.0
    error = math.sqrt(statistics.fmean((row.error_pct / 100) ** 2 for row, _ in measured))
    spread = max(scatter, error, 1e-12)  # rounds that agree exactly, with no error: as far out as they fall short
    t = statistics.fmean(logs) * math.sqrt(len(logs)) / spread
    return Shortfall((1 - math.exp(statistics.median(logs))) * 100, t, len(logs))


def blame(
    rows: list[PairRow], node_of_rank: list[int], slow_pct: float, rechecks: list[PairRow] | None = None
) -> Blame:
    """Which node is at fault: one every pair of which returned wrong data (`first_pass`), or a suspect slow again
    beside a node that passed (`rechecks`, `shortfall`), each pair against the references of its round (`beside`):
    pairs of nodes that passed where there are MIN_PAIRS, else the pairs without this suspect (two suspects of four
    nodes leave no two that passed; the first pass's figures would blame a suspect for a machine slower as a whole),
    else the first pass's reference. A suspect the second pass could not pair is named on the first pass's evidence,
    saying so. Wrong data never passes: where no node explains it, the pair is named."""
    wrong, suspects = first_pass(rows, node_of_rank, slow_pct)
    passed_pairs = [r for r in rechecks or [] if not set(r.nodes) & set(suspects)]
    slow: dict[int, str] = {}
    for node, suspect in suspects.items():
        shown = ", ".join(f"{p.busbw_gbps:.4g}" for p in suspect.pairs)
        why = (
            f"slow in all {len(suspect.pairs)} of its pairs ({shown} GB/s; the pairs without it: median "
            f"{suspect.reference_gbps:.4g} GB/s, slow below {suspect.floor_gbps:.4g})"
        )
        again = [r for r in rechecks or [] if node in r.nodes]
        distinct = len({r.nodes[1] for r in again})
        repeated = ""
        if distinct < len(again):
            repeated = f"; {distinct} node(s) passed to pair it with, so a partner was measured more than once"
        references, of_whom = passed_pairs, "of nodes that passed"
        if len(passed_pairs) < MIN_PAIRS:  # the pairs without it in its own rounds
            rounds = {r.round for r in again}
            references = [r for r in rechecks or [] if node not in r.nodes and r.round in rounds]
            of_whom = "without it"
        if not again:
            slow[node] = f"{why}; not measured again: no node that passed to pair it with"
            continue
        if len(references) >= MIN_PAIRS:
            against = [(r, beside(r, references)) for r in again]
            of_pairs = f"the pairs {of_whom} measured at the same time"
        else:  # no pair measured beside it: the first pass's reference
            against = [(r, suspect.reference_gbps) for r in again]
            of_pairs = "the first pass's pairs without it"
        found = shortfall(against)
        if found.slow(slow_pct):
            partners = ", ".join(f"node{r.nodes[1]}: {r.busbw_gbps:.4g} against {gbps:.4g}" for r, gbps in against)
            slow[node] = (
                f"{why}, and again beside a node that passed, in {found.rounds} rounds: {found.below_pct:.0f}% below "
                f"{of_pairs} at the median, {-found.t:.1f} standard errors of the rounds ({partners} GB/s{repeated})"
            )
    pairs_wrong = {}
    for row in rows:
        if row.wrong_by_rank and not set(row.nodes) & set(wrong):
            ranks = ", ".join(f"rank {rank}: {n}" for rank, n in sorted(row.wrong_by_rank.items()))
            pairs_wrong[row.nodes] = (
                f"wrong data in this pair ({ranks} elements): the path between node{row.nodes[0]} and "
                f"node{row.nodes[1]}, or one of them"
            )
    return Blame(wrong | slow, pairs_wrong)
