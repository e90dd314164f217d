"""What NCCL's own log says it did: whether NVLS (NVLink SHARP) was available and used, whether a communicator
spans nodes over multi-node NVLink (MNNVL), and which transport each of its connections used. Pure text parsing, no
torch, no pytest.

The lines read, with where NCCL prints them (github.com/NVIDIA/nccl, master at 5067397c):

- ``NVLS multicast support is [not ]available on dev %d`` -- src/transport/nvls.cc (INIT), once per rank at init.
- ``%s: %ld Bytes -> Algo %s proto %s channel{Lo..Hi}={%d..%d}`` -- src/enqueue.cc (subsystem TUNING), rank 0
  only, one line per collective call: the algorithm NCCL ran (``Ring`` or ``RING``, by release: both are read).
- ``comm %p rank %d nRanks %d nNodes %d localRanks %d localRank %d MNNVL %d`` -- src/init.cc (INIT): MNNVL 1
  when the communicator runs over multi-node NVLink (NCCL then counts the NVLink domain as one node).
- A connection of one channel, printed as it is set up: ``Channel %02d/%d : %d[%d] -> %d[%d] via P2P/%s%s%s`` (and
  ``P2P/IPC``, ``P2P/direct pointer``, ``P2P/indirect/...``) by the sender -- src/transport/p2p.cc: ``P2P/MNNVL``
  over multi-node NVLink, ``P2P/CUMEM`` or ``P2P/IPC`` within one node; ``Channel %02d : %d[%d] -> %d[%d] via
  SHM/%s/%s`` -- src/transport/shm.cc (same host, through host memory); ``Channel %02d/%d : %d[%d] -> %d[%d] [send]
  via NET/%s/%d%s%s%s`` and its ``[receive]`` twin from the receiver -- src/transport/net.cc: ``NET/IB/0/GDRDMA``,
  ``NET/Socket/0``, or a plugin's (``NET/IBext_v8/2``); ``NET/%s/%d(%d)`` names the rank whose NIC proxies it (PXN).
  Older releases are read too: before 2.18 the brackets hold the rank's PCI bus id (``2[c7000]``); the connection
  index came to NET's lines in 2.12 and P2P's in 2.14 (SHM's have none); before 2.13 SHM said ``via direct shared
  memory``. Each gives its ranks, its transport (the path's first two parts; ``SHM`` alone) and the whole path. With
  ``NCCL_RUNTIME_CONNECT=1`` (the default since 2.22) NCCL connects, and prints, only what the algorithms it runs
  need, at the first call that needs them. Not read: CollNet's ``CollNet %02d/%1d : %d [send] via COLLNET/...`` (no
  peer), and NVLS, which prints no line per peer (``Connected NVLS tree`` only where NCCL counts several nodes).
- ``NCCL WARN ...`` lines, e.g. ``No algorithm/protocol available for function AllReduce with datatype ...
  NCCL_ALGO was set to NVLS.`` (src/enqueue.cc: an algorithm this communicator cannot run; the call fails) or
  ``MNNVL (cliqueSize %d) is available but not working on this system. Check the IMEX ...`` (src/mnnvl.cc).

NCCL writes these with NCCL_DEBUG=INFO and NCCL_DEBUG_SUBSYS naming INIT and TUNING (`debug_env`): a line prints
where its subsystems share one with NCCL_DEBUG_SUBSYS (src/debug.cc), so INIT covers the connection lines'
``INIT|P2P``, ``INIT|SHM`` and ``INIT|NET``. A rank's host is read from the ``host:pid:tid [dev] NCCL INFO`` (or
``WARN``) prefix of its init and connection lines.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

# NCCL's algorithms that are NVLink SHARP: NVLS within an NVLink domain, NVLSTree across nodes (tree between them).
NVLS_ALGORITHMS = frozenset({"NVLS", "NVLSTREE"})
NCCL_FUNCTION = dict(  # NCCL's name for the collectives this package measures (ncclFuncToString)
    all_reduce="AllReduce", all_gather="AllGather", reduce_scatter="ReduceScatter", broadcast="Broadcast"
)
SUBSYSTEMS = "INIT,ENV,TUNING"
# How a problem starts where the log does not say what ran (no line of the kind the check reads): the check cannot
# tell, and says so as unresolved, never as the node's fault (suites/test_collectives.py).
NOT_CONFIRMED = "NCCL did not confirm"

_NVLS_SUPPORT = re.compile(r"NVLS multicast support is (not )?available on dev (\d+)")
_CHOICE = re.compile(r"(?:^|\s)(\w+): (\d+) Bytes -> Algo (\w+) proto (\w+)")
_COMM = re.compile(r"\bcomm \S+ rank (\d+) nRanks (\d+) nNodes (\d+) localRanks \d+ localRank \d+ MNNVL (\d+)")
_WARN = re.compile(r"NCCL WARN (.*)")
# The ``host:pid:tid [dev]`` before NCCL INFO / WARN (a WARN puts ``file:line`` between them).
_HOST = re.compile(r"(\S+):\d+:\d+ \[\d+\] (?:\S+:\d+ )?NCCL (?:INFO|WARN)")
_CONNECTION = re.compile(
    r"\bChannel (\d+)(?:/(\d+))? : (\d+)\[[0-9a-fA-F]+\] -> (\d+)\[[0-9a-fA-F]+\](?: \[(send|receive)\])? via (\S.*)"
)
# A transport's name where its second part may hold a space: a network plugin's (``NET/AWS Libfabric/0``, up to
# the device number) and P2P's ``direct pointer``.
_NET_PATH = re.compile(r"(NET/.+?)/\d+\S*")
_P2P_PATH = re.compile(r"(P2P/(?:direct pointer|[^/\s]+))\S*")
MNNVL_TRANSPORT = "P2P/MNNVL"  # between nodes over multi-node NVLink (p2p.cc: comm->MNNVL ? "MNNVL" : "CUMEM")


@dataclass(frozen=True)
class AlgoChoice:
    """One collective call as NCCL's tuner chose to run it."""

    function: str  # NCCL's name: AllReduce, AllGather, ...
    size_bytes: int
    algorithm: str  # upper case: RING, TREE, NVLS, NVLSTREE, COLLNETDIRECT, ...
    protocol: str  # upper case: LL, LL128, SIMPLE


