"""The pairwise check's pure parts: how nodes are paired, and which node is to blame. (End to end: four torchrun
nodes on loopback in tests/e2e/test_multinode.py.)"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from pytest_gbvalidate.bench.pairwise import (
    RECHECKS,
    Blame,
    PairResult,
    PairRow,
    blame,
    node_pairs,
    pair_rows,
    recheck_pairs,
)
from pytest_gbvalidate.workloads.llama.parallel import Layout, weak_scaled


@pytest.mark.parametrize(
    ("nodes", "rounds"),
    [
        (1, []),
        (2, [[(0, 1)]]),  # the shifted round would pair them again
        (3, [[(0, 1)], [(1, 2)], [(2, 0)]]),  # odd: a third round gives every node two partners
        (4, [[(0, 1), (2, 3)], [(1, 2), (3, 0)]]),
        (6, [[(0, 1), (2, 3), (4, 5)], [(1, 2), (3, 4), (5, 0)]]),
    ],
)
def test_nodes_pair_even_odd_then_shifted(nodes: int, rounds: list[list[tuple[int, int]]]) -> None:
    assert node_pairs(nodes) == rounds
    for pairs in rounds:  # within a round no node is in two pairs: they run at the same time
        members = [n for pair in pairs for n in pair]
        assert len(members) == len(set(members))


def rows(
    busbw: dict[tuple[int, int], float], wrong: dict[tuple[int, int], dict[int, int]] | None = None
) -> list[PairRow]:
    return [PairRow(pair, gbps, (wrong or {}).get(pair, {})) for pair, gbps in busbw.items()]


ONE_RANK_PER_NODE = [0, 1, 2, 3]


def test_the_node_slow_in_every_pair_is_named_not_its_partners() -> None:
    measured = rows({(0, 1): 40.0, (2, 3): 20.0, (1, 2): 21.0, (3, 0): 41.0})
    found = blame(measured, ONE_RANK_PER_NODE, slow_pct=10)
    assert list(found.nodes) == [2] and not found.pairs
    assert found.nodes[2].startswith("slow in all 2 of its pairs (20, 21 GB/s; the pairs without it: median 40.5")


def test_a_node_just_past_the_threshold_is_named_against_the_pairs_without_it() -> None:
    # 12% slow: the median of all four pairs would be one of its own, 37.6, hiding it at 10%
    four = rows({(0, 1): 40.0, (2, 3): 35.2, (1, 2): 35.2, (3, 0): 40.0})
    assert list(blame(four, ONE_RANK_PER_NODE, slow_pct=10).nodes) == [2]
    assert blame(four, ONE_RANK_PER_NODE, slow_pct=15).nodes == {}
    # three nodes: one pair without the node is too little to call it slow (two nodes on one leaf switch)
    assert blame(rows({(0, 1): 40.0, (1, 2): 20.0, (2, 0): 20.0}), [0, 1, 2], slow_pct=10) == Blame({}, {})


def test_a_uniformly_slow_fleet_names_nobody_and_one_pair_cannot_tell() -> None:
    assert blame(rows({(0, 1): 20.0, (2, 3): 20.5, (1, 2): 19.8, (3, 0): 20.1}), ONE_RANK_PER_NODE, 10) == Blame({}, {})
    assert blame(rows({(0, 1): 1.0}), ONE_RANK_PER_NODE, 10) == Blame({}, {})


def test_wrong_data_is_blamed_on_the_node_in_every_wrong_pair() -> None:
    node_of_rank = [0, 0, 1, 1, 2, 2, 3, 3]  # two ranks per node
    # node 3 sees wrong sums itself in one pair; in the other its partner does (what node 3 sent was wrong)
    wrong = {(2, 3): {7: 1}, (3, 0): {0: 4}, (0, 1): {}}
    measured = rows({(0, 1): 40.0, (2, 3): 40.0, (1, 2): 40.0, (3, 0): 40.0}, wrong)
    why = "wrong data in all 2 of its pairs (on its and its partners' ranks: 0, 7)"
    assert blame(measured, node_of_rank, 10) == Blame({3: why}, {})


def test_wrong_data_no_node_explains_names_the_pair_and_two_nodes_name_no_node() -> None:
    measured = rows({(0, 1): 40.0, (2, 3): 40.0, (1, 2): 40.0, (3, 0): 40.0}, {(1, 2): {2: 8}})
    found = blame(measured, ONE_RANK_PER_NODE, 10)
    assert found.nodes == {}
    why = "wrong data in this pair (rank 2: 8 elements): the path between node1 and node2, or one of them"
    assert found.pairs == {(1, 2): why}
    two = blame(rows({(0, 1): 40.0}, {(0, 1): {0: 8, 1: 8}}), [0, 1], 10)
    assert two.nodes == {} and list(two.pairs) == [(0, 1)]


# --- the second pass: a slow partner and a noisy moment cannot name a healthy node ------------------------------
# The first pass of a 4-node loopback run on a busy 2-core machine (seen): node1 is the slow one, node3 returns
# wrong data; healthy node0 was slow in both its pairs, one with node1 and one in a noisy moment.
SEEN = rows({(0, 1): 0.04643, (2, 3): 1.4965, (1, 2): 0.04891, (3, 0): 0.5668}, {(2, 3): {3: 5}, (3, 0): {3: 5}})


def test_suspects_are_measured_again_beside_a_node_that_passed() -> None:
    # node2 is the only node that passed (node3 is wrong): each suspect RECHECKS times beside it, a pair a round
    assert recheck_pairs(SEEN, ONE_RANK_PER_NODE, 10) == [[(0, 2)], [(1, 2)]] * RECHECKS
    # with several that passed, partners are taken in turn and a round holds disjoint pairs, filled out with pairs
    # of the nodes that passed and are free in it: the reference, measured at the same time
    six = rows({(0, 1): 4.0, (2, 3): 40.0, (4, 5): 40.0, (1, 2): 4.1, (3, 4): 40.0, (5, 0): 40.0})
    again = recheck_pairs(six, [0, 1, 2, 3, 4, 5], 10)
    assert len(again) == RECHECKS and again[:3] == [
        [(1, 0), (2, 3), (4, 5)],
        [(1, 2), (0, 3), (4, 5)],
        [(1, 3), (0, 2), (4, 5)],
    ]
    assert recheck_pairs(rows({(0, 1): 40.0, (2, 3): 40.0, (1, 2): 40.0, (3, 0): 40.0}), ONE_RANK_PER_NODE, 10) == []


def test_each_suspect_is_measured_again_beside_distinct_partners_where_enough_passed() -> None:
    # Six nodes, node1 and node4 slow, node0 and node3 wrong: two passed (node2, node5). Taken in one turn shared by
    # the suspects, node1 got node2 twice and node4 node5 twice.
    wrong = {(0, 1): {0: 1}, (5, 0): {0: 1}, (2, 3): {3: 1}, (3, 4): {3: 1}}
    six = rows({(0, 1): 4.0, (2, 3): 40.0, (4, 5): 4.0, (1, 2): 4.1, (3, 4): 4.2, (5, 0): 40.0}, wrong)
    rounds = recheck_pairs(six, [0, 1, 2, 3, 4, 5], 10)
    assert _partners(rounds, {1, 4}) == {
        1: [(2, 5)[t % 2] for t in range(RECHECKS)],
        4: [(5, 2)[t % 2] for t in range(RECHECKS)],
    }
    for pairs in rounds:  # and a round still holds disjoint pairs
        members = [n for pair in pairs for n in pair]
        assert len(members) == len(set(members))
    # four passed: each suspect's partners differ, and the suspects start at different ones
    quiet = rows({(0, 1): 4.0, (2, 3): 40.0, (4, 5): 4.0, (1, 2): 4.1, (3, 4): 4.2, (5, 0): 40.0})
    partners = _partners(recheck_pairs(quiet, [0, 1, 2, 3, 4, 5], 10), {1, 4})
    assert partners == {
        1: [[0, 2, 3, 5][t % 4] for t in range(RECHECKS)],
        4: [[2, 3, 5, 0][t % 4] for t in range(RECHECKS)],
    }


def _partners(rounds: list[list[tuple[int, int]]], suspects: set[int]) -> dict[int, list[int]]:
    found: dict[int, list[int]] = {}
    for pairs in rounds:
        for suspect, partner in pairs:
            if suspect in suspects:
                found.setdefault(suspect, []).append(partner)
    return found


def test_a_suspect_is_judged_against_the_pairs_measured_beside_it() -> None:
    # node1 slow in its first-pass pairs (4 against 40 GB/s); in the second pass the whole machine got busy: its
    # pairs at 20, and so the reference pairs of nodes that passed: not slow against them
    six = rows({(0, 1): 4.0, (2, 3): 40.0, (4, 5): 40.0, (1, 2): 4.1, (3, 4): 40.0, (5, 0): 40.0})
    busy = rows({(1, 0): 20.0, (2, 3): 21.0, (4, 5): 20.5, (1, 2): 19.5, (0, 3): 20.0})
    assert blame(six, [0, 1, 2, 3, 4, 5], 10, busy).nodes == {}
    # the machine got quieter, the reference pairs at 80: node1's pairs at 45 are fast against the first pass, slow
    # against the pairs measured beside them
    quiet = rows({(1, 0): 45.0, (2, 3): 80.0, (4, 5): 81.0, (1, 2): 44.0, (0, 3): 79.0})
    found = blame(six, [0, 1, 2, 3, 4, 5], 10, quiet).nodes
    assert list(found) == [1] and found[1].endswith(
        "and again beside a node that passed, in 2 rounds: 44% below the pairs of nodes that passed measured at the "
        "same time at the median, 52.2 standard errors of the rounds (node0: 45 against 80, node2: 44 against 80 GB/s)"
    )


def test_a_suspect_is_judged_against_the_pairs_of_its_own_round() -> None:
    # A 2-vCPU VM, one node 25% slower: the second pass's first round ran at 0.43 GB/s, its second at 0.32. Against
    # the median of both, node1's pairs were within their noise (0.334: 11% below 0.376, error 7.9%); against the
    # pair measured beside each, 23% and 18% below.
    first = rows({(0, 1): 0.26, (2, 3): 0.353, (1, 2): 0.238, (3, 0): 0.3375})
    first = [PairRow(r.nodes, r.busbw_gbps, {}, 7.0, 0 if r.nodes in {(0, 1), (2, 3)} else 1) for r in first]
    assert recheck_pairs(first, ONE_RANK_PER_NODE, 10)[:2] == [[(1, 0), (2, 3)], [(1, 2), (0, 3)]]
    again = [
        PairRow((1, 0), 0.3339, {}, 7.9, 0),
        PairRow((2, 3), 0.434, {}, 7.37, 0),
        PairRow((1, 2), 0.2622, {}, 7.23, 1),
        PairRow((0, 3), 0.3177, {}, 5.89, 1),
    ]
    found = blame(first, ONE_RANK_PER_NODE, 10, again).nodes
    assert list(found) == [1] and "node0: 0.3339 against 0.434, node2: 0.2622 against 0.3177 GB/s)" in found[1]
    # the same pairs with each round's reference swapped: node1 was as fast as the pairs beside it
    swapped = [PairRow(r.nodes, r.busbw_gbps, {}, r.error_pct, 1 - r.round) if 1 not in r.nodes else r for r in again]
    assert blame(first, ONE_RANK_PER_NODE, 10, swapped).nodes == {}


def test_two_suspects_of_four_are_judged_against_each_other_s_pairs_measured_beside_them() -> None:
    # A healthy 2-vCPU VM: node0 and node1 suspects, so node2 and node3 are the partners and no two nodes that
    # passed are left to pair. The whole machine ran slower in the second pass: against the first pass's pairs
    # without it (median 0.72), node0 was slow in both; against the pair measured beside it, faster in one.
    first = [
        PairRow((0, 1), 0.4805, {}, 6.0, 0),
        PairRow((2, 3), 0.87, {}, 6.0, 0),
        PairRow((1, 2), 0.5735, {}, 6.0, 1),
        PairRow((3, 0), 0.4789, {}, 6.0, 1),
    ]
    assert recheck_pairs(first, ONE_RANK_PER_NODE, 10)[:2] == [[(0, 2), (1, 3)], [(0, 3), (1, 2)]]
    again = [
        PairRow((0, 2), 0.5787, {}, 7.0, 0),
        PairRow((1, 3), 0.401, {}, 6.9, 0),
        PairRow((0, 3), 0.4346, {}, 5.7, 1),
        PairRow((1, 2), 0.6576, {}, 5.8, 1),
    ]
    assert blame(first, ONE_RANK_PER_NODE, 10, again).nodes == {}
    # a node 40% slower than the other suspect's pair beside it, round after round, is named
    beside_it = {r.round: r.busbw_gbps for r in again if 0 not in r.nodes}
    slow = [
        PairRow(r.nodes, beside_it[r.round] * 0.6 if 0 in r.nodes else r.busbw_gbps, {}, 6.0, r.round) for r in again
    ]
    found = blame(first, ONE_RANK_PER_NODE, 10, slow).nodes
    assert list(found) == [0] and "40% below the pairs without it measured at the same time at the median" in found[0]


def two_a_round(figures: list[tuple[tuple[int, int], float, float]]) -> list[PairRow]:
    """Rows of a pass as the report lists them, (pair, GB/s, error %), two pairs a round."""
    return [PairRow(pair, gbps, {}, error, i // 2) for i, (pair, gbps, error) in enumerate(figures)]


def test_a_suspect_is_named_for_its_rounds_together_not_for_any_one_of_them() -> None:
    # A 2-vCPU VM, node1 25% slower: in the first of its six rounds its pair was 10% below the pair beside it (the
    # two share the cores), in the others 18-28%. Judged round by round, the first round cleared it.
    first = two_a_round(
        [((0, 1), 0.3068, 5.083), ((2, 3), 0.4989, 7.152), ((1, 2), 0.3416, 4.84), ((3, 0), 0.377, 8.017)]
    )
    slowed = two_a_round(
        [
            ((1, 0), 0.3088, 4.936),
            ((2, 3), 0.3414, 4.751),
            ((0, 3), 0.3802, 6.266),
            ((1, 2), 0.2724, 4.905),
            ((0, 2), 0.3897, 4.996),
            ((1, 3), 0.3203, 4.312),
            ((1, 0), 0.2934, 5.161),
            ((2, 3), 0.3701, 5.451),
            ((0, 3), 0.3554, 5.073),
            ((1, 2), 0.2746, 4.84),
            ((0, 2), 0.3975, 4.355),
            ((1, 3), 0.3092, 4.787),
        ]
    )
    found = blame(first, ONE_RANK_PER_NODE, 10, slowed).nodes
    assert list(found) == [1] and "in 6 rounds: 21% below the pairs of nodes that passed" in found[1]
    # its first two rounds alone, 10% and 28% below, scatter as wide as they fall short: not named
    assert blame(first, ONE_RANK_PER_NODE, 10, slowed[:4]).nodes == {}
    # The same VM, all healthy, node1 and node2 suspects: node1's pairs 11% faster than the pair beside them in one
    # round, 2-35% slower in the others; node2's the mirror image. Neither is slow round after round.
    first = two_a_round(
        [((0, 1), 0.5704, 5.847), ((2, 3), 0.4797, 9.07), ((1, 2), 0.5865, 8.231), ((3, 0), 0.9749, 2.311)]
    )
    healthy = two_a_round(
        [
            ((1, 0), 0.6544, 6.521),
            ((2, 3), 0.5857, 7.356),
            ((1, 3), 0.5117, 7.26),
            ((2, 0), 0.5863, 7.999),
            ((1, 0), 0.5491, 7.296),
            ((2, 3), 0.5614, 8.261),
            ((1, 3), 0.5991, 8.052),
            ((2, 0), 0.6231, 7.333),
            ((1, 0), 0.4403, 7.661),
            ((2, 3), 0.6237, 6.88),
            ((1, 3), 0.489, 7.144),
            ((2, 0), 0.5907, 8.208),
        ]
    )
    assert blame(first, ONE_RANK_PER_NODE, 10, healthy).nodes == {}


def test_a_pair_s_row_is_its_slowest_rank_and_the_largest_error_of_its_ranks_medians() -> None:
    measured = [
        PairResult((0, 1), 0, 0, 40.0, 0.1, 0, spread_pct=20.0, samples=100),  # 20% x 1.2533 / 10: 2.51%
        PairResult((0, 1), 0, 1, 38.0, 0.1, 2, spread_pct=10.0, samples=25),  # 10% x 1.2533 / 5: 2.51%
        PairResult((0, 1), 1, 1, 41.0, 0.1, 0, spread_pct=40.0, samples=100),  # the same pair again, in round 1
    ]
    first, again = pair_rows(measured)
    assert (first.nodes, first.busbw_gbps, first.wrong_by_rank, first.round) == ((0, 1), 38.0, {1: 2}, 0)
    assert first.error_pct == pytest.approx(2.5066, abs=1e-4) and again.error_pct == pytest.approx(5.0133, abs=1e-4)


def test_a_pair_slow_within_its_own_samples_noise_is_not_slow() -> None:
    # node2's pairs 15% below the rest: slow when its median is sure, not within 20% of error (a noisy moment)
    quiet = rows({(0, 1): 40.0, (2, 3): 34.0, (1, 2): 34.0, (3, 0): 40.0})
    assert list(blame(quiet, ONE_RANK_PER_NODE, slow_pct=10).nodes) == [2]
    noisy = [PairRow(r.nodes, r.busbw_gbps, {}, 20.0 if 2 in r.nodes else 1.0) for r in quiet]
    assert blame(noisy, ONE_RANK_PER_NODE, slow_pct=10).nodes == {}
    # a slow node is slow in every sample: far beyond that noise
    slow = [PairRow(r.nodes, 4.0 if 2 in r.nodes else r.busbw_gbps, {}, 3.0) for r in quiet]
    assert list(blame(slow, ONE_RANK_PER_NODE, slow_pct=10).nodes) == [2]


def test_a_suspect_fast_beside_a_node_that_passed_is_cleared() -> None:
    # one pair a round (only node2 passed): no pair measured beside either suspect's, the first pass's reference
    measured = rows({(0, 2): 0.81, (1, 2): 0.051}) + rows({(0, 2): 0.77, (1, 2): 0.049})
    again = [PairRow(r.nodes, r.busbw_gbps, {}, r.error_pct, i) for i, r in enumerate(measured)]
    found = blame(SEEN, ONE_RANK_PER_NODE, 10, again)
    assert sorted(found.nodes) == [1, 3]
    assert found.nodes[1].endswith(
        "in 2 rounds: 95% below the first pass's pairs without it at the median, 151.3 standard errors of the rounds "
        "(node2: 0.051 against 1.032, node2: 0.049 against 1.032 GB/s; 1 node(s) passed to pair it with, so a partner "
        "was measured more than once)"
    )
    # slow once of twice beside a node that passed: one noisy moment more, not the node
    assert 0 not in blame(SEEN, ONE_RANK_PER_NODE, 10, rows({(0, 2): 0.5, (1, 2): 0.05}) + rows({(0, 2): 0.8})).nodes
    # no node passed to pair a suspect with: named on the first pass alone, saying so
    alone = blame(rows({(0, 1): 20.0, (2, 3): 40.0, (1, 2): 20.5, (3, 0): 41.0}), ONE_RANK_PER_NODE, 10, [])
    assert alone.nodes[1].endswith("not measured again: no node that passed to pair it with")


def noisy_fleet(rng: random.Random, nodes: int, slow: int, dip_p: float) -> Callable[[tuple[int, int]], PairRow]:
    """A pair's row in a fleet with one node at a tenth of the speed: a few percent of jitter, and in a fraction
    `dip_p` of measurements a dip to 20-70% (what a busy machine did to a healthy pair above: 0.5668 against the
    other healthy pair's 1.4965). A dip shows in the pair's own samples as a spread of 0 to 40% (a neighbour that
    held on for every sample shows none); a steady pair spreads 1-4%."""

    def measure(pair: tuple[int, int]) -> PairRow:
        gbps = 40.0 * (0.1 if slow in pair else 1.0) * rng.lognormvariate(0, 0.03)
        if rng.random() < dip_p:
            return PairRow(pair, gbps * rng.uniform(0.2, 0.7), {}, rng.uniform(0.0, 40.0))
        return PairRow(pair, gbps, {}, rng.uniform(1.0, 4.0))

    return measure


@pytest.mark.parametrize("nodes", [4, 5, 8])
def test_over_many_noisy_rounds_only_the_slow_node_is_named(nodes: int) -> None:
    rng = random.Random(nodes)
    rounds, dip_p = 2000, 0.1
    named_healthy_first_pass = named_healthy = missed = 0
    for _ in range(rounds):
        slow = rng.randrange(nodes)
        measure = noisy_fleet(rng, nodes, slow, dip_p)
        first = [measure(pair) for pairs in node_pairs(nodes) for pair in pairs]
        rank_nodes = list(range(nodes))
        again = [measure(p) for ps in recheck_pairs(first, rank_nodes, 10) for p in ps]
        named = set(blame(first, rank_nodes, 10, again).nodes)
        bare = [PairRow(r.nodes, r.busbw_gbps, {}) for r in first]  # the same figures, their noise unknown
        named_healthy_first_pass += bool(set(blame(bare, rank_nodes, 10).nodes) - {slow})
        named_healthy += bool(named - {slow})
        missed += slow not in named
    # The first pass alone, blind to the noise, names a healthy node in 10-22% of the rounds (a neighbour of the
    # slow node whose other pair dipped); with each pair's noise and the second pass, where the suspect's RECHECKS
    # rounds must fall short beyond their own scatter (most of them dipped, alike): at most 0.5% (seen: 0-0.05%
    # over three seeds each). The slow node is never missed.
    assert named_healthy_first_pass > rounds * 0.05, named_healthy_first_pass
    assert named_healthy <= rounds * 0.005, (named_healthy, named_healthy_first_pass)
    assert missed == 0


def test_a_layout_weak_scales_to_a_world_of_whole_nodes() -> None:
    per_node = Layout(mbs=2, gbs=16, pp=2)
    assert weak_scaled(per_node, 2) == per_node
    assert weak_scaled(per_node, 8) == Layout(mbs=2, gbs=64, pp=2, dp=4)
    assert weak_scaled(per_node, 8).microbatches == per_node.microbatches  # the same work per replica
    assert weak_scaled(per_node, 3) == per_node  # not a multiple: check_world says what is wrong
