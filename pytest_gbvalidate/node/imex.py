"""IMEX (NVIDIA Internode Memory Exchange), which multi-node NVLink needs: a process maps another node's GPU memory
through an IMEX channel (a character device /dev/nvidia-caps-imex-channels/channelN, made by the driver with
NVreg_CreateImexChannel0=1 or by hand), and the node's nvidia-imex daemon brokers the mappings with the other nodes'.
No pytest here; the devices directory and the command runner are arguments, so tests give their own."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

CHANNELS_DIR = Path("/dev/nvidia-caps-imex-channels")
# The daemon's list of the domain's nodes, where IMEX is set up at boot for a whole rack (NVIDIA's IMEX guide); a
# domain made on demand (a Kubernetes ComputeDomain, a Slurm job) brings its own configuration with it.
NODES_CONFIG = Path("/etc/nvidia-imex/nodes_config.cfg")
CTL = "nvidia-imex-ctl"
READY = "READY"
# The states `nvidia-imex-ctl -q` prints (NVIDIA DCGM's DCGM_FI_IMEX_DAEMON_STATUS lists the same values).
DAEMON_STATES = (
    *("INITIALIZING", "STARTING_AUTH_SERVER", "WAITING_FOR_PEERS", "WAITING_FOR_RECOVERY"),
    *("INIT_GPU", "READY", "SHUTTING_DOWN", "UNAVAILABLE"),
)
# What a channel is: a character device. Tests on a host where they cannot make device nodes use regular files.
CHANNEL_FILE_TYPE = stat.S_IFCHR
QUERY_TIMEOUT_S = 10.0
_CHANNEL = re.compile(r"channel(\d+)")

# (command, timeout) -> (exit status, stdout, stderr); raises OSError when the command cannot start and
# subprocess.TimeoutExpired when it runs past the timeout.
Runner = Callable[[Sequence[str], float], tuple[int, str, str]]


@dataclass(frozen=True)
class Channels:
    numbers: tuple[int, ...]  # the channel devices present, by number
    problem: str | None  # why the directory could not be read, or what in it is not a channel device


def read_channels(directory: Path) -> Channels:
    """The IMEX channel devices under `directory`; a problem: a stray channelN, or the directory missing or unread."""
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return Channels((), f"{directory} does not exist: no IMEX channel was created")
    except OSError as exc:
        return Channels((), f"cannot read {directory}: {exc.strerror or exc}")
    numbers, strays = [], []
    for name in names:
        if (match := _CHANNEL.fullmatch(name)) is None:
            continue
        try:
            mode = os.lstat(directory / name).st_mode
        except OSError:
            mode = 0
        if stat.S_IFMT(mode) == CHANNEL_FILE_TYPE:
            numbers.append(int(match.group(1)))
        else:
            strays.append(name)
    problem = f"{', '.join(strays)} in {directory} not a character device" if strays else None
    return Channels(tuple(sorted(numbers)), problem)


def set_up(channels: Channels, daemon: Daemon) -> bool:
    """Whether IMEX is set up on this node: a channel device, a daemon that answers, or the daemon's static
    configuration. An idle node outside any compute domain has none of them."""
    return bool(channels.numbers) or daemon.state is not None or NODES_CONFIG.is_file()


def run_command(command: Sequence[str], timeout_s: float) -> tuple[int, str, str]:
    done = subprocess.run(
        list(command), capture_output=True, text=True, errors="replace", timeout=timeout_s, check=False
    )
    return done.returncode, done.stdout, done.stderr


@dataclass(frozen=True)
class Daemon:
    state: str | None  # what `nvidia-imex-ctl -q` printed (READY, WAITING_FOR_PEERS, ...); None: no answer
    problem: str | None  # why it gave no answer, or why the answer is not READY


def daemon_state(run: Runner = run_command, timeout_s: float = QUERY_TIMEOUT_S) -> Daemon:
    """The IMEX daemon's state, as `nvidia-imex-ctl -q` reports it: READY when connected and serving."""
    command = [CTL, "-q"]
    try:
        status, out, err = run(command, timeout_s)
    except subprocess.TimeoutExpired:
        return Daemon(None, f"`{' '.join(command)}` did not answer in {timeout_s:g} s")
    except OSError as exc:
        return Daemon(None, f"cannot run {CTL}: {exc.strerror or exc} (is the nvidia-imex package installed?)")
    lines = out.strip().splitlines()
    state = lines[0].strip() if lines else ""
    if status != 0 or not state:
        said = (err.strip() or out.strip() or "nothing").splitlines()[-1][:200]
        return Daemon(None, f"`{' '.join(command)}` exited {status}: {said}")
    if state != READY:
        known = "" if state in DAEMON_STATES else " (not a state nvidia-imex-ctl reports)"
        return Daemon(state[:80], f"the IMEX daemon is {state[:80]!r}{known}, not {READY}")
    return Daemon(state, None)


# `nvidia-imex-ctl -N -j -H` (which DCGM reads for its DCGM_FI_IMEX_DOMAIN_STATUS): the domain's `status` (UP, DOWN,
# DEGRADED) and, for each node of its nodes_config.cfg by index, its daemon's `status`, `host` (the config's address),
# `hostName` (-H) and `connections` to each node (index -> {"host", "status": CONNECTED, ...}).
DOMAIN_UP = "UP"
CONNECTED = "CONNECTED"


@dataclass(frozen=True)
class DomainNode:
    index: str
    host: str  # its address in the domain's nodes_config.cfg
    hostname: str  # "" where the output gives none
    status: str  # its daemon's state, as the domain sees it
    connections: dict[str, str]  # node index -> the state of its connection to that node


