"""Topology: the node's NUMA map (GPU -> NUMA node -> CPUs, NICs -> NUMA node) as NVML and sysfs see it,
against the layout the `topology` section of the SKU's baseline expects. The map itself is read on every SKU,
`cpu` included, and written to the JSON report."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from pytest_gbvalidate.expect import Expect, Measured
from pytest_gbvalidate.node.topology import Nic, NumaMap, format_cpulist
from pytest_gbvalidate.probes import Expected, Gpu, NodeGpus
from pytest_gbvalidate.reference_tools import perftest, runner
from pytest_gbvalidate.target import ReferenceTools, Target

pytestmark = pytest.mark.gb_level("passive")  # reads the node, measures nothing

IB_WRITE_METRIC = "ib_write_bandwidth_gbps"
IB_WRITE_BYTES, IB_WRITE_ITERATIONS = 2**20, 5000  # large messages, a few seconds per port


def test_numa_nodes_hold_every_cpu(numa_map: NumaMap) -> None:
    """Every online CPU is on exactly one NUMA node. Nodes without CPUs are allowed: Grace systems expose each
    GPU's memory as one."""
    assert any(n.cpus for n in numa_map.nodes.values()), f"no NUMA node has CPUs: {numa_map.as_dict()['nodes']}"
    unplaced = numa_map.unplaced_cpus()
    assert not unplaced, f"online CPUs {format_cpulist(unplaced)} are on no NUMA node"
    twice = numa_map.cpus_in_several_nodes()
    assert not twice, f"CPUs {format_cpulist(twice)} are on more than one NUMA node"


def test_gpu_placement_nvml_agrees_with_sysfs(gpu: Gpu, numa_map: NumaMap) -> None:
    placement = numa_map.gpus[gpu.info.index]
    if not placement.compared and placement.in_sysfs:
        pytest.skip(f"{gpu}: neither NVML nor sysfs place this GPU on a NUMA node or CPUs")
    problems = placement.disagreements()
    assert not problems, f"{gpu}: {'; '.join(problems)}"


def test_gpu_numa_node(gpu: Gpu, numa_map: NumaMap, gb_expected: Expected) -> None:
    layout = gb_expected.require("topology.gpu_numa_nodes")
    node = numa_map.cpu_node(gpu.info.index)
    assert node == layout[gpu.index], (
        f"{gpu} is on NUMA node {node}, the {gpu.gpus.target.sku} layout puts it on {layout[gpu.index]}"
    )


@pytest.mark.gb_gpu
def test_gpus_per_numa_node(gpus: NodeGpus, numa_map: NumaMap, gb_expected: Expected) -> None:
    per_node = gb_expected.require("topology.gpus_per_numa_node")
    nodes = {g.index: numa_map.cpu_node(g.index) for g in gpus.devices}
    unplaced = [f"gpu{i}" for i, node in nodes.items() if node is None]
    assert not unplaced, f"{', '.join(unplaced)}: on no NUMA node with CPUs"
    counts = dict(sorted(Counter(nodes.values()).items()))
    assert all(n == per_node for n in counts.values()), (
        f"GPUs per NUMA node: {counts}, the {gpus.target.sku} layout has {per_node} on each"
    )


def test_gpu_has_a_nic_on_its_numa_node(gpu: Gpu, numa_map: NumaMap, gb_expected: Expected) -> None:
    if not gb_expected.require("topology.nic_on_gpu_numa_node"):
        pytest.skip(f"the {gpu.gpus.target.sku} baseline does not expect a NIC on each GPU's NUMA node")
    node = numa_map.cpu_node(gpu.info.index)
    assert node is not None, f"{gpu}: on no NUMA node with CPUs"
    nics = numa_map.nics_on(node)
    elsewhere = ", ".join(f"{n.name} on {n.numa_node}" for n in numa_map.nics) or "none"
    assert nics, f"{gpu} is on NUMA node {node}, which has no NIC (NICs: {elsewhere})"


