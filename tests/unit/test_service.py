"""pytest_gbvalidate/service.py: the names and texts a line that drains, cordons, taints or labels a node may hold."""

from __future__ import annotations

import pytest

from pytest_gbvalidate.service import (
    kubernetes_node_name,
    label_value_problem,
    qualified_name_problem,
    reason_text,
    slurm_node_name,
)

# What Slurm reads as several nodes, or a terminal as a command: none of these may reach a drain line.
NOT_ONE_NODE = [
    "ALL",
    "all",
    "n1,n2",
    "node[01-99]",
    "n1 n2",
    "",
    "-n1",
    "n1-",
    "evil\n\x1b[2J",
    "n\u043ede-1",
    "a" * 64,
    # ipaddress takes anything after an IPv6 address's `%` as its scope id: here a hostlist of 128 other nodes
    "fe80::1%n1,gpu[001-128]",
    "fe80::1%eth0",
    "fe80::1%25eth0",
    "10.0.0.1,10.0.0.2",
]


def test_a_slurm_node_name_is_the_short_hostname_or_an_address() -> None:
    assert slurm_node_name("ndv6-0007.internal.cloudapp.net") == "ndv6-0007"
    assert slurm_node_name("node-01") == "node-01"
    assert slurm_node_name("GPU-01") == "GPU-01"
    assert slurm_node_name("10.1.0.7") == "10.1.0.7"
    assert slurm_node_name("fd00::7") == "fd00::7"


@pytest.mark.parametrize("hostname", NOT_ONE_NODE)
def test_no_slurm_node_name_for_what_is_not_one_node(hostname: str) -> None:
    assert slurm_node_name(hostname) is None


@pytest.mark.parametrize(
    "hostname", ["gpu-017.cluster.local", "10.1.0.7", "fd00::7", "::ffff:10.1.0.7", "FD00:0:0::7", *NOT_ONE_NODE]
)
def test_no_accepted_name_holds_what_slurm_reads_as_several_nodes(hostname: str) -> None:
    name = slurm_node_name(hostname)
    assert name is None or not any(c in name for c in ",[]% \t\n"), name


def test_a_kubernetes_node_name_is_the_hostname_lowercased_as_the_kubelet_registers_it() -> None:
    assert kubernetes_node_name("GPU-017.Cluster.Local") == "gpu-017.cluster.local"
    assert kubernetes_node_name("node-01") == "node-01"
    assert kubernetes_node_name("10.1.0.7") == "10.1.0.7"
    assert kubernetes_node_name("a" * 63 + ".b") == "a" * 63 + ".b"


@pytest.mark.parametrize(
    "hostname", ["n1,n2", "node[01-99]", "n1 n2", "", "-n1", "n1-", "n1..x", "n_1", "evil\n\x1b[2J", "n\u043ede-1"]
)
def test_no_kubernetes_node_name_for_what_is_no_dns_subdomain(hostname: str) -> None:
    assert kubernetes_node_name(hostname) is None


def test_kubernetes_names_are_bounded() -> None:
    assert kubernetes_node_name(".".join(["a" * 63] * 4)) is None  # 255 characters
    assert kubernetes_node_name("a" * 253) == "a" * 253  # apimachinery bounds the whole name, not each label
    assert kubernetes_node_name("a" * 254) is None


@pytest.mark.parametrize("value", ["gpu_hardware", "link", "A.b-c_9", "", "x" * 63])
def test_label_values_apimachinery_accepts(value: str) -> None:
    assert label_value_problem(value) is None


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("x" * 64, "longer than 63"),
        ("_gpu", "alphanumeric at both ends"),
        ("gpu-", "alphanumeric at both ends"),
        ("gpu hardware", "alphanumeric at both ends"),
        ("gpu/hw", "alphanumeric at both ends"),
        ("g\u00e9pu", "alphanumeric at both ends"),
        ("evil\n", "'evil\\\\n'"),
    ],
)
def test_label_values_apimachinery_refuses_say_why(value: str, why: str) -> None:
    problem = label_value_problem(value)
    assert problem is not None and why in problem and "\n" not in problem


def test_qualified_names() -> None:
    assert qualified_name_problem("gbvalidate/fault") is None
    assert qualified_name_problem("example.com/fault") is None
    assert qualified_name_problem("fault") is None
    for bad in ("Example.com/fault", "/fault", "gbvalidate/", "a/b/c", "gbvalidate/-x", "x" * 64):
        assert qualified_name_problem(bad) is not None, bad


def test_a_reason_is_one_bounded_line_without_quotes() -> None:
    text = reason_text('gbvalidate: link: test_ib_ports[mlx5_0]\n"it\'s" `bad`\\ \x1b[2J', 120)
    assert text == "gbvalidate: link: test_ib_ports[mlx5_0] its bad x1b[2J"
    long = reason_text("gbvalidate: " + "x" * 500, 120)
    assert len(long) == 120 and long.endswith("...")
    assert reason_text("caf\u00e9", 120) == "cafxe9"  # printable ASCII only
