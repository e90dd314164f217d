"""Run one function SPMD on every rank of a gang and get each rank's result back.

Two kinds of gang, one interface (`Gang`, with the `RankContext` each rank gets and `GangError`, all here):
- `LocalGang` (here): we start the ranks ourselves, one process per GPU (or N processes on the CPU), each with
  torch.distributed initialised (NCCL on GPUs, gloo on the CPU) over a file rendezvous in a private temporary
  directory, so parallel runs never collide on a port. The processes stay up between calls (starting a gang
  costs seconds); a rank that crashes, raises or outlives its deadline tears the whole gang down, the call
  raises `GangError` naming the rank and the cause (a hung rank's whereabouts: hang.py), and the next call
  starts a fresh gang.
- `WorldGang` (world_gang.py): pytest itself runs under torchrun or Slurm `srun`; this process is one rank of
  that world and `run` executes the function here and gathers every rank's result, so all ranks see the same
  results.

`run_on_local_rank` runs a function on one local rank of every node (per-GPU and per-node measurements) while
the other ranks wait, so a node-local check needs no code of its own to work across nodes.
"""

from __future__ import annotations

import contextlib
import faulthandler
import multiprocessing as mp
import os
import shutil
import signal
import socket
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist

from pytest_gbvalidate import labels
from pytest_gbvalidate.ranks.hang import innermost_frame, waiting_for_a_peer
from pytest_gbvalidate.ranks.world import number_gpus_by_pci_bus

_POLL_S = 0.05
_PARENT_CHECK_S = 1.0
_TMPDIR_PREFIX = "gbvalidate-gang-"  # then the pid of the process that made it
# A call that runs out of time with its ranks waiting for a CPU this share of it or more was slowed by the host, not
# hung: a rank stuck in a collective sleeps, one stuck on a GPU spins on a free CPU; neither queues for one.
SLOWED_SHARE = 0.25


@dataclass(frozen=True)
class RankContext:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str
    node_rank: int = 0  # which node of the world this rank is on (0 for a local gang)
    # How many ranks of the world hold their buffers in this rank's memory (its own included): a CPU gang's ranks
    # share their host's; ranks share one GPU only where a launcher put them there (several torchrun "nodes" of
    # one machine, each its own NCCL host). What a rank may take is the free memory divided among them.
    device_sharers: int = 1


def device_sharers(keys: Sequence[str], rank: int) -> int:
    """How many ranks share rank `rank`'s memory, from every rank's device key (device_key's), in rank order."""
    return sum(1 for key in keys if key == keys[rank])


def device_key(device: torch.device, hostname: str, rank: int) -> str:
    """What names the memory a rank's buffers live in, alike on the ranks that share it: the host's memory for a
    CPU rank; a GPU's UUID for a GPU rank. Where the UUID cannot be read, a key of the rank's own: a guess that
    two ranks share a GPU would shrink every collective's sizes, and the gated ones would then fail."""
    if device.type == "cpu":
        return f"{hostname}:host-memory"
    try:  # CUDA-only: the UUID names the GPU whatever CUDA_VISIBLE_DEVICES numbered it
        return f"{device.type}:{torch.cuda.get_device_properties(device).uuid}"
    except (AssertionError, RuntimeError, AttributeError):
        return f"{hostname}:{device}:rank{rank}"


class GangError(RuntimeError):
    """A rank failed. `rank` is the first rank seen failing (None when several timed out together)."""

    def __init__(self, rank: int | None, cause: str, detail: str) -> None:
        who = "gang" if rank is None else f"rank {rank}"
        super().__init__(f"{who} {cause}: {detail}")
        self.rank = rank
        self.cause = cause
        self.detail = detail


class CpuWaits(Protocol):
    """How long a process's threads waited for a CPU another task held (node/neighbours.py, which run/gangs.py hands
    a local gang: the ranks know nothing of the node)."""

    def read(self, tasks: Path) -> Any: ...

    def waited_share(self, start: Any, end: Any) -> float | None: ...


class Gang(Protocol):
    world_size: int
    hosts: dict[int, str]  # node rank -> hostname: one node for a local gang, each node of a torchrun / srun world
    failed_starts: list[str]  # why each start-up of the ranks that failed and was tried again failed, in order
    # This process's own process group failed (a world's call raised or lost a peer): it may never end cleanly, and
    # the process ends as soon as its reports are written. A local gang's ranks are processes of their own: never.
    broken: bool

    def run(self, fn: Callable[..., Any], *args: Any, timeout_s: float | None = None) -> list[Any]:
        """`fn(ctx, *args)` on every rank; the results in rank order. `fn` must be a module-level function.
        `timeout_s` bounds the call (None: the gang's default)."""
        ...

    def close(self) -> None: ...


