"""Unit tests of the NUMA map (pytest_gbvalidate/node/topology.py) on fake sysfs trees, and of the Xid reader
(pytest_gbvalidate/node/xid.py) on fake kernel logs. The map of this machine is read for real too."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pytest_gbvalidate.node import topology, xid
from pytest_gbvalidate.node.nvml import Clocks, GpuInfo
from pytest_gbvalidate.node.topology import format_cpulist, parse_cpulist, read_numa_map, sysfs_pci_address
from tests.helpers.fakenode import FakeHca, FakeNode, nd_gb200_v6, xid_line
from tests.helpers.fakenvml import FakeGpu


def gpu_info(fake: FakeGpu, index: int) -> GpuInfo:
    """What nvml.read_inventory would say of `fake` (only the fields the map uses matter)."""
    return GpuInfo(
        index=index,
        uuid=fake.uuid,
        name=fake.name,
        pci_bus_id=fake.pci_bus_id,
        serial=None,
        memory_total_bytes=0,
        driver_version="",
        cuda_driver_version="",
        vbios_version=None,
        ecc_mode=None,
        persistence_mode=None,
        compute_mode=None,
        power_limit_w=None,
        clocks=Clocks(*[None] * 8),
        pcie=None,
        nvlinks={},
        c2c_enabled=None,
        fabric_state=None,
        fabric_status=None,
        fabric_degraded_bandwidth=None,
        mig_mode=None,
        numa_nodes=tuple(fake.numa_nodes),
        cpu_affinity=tuple(fake.cpus),
        memory_numa_node=fake.memory_numa_node,
    )


def numa_map_of(node: FakeNode, tmp_path: Path) -> topology.NumaMap:
    node.write_sysfs(tmp_path)
    return read_numa_map(tmp_path, [gpu_info(g, i) for i, g in enumerate(node.gpus)])


@pytest.mark.parametrize(
    ("text", "cpus"), [("0-3,8,10-11\n", (0, 1, 2, 3, 8, 10, 11)), ("5", (5,)), ("", ()), ("\n", ())]
)
def test_cpulists_in_the_kernel_format(text: str, cpus: tuple[int, ...]) -> None:
    assert parse_cpulist(text) == cpus
    assert parse_cpulist(format_cpulist(cpus)) == cpus


def test_nvml_bus_ids_name_sysfs_devices() -> None:
    assert sysfs_pci_address("00000008:1B:00.0") == "0008:1b:00.0"
    assert sysfs_pci_address("00010000:01:00.1") == "10000:01:00.1"  # domains past 0xffff (VMD) keep their digits


def test_a_grace_node_keeps_its_memory_only_numa_nodes(tmp_path: Path) -> None:
    m = numa_map_of(nd_gb200_v6(), tmp_path)
    assert {n: bool(v.cpus) for n, v in m.nodes.items()} == {0: True, 1: True, 2: False, 3: False, 4: False, 5: False}
    assert [m.cpu_node(i) for i in range(4)] == [0, 0, 1, 1]
    assert [g.memory_numa_node for g in m.gpus.values()] == [2, 3, 4, 5]
    assert all(g.compared and not g.disagreements() for g in m.gpus.values())
    assert [n.name for n in m.nics_on(1)] == ["mlx5_2", "mlx5_3"]
    assert m.nics[0].ports == (topology.IbPort(1, "ACTIVE", 400.0, "InfiniBand"),)
    assert m.unplaced_cpus() == [] and m.cpus_in_several_nodes() == []
    assert m.as_dict()["nodes"]["3"] == {"cpus": "", "has_cpus": False}


def test_a_gpu_whose_pci_device_names_its_memory_node_is_placed_by_nvml(tmp_path: Path) -> None:
    node = nd_gb200_v6()
    node.write_sysfs(tmp_path)
    device = tmp_path / "bus/pci/devices" / sysfs_pci_address(node.gpus[1].pci_bus_id)
    (device / "numa_node").write_text("3\n")  # the GPU's own, CPU-less node
    m = read_numa_map(tmp_path, [gpu_info(g, i) for i, g in enumerate(node.gpus)])
    assert m.cpu_node(1) == 0 and m.gpus[1].disagreements() == []


def test_disagreements_between_nvml_and_sysfs_are_spelled_out(tmp_path: Path) -> None:
    node = nd_gb200_v6()
    node.write_sysfs(tmp_path)
    infos = [gpu_info(g, i) for i, g in enumerate(node.gpus)]
    infos[2] = dataclasses.replace(infos[2], numa_nodes=(0,), cpu_affinity=tuple(range(8)))
    infos[3] = dataclasses.replace(infos[3], pci_bus_id="0000AAAA:01:00.0")
    m = read_numa_map(tmp_path, infos)
    assert m.gpus[2].disagreements() == [
        "NUMA node: NVML says 0, sysfs numa_node says 1",
        "CPUs: NVML affinity says 0-7, sysfs local_cpulist says 72-143",
    ]
    assert m.gpus[3].disagreements() == ["no PCI device aaaa:01:00.0 in sysfs"]


def test_unknown_numa_nodes_and_missing_files(tmp_path: Path) -> None:
    node = FakeNode({0: "0-3", 1: "4-7"}, [FakeGpu(numa_nodes=[1], cpus=[4, 5, 6, 7])])
    node.hcas = [FakeHca("mlx5_0", "0000:05:00.0", 1, state="1: DOWN", rate="", link_layer="Ethernet")]
    node.write_sysfs(tmp_path)
    device = tmp_path / "bus/pci/devices" / sysfs_pci_address(node.gpus[0].pci_bus_id)
    (device / "numa_node").write_text("-1\n")  # firmware gave no node
    (device / "local_cpulist").unlink()
    m = read_numa_map(tmp_path, [gpu_info(node.gpus[0], 0)])
    g = m.gpus[0]
    assert (g.sysfs_numa_node, g.sysfs_cpus, g.compared) == (None, None, False)
    assert m.cpu_node(0) == 1  # NVML's single node with CPUs
    assert m.nics[0].ports == (topology.IbPort(1, "DOWN", None, "Ethernet"),)
    assert [n.name for n in m.nics] == ["mlx5_0"]  # lo has no device behind it


def test_a_kernel_without_numa_has_one_node_with_every_cpu(tmp_path: Path) -> None:
    (tmp_path / "devices/system/cpu").mkdir(parents=True)
    (tmp_path / "devices/system/cpu/online").write_text("0-5\n")
    m = read_numa_map(tmp_path, [])
    assert m.nodes == {0: topology.NumaNode(0, (0, 1, 2, 3, 4, 5))} and m.unplaced_cpus() == []


def test_cpus_outside_or_in_two_nodes_are_found(tmp_path: Path) -> None:
    FakeNode({0: "0-3", 1: "3-5"}, []).write_sysfs(tmp_path)
    (tmp_path / "devices/system/cpu/online").write_text("0-7\n")
    m = read_numa_map(tmp_path, [])
    assert (m.unplaced_cpus(), m.cpus_in_several_nodes()) == ([6, 7], [3])


def test_this_machine_has_a_numa_map() -> None:
    m = read_numa_map(topology.SYSFS_ROOT, [])
    assert m.online_cpus and m.unplaced_cpus() == [] and m.cpus_in_several_nodes() == []


# --- Xid events ------------------------------------------------------------------------------------------


def test_xid_events_from_dev_kmsg_records(tmp_path: Path) -> None:
    gpu = FakeGpu(pci_bus_id="00000008:01:00.0")
    log = tmp_path / "kmsg"
    log.write_text(
        "6,1,100,-;Linux version 6.8.0\n"
        f"4,2,200,-;{xid_line(gpu, 79, 'GPU has fallen off the bus.')}\n"
        " SUBSYSTEM=pci\n"  # a continuation line of the record above
        "4,3,300,c;NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, An uncorrectable double bit error"
    )
    events = xid.xid_events(xid.read_kernel_log(log))
    assert [(e.pci, e.xid) for e in events] == [((8, 1, 0), 79), ((0, 0x3B, 0), 48)]
    assert events[0].text.startswith("NVRM: Xid (PCI:0008:01:00): 79, ") and xid.pci_of(gpu.pci_bus_id) == (8, 1, 0)


def test_plain_syslog_lines_are_read_too() -> None:
    line = "Nov 21 10:00:00 node kernel: [ 12.3] NVRM: Xid (PCI:0000:b7:00): 94, pid=7, Contained ECC error."
    assert [(e.pci, e.xid) for e in xid.xid_events([line, "no xid here"])] == [((0, 0xB7, 0), 94)]


def test_an_unreadable_kernel_log_raises(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        xid.read_kernel_log(tmp_path / "missing")


def test_this_machine_kernel_log_reads() -> None:
    try:
        lines = xid.read_kernel_log(xid.KERNEL_LOG)
    except OSError as exc:
        pytest.skip(f"no readable kernel log on this machine: {exc}")
    assert lines  # /dev/kmsg ends a non-blocking read with EAGAIN, not EOF: the reader must stop there
