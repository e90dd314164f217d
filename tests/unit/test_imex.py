"""Unit tests of the IMEX reader (pytest_gbvalidate/node/imex.py): channel devices in a directory, the daemon's
state through a command runner. The directory is real (tmp_path); the runner is a function standing in for
nvidia-imex-ctl, which this host does not have."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from pytest_gbvalidate.node import imex


def test_channels_are_the_character_devices_named_channel_n(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "README").write_text("not a channel")
    for n in (2, 0):
        try:
            os.mknod(tmp_path / f"channel{n}", stat.S_IFCHR | 0o600, os.makedev(235, n))
        except PermissionError:  # no device nodes here: regular files stand in, as the fake node does
            (tmp_path / f"channel{n}").touch()
            monkeypatch.setattr(imex, "CHANNEL_FILE_TYPE", stat.S_IFREG)
    assert imex.read_channels(tmp_path) == imex.Channels((0, 2), None)


def test_a_channel_that_is_no_device_or_a_missing_directory_is_a_problem(tmp_path: Path) -> None:
    (tmp_path / "channel0").mkdir()
    assert imex.read_channels(tmp_path) == imex.Channels((), f"channel0 in {tmp_path} not a character device")
    missing = tmp_path / "nvidia-caps-imex-channels"
    assert imex.read_channels(missing) == imex.Channels((), f"{missing} does not exist: no IMEX channel was created")


def answers(status: int, out: str, err: str = "", flags: Sequence[str] = ("-q",)) -> imex.Runner:
    def run(command: Sequence[str], timeout_s: float) -> tuple[int, str, str]:
        assert list(command) == ["nvidia-imex-ctl", *flags] and timeout_s == imex.QUERY_TIMEOUT_S
        return status, out, err

    return run


def raises(exc: BaseException) -> imex.Runner:
    def run(command: Sequence[str], timeout_s: float) -> tuple[int, str, str]:
        raise exc

    return run


@pytest.mark.parametrize(
    ("run", "expected"),
    [
        (answers(0, "READY\n"), imex.Daemon("READY", None)),
        (
            answers(0, "WAITING_FOR_PEERS\n"),
            imex.Daemon("WAITING_FOR_PEERS", "the IMEX daemon is 'WAITING_FOR_PEERS', not READY"),
        ),
        (
            answers(0, "bogus\n"),
            imex.Daemon("bogus", "the IMEX daemon is 'bogus' (not a state nvidia-imex-ctl reports), not READY"),
        ),
        (
            answers(1, "", "connect failed: Connection refused\n"),
            imex.Daemon(None, "`nvidia-imex-ctl -q` exited 1: connect failed: Connection refused"),
        ),
        (answers(0, ""), imex.Daemon(None, "`nvidia-imex-ctl -q` exited 0: nothing")),
        (
            raises(FileNotFoundError(2, "No such file or directory")),
            imex.Daemon(
                None, "cannot run nvidia-imex-ctl: No such file or directory (is the nvidia-imex package installed?)"
            ),
        ),
        (
            raises(subprocess.TimeoutExpired(["nvidia-imex-ctl", "-q"], 10)),
            imex.Daemon(None, "`nvidia-imex-ctl -q` did not answer in 10 s"),
        ),
    ],
    ids=["ready", "waiting", "unknown-state", "refused", "silent", "not-installed", "hung"],
)
def test_the_daemon_state_or_why_there_is_none(run: imex.Runner, expected: imex.Daemon) -> None:
    assert imex.daemon_state(run) == expected


def test_the_real_runner_runs_the_command_with_its_timeout(tmp_path: Path) -> None:
    assert imex.run_command(["sh", "-c", "echo READY; echo oops >&2; exit 3"], 5) == (3, "READY\n", "oops\n")
    with pytest.raises(subprocess.TimeoutExpired):
        imex.run_command(["sleep", "5"], 0.1)


DOMAIN = ("-N", "-j", "-H")


# `nvidia-imex-ctl -N -j -H` of a domain of three nodes, in the shape NVIDIA's IMEX prints it.
def domain_json(states: Sequence[str], links: Sequence[str], domain: str = "UP") -> str:
    """Node i: state states[i], host 10.0.0.{i+1}, hostname node-{i}; node 0's connections: links[i] to node i."""
    hosts = [f"10.0.0.{i + 1}" for i in range(len(states))]

    def connections(i: int) -> dict[str, object]:
        return {str(j): {"host": h, "status": links[j] if i == 0 else "CONNECTED"} for j, h in enumerate(hosts)}

    nodes = {
        str(i): {"status": s, "host": hosts[i], "hostName": f"node-{i}", "connections": connections(i)}
        for i, s in enumerate(states)
    }
    return json.dumps({"nodes": nodes, "timestamp": "11/27/2026 10:00:00.000", "status": domain})


def judged(text: str, own: set[str] | None = None) -> imex.DomainVerdict:
    return imex.judge_domain(imex.domain_state(answers(0, text, flags=DOMAIN)), own or {"node-0", "10.0.0.1"})


