"""The torchrun / Slurm world this process may belong to, and the GPU that is a rank's own, read from the
environment. No torch here: the plugin asks at start-up, in every pytest run."""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable, Mapping
from typing import NamedTuple


class WorldError(ValueError):
    """The launcher's variables contradict each other: whether this process is a rank, and of what, is unknown."""


class World(NamedTuple):
    """This process's place in a launcher's world."""

    rank: int  # global
    size: int  # ranks in the world
    local_rank: int  # on its node


def world_from_environment(env: Mapping[str, str]) -> World | None:
    """(rank, world_size, local_rank) when this process is one task of a launcher's world of two or more, else None.
    An sbatch script or salloc shell (SLURM_PROCID=0, the job's SLURM_NTASKS) is no task of an srun step, nor is the
    shell of `srun -n2 --pty bash` (SLURM_PTY_PORT): their other tasks are never ranks. Raises WorldError where the
    variables contradict each other or leave a rank's place on its node unknown (no LOCAL_RANK, as a hand-made
    `RANK=$SLURM_PROCID` gives): a guess would wait forever, join the wrong world or mismeasure the node."""
    if "RANK" in env or "WORLD_SIZE" in env:
        missing = [name for name in ("RANK", "WORLD_SIZE") if name not in env]
        if missing:
            present = "RANK" if missing == ["WORLD_SIZE"] else "WORLD_SIZE"
            raise WorldError(
                f"{present}={_shown(env[present])} is set without {missing[0]}: torchrun sets both for each rank; "
                f"unset {present}, or run under torchrun"
            )
        world = _world(env, "RANK", "WORLD_SIZE", _local_rank(env)[1])
        if world is not None and "LOCAL_RANK" not in env:
            raise WorldError(
                f"RANK={world.rank} and WORLD_SIZE={world.size} are set without LOCAL_RANK: torchrun sets all three "
                "for each rank (under srun, SLURM_LOCALID is the task's LOCAL_RANK)"
            )
        return world
    if "SLURM_STEP_NUM_TASKS" in env and "SLURM_PTY_PORT" not in env:  # a task of an srun step, not a --pty shell
        if "SLURM_PROCID" not in env:
            raise WorldError("SLURM_STEP_NUM_TASKS is set without SLURM_PROCID: srun sets both for each task")
        return _world(env, "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", _local_rank(env)[1])
    return None


def _world(env: Mapping[str, str], rank_name: str, size_name: str, local_rank: int) -> World | None:
    rank, size = _count(env, rank_name), _count(env, size_name)
    if size < 1 or rank >= size:
        raise WorldError(f"{rank_name}={rank} is no rank of a world of {size_name}={size}")
    return World(rank, size, local_rank) if size > 1 else None


def _count(env: Mapping[str, str], name: str) -> int:
    text = env[name]
    if not _whole(text):
        raise WorldError(f"{name}={_shown(text)} is not a whole number")
    return int(text)


def _shown(text: str) -> str:
    return ascii(text[:40]) if not (text.isascii() and text.isprintable()) or len(text) > 40 else text


def _under_torchrun(env: Mapping[str, str]) -> bool:
    """torchrun's variables win over Slurm's: torchrun started by srun (one task per node) sees both."""
    return "WORLD_SIZE" in env and "RANK" in env


def _local_rank(env: Mapping[str, str]) -> tuple[str, int]:
    """The variable that says this rank's place on its node, and its value (0 when unset)."""
    name = "LOCAL_RANK" if _under_torchrun(env) or "SLURM_PROCID" not in env else "SLURM_LOCALID"
    return name, _count(env, name) if name in env else 0


def _ranks_on_this_node(env: Mapping[str, str]) -> tuple[str, int] | None:
    """The variable saying how many ranks share this node, and its value, else None: Slurm's ("4", "4(x2)"; not an
    uneven "4,3"), or under torchrun, whose agents Slurm counts, LOCAL_WORLD_SIZE."""
    slurm = ["SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"]
    for name in ["LOCAL_WORLD_SIZE"] if _under_torchrun(env) else slurm:
        same_on_every_node = re.fullmatch(r"(\d+)(\(x\d+\))?", env.get(name, ""))
        if same_on_every_node:
            return name, int(same_on_every_node[1])
    return None


class DeviceChoiceError(ValueError):
    """This rank cannot tell which of the GPUs it sees is its own."""


def cuda_device_index(env: Mapping[str, str], device_count: int) -> int:
    """The index of this rank's own GPU among the `device_count` it sees: the one seen (srun --gpus-per-task=1 leaves
    SLURM_LOCALID no index into it), else the local rank where there are enough, else DeviceChoiceError."""
    name, local_rank = _local_rank(env)
    visible = env.get("CUDA_VISIBLE_DEVICES")
    shown = "CUDA_VISIBLE_DEVICES unset" if visible is None else f"CUDA_VISIBLE_DEVICES={visible}"
    sees = f"{device_count} GPU{'' if device_count == 1 else 's'} ({shown})"
    if device_count < 1:
        raise DeviceChoiceError(f"{name}={local_rank} sees no GPU: {sees}")
    if device_count == 1:
        return 0
    on_node = _ranks_on_this_node(env)
    if local_rank < device_count and (on_node is None or device_count >= on_node[1]):
        return local_rank
    ranks = f"{name}={local_rank}" + ("" if on_node is None else f" of {on_node[0]}={on_node[1]} ranks on the node")
    raise DeviceChoiceError(
        f"{ranks} sees {sees}: not one per rank, so which one is its own is unknown. Give each task one GPU "
        "(srun --gpus-per-task=1, or --gpu-bind=single:1) or every task all of its node's GPUs"
    )


