"""SPMD functions the Llama tests run on every rank (module level, so spawned ranks can import them)."""

from __future__ import annotations

import gc
import weakref

import pytest

from pytest_gbvalidate.ranks.gang import RankContext
from pytest_gbvalidate.workloads.llama.parallelize import build_groups
from pytest_gbvalidate.workloads.llama.request import TrainRequest
from pytest_gbvalidate.workloads.llama.train import Trainer, torch_release

# torch 2.9's pipeline schedule cannot run over gloo: the trainer refuses it, saying why
# (test_llama_parallel.py::test_pipelining_over_gloo_on_torch_2_9_fails_saying_why); tests that train a PP layout
# on the CPU need torch >= 2.10.
needs_pipelining_over_gloo = pytest.mark.skipif(
    torch_release() < (2, 10), reason="pipeline parallelism over gloo needs torch >= 2.10"
)


def step_losses(ctx: RankContext, request: TrainRequest) -> list[float] | None:
    """The loss of each of `request.steps` optimizer steps; None on ranks that do not compute it (the first
    stage of a pipeline)."""
    trainer = Trainer(request, ctx.device, build_groups(request.layout, ctx.device))
    losses = [trainer.step(i) for i in range(request.steps)]
    return None if None in losses else [float(x) for x in losses if x is not None]


def weights_outlive_the_trainer(ctx: RankContext, request: TrainRequest) -> list[str]:
    """The names of this rank's weights still referenced once a trainer of `request` has run a step and been
    dropped, with Python's cyclic collector off (as it may stay off for many runs of a long-lived rank): only
    a reference cycle keeps one."""
    gc.collect()
    gc.disable()
    try:
        groups = build_groups(request.layout, ctx.device) if request.layout.world_size > 1 else None
        trainer = Trainer(request, ctx.device, groups)
        trainer.step(0)
        weights = {name: weakref.ref(p) for name, p in trainer.model.named_parameters()}
        del trainer, groups
        return [name for name, ref in weights.items() if ref() is not None]
    finally:
        gc.enable()
