"""bench/nccl_log.py against short real NCCL logs (tests/helpers/nccl_logs.py): NVLS availability, the algorithm
NCCL ran each call with, MNNVL, the transport each connection used, and the one-line reason a check fails."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_gbvalidate.bench import nccl_log
from pytest_gbvalidate.bench.nccl_log import AlgoChoice, CommInit, Connection
from tests.helpers import nccl_logs


def test_the_lines_that_matter_are_read_and_the_rest_ignored() -> None:
    log = nccl_log.parse(nccl_logs.NVLS_NOT_AVAILABLE + nccl_logs.RING_CHOSEN + nccl_logs.MNNVL_OFF)
    assert log.nvls_support == {4: False, 0: False}
    # the per-call "AllReduce: opCount ..." line of NCCL_DEBUG_SUBSYS=ALL is not an algorithm choice
    assert log.choices == [AlgoChoice("AllReduce", 4, "RING", "SIMPLE")]
    assert log.comms == [CommInit(1, 8, 1, False), CommInit(0, 8, 1, False)]
    assert log.lines == 8
    assert log.algorithms("AllReduce") == ["RING/SIMPLE"]
    assert log.algorithms("AllReduce", 4) == ["RING/SIMPLE"] and log.algorithms("AllReduce", 8) == []


def test_nvls_is_confirmed_only_where_every_all_reduce_ran_nvls() -> None:
    used = nccl_log.parse(nccl_logs.NVLS_AVAILABLE + nccl_logs.NVLS_CHOSEN.splitlines()[1])
    assert used.nvls_support == {5: True, 2: True}
    assert used.algorithms("AllReduce", 2097152) == ["NVLS/SIMPLE"]
    assert nccl_log.nvls_problem(used, "AllReduce") is None


def test_each_way_of_not_using_nvls_is_one_line_saying_how() -> None:
    unavailable = nccl_log.parse(nccl_logs.NVLS_NOT_AVAILABLE + nccl_logs.NVLS_CHOSEN)
    assert nccl_log.nvls_problem(unavailable, "AllReduce") == (
        "NCCL did not use NVLS: NCCL says NVLS multicast support is not available on dev 0, 4"
    )
    fell_back = nccl_log.parse(nccl_logs.NVLS_AVAILABLE + nccl_logs.NVLS_CHOSEN)
    assert nccl_log.nvls_problem(fell_back, "AllReduce") == (
        "NCCL did not use NVLS: it ran 1 of 2 AllReduce calls with another algorithm (first: 4096 bytes -> RING/LL)"
    )
    refused = nccl_log.parse(nccl_logs.NVLS_AVAILABLE + nccl_logs.NO_ALGORITHM)
    assert nccl_log.nvls_problem(refused, "AllReduce") == (
        "NCCL did not use NVLS: NCCL refused the collective: "
        "No algorithm/protocol available for AllGather with ncclInt8"
    )
    silent = nccl_log.parse(nccl_logs.NVLS_AVAILABLE)
    assert nccl_log.nvls_problem(silent, "AllReduce") == (
        "NCCL did not confirm NVLS: its log (2 lines) names no algorithm for AllReduce "
        "(NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,ENV,TUNING on the ranks)"
    )


def test_ranks_merge_and_one_rank_without_nvls_is_enough_to_fail() -> None:
    merged = nccl_log.merge(
        [
            nccl_log.parse(nccl_logs.NVLS_AVAILABLE + nccl_logs.NVLS_CHOSEN.splitlines()[1]),
            nccl_log.parse(nccl_logs.NVLS_NOT_AVAILABLE),
        ]
    )
    assert merged.nvls_support == {5: True, 2: True, 4: False, 0: False}
    assert merged.lines == 6
    assert nccl_log.nvls_problem(merged, "AllReduce") == (
        "NCCL did not use NVLS: NCCL says NVLS multicast support is not available on dev 0, 4"
    )


def test_mnnvl_is_read_from_the_communicator_init_line() -> None:
    assert nccl_log.mnnvl_problem(nccl_log.parse(nccl_logs.MNNVL_ON)) is None  # MNNVL 1, and P2P/MNNVL
    assert nccl_log.mnnvl_problem(nccl_log.parse(nccl_logs.MNNVL_OFF)) == (
        "NCCL did not use multi-node NVLink: "
        "rank 1's communicator says MNNVL 0 (8 ranks on 1 nodes as NCCL counts them)"
    )
    assert nccl_log.mnnvl_problem(nccl_log.parse(nccl_logs.RING_CHOSEN)) == (
        "NCCL did not confirm multi-node NVLink: its log (3 lines) has no communicator init line "
        "(NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,ENV,TUNING on the ranks)"
    )


def test_the_debug_environment_and_the_recorded_settings() -> None:
    assert nccl_log.debug_env("/tmp/x/nccl-rank0.log") == {
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": "INIT,ENV,TUNING",
        "NCCL_DEBUG_FILE": "/tmp/x/nccl-rank0.log",
    }
    assert nccl_log.shown_env({"NCCL_ALGO": "NVLS"}, ("NCCL_ALGO", "NCCL_MNNVL_ENABLE")) == {
        "NCCL_ALGO": "NVLS",
        "NCCL_MNNVL_ENABLE": "unset",
    }


# Each real connection line: what it is read as, and the host its printer's prefix names.
CONNECTION_LINES = [
    (nccl_logs.MNNVL_ON, Connection(0, 0, 0, 1, "P2P/MNNVL", "P2P/MNNVL"), {0: "watchtower-navy-cn13"}),
    (nccl_logs.MNNVL_OFF_CUMEM, Connection(0, 0, 0, 1, "P2P/CUMEM", "P2P/CUMEM"), {0: "watchtower-navy-cn13"}),
    (
        nccl_logs.NET_IB_CHANNELS.splitlines()[0],
        Connection(0, 0, 1, 8, "NET/IB", "NET/IB/0/GDRDMA", "receive"),
        {8: "tpgds-aihub0008"},  # [receive]: the receiving rank printed it
    ),
    (
        nccl_logs.NET_IB_CHANNELS.splitlines()[1],
        Connection(0, 0, 8, 15, "P2P/IPC", "P2P/IPC"),
        {8: "tpgds-aihub0008"},
    ),
    (
        nccl_logs.NET_IB_CHANNELS.splitlines()[2],
        Connection(7, 0, 8, 7, "NET/IB", "NET/IB/0/GDRDMA", "send"),
        {8: "tpgds-aihub0008"},
    ),
    (
        nccl_logs.NET_SOCKET.splitlines()[0],
        Connection(1, 0, 8, 15, "P2P/IPC", "P2P/IPC/read"),
        {8: "<cluster_name>"},
    ),
    (
        nccl_logs.NET_SOCKET.splitlines()[1],
        Connection(3, 0, 15, 6, "NET/Socket", "NET/Socket/3", "send"),
        {15: "<cluster_name>"},
    ),
    (
        nccl_logs.SHM_THEN_NET.splitlines()[0],
        Connection(0, 0, 1, 0, "SHM", "SHM/direct/direct"),  # no connection index, PCI bus ids in the brackets
        {1: "ault43"},
    ),
    (
        nccl_logs.SHM_THEN_NET.splitlines()[1],
        Connection(0, 1, 1, 2, "NET/IB", "NET/IB/1/Shared", "send"),
        {1: "ault43"},
    ),
    (
        nccl_logs.NET_WITHIN_A_HOST.splitlines()[0],
        Connection(1, 0, 2, 0, "NET/IB", "NET/IB/5/GDRDMA", "receive"),
        {0: "10-90-43-152"},
    ),
    (
        nccl_logs.OTHER_TRANSPORTS.splitlines()[0],
        Connection(1, 1, 0, 3, "P2P/direct pointer", "P2P/direct pointer"),
        {0: "sh9-machine-20250813085604-64df4c99dc-m27xf"},
    ),
    (
        nccl_logs.OTHER_TRANSPORTS.splitlines()[1],
        Connection(3, 0, 47, 39, "NET/IBext_v8", "NET/IBext_v8/2", "receive"),
        {39: "hostname-test"},
    ),
    (
        nccl_logs.OTHER_TRANSPORTS.splitlines()[2],
        Connection(12, 0, 3, 2, "P2P/IPC", "P2P/IPC/read"),
        {3: "09677202c889"},
    ),
]


@pytest.mark.parametrize(
    ("text", "connection", "hosts"),
    CONNECTION_LINES,
    ids=[f"{c.source}->{c.target} {c.path}" for _, c, _ in CONNECTION_LINES],
)
def test_each_connection_line_is_read_with_its_transport_and_host(
    text: str, connection: Connection, hosts: dict[int, str]
) -> None:
    log = nccl_log.parse(text)
    assert log.connections == [connection]
    assert {r: h for r, h in log.hosts.items() if r in (connection.source, connection.target)} == hosts


def test_the_ring_order_and_connected_lines_are_not_connections() -> None:
    log = nccl_log.parse(nccl_logs.NET_IB_COMMS + nccl_logs.NET_IB_CHANNELS)
    assert len(log.connections) == 3  # "Connected all rings, use ring PXN 0 GDR 1" is not one
    assert log.hosts == {15: "tpgds-aihub0008", 8: "tpgds-aihub0008"}  # the init lines' hosts
    assert log.transports() == {"NET/IB": 2, "P2P/IPC": 1}
    assert [log.between_nodes(c) for c in log.connections] == [True, False, True]  # 1 and 7: the other node


def test_a_net_connection_is_counted_once_and_within_a_host_is_not_between_nodes() -> None:
    log = nccl_log.parse(nccl_logs.NET_WITHIN_A_HOST)
    assert len(log.connections) == 4 and len(log.links()) == 3  # 3 -> 2 logged at both ends
    assert log.transports() == {"NET/IB": 3}
    assert set(log.hosts.values()) == {"10-90-43-152"} and sorted(log.hosts) == [0, 1, 2, 3]
    assert not any(log.between_nodes(c) for c in log.links())  # every rank on the one host: NET within it
    # each rank's own log, merged: the same
    merged = nccl_log.merge(nccl_log.parse(line) for line in nccl_logs.NET_WITHIN_A_HOST.splitlines())
    assert merged.links() == log.links() and merged.hosts == log.hosts and merged.transports() == {"NET/IB": 3}


def test_mnnvl_fails_where_connections_between_nodes_ran_over_the_network() -> None:
    fell_back = nccl_log.parse(nccl_logs.NET_IB_COMMS + nccl_logs.NET_IB_CHANNELS)
    assert nccl_log.mnnvl_problem(fell_back) == (
        "NCCL did not use multi-node NVLink: 2 connections between nodes ran over NET/IB, not P2P/MNNVL (first: "
        "rank 1 -> rank 8 (tpgds-aihub0008), channel 00/0, via NET/IB/0/GDRDMA; NCCL's connections: NET/IB 2, "
        "P2P/IPC 1)"
    )
    # the communicator's init line says MNNVL 1, its connections between nodes ran over the network: still a fail
    said_mnnvl = nccl_log.parse(nccl_logs.MNNVL_ON + nccl_logs.NET_IB_CHANNELS)
    assert all(c.mnnvl for c in said_mnnvl.comms)
    assert nccl_log.mnnvl_problem(said_mnnvl) == (
        "NCCL did not use multi-node NVLink: 2 connections between nodes ran over NET/IB, not P2P/MNNVL (first: "
        "rank 1 -> rank 8 (tpgds-aihub0008), channel 00/0, via NET/IB/0/GDRDMA; NCCL's connections: NET/IB 2, "
        "P2P/IPC 1, P2P/MNNVL 1)"
    )
    sockets = nccl_log.parse(nccl_logs.MNNVL_ON + nccl_logs.NET_SOCKET)
    assert nccl_log.mnnvl_problem(sockets) == (
        "NCCL did not use multi-node NVLink: 1 connection between nodes ran over NET/Socket, not P2P/MNNVL (first: "
        "rank 15 (<cluster_name>) -> rank 6, channel 03/0, via NET/Socket/3; NCCL's connections: NET/Socket 1, "
        "P2P/IPC 1, P2P/MNNVL 1)"
    )


def test_mnnvl_is_unconfirmed_without_a_connection_line_and_off_with_cumem() -> None:
    init_only = nccl_log.parse(nccl_logs.MNNVL_ON.splitlines()[1])
    assert nccl_log.mnnvl_problem(init_only) == (
        "NCCL did not confirm multi-node NVLink: its log (1 lines) has no channel connection line, so the transport "
        "between nodes is unknown (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,ENV,TUNING on the ranks)"
    )
    assert nccl_log.mnnvl_problem(nccl_log.parse(nccl_logs.MNNVL_OFF_CUMEM)) == (
        "NCCL did not use multi-node NVLink: "
        "rank 0's communicator says MNNVL 0 (4 ranks on 1 nodes as NCCL counts them)"
    )


# A connection as the property below writes it: the kind of line (NCCL's format for it) and its two ranks.
P2P_PATHS = ("P2P/MNNVL", "P2P/CUMEM/read", "P2P/IPC", "P2P/direct pointer")
# net.cc's paths (a proxy rank in parentheses: PXN; a plugin's name with a space) -> the transport's name
NET_PATHS = {
    "NET/IB/0/GDRDMA": "NET/IB",
    "NET/IB/2(3)/GDRDMA": "NET/IB",
    "NET/Socket/1": "NET/Socket",
    "NET/AWS Libfabric/0/GDRDMA": "NET/AWS Libfabric",
}
KINDS = (*P2P_PATHS, "SHM/direct/direct", *NET_PATHS)


def _line(host: str, printer: int, head: str, via: str) -> str:
    return f"{host}:1234:1240 [{printer % 8}] NCCL INFO {head} via {via}"


@settings(deadline=None)  # a busy 2-core machine times no example
@given(
    hosts=st.lists(st.sampled_from(["node-a", "node-b", "node-c"]), min_size=2, max_size=6),
    announced=st.sets(st.integers(0, 5), min_size=1),
    links=st.lists(
        st.tuples(st.integers(0, 5), st.integers(0, 5), st.sampled_from(KINDS), st.sampled_from(["send", "both"])),
        max_size=8,
    ),
)
def test_mnnvl_passes_only_with_a_connection_and_none_between_nodes_over_the_network(
    hosts: list[str], announced: set[int], links: list[tuple[int, int, str, str]]
) -> None:
    """Any mix of communicator init lines (MNNVL 1) and connection lines, each printed as NCCL prints it by the
    rank that sets it up: the check passes iff no NET connection joins two hosts (a rank whose host no line names
    counts as elsewhere) and the log has a connection at all."""
    announced = {r % len(hosts) for r in announced}
    lines = [
        f"{hosts[r]}:1234:1234 [{r}] NCCL INFO comm 0x5 rank {r} nRanks {len(hosts)} nNodes 1 localRanks "
        f"{len(hosts)} localRank {r} MNNVL 1"
        for r in sorted(announced)
    ]
    known = {r: hosts[r] for r in announced}
    network: set[str] = set()
    for channel, (a, b, kind, ends) in enumerate(links):
        source, target = a % len(hosts), b % len(hosts)
        ranks = f"{source}[{source}] -> {target}[{target}]"
        if kind.startswith("NET/"):
            lines.append(_line(hosts[source], source, f"Channel {channel:02d}/0 : {ranks} [send]", kind))
            known.setdefault(source, hosts[source])
            if ends == "both":
                lines.append(_line(hosts[target], target, f"Channel {channel:02d}/0 : {ranks} [receive]", kind))
                known.setdefault(target, hosts[target])
        else:  # shm.cc prints no connection index
            head = f"Channel {channel:02d}{'' if kind.startswith('SHM') else '/0'} : {ranks}"
            lines.append(_line(hosts[source], source, head, kind))
            known.setdefault(source, hosts[source])
    for a, b, kind, _ in links:
        source, target = a % len(hosts), b % len(hosts)
        if kind in NET_PATHS and (source not in known or target not in known or known[source] != known[target]):
            network.add(NET_PATHS[kind])
    log = nccl_log.parse("\n".join(lines))
    assert sum(log.transports().values()) == len(links)  # NET's two ends counted once
    problem = nccl_log.mnnvl_problem(log)
    assert (problem is None) == (not network and bool(links)), problem
    if network:
        assert problem is not None and problem.startswith("NCCL did not use multi-node NVLink: ")
        assert f"ran over {', '.join(sorted(network))}, not P2P/MNNVL (first: rank " in problem
    elif not links:
        assert problem is not None and problem.startswith("NCCL did not confirm multi-node NVLink: ")