def device_for(device_type: str, local_rank: int) -> torch.device:
    return torch.device("cpu") if device_type == "cpu" else torch.device(device_type, local_rank)


# gloo names this host by its hostname in a buffer of 64 bytes, its terminator included: at the kernel's 64
# characters it fails to start ("File name too long").
GLOO_HOSTNAME_MAX = 63


def gloo_interface(hostname: str, env: Mapping[str, str], local: bool) -> str | None:
    """The network interface gloo must be given (GLOO_SOCKET_IFNAME) where it cannot name this host by its
    hostname, else None: the loopback for a local gang, whose ranks are all on this host. Raises WorldError for a
    world's rank, whose peers are elsewhere: which interface reaches them is the launcher's to say."""
    from pytest_gbvalidate.ranks.world import WorldError

    if len(hostname.encode("utf-8", "surrogateescape")) <= GLOO_HOSTNAME_MAX or "GLOO_SOCKET_IFNAME" in env:
        return None
    if local:
        return "lo"
    raise WorldError(
        f"this node's hostname is {len(hostname)} characters, and gloo (torch's CPU collectives) holds "
        f"{GLOO_HOSTNAME_MAX} at most: set GLOO_SOCKET_IFNAME to the interface the nodes reach each other on"
    )


def _init_rank(device: torch.device, rank: int, world_size: int, init_method: str, timeout_s: float) -> str:
    if device.type != "cpu":
        torch.accelerator.set_device_index(device.index)
    backend = dist.get_default_backend_for_device(device)
    if backend == "gloo":
        interface = gloo_interface(socket.gethostname(), os.environ, init_method.startswith("file://"))
        if interface is not None:
            os.environ["GLOO_SOCKET_IFNAME"] = interface
    dist.init_process_group(
        backend, init_method=init_method, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s)
    )
    return backend


# --- local gang ---------------------------------------------------------------------------------------------


def _rank_main(
    rank: int,
    world_size: int,
    device_type: str,
    init_method: str,
    env: dict[str, str],
    collective_timeout_s: float,
    conn: Connection,
    stack_file: str,
    parent_pid: int,
) -> None:
    os.environ.update(env)
    number_gpus_by_pci_bus()
    # On a hang the parent asks every rank where it is stuck; the answer names the culprit.
    faulthandler.register(signal.SIGUSR1, file=open(stack_file, "w"), all_threads=False)  # noqa: SIM115
    if device_type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))  # ranks share the cores
    device = device_for(device_type, rank)
    try:
        backend = _init_rank(device, rank, world_size, init_method, collective_timeout_s)
    except BaseException:
        conn.send(("raised", traceback.format_exc()))
        return
    ctx = RankContext(rank, world_size, rank, device, backend, device_sharers=world_size if device_type == "cpu" else 1)
    conn.send(("ok", None))
    while True:
        if not conn.poll(_PARENT_CHECK_S):
            if os.getppid() != parent_pid:
                return _orphaned(stack_file)
            continue
        try:
            task = conn.recv()
        except (EOFError, OSError):  # the parent's end is gone without a goodbye: it died
            return _orphaned(stack_file)
        if task is None:
            break
        fn, args = task
        try:
            conn.send(("ok", fn(ctx, *args)))
        except BaseException:
            conn.send(("raised", traceback.format_exc()))
    with contextlib.suppress(Exception):
        dist.destroy_process_group()


def _orphaned(stack_file: str) -> None:
    """pytest was killed: do not linger, nor leave the rendezvous directory behind."""
    shutil.rmtree(os.path.dirname(stack_file), ignore_errors=True)