def number_gpus_by_pci_bus() -> None:
    """Make cuda:3 the GPU NVML, nvidia-smi and our `[gpu3]` test cases call 3 (by PCI bus id, not fastest first):
    call it before anything initialises CUDA, which reads CUDA_DEVICE_ORDER once. An operator's order stays."""
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")


def node_rank_from_environment(env: Mapping[str, str], rank: int) -> int:
    """The node this rank is on: torchrun's GROUP_RANK, Slurm's SLURM_NODEID, else from the ranks per node."""
    for name in ("GROUP_RANK", "SLURM_NODEID"):
        if _whole(env.get(name, "")):
            return int(env[name])
    per_node = env.get("LOCAL_WORLD_SIZE", env.get("SLURM_NTASKS_PER_NODE", ""))
    return rank // int(per_node) if _whole(per_node) and int(per_node) > 0 else 0


def _whole(text: str) -> bool:
    """Digits int() reads: str.isdigit() also takes `²`, which int() refuses."""
    return text.isascii() and text.isdecimal()


def rendezvous_problem(env: Mapping[str, str], resolves: Callable[[str], bool] | None = None) -> str | None:
    """Why this process cannot join its world's rendezvous (env://), or None: the launcher's setting named, where a
    bad MASTER_ADDR / MASTER_PORT (srun sets neither) would otherwise be an obscure store error in a test."""
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not env.get(name)]
    if missing:
        return (
            f"{' and '.join(missing)} not set: under srun export MASTER_ADDR (the address of the step's first "
            "node: its NodeAddr in `scontrol show node`, not its NodeName) and MASTER_PORT (a free port) for every "
            "task, as contrib/slurm/gbvalidate-world.sbatch does"
        )
    port, address = env["MASTER_PORT"], env["MASTER_ADDR"]
    if not _whole(port) or not 1 <= int(port) <= 65535:
        return f"MASTER_PORT={port!r} is no port (a whole number from 1 to 65535): the launcher's setting"
    if not (resolves or _resolves)(address):
        return (
            f"MASTER_ADDR={address!r} does not resolve to an address on this node: the launcher's setting (the "
            "step's first node as this node can reach it)"
        )
    return None


def _resolves(host: str) -> bool:
    try:
        socket.getaddrinfo(host, None)
    except (OSError, UnicodeError):
        return False
    return True


def launcher_world(hint: str, env: Mapping[str, str] = os.environ) -> tuple[World | None, str | None]:
    """The launcher's world this process is a rank of, else None; and why that cannot be told (`hint` appended)."""
    try:
        world = world_from_environment(env)
    except WorldError as exc:
        return None, f"{exc} ({hint})"
    # Its rendezvous too, before any test: a test that cannot join its world is the launcher's failure, not the node's.
    problem = None if world is None else rendezvous_problem(env)
    return world, None if problem is None else f"{problem} ({hint})"


def world_rank(env: Mapping[str, str]) -> int | None:
    """This process's global rank when it is one rank of a world, else None."""
    world = world_from_environment(env)
    return None if world is None else world.rank


# torch's TORCH_NCCL_ASYNC_ERROR_HANDLING values: 0 no handling, 1 tear down, 2 clean up only, 3 skip clean-up.
NCCL_CLEAN_UP_ONLY = "2"
# What torchrun (LocalElasticAgent) hands every worker unless set: in the worker, it looks like an operator's 1.
TORCHRUN_TEAR_DOWN = "1"


def nccl_error_settings(env: Mapping[str, str]) -> dict[str, str]:
    """The torch settings a world's rank takes before its NCCL process group is made, so that a dead or hung peer
    fails a test rather than taking the process (and its report) down; an operator's values stay:
    TORCH_NCCL_ASYNC_ERROR_HANDLING=2 (clean up only: under torchrun's 1, every surviving rank died by SIGABRT after
    a peer did; H200, torch 2.11) and TORCH_NCCL_TRACE_BUFFER_SIZE=0 (the flight recorder's thread read Python's
    frames as a finished rank exited, which died by SIGSEGV)."""
    settings = {}
    handling = env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING")
    if handling is None or (handling == TORCHRUN_TEAR_DOWN and "TORCHELASTIC_RUN_ID" in env):
        settings["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = NCCL_CLEAN_UP_ONLY
    if "TORCH_NCCL_TRACE_BUFFER_SIZE" not in env:
        settings["TORCH_NCCL_TRACE_BUFFER_SIZE"] = "0"
    return settings
