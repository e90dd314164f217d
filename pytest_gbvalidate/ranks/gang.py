"""Run one function SPMD on every rank of a gang and get each rank's result back. `LocalGang` starts the ranks
itself, one process per GPU (or N on the CPU), over a file rendezvous in a private temporary directory, so parallel
runs never collide on a port. They stay up between calls (a start costs seconds); a rank that crashes, raises or
outlives its deadline tears the gang down, the call raises `GangError` naming the rank and the cause (a hung rank's
whereabouts: hang.py), and the next call starts afresh. `WorldGang` (world_gang.py), behind the same `Gang`
interface, is for pytest itself running as one rank of a torchrun / srun world."""

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
# Ranks that ran out of time waiting for a CPU this share of it or more were slowed by the host, not hung: a rank
# stuck in a collective sleeps, one stuck on a GPU spins on a free CPU; neither queues for one.
SLOWED_SHARE = 0.25


@dataclass(frozen=True)
class RankContext:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str
    node_rank: int = 0  # which node of the world this rank is on (0 for a local gang)
    # Ranks holding their buffers in this rank's memory (device_key), its own included: each may take a share of it.
    device_sharers: int = 1


def device_sharers(keys: Sequence[str], rank: int) -> int:
    """How many ranks share rank `rank`'s memory, from every rank's device_key, in rank order."""
    return sum(1 for key in keys if key == keys[rank])


def device_key(device: torch.device, hostname: str, rank: int) -> str:
    """The name of the memory a rank's buffers live in (the host's, or a GPU's UUID), alike on the ranks sharing it.
    Unreadable UUID: a key of the rank's own, as a wrong guess of sharing would shrink and fail gated collectives."""
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
        self.rank, self.cause, self.detail = rank, cause, detail


class CpuWaits(Protocol):
    """How long a process's threads waited for a CPU another task held (node/neighbours.py, via run/gangs.py)."""

    def read(self, tasks: Path) -> Any: ...
    def waited_share(self, start: Any, end: Any) -> float | None: ...


class Gang(Protocol):
    world_size: int
    hosts: dict[int, str]  # node rank -> hostname
    failed_starts: list[str]  # why each start-up of the ranks that was tried again failed, in order
    # A world's process group failed (a call raised or lost a peer): the process ends once its reports are written.
    broken: bool

    def run(self, fn: Callable[..., Any], *args: Any, timeout_s: float | None = None) -> list[Any]:
        """`fn(ctx, *args)` (a module-level function) on every rank; the results in rank order."""

    def close(self) -> None: ...


# gloo holds this host's name in 64 bytes, its terminator included: at 64 characters it fails ("File name too long").
GLOO_HOSTNAME_MAX = 63