class LocalGang:
    def __init__(
        self,
        world_size: int,
        *,
        device_type: str = "cpu",
        env: Mapping[str, str] | None = None,
        start_timeout_s: float = 120.0,
        collective_timeout_s: float = 600.0,
        call_timeout_s: float = 600.0,
        cpu_waits: CpuWaits | None = None,
    ) -> None:
        self.world_size = world_size
        self.cpu_waits = cpu_waits  # None: a call that runs out of time is never judged slowed
        self.hosts = {0: labels.hostname()}
        self.device_type = device_type
        self.env = dict(env or {})
        self.start_timeout_s = start_timeout_s
        self.collective_timeout_s = collective_timeout_s
        self.call_timeout_s = call_timeout_s
        self._procs: list[Any] = []
        self._conns: list[Connection] = []
        self._tmpdir: str | None = None
        self.starts = 0  # how many times ranks were started: a failed call costs a restart
        self.failed_starts: list[str] = []  # why each failed start-up failed, in order
        self.broken = False

    def run(self, fn: Callable[..., Any], *args: Any, timeout_s: float | None = None) -> list[Any]:
        if not self._procs:
            self._start_retrying_once()
        try:
            for conn in self._conns:
                conn.send((fn, args))
            if timeout_s is None:  # the call timeout: --gb-timeout's (run/gangs.py)
                return self._collect(self.call_timeout_s, _name(fn, args), bound_by="--gb-timeout")
            return self._collect(timeout_s, _name(fn, args))
        except BaseException:
            self.close(force=True)
            raise

    def _start_retrying_once(self) -> None:
        """One rank dying at start-up (a transient driver or rendezvous hiccup) must not fail the call: the
        start is tried once more. A second failure fails the call; the next call tries afresh."""
        try:
            self._start()
        except GangError as first:
            first_line = str(first).partition("\n")[0]
            self.failed_starts.append(first_line)
            try:
                self._start()
            except GangError as second:
                self.failed_starts.append(str(second).partition("\n")[0])
                # On the first line, which is what JUnit's message attribute and the JSON's `message` keep: the
                # rank's traceback follows it.
                head, newline, traceback = second.detail.partition("\n")
                note = f"(start-up retried once; the first try: {first_line})"
                raise GangError(second.rank, second.cause, f"{head} {note}{newline}{traceback}") from None

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        remove_dead_gang_dirs(Path(tempfile.gettempdir()))
        self._tmpdir = tempfile.mkdtemp(prefix=f"{_TMPDIR_PREFIX}{os.getpid()}-")
        init_method = f"file://{os.path.join(self._tmpdir, 'rendezvous')}"
        pipes = [ctx.Pipe() for _ in range(self.world_size)]
        self._conns = [parent_end for parent_end, _ in pipes]
        self._procs = [
            ctx.Process(
                target=_rank_main,
                args=(
                    rank,
                    self.world_size,
                    self.device_type,
                    init_method,
                    self.env,
                    self.collective_timeout_s,
                    child_end,
                    self._stack_file(rank),
                    os.getpid(),
                ),
                name=f"gbvalidate-rank{rank}",
                daemon=True,
            )
            for rank, (_, child_end) in enumerate(pipes)
        ]
        for p in self._procs:
            p.start()
        for _, child_end in pipes:
            child_end.close()
        self.starts += 1
        try:
            self._collect(self.start_timeout_s, "start-up")
        except BaseException:
            self.close(force=True)
            raise

    def _stack_file(self, rank: int) -> str:
        assert self._tmpdir is not None
        return os.path.join(self._tmpdir, f"stack-rank{rank}.txt")

    def _collect(self, timeout_s: float, what: str, bound_by: str | None = None) -> list[Any]:
        """Every rank's answer to the call `what` within `timeout_s` (the setting that sets it: `bound_by`)."""
        deadline = time.monotonic() + timeout_s
        waits = self._waits()  # where a call runs out of time, whether its ranks were waiting for a CPU
        results: dict[int, Any] = {}
        while len(results) < self.world_size:
            pending = {self._conns[r]: r for r in range(self.world_size) if r not in results}
            ready = wait(list(pending), timeout=max(0.0, min(_POLL_S * 20, deadline - time.monotonic())))
            for conn in ready:
                assert isinstance(conn, Connection)
                rank = pending[conn]
                try:
                    status, payload = conn.recv()
                except (EOFError, OSError):
                    raise self._crash(rank, what) from None
                if status == "raised":
                    error = GangError(rank, "raised", f"{what}: {_last_line(str(payload))}\n{payload}")
                    raise self._first_crash(what) or error
                results[rank] = payload
            if not ready and time.monotonic() >= deadline:
                missing = sorted(pending.values())
                raise self._first_crash(what) or self._timeout(missing, timeout_s, what, waits, bound_by)
        return [results[r] for r in range(self.world_size)]

    def _waits(self) -> dict[int, Any]:
        """Each rank process's threads' run delays now (cpu_waits: node/neighbours.py); none without a reader."""
        if self.cpu_waits is None:
            return {}
        return {rank: self.cpu_waits.read(Path(f"/proc/{p.pid}/task")) for rank, p in enumerate(self._procs)}

    def _crash(self, rank: int, what: str) -> GangError:
        self._procs[rank].join(timeout=1.0)
        return GangError(rank, "crashed", f"during {what}: process exited with code {self._procs[rank].exitcode}")

    def _first_crash(self, what: str) -> GangError | None:
        """A peer's error is often the echo of a rank that died: blame the dead rank when there is one."""
        time.sleep(_POLL_S)
        for rank, p in enumerate(self._procs):
            if p.exitcode is not None:
                return self._crash(rank, what)
        return None

    def _timeout(
        self,
        missing: list[int],
        timeout_s: float,
        what: str,
        waits: Mapping[int, Any],
        bound_by: str | None,
    ) -> GangError:
        """Why `missing` did not answer in time: a rank stuck (hang.py says which, from the stacks), or, where they
        spent SLOWED_SHARE or more of a call (one `bound_by` a setting; not the start-up, whose rendezvous may hang
        however busy the host) waiting for a CPU another task held, a busy host that slowed them: no hang of the
        node (a hung rank sleeps in a collective or spins on a free CPU; it does not queue)."""
        now, reader = self._waits(), self.cpu_waits
        found = [] if reader is None else [reader.waited_share(waits.get(r), now.get(r)) for r in missing]
        shares = [s for s in found if s is not None]
        stacks = {}
        for rank in missing:
            with contextlib.suppress(OSError):
                os.kill(self._procs[rank].pid, signal.SIGUSR1)
        time.sleep(0.5)
        for rank in missing:
            with contextlib.suppress(OSError), open(self._stack_file(rank)) as f:
                stacks[rank] = innermost_frame(f.read())
        # Ranks blocked in a collective are waiting for a peer; a rank that is not is the likely culprit.
        culprits = [r for r in missing if not waiting_for_a_peer(stacks.get(r))]
        where = "; ".join(f"rank {r} at {stacks.get(r, '?')}" for r in missing)
        culprit = culprits[0] if len(culprits) == 1 else None
        within = f"{what} did not finish within {timeout_s:g} s" + (f" ({bound_by})" if bound_by else "")
        if bound_by is not None and shares and max(shares) >= SLOWED_SHARE:  # a call's, not the start-up's
            said = f"its ranks waited for a CPU another task held {max(shares):.0%} of that time"
            detail = f"{within}: {said}, a busy host, not a hung node; run it on an idle node"
            detail += f" or raise {bound_by}" if bound_by else ""
            return GangError(None, "slowed", f"{detail} ({where})")
        return GangError(culprit, "timed out", f"{within} ({where})")

    def close(self, *, force: bool = False) -> None:
        """Stop every rank: politely (they finish their call and leave the process group), or at once after a
        failure (a rank may be stuck in a collective). Safe to call twice."""
        if not force:
            for conn in self._conns:
                with contextlib.suppress(OSError):
                    conn.send(None)
            deadline = time.monotonic() + 5.0
            for p in self._procs:
                p.join(timeout=max(0.0, deadline - time.monotonic()))
        for p in self._procs:
            if p.is_alive():
                p.kill()
            p.join(timeout=5.0)
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None


