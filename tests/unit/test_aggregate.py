"""Every rank's host-to-device copy at once: the node's figure from its ranks' windows, and the copies run for real
on a CPU gang (the same code a GPU node runs, with the host as the device)."""

from __future__ import annotations

import pytest

from pytest_gbvalidate.bench.aggregate import RankCopies, aggregate, concurrent_h2d_on_rank
from pytest_gbvalidate.ranks.gang import LocalGang

pytestmark = pytest.mark.torch_version  # bench/aggregate.py and bench/on_rank.py call torch.accelerator


def copies(node: int, rank: int, start_s: float, end_s: float) -> RankCopies:
    return RankCopies(node, rank, size_bytes=10**9, iterations=4, start_s=start_s, end_s=end_s)


def test_the_node_figure_is_every_byte_over_the_window_from_first_start_to_last_end() -> None:
    # Node 0: two GPUs, 4 GB each; the second starts 1 s late, so the window is 3 s, not 2.
    # Node 1: one GPU alone.
    node0, node1 = aggregate([copies(0, 0, 10.0, 12.0), copies(0, 1, 11.0, 13.0), copies(1, 0, 5.0, 9.0)])
    assert (node0.node_rank, node0.gpus, node0.window_s) == (0, 2, 3.0)
    assert node0.bandwidth_gbps == pytest.approx(8.0 / 3.0)
    assert node0.per_gpu_gbps == {0: pytest.approx(2.0), 1: pytest.approx(2.0)}
    assert (node1.node_rank, node1.gpus) == (1, 1) and node1.bandwidth_gbps == pytest.approx(1.0)


def test_a_window_that_did_not_advance_is_refused_naming_the_node() -> None:
    with pytest.raises(ValueError, match=r"node 0: the copies' window is 0\.0 s"):
        aggregate([copies(0, 0, 1.0, 1.0)])


def test_every_rank_copies_at_once_and_the_bytes_arrive() -> None:
    gang = LocalGang(2, start_timeout_s=60)
    try:
        ranks = gang.run(concurrent_h2d_on_rank, 2**20, 1, 10)
    finally:
        gang.close()
    assert [(r.node_rank, r.local_rank, r.bytes_copied) for r in ranks] == [(0, 0, 10 * 2**20), (0, 1, 10 * 2**20)]
    # Whether the two overlapped depends on the machine's load (a busy 2-core machine may run them one after the
    # other): the window spans both whatever happened.
    (node,) = aggregate(ranks)
    assert node.window_s == max(r.end_s for r in ranks) - min(r.start_s for r in ranks)
    assert node.gpus == 2 and node.bandwidth_gbps > 0 and set(node.per_gpu_gbps) == {0, 1}