def gloo_interface(hostname: str, env: Mapping[str, str], local: bool) -> str | None:
    """The GLOO_SOCKET_IFNAME gloo needs where it cannot name this host by its hostname, else None: the loopback
    for a local gang. Raises WorldError for a world's rank: which interface reaches its peers is the launcher's."""
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
    timeout = timedelta(seconds=timeout_s)
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size, timeout=timeout)
    return backend


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
    faulthandler.register(signal.SIGUSR1, file=open(stack_file, "w"), all_threads=False)  # noqa: SIM115
    if device_type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))  # ranks share the cores
    device = torch.device("cpu") if device_type == "cpu" else torch.device(device_type, rank)
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
                break
            continue
        try:
            task = conn.recv()
        except (EOFError, OSError):  # the parent's end is gone without a goodbye: it died
            break
        if task is None:
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
            return
        fn, args = task
        try:
            conn.send(("ok", fn(ctx, *args)))
        except BaseException:
            conn.send(("raised", traceback.format_exc()))
    # Orphaned (pytest was killed): do not linger, nor leave the rendezvous directory behind.
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
        self.world_size, self.device_type, self.env = world_size, device_type, dict(env or {})
        self.cpu_waits = cpu_waits  # None: a call that runs out of time is never judged slowed
        self.hosts = {0: labels.hostname()}
        self.start_timeout_s, self.call_timeout_s = start_timeout_s, call_timeout_s
        self.collective_timeout_s = collective_timeout_s
        self._procs: list[Any] = []
        self._conns: list[Connection] = []
        self._tmpdir: str | None = None
        self.starts = 0  # how many times ranks were started: a failed call costs a restart
        self.failed_starts: list[str] = []
        self.broken = False  # never: the ranks are processes of their own

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
        """A start-up failure (a transient driver or rendezvous hiccup) is tried once more before failing the call."""
        try:
            self._start()
        except GangError as first:
            first_line = str(first).partition("\n")[0]
            self.failed_starts.append(first_line)
            try:
                self._start()
            except GangError as second:
                self.failed_starts.append(str(second).partition("\n")[0])
                # On the first line, which JUnit's message and the JSON's `message` keep, before the traceback.
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
        common = (self.world_size, self.device_type, init_method, self.env, self.collective_timeout_s)
        self._procs = []
        for rank, (_, child_end) in enumerate(pipes):
            args = (rank, *common, child_end, self._stack_file(rank), os.getpid())
            self._procs.append(ctx.Process(target=_rank_main, args=args, name=f"gbvalidate-rank{rank}", daemon=True))
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
        """Every rank's answer to the call `what` within `timeout_s` (set by the setting `bound_by`)."""
        deadline = time.monotonic() + timeout_s
        waits = self._waits()
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
        self, missing: list[int], timeout_s: float, what: str, waits: dict[int, Any], bound_by: str | None
    ) -> GangError:
        """Why `missing` did not answer in time: a rank stuck (hang.py says which, from the stacks), or a busy host
        that slowed them (SLOWED_SHARE; a call's only, not the start-up, whose rendezvous may hang however busy)."""
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
        culprits = [r for r in missing if not waiting_for_a_peer(stacks.get(r))]
        where = "; ".join(f"rank {r} at {stacks.get(r, '?')}" for r in missing)
        culprit = culprits[0] if len(culprits) == 1 else None
        within = f"{what} did not finish within {timeout_s:g} s" + (f" ({bound_by})" if bound_by else "")
        if bound_by and shares and max(shares) >= SLOWED_SHARE:
            said = f"its ranks waited for a CPU another task held {max(shares):.0%} of that time"
            detail = f"{within}: {said}, a busy host, not a hung node; run it on an idle node or raise {bound_by}"
            return GangError(None, "slowed", f"{detail} ({where})")
        return GangError(culprit, "timed out", f"{within} ({where})")

    def close(self, *, force: bool = False) -> None:
        """Stop every rank: politely (they finish their call), or at once after a failure. Safe to call twice."""
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
    """Remove the rendezvous directories of gangs whose process is gone (a pytest SIGKILLed with its ranks)."""
    for path in tmp.glob(f"{_TMPDIR_PREFIX}*"):
        pid = path.name.removeprefix(_TMPDIR_PREFIX).partition("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        with contextlib.suppress(PermissionError):  # another user's process
            os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _name(fn: Callable[..., Any], args: tuple[Any, ...]) -> str:
    """What a call is, for messages: the function, or for `run_on_local_rank` the function it runs."""
    if fn is _on_local_rank and len(args) >= 2:
        return getattr(args[1], "__name__", str(args[1]))
    return getattr(fn, "__name__", str(fn))


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else text


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
    """`fn(ctx, *args)` on the rank with this local rank on every node, while the others wait: one result per node,
    in node order, the same list on every rank of a world, so every rank reaches the same verdict."""
    results = gang.run(_on_local_rank, local_rank, fn, *args, timeout_s=timeout_s)
    found = [r for r in results if r is not None]
    if not found:
        raise GangError(None, "has no such rank", f"no rank has local rank {local_rank} (world of {len(results)})")
    return sorted(found, key=lambda r: r.node_rank)


def _on_local_rank(ctx: RankContext, local_rank: int, fn: Callable[..., Any], *args: Any) -> NodeResult | None:
    if ctx.local_rank != local_rank:
        return None
    return NodeResult(ctx.node_rank, labels.hostname(), ctx.rank, fn(ctx, *args))