@dataclass(frozen=True)
class Domain:
    status: str | None  # UP, DOWN, DEGRADED; None: no answer
    nodes: tuple[DomainNode, ...]
    problem: str | None  # why there is no answer


def domain_state(run: Runner = run_command, timeout_s: float = QUERY_TIMEOUT_S) -> Domain:
    """The IMEX domain as this node's daemon sees it (`nvidia-imex-ctl -N -j -H`); output not its JSON is no answer."""
    command = [CTL, "-N", "-j", "-H"]
    shown = f"`{' '.join(command)}`"
    try:
        status, out, err = run(command, timeout_s)
    except subprocess.TimeoutExpired:
        return Domain(None, (), f"{shown} did not answer in {timeout_s:g} s")
    except OSError as exc:
        return Domain(None, (), f"cannot run {CTL}: {exc.strerror or exc} (is the nvidia-imex package installed?)")
    if status != 0:
        said = (err.strip() or out.strip() or "nothing").splitlines()[-1][:200]
        return Domain(None, (), f"{shown} exited {status}: {said}")
    try:
        data = json.loads(out)
    except ValueError as exc:
        return Domain(None, (), f"{shown} printed no JSON ({exc})")
    except RecursionError:  # thousands of `[`: Python's stack ends before the parser does
        return Domain(None, (), f"{shown} printed no JSON (nested too deeply to read)")
    state = data.get("status") if isinstance(data, dict) else None
    listed = data.get("nodes") if isinstance(data, dict) else None
    if not isinstance(state, str) or not isinstance(listed, dict):
        return Domain(None, (), f"{shown} printed no domain `status` and `nodes`")
    nodes = []
    for index, node in listed.items():
        if not isinstance(node, dict) or not all(isinstance(node.get(key), str) for key in ("host", "status")):
            return Domain(None, (), f"{shown}: node {str(index)[:20]!r} has no `host` and `status`")
        links = node["connections"] if isinstance(node.get("connections"), dict) else {}
        connections = {str(peer): str(link.get("status", "")) for peer, link in links.items() if isinstance(link, dict)}
        name = node["hostName"] if isinstance(node.get("hostName"), str) else ""
        nodes.append(DomainNode(str(index), node["host"][:80], name[:80], node["status"][:40], connections))
    return Domain(state[:40], tuple(nodes), None)


@dataclass(frozen=True)
class DomainVerdict:
    problem: str | None  # what is wrong with this node in its domain
    others: str | None  # what is wrong with the domain beyond this node: said, never failing this node


def judge_domain(domain: Domain, own: Collection[str]) -> DomainVerdict:
    """This node's place in its IMEX domain, found by its hostname or an address (`own`): its entry READY, and
    connected to at least one other READY node (else it is the one cut off, as it is reaching no node at all). A node
    down elsewhere, or one connection down, is the domain's state, said in `others` (that node's own run names it).
    A node not found by its names (a container's are not the host's) is not judged: its daemon READY (`-q`) says it."""
    if domain.status is None:
        return DomainVerdict(domain.problem, None)
    if not (mine := [n for n in domain.nodes if n.host in own or (n.hostname and n.hostname in own)]):
        listed = ", ".join(_name(n) for n in domain.nodes[:8]) or "none"
        return DomainVerdict(
            None,
            f"the IMEX domain is {domain.status}; this node was not found among its {len(domain.nodes)} nodes "
            f"({listed}) by its hostname or addresses ({', '.join(sorted(own)[:4])}): its place in it not judged",
        )
    me = mine[0]
    others = [n for n in domain.nodes if n is not me]
    ready = [n for n in others if n.status == READY]
    cut = [n for n in ready if me.connections.get(n.index) != CONNECTED]
    reached = [n for n in others if me.connections.get(n.index) == CONNECTED]
    problem = None
    if me.status != READY:
        problem = f"this node's daemon is {me.status!r} in its IMEX domain, not {READY}"
    elif ready and len(cut) == len(ready):
        shown = ", ".join(f"{_name(n)} {me.connections.get(n.index) or 'not listed'}" for n in cut)
        problem = f"this node reaches none of the {len(ready)} other READY nodes of its IMEX domain ({shown})"
    elif others and not reached:
        # Every peer unreachable, UNAVAILABLE as it sees them: a node cut off sees exactly that (its peers name it).
        shown = "; ".join(f"{_name(n)} {n.status}, {me.connections.get(n.index) or 'not connected'}" for n in others)
        problem = f"this node reaches none of the {len(others)} other nodes of its IMEX domain ({shown})"
    said = [f"{_name(n)} {n.status}" for n in others if n.status != READY]
    if problem is None:
        said += [f"no connection to {_name(n)} ({me.connections.get(n.index) or 'not listed'})" for n in cut]
    if domain.status == DOMAIN_UP and not said:
        return DomainVerdict(problem, None)
    note = f"the IMEX domain is {domain.status}"
    if said:
        note += f": {'; '.join(said[:8])}" + (f"; {len(said) - 8} more" if len(said) > 8 else "")
    return DomainVerdict(problem, note)


def _name(node: DomainNode) -> str:
    return node.hostname or node.host


def own_names() -> set[str]:
    """How nodes_config.cfg may list this node: its hostname (also up to its first dot), its interfaces' addresses."""
    import socket

    import psutil

    name = socket.gethostname()
    addresses = {a.address.split("%")[0] for nics in psutil.net_if_addrs().values() for a in nics}
    return {name, name.split(".")[0]} | {a for a in addresses if a}
