"""The torchrun / Slurm world this process may belong to, read from the environment. No torch here: the plugin
asks at start-up, in every pytest run."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["node_rank_from_environment", "rendezvous_problem", "world_from_environment", "world_rank"]


def world_from_environment(env: Mapping[str, str]) -> tuple[int, int, int] | None:
    """(rank, world_size, local_rank) when this process is a rank of torchrun's or srun's world, else None."""
    if "WORLD_SIZE" in env and "RANK" in env:
        return int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", "0"))
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env and int(env["SLURM_NTASKS"]) > 1:
        return int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"]), int(env.get("SLURM_LOCALID", "0"))
    return None


def node_rank_from_environment(env: Mapping[str, str], rank: int) -> int:
    """The node this rank is on: torchrun's GROUP_RANK, Slurm's SLURM_NODEID, else from the ranks per node."""
    for name in ("GROUP_RANK", "SLURM_NODEID"):
        if env.get(name, "").isdigit():
            return int(env[name])
    per_node = env.get("LOCAL_WORLD_SIZE", env.get("SLURM_NTASKS_PER_NODE", ""))
    return rank // int(per_node) if per_node.isdigit() and int(per_node) > 0 else 0


def rendezvous_problem(env: Mapping[str, str]) -> str | None:
    """Why this process cannot join its world's rendezvous (env://), or None. torchrun sets MASTER_ADDR and
    MASTER_PORT; `srun` does not, and a missing one would otherwise surface as an obscure store error."""
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not env.get(name)]
    if not missing:
        return None
    return (
        f"{' and '.join(missing)} not set: under srun export MASTER_ADDR (the first node of the job, e.g. "
        "$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1)) and MASTER_PORT (a free port) for every task"
    )


def world_rank(env: Mapping[str, str]) -> int | None:
    """This process's global rank when it is one rank of a world, else None."""
    world = world_from_environment(env)
    return None if world is None else world[0]