def test_infiniband_ports_active(numa_map: NumaMap, gb_expected: Expected, gb_target: Target) -> None:
    rate_gbps = gb_expected.get("topology.ib_rate_gbps")
    ports = [(nic, port) for nic in numa_map.nics for port in nic.ports if port.link_layer == "InfiniBand"]
    if not ports:
        assert rate_gbps is None, (
            f"no InfiniBand port on this node; the {gb_target.sku} baseline expects {rate_gbps} Gb/s ports"
        )
        pytest.skip("no InfiniBand port on this node, and the baseline expects none")
    bad = [
        f"{nic.name} port {port.port}: {port.state} at {port.rate_gbps} Gb/s"
        for nic, port in ports
        if port.state != "ACTIVE" or (rate_gbps is not None and port.rate_gbps != rate_gbps)
    ]
    want = "ACTIVE" + (f" at {rate_gbps:g} Gb/s" if rate_gbps is not None else "")
    assert not bad, f"InfiniBand ports not {want}: {'; '.join(bad)}"


@pytest.mark.gb_level("standard")
def test_infiniband_write_bandwidth(
    numa_map: NumaMap, gb_target: Target, gb_expect: Expect, gb_reference_tools: ReferenceTools, tmp_path: Path
) -> None:
    """RDMA write bandwidth of every active InfiniBand port, measured by perftest's ib_write_bw in loopback (a
    server and a client on this host) when it is on PATH, gated per port (`mlx5_0:1`). With the metric's
    `params.use_cuda`, GPU memory through GPUDirect RDMA: the GPU on the HCA's NUMA node. The client's figure, from
    its JSON file where this perftest writes one (6.19 on), its table otherwise."""
    binary = runner.find(perftest.IB_WRITE_BW)
    if binary is None:
        pytest.skip(f"{perftest.IB_WRITE_BW} (perftest) is not on PATH")
    ports = [(n, p) for n in numa_map.nics for p in n.ports if p.link_layer == "InfiniBand" and p.state == "ACTIVE"]
    if not ports:
        pytest.skip("no active InfiniBand port on this node")
    params = gb_target.params(IB_WRITE_METRIC)
    size, iterations = int(params.get("size_bytes", IB_WRITE_BYTES)), int(params.get("iterations", IB_WRITE_ITERATIONS))
    timeout_s = gb_reference_tools.timeout_s
    as_json = perftest.perftest_writes_json(binary, env={}, timeout_s=timeout_s)
    measured, problems = [], []
    for nic, port in ports:
        cuda = _gpu_near(numa_map, nic) if params.get("use_cuda") else None
        server = perftest.ib_write_bw_command(
            binary, nic.name, port.port, size_bytes=size, iterations=iterations, cuda_device=cuda
        )
        json_file = tmp_path / f"{nic.name}-{port.port}.json"
        client = [*server, *(perftest.ib_write_bw_json_options(json_file) if as_json else []), "localhost"]
        try:
            text = perftest.run_loopback(server, client, env={}, timeout_s=timeout_s)
            if as_json:
                value = perftest.parse_ib_write_bw_json(runner.read_json_file(binary, json_file))
            else:
                value = perftest.parse_ib_write_bw(text)
        except runner.ToolError as exc:
            problems.append(f"{nic.name} port {port.port}: {exc}")
            continue
        details = {"tool": "perftest ib_write_bw", "size_bytes": size, "cuda_device": cuda, "rate_gbps": port.rate_gbps}
        details["read_from"] = "json" if as_json else "text"
        measured.append(Measured(IB_WRITE_METRIC, value, f"{nic.name}:{port.port}", details))
    gb_expect.each(measured, problems)


def _gpu_near(numa_map: NumaMap, nic: Nic) -> int | None:
    return next((i for i in sorted(numa_map.gpus) if numa_map.cpu_node(i) == nic.numa_node), None)