@dataclass(frozen=True)
class CommInit:
    """A communicator's init line: its size, and whether NCCL runs it over multi-node NVLink."""

    rank: int
    ranks: int
    nodes: int  # as NCCL counts them: an MNNVL domain is one
    mnnvl: bool


@dataclass(frozen=True)
class Connection:
    """One connection of one channel as NCCL set it up: `source` to `target` (communicator ranks) over `transport`."""

    channel: int
    index: int  # NCCL's connection index (0 where the release prints none)
    source: int  # the sending rank
    target: int  # the receiving rank
    transport: str  # the path's first two parts (SHM alone): P2P/MNNVL, P2P/CUMEM, P2P/IPC, SHM, NET/IB, NET/Socket
    path: str  # as NCCL printed it: NET/IB/0/GDRDMA, P2P/CUMEM/read, SHM/direct/direct
    side: str | None = None  # NET's "send" or "receive": the end that printed the line

    @property
    def key(self) -> tuple[int, int, int, int]:
        """The connection whichever end printed it (NET prints both ends)."""
        return (self.channel, self.index, self.source, self.target)

    @property
    def printed_by(self) -> int:
        """The rank whose log line this is: the receiver for NET's [receive], else the sender."""
        return self.target if self.side == "receive" else self.source


@dataclass
class NcclLog:
    """What one or more ranks' NCCL logs say (`merge` combines ranks)."""

    nvls_support: dict[int, bool] = field(default_factory=dict)  # CUDA device -> multicast available
    choices: list[AlgoChoice] = field(default_factory=list)
    comms: list[CommInit] = field(default_factory=list)
    connections: list[Connection] = field(default_factory=list)  # as logged: NET's twice where both ends are
    hosts: dict[int, str] = field(default_factory=dict)  # rank -> the host its lines name (the first one read)
    warnings: list[str] = field(default_factory=list)
    lines: int = 0

    def links(self) -> list[Connection]:
        """Each connection once (NET's [send] and [receive] lines are the two ends of one), in the log's order."""
        first: dict[tuple[int, int, int, int], Connection] = {}
        for c in self.connections:
            first.setdefault(c.key, c)
        return list(first.values())

    def transports(self) -> dict[str, int]:
        """How many connections ran over each transport (`links`), by name: ``{"NET/IB": 16, "P2P/IPC": 112}``."""
        return dict(sorted(Counter(c.transport for c in self.links()).items()))

    def between_nodes(self, connection: Connection) -> bool:
        """Whether `connection` joins two hosts: unless the log puts both ranks on one (an unnamed host counts as
        elsewhere; NCCL joins two ranks of one host over the network only where P2P and SHM cannot)."""
        source, target = self.hosts.get(connection.source), self.hosts.get(connection.target)
        return source is None or target is None or source != target

    def describe(self, connection: Connection) -> str:
        """``rank 1 -> rank 8 (node-b), channel 00/0, via NET/IB/0/GDRDMA``: a connection in a failure's words."""

        def rank(r: int) -> str:
            return f"rank {r} ({self.hosts[r]})" if r in self.hosts else f"rank {r}"

        return (
            f"{rank(connection.source)} -> {rank(connection.target)}, channel "
            f"{connection.channel:02d}/{connection.index}, via {connection.path}"
        )

    def algorithms(self, function: str, size_bytes: int | None = None) -> list[str]:
        """The distinct ``ALGO/PROTO`` NCCL ran `function` with (at `size_bytes` only, when given), sorted."""
        calls = [c for c in self.choices if c.function == function and size_bytes in (None, c.size_bytes)]
        return sorted({f"{c.algorithm}/{c.protocol}" for c in calls})


