"""The silent data corruption check's verdict (pytest_gbvalidate/workloads/sdc.py): on a node of many GPUs, the one
that differs bit for bit is named by the majority. (The check end to end: e2e/test_sdc_suite.py.)"""

from __future__ import annotations

import torch

from pytest_gbvalidate.workloads import sdc


def test_on_a_node_of_many_gpus_the_one_that_differs_bit_for_bit_is_named() -> None:
    """A one-bit difference that every tolerance accepts: the majority of the node's GPUs names the odd one."""
    reference = {name: torch.ones(3) for name in sdc.COMPUTATIONS}

    def answer(digest: str) -> list[dict[str, sdc.Outcome]]:
        return [{name: sdc.Outcome(digest, torch.ones(3)) for name in sdc.COMPUTATIONS}] * 2  # both passes

    per_rank = [answer("a1"), answer("a1"), answer("b2"), answer("a1")]
    found = sdc.problems(["gpu0", "gpu1", "gpu2", "gpu3"], per_rank, reference)
    assert found == [
        f"gpu2: {name} differs bit for bit from the 3 other ranks, which agree (b2 vs a1)" for name in sdc.COMPUTATIONS
    ]
    assert sdc.problems(["gpu0", "gpu1", "gpu2", "gpu3"], [answer("a1")] * 4, reference) == []
