"""A pytest plugin the multi-node tests load (`-p tests.helpers.node_fault`) into one node's pytest under torchrun,
never a real run: that node's all_reduce is slow (NODE_FAULT=slow: 5 ms more per call, as a node with a bad NIC
or cable) or wrong (NODE_FAULT=wrong: its result is off by one, as tests/helpers/rank_faults.py corrupts a gang
rank's), or its compute is slow (NODE_FAULT=slow_compute: 40 ms more per attention call, as a GPU held down by its
clocks), or the rank NODE_FAULT_RANK dies (NODE_FAULT=kill: SIGKILL once its NODE_FAULT_CALL-th all_reduce is under
way, as a node that loses power mid-collective; every node loads the plugin, the rank that dies is chosen by its
global rank). It writes the node rank torchrun gave it to NODE_FAULT_FILE where set, since the rendezvous, not the
start order, numbers the nodes."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
import torch.nn.functional as F

from tests.helpers.rank_faults import corrupted_collectives

# An all_reduce's extra time on the slow node: as long as a 1 MiB call on a busy 2-core machine or longer, and short
# enough for the pairwise check's calls (40 samples a repeat: 6 repeats of 2 first-pass rounds, 3 of RECHECKS
# second-pass rounds).
SLOW_S = 0.005
# An attention call's extra time on the slow_compute node: large against what a busy 2-core machine adds to the
# other node's work before the sync (20 ms a call showed 0.08 s of its 0.32 s a step there once).
SLOW_COMPUTE_S = 0.04
_active = contextlib.ExitStack()


def pytest_configure(config: pytest.Config) -> None:
    fault = os.environ["NODE_FAULT"]
    if "NODE_FAULT_FILE" in os.environ:
        Path(os.environ["NODE_FAULT_FILE"]).write_text(os.environ["GROUP_RANK"])
    if fault == "kill":
        if os.environ["RANK"] == os.environ["NODE_FAULT_RANK"]:
            _die_in(dist, "all_reduce", int(os.environ["NODE_FAULT_CALL"]))
    elif fault == "wrong":
        _active.enter_context(corrupted_collectives())
    elif fault == "slow":
        _slow_down(dist, "all_reduce")
    elif fault == "slow_compute":
        _slow_down(F, "scaled_dot_product_attention", SLOW_COMPUTE_S)
    else:
        raise ValueError(f"NODE_FAULT={fault!r}: slow, slow_compute, wrong or kill")


def _slow_down(module: Any, name: str, seconds: float = SLOW_S) -> None:
    real = getattr(module, name)

    def slow(*args: Any, **kwargs: Any) -> Any:
        time.sleep(seconds)
        return real(*args, **kwargs)

    _active.callback(setattr, module, name, real)
    setattr(module, name, slow)


def _die_in(module: Any, name: str, call: int) -> None:
    real = getattr(module, name)
    calls = itertools.count(1)

    def dying(*args: Any, **kwargs: Any) -> Any:
        work = real(*args, **kwargs)  # under way on every rank (NCCL's is asynchronous: still in flight)
        if next(calls) == call:
            os.kill(os.getpid(), signal.SIGKILL)
        return work

    _active.callback(setattr, module, name, real)
    setattr(module, name, dying)


def pytest_unconfigure(config: pytest.Config) -> None:
    _active.close()