def debug_env(path: str) -> dict[str, str]:
    """The NCCL environment that makes NCCL write the lines read here to `path`."""
    return {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": SUBSYSTEMS, "NCCL_DEBUG_FILE": path}


def parse(text: str) -> NcclLog:
    """The NVLS, algorithm, communicator, connection and warning lines of one NCCL log (no other line)."""
    log = NcclLog()
    for line in text.splitlines():
        log.lines += 1
        if m := _CHOICE.search(line):
            log.choices.append(AlgoChoice(m[1], int(m[2]), m[3].upper(), m[4].upper()))
        elif m := _CONNECTION.search(line):
            transport, path = _transport(m[6])
            connection = Connection(int(m[1]), int(m[2] or 0), int(m[3]), int(m[4]), transport, path, m[5])
            log.connections.append(connection)
            if host := _host(line):
                log.hosts.setdefault(connection.printed_by, host)
        elif m := _NVLS_SUPPORT.search(line):
            log.nvls_support[int(m[2])] = m[1] is None
        elif m := _COMM.search(line):
            log.comms.append(CommInit(int(m[1]), int(m[2]), int(m[3]), m[4] != "0"))
            if host := _host(line):
                log.hosts.setdefault(int(m[1]), host)
        elif m := _WARN.search(line):
            log.warnings.append(m[1].strip())
    return log


def _host(line: str) -> str | None:
    """The host a line's ``host:pid:tid [dev]`` prefix names, None where it has none."""
    return m[1] if (m := _HOST.search(line)) else None


def _transport(via: str) -> tuple[str, str]:
    """A connection line's text after ``via``: its transport's name and its path as NCCL printed it."""
    if m := _NET_PATH.match(via) or _P2P_PATH.match(via):
        return m[1], m[0]
    path = via.split()[0]
    if via.startswith("direct shared memory"):  # SHM before NCCL 2.13
        return "SHM", "direct shared memory"
    if path.startswith("SHM"):  # SHM/direct/direct: the second part is a copy mode, not a transport
        return "SHM", path
    return "/".join(path.split("/")[:2]), path


def merge(logs: Iterable[NcclLog]) -> NcclLog:
    """Every rank's log as one (a device not available on any rank counts as not available)."""
    out = NcclLog()
    for log in logs:
        for dev, ok in log.nvls_support.items():
            out.nvls_support[dev] = out.nvls_support.get(dev, True) and ok
        out.choices += log.choices
        out.comms += log.comms
        out.connections += log.connections
        for rank, host in log.hosts.items():
            out.hosts.setdefault(rank, host)
        out.warnings += [w for w in log.warnings if w not in out.warnings]
        out.lines += log.lines
    return out


def nvls_problem(log: NcclLog, function: str) -> str | None:
    """Why NCCL's log does not show `function` (NCCL's name) run with NVLS, in one line; None when every call of
    it that the log records ran NVLS or NVLSTree."""
    unavailable = sorted(dev for dev, ok in log.nvls_support.items() if not ok)
    if unavailable:
        devs = ", ".join(str(d) for d in unavailable)
        return f"NCCL did not use NVLS: NCCL says NVLS multicast support is not available on dev {devs}"
    refused = [w for w in log.warnings if "No algorithm/protocol available" in w]
    if refused:
        return f"NCCL did not use NVLS: NCCL refused the collective: {refused[0]}"
    calls = [c for c in log.choices if c.function == function]
    other = [c for c in calls if c.algorithm not in NVLS_ALGORITHMS]
    if other:
        first = other[0]
        return (
            f"NCCL did not use NVLS: it ran {len(other)} of {len(calls)} {function} calls with another algorithm "
            f"(first: {first.size_bytes} bytes -> {first.algorithm}/{first.protocol})"
        )
    if not calls:
        return (
            f"{NOT_CONFIRMED} NVLS: its log ({log.lines} lines) names no algorithm for {function} "
            f"(NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS={SUBSYSTEMS} on the ranks)"
        )
    return None


def mnnvl_problem(log: NcclLog) -> str | None:
    """Why NCCL's log does not show the communicator over multi-node NVLink, in one line; None when every init line says
    MNNVL 1 and no connection line (one at least) joins nodes over NET/...: the transport used decides."""
    broken = [w for w in log.warnings if w.startswith("MNNVL")]
    if broken:
        return f"NCCL did not use multi-node NVLink: {broken[0]}"
    links = log.links()
    network = [c for c in links if c.transport.startswith("NET/") and log.between_nodes(c)]
    if network:
        used = ", ".join(sorted({c.transport for c in network}))
        counts = ", ".join(f"{name} {n}" for name, n in log.transports().items())
        connections = f"{len(network)} connection" + ("" if len(network) == 1 else "s")
        return (
            f"NCCL did not use multi-node NVLink: {connections} between nodes ran over {used}, not "
            f"{MNNVL_TRANSPORT} (first: {log.describe(network[0])}; NCCL's connections: {counts})"
        )
    off = [c for c in log.comms if not c.mnnvl]
    if off:
        return (
            f"NCCL did not use multi-node NVLink: rank {off[0].rank}'s communicator says MNNVL 0 "
            f"({off[0].ranks} ranks on {off[0].nodes} nodes as NCCL counts them)"
        )
    if not log.comms:
        return (
            f"{NOT_CONFIRMED} multi-node NVLink: its log ({log.lines} lines) has no communicator init line "
            f"(NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS={SUBSYSTEMS} on the ranks)"
        )
    if not links:
        return (
            f"{NOT_CONFIRMED} multi-node NVLink: its log ({log.lines} lines) has no channel connection line, "
            f"so the transport between nodes is unknown (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS={SUBSYSTEMS} on the ranks)"
        )
    return None


def shown_env(env: Mapping[str, str], names: Iterable[str]) -> dict[str, str]:
    """`names` as the ranks have them, ``unset`` where they are not set: what a measurement's details record."""
    return {name: env.get(name, "unset") for name in names}
