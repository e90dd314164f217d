"""The session's ranks: this process's torchrun / srun world where it is one, else local ranks (one per GPU, or
CPU_RANKS on the CPU), with the SKU's NCCL environment and the call timeout."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import pytest

from pytest_gbvalidate.settings import Setting

if TYPE_CHECKING:
    from pytest_gbvalidate.ranks.gang import Gang
    from pytest_gbvalidate.ranks.world import World
    from pytest_gbvalidate.target import Target

# How long one call on the ranks may take (--gb-timeout overrides): a GPU sweep to 16 GiB, or NCCL setting up
# its communicators on many nodes, takes minutes at worst; the CPU smoke run finishes in seconds.
DEFAULT_TIMEOUT_S = {"gpu": 300.0, "cpu": 30.0}


def call_timeout(chosen: Setting[float | None], target: Target) -> Setting[float]:
    """Seconds one call on the ranks may take: the setting, else the SKU's default."""
    if chosen.value is not None:
        return Setting(chosen.value, chosen.source)
    kind = "gpu" if target.is_gpu else "cpu"
    return Setting(DEFAULT_TIMEOUT_S[kind], f"default for a {'GPU' if kind == 'gpu' else 'CPU-only'} SKU")


def start(target: Target, world: World | None, timeout_s: float, env: Mapping[str, str]) -> Gang:
    """The ranks, as the run's world says. A world whose rendezvous fails ends the run as a usage error: the
    launcher's failure, no verdict on the node (as the problems found before any test)."""
    from pytest_gbvalidate.ranks.gang import GangError, LocalGang
    from pytest_gbvalidate.ranks.world_gang import WorldGang

    if world is not None:
        try:
            return WorldGang(*world, device_type=target.device_type, timeout_s=timeout_s, env=dict(env))
        except GangError as exc:
            if exc.cause != "cannot join its world":
                raise
            pytest.exit(f"{exc} (the launcher's failure: no verdict on this node)", pytest.ExitCode.USAGE_ERROR)
    # The call timeout bounds every call; the ranks' own collective timeout is only a backstop, longer, so that the
    # call timeout fires first and can say which rank is stuck where.
    from pytest_gbvalidate.node import neighbours

    return LocalGang(
        target.local_world_size,
        device_type=target.device_type,
        env=dict(env),
        collective_timeout_s=2 * timeout_s,
        call_timeout_s=timeout_s,
        cpu_waits=neighbours,  # a call a busy host slowed past the timeout is no hang (ranks/gang.py SLOWED_SHARE)
    )
