"""The world gang (the interface: gang.py): pytest itself runs under torchrun or Slurm `srun`, this process is one
rank of that world, and `WorldGang.run` runs the function here and gathers every rank's result over a gloo control
group of its own, so all ranks see the same results (and the same failures)."""

from __future__ import annotations

import os
import socket
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from pytest_gbvalidate import labels
from pytest_gbvalidate.ranks.gang import (
    GangError,
    RankContext,
    _init_rank,
    _last_line,
    _name,
    device_key,
    device_sharers,
)
from pytest_gbvalidate.ranks.world import (
    DeviceChoiceError,
    WorldError,
    cuda_device_index,
    nccl_error_settings,
    node_rank_from_environment,
    number_gpus_by_pci_bus,
    rendezvous_problem,
)


def store_problem(address: str, port: int, timeout_s: float) -> str | None:
    """Why no torch store answered at `address`:`port` within `timeout_s`, else None: another program holding the
    port held torch's handshake whatever its timeout (deaf to SIGTERM, torch 2.13), so here it runs on a thread,
    waited on in steps (a signal's handler runs between them) and left behind if it never ends."""
    outcome: list[Exception | None] = []

    def connect() -> None:
        try:  # a client that only connects: it does not count as one of the world's ranks (wait_for_workers)
            store = dist.TCPStore  # type: ignore[attr-defined, unused-ignore]  # documented; not in torch's stubs
            store(address, port, None, False, timeout=timedelta(seconds=timeout_s), wait_for_workers=False)
            outcome.append(None)
        except Exception as exc:  # torch's DistNetworkError or DistStoreError, as the case may be
            outcome.append(exc)

    probe = threading.Thread(target=connect, name="gbvalidate-store-probe", daemon=True)
    probe.start()
    deadline = time.monotonic() + timeout_s
    while probe.is_alive() and time.monotonic() < deadline:
        probe.join(0.2)
    where = f"MASTER_ADDR={address} MASTER_PORT={port}"
    if outcome == [None]:
        return None
    if not outcome and _accepts(address, port):
        return (
            f"{where} accepted a connection but no torch store answered within {timeout_s:g} s: another program "
            "holds MASTER_PORT on the first node (the launcher's setting: a free port)"
        )
    why = f": {(str(outcome[0]).strip().splitlines() or [''])[0]}" if outcome and outcome[0] is not None else ""
    return f"no world's store answered at {where} within {timeout_s:g} s (did rank 0 start?){why}"


def _accepts(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=5.0):
            return True
    except OSError:
        return False


class WorldGang:
    """This process as one rank of a torchrun / srun world. `timeout_s`, the process group's collective timeout, is
    the only bound on a hung peer: the processes are the launcher's (a call's own `timeout_s` cannot shorten it)."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        local_rank: int,
        *,
        device_type: str,
        timeout_s: float,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.world_size = world_size
        self.failed_starts: list[str] = []  # the launcher starts the ranks, once: nothing here is tried again
        number_gpus_by_pci_bus()  # before device_count() below initialises CUDA
        if device_type == "cpu":
            self.device = torch.device("cpu")
        else:  # srun may have bound this task to a GPU of its own: the local rank is then no index (world.py)
            try:
                self.device = torch.device(device_type, cuda_device_index(os.environ, torch.cuda.device_count()))
            except DeviceChoiceError as exc:
                raise GangError(rank, "has no GPU of its own", str(exc)) from None
        self._made_group = not dist.is_initialized()
        self.broken = False
        if self._made_group:
            problem = rendezvous_problem(os.environ)
            port = int(os.environ["MASTER_PORT"]) if problem is None else 0
            if problem is None and (rank != 0 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"):
                problem = store_problem(os.environ["MASTER_ADDR"], port, timeout_s)  # a client: the store answers
            if problem is not None:
                raise GangError(rank, "cannot join its world", problem)
            place = {"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(local_rank)}
            for name, value in {**place, **(env or {})}.items():  # NCCL reads `env` when it makes a communicator
                os.environ.setdefault(name, value)
            os.environ.update(nccl_error_settings(os.environ))
            try:
                _init_rank(self.device, rank, world_size, "env://", timeout_s)
            except WorldError as exc:  # the launcher's to set: no test of the node failed for it
                raise GangError(rank, "cannot join its world", str(exc)) from None
            except dist.DistNetworkError as exc:
                if "EADDRINUSE" not in str(exc):
                    raise
                used = f"MASTER_PORT={port} is in use on this node by another program, and rank 0 makes the world's"
                said = f"{used} store there: the launcher's setting (a free port)"
                raise GangError(rank, "cannot join its world", said) from None
        node_rank = node_rank_from_environment(os.environ, rank)
        backend = dist.get_backend()
        # Results and verdicts travel on a gloo group of their own (over TCP, on the host): a dead or hung peer
        # fails the gather with an exception on every survivor, whatever state NCCL's communicators are in.
        self._control: dist.ProcessGroup | None = None
        if backend != "gloo":
            control = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
            # new_group returns -100 or None only to ranks left out of it.
            self._control = control if isinstance(control, dist.ProcessGroup) else None
        hostname = labels.hostname()
        placed: list[Any] = [None] * world_size
        mine = device_key(self.device, hostname, rank)
        dist.all_gather_object(placed, (node_rank, hostname, mine), group=self._control)
        self.hosts = {node: host for node, host, _ in sorted(placed)}
        sharers = device_sharers([key for _, _, key in placed], rank)
        self.ctx = RankContext(rank, world_size, local_rank, self.device, backend, node_rank, sharers)

    def run(self, fn: Callable[..., Any], *args: Any, timeout_s: float | None = None) -> list[Any]:
        try:
            mine: tuple[str, Any] = ("ok", fn(self.ctx, *args))
        except Exception:
            self.broken = True  # the communicators may be aborted, or their collectives still queued
            mine = ("raised", traceback.format_exc())
        gathered: list[Any] = [None] * self.world_size
        try:
            dist.all_gather_object(gathered, mine, group=self._control)
        except Exception as exc:  # a peer died or timed out: every surviving rank gets here
            self.broken = True
            raise GangError(None, "lost a peer", f"{_name(fn, args)}: {_last_line(str(exc))}") from exc
        for rank, (status, payload) in enumerate(gathered):
            if status == "raised":
                raise GangError(rank, "raised", f"{_name(fn, args)}: {_last_line(payload)}\n{payload}")
        return [payload for _, payload in gathered]

    def close(self) -> None:
        """End the process group this gang made, not left to the process's exit, where a finished rank could abort
        (SIGABRT, torch 2.14.1) and fail a healthy node's job; not once broken, as a communicator waiting on a dead
        peer may not end."""
        if self._made_group and not self.broken and dist.is_initialized():
            dist.destroy_process_group()