def remove_dead_gang_dirs(tmp: Path) -> None:
    """Remove the rendezvous directories of gangs whose process is gone: a pytest killed together with its ranks
    (SIGKILL to the process group) had no one left to clean up."""
    for path in tmp.glob(f"{_TMPDIR_PREFIX}*"):
        pid = path.name.removeprefix(_TMPDIR_PREFIX).partition("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _name(fn: Callable[..., Any], args: tuple[Any, ...]) -> str:
    """What a call is, for messages: the function, or for `run_on_local_rank` the function it runs."""
    if fn is _on_local_rank and len(args) >= 2:
        return getattr(args[1], "__name__", str(args[1]))
    return getattr(fn, "__name__", str(fn))


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else text


# --- one local rank per node --------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeResult:
    """What one node's rank returned from `run_on_local_rank`."""

    node_rank: int
    host: str
    rank: int
    value: Any


def run_on_local_rank(
    gang: Gang, local_rank: int, fn: Callable[..., Any], *args: Any, timeout_s: float | None = None
) -> list[NodeResult]:
    """`fn(ctx, *args)` on the rank with this local rank on every node, while the others wait, so a per-GPU or
    per-node measurement runs alone on its node. One result per node, in node order; every rank of a world
    gets the same list, so every rank reaches the same verdict."""
    results = gang.run(_on_local_rank, local_rank, fn, *args, timeout_s=timeout_s)
    found = [r for r in results if r is not None]
    if not found:
        raise GangError(None, "has no such rank", f"no rank has local rank {local_rank} (world of {len(results)})")
    return sorted(found, key=lambda r: r.node_rank)


def _on_local_rank(ctx: RankContext, local_rank: int, fn: Callable[..., Any], *args: Any) -> NodeResult | None:
    if ctx.local_rank != local_rank:
        return None
    return NodeResult(ctx.node_rank, labels.hostname(), ctx.rank, fn(ctx, *args))