def test_a_domain_up_with_this_node_ready_and_connected_is_fine() -> None:
    domain = imex.domain_state(answers(0, domain_json(["READY"] * 3, ["CONNECTED"] * 3), flags=DOMAIN))
    assert (domain.status, len(domain.nodes), domain.problem) == ("UP", 3, None)
    assert domain.nodes[1] == imex.DomainNode("1", "10.0.0.2", "node-1", "READY", dict.fromkeys("012", "CONNECTED"))
    assert judged(domain_json(["READY"] * 3, ["CONNECTED"] * 3)) == imex.DomainVerdict(None, None)
    # found by an address where the output has no hostname (without -H)
    assert judged(domain_json(["READY"] * 3, ["CONNECTED"] * 3), {"10.0.0.1"}).problem is None


def test_another_node_down_or_one_link_down_is_said_and_never_this_node_s_fault() -> None:
    peer_down = judged(domain_json(["READY", "UNAVAILABLE", "READY"], ["CONNECTED", "", "CONNECTED"], "DEGRADED"))
    assert peer_down == imex.DomainVerdict(None, "the IMEX domain is DEGRADED: node-1 UNAVAILABLE")
    one_link = judged(domain_json(["READY"] * 3, ["CONNECTED", "DISCONNECTED", "CONNECTED"]))
    assert one_link == imex.DomainVerdict(None, "the IMEX domain is UP: no connection to node-1 (DISCONNECTED)")


def test_this_node_not_ready_or_cut_off_is_its_own_problem() -> None:
    down = judged(domain_json(["WAITING_FOR_PEERS", "READY", "READY"], ["CONNECTED"] * 3, "DEGRADED"))
    assert down.problem == "this node's daemon is 'WAITING_FOR_PEERS' in its IMEX domain, not READY"
    cut = judged(domain_json(["READY"] * 3, ["CONNECTED", "DISCONNECTED", "DISCONNECTED"], "DEGRADED"))
    assert cut.problem == (
        "this node reaches none of the 2 other READY nodes of its IMEX domain (node-1 DISCONNECTED, "
        "node-2 DISCONNECTED)"
    )
    assert cut.others == "the IMEX domain is DEGRADED"
    # not found by its names (a container's are not the host's): its place is not judged, and it says so
    elsewhere = judged(domain_json(["READY"] * 3, ["CONNECTED"] * 3), {"gpu-07", "10.1.0.7"})
    assert elsewhere == imex.DomainVerdict(
        None,
        "the IMEX domain is UP; this node was not found among its 3 nodes (node-0, node-1, node-2) by its "
        "hostname or addresses (10.1.0.7, gpu-07): its place in it not judged",
    )


def test_a_node_cut_off_from_its_whole_domain_is_cut_off() -> None:
    """READY itself, reaching no peer, which it therefore sees UNAVAILABLE, the domain DOWN: it passed (no other
    node was READY to be unreachable), and so did each of its peers, seeing the same: nobody was named."""
    alone = judged(domain_json(["READY", "UNAVAILABLE", "UNAVAILABLE"], ["CONNECTED", "", ""], "DOWN"))
    assert alone.problem == (
        "this node reaches none of the 2 other nodes of its IMEX domain (node-1 UNAVAILABLE, not connected; "
        "node-2 UNAVAILABLE, not connected)"
    )
    # a peer down while another answers: the domain's state, not this node's
    one_down = judged(domain_json(["READY", "UNAVAILABLE", "READY"], ["CONNECTED", "", "CONNECTED"], "DEGRADED"))
    assert one_down.problem is None


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            "Failed to read node configuration file",
            "`nvidia-imex-ctl -N -j -H` printed no JSON (Expecting value: line 1 column 1 (char 0))",
        ),
        ("[]", "`nvidia-imex-ctl -N -j -H` printed no domain `status` and `nodes`"),
        (
            '{"status": "UP", "nodes": {"0": {"status": 5}}}',
            "`nvidia-imex-ctl -N -j -H`: node '0' has no `host` and `status`",
        ),
        (
            "[" * 100_000 + "]" * 100_000,
            "`nvidia-imex-ctl -N -j -H` printed no JSON (nested too deeply to read)",
        ),
    ],
    ids=["not-json", "no-domain", "bad-node", "too-deep"],
)
def test_an_answer_that_is_not_the_domain_s_json_is_no_answer_saying_why(text: str, problem: str) -> None:
    assert imex.domain_state(answers(0, text, flags=DOMAIN)) == imex.Domain(None, (), problem)
    assert judged(text) == imex.DomainVerdict(problem, None)
    refused = imex.domain_state(answers(1, "", "connect failed: Connection refused\n", flags=DOMAIN))
    assert refused.problem == "`nvidia-imex-ctl -N -j -H` exited 1: connect failed: Connection refused"
    hung = imex.domain_state(raises(subprocess.TimeoutExpired(["nvidia-imex-ctl"], 10)))
    assert hung.problem == "`nvidia-imex-ctl -N -j -H` did not answer in 10 s"
