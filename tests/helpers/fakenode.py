"""Fake nodes for the probe and suite tests: GPUs behind the fake NVML (fakenvml.py), a sysfs tree with the
NUMA nodes, PCI devices and HCAs, and a kernel log, all consistent with each other. `install` puts one under
tmp_path and points NVML, the topology reader, the Xid reader and SKU detection at it. Test-only.

The two descriptions follow the layouts the SKUs publish (ND96asr_v4: GPUs 0,1 on NUMA 1; 2,3 on 0; 4,5 on 3;
6,7 on 2. ND GB200 v6: GPUs 0,1 on Grace 0, GPUs 2,3 on Grace 1, each GPU's memory a CPU-less NUMA node); the
rest (bus ids, CPU numbering, HCAs) is made up to be plausible.
"""

from __future__ import annotations

import os
import shlex
import stat
from dataclasses import dataclass, field
from pathlib import Path

import pynvml
import pytest
import torch

from pytest_gbvalidate import sku
from pytest_gbvalidate.node import imex, nccl_stack, nic, topology, window, xid
from pytest_gbvalidate.node.topology import format_cpulist, parse_cpulist, sysfs_pci_address
from tests.helpers.fakenvml import FakeGpu, FakeNvmlLib, clocks_mhz, install

NVIDIA_3D_CONTROLLER = "0x030200"  # the PCI class sysfs shows for a data-centre GPU
IMEX_MAJOR = 235  # made up: the kernel hands nvidia-caps-imex-channels a dynamic major (/proc/devices)
GB200_CLUSTER_UUID = "1e6c5a7d-2b3f-4c8e-9a01-5d2f7b9c4e60"  # made up: the rack's NVLink domain


@dataclass
class FakeHca:
    name: str
    pci: str  # sysfs address
    numa_node: int
    state: str = "4: ACTIVE"
    rate: str = "400 Gb/sec (4X NDR)"
    link_layer: str = "InfiniBand"
    # The card's PCIe link as its PCI device's sysfs files read (node/nic.py): (speed, width), now and at most.
    current_link: tuple[str, str] = ("32.0 GT/s PCIe", "16")
    max_link: tuple[str, str] = ("32.0 GT/s PCIe", "16")
    # Port 1's error counters (ports/1/counters/, and hw_counters/ for rnr_nak_retry_err): all 0 on a healthy card.
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(nic.COUNTERS, 0))


@dataclass
class FakeNode:
    numa_cpus: dict[int, str]  # NUMA node -> its cpulist, "" for a memory-only node
    gpus: list[FakeGpu]
    hcas: list[FakeHca] = field(default_factory=list)
    kernel_log: list[str] = field(default_factory=list)  # /dev/kmsg's records, 1 ms apart from boot
    uptime_s: float = 3600.0
    # The NCCL stack: the version torch loads, /etc/nccl.conf's text (None: no such file), whether NCCL's net
    # plugin loads (where the baseline names one; the host running the tests has none).
    nccl_version: str = "2.21.5"
    nccl_conf: str | None = None
    net_plugin_loads: bool = True
    # IMEX: the channel devices (None: no channels directory) and what `nvidia-imex-ctl -q` answers: (exit
    # status, what it prints: stdout when 0, else stderr); None: nvidia-imex-ctl is not installed.
    imex_channels: list[int] | None = None
    imex_ctl: tuple[int, str] | None = None
    # What `nvidia-imex-ctl -N -j -H` answers (exit status, what it prints); None: a domain of this node and
    # another, both READY and connected (imex_domain_json).
    imex_domain: tuple[int, str] | None = None
    # The daemon's static configuration (/etc/nvidia-imex/nodes_config.cfg), as a rack set up for IMEX at boot has.
    imex_nodes_config: bool = True
    peermem_loaded: bool = True  # GPUDirect RDMA's module (/sys/module/nvidia_peermem) is loaded

    def nvml(self) -> FakeNvmlLib:
        return FakeNvmlLib(self.gpus)

    def write_sysfs(self, root: Path) -> None:
        nodes = root / "devices/system/node"
        for node, cpus in self.numa_cpus.items():
            _write(nodes / f"node{node}/cpulist", cpus)
        every_cpu = [c for cpus in self.numa_cpus.values() for c in parse_cpulist(cpus)]
        _write(root / "devices/system/cpu/online", format_cpulist(every_cpu))
        write_detection_sysfs(root, [sysfs_pci_address(gpu.pci_bus_id) for gpu in self.gpus])
        for gpu in self.gpus:
            device = root / "bus/pci/devices" / sysfs_pci_address(gpu.pci_bus_id)
            _write(device / "numa_node", str(gpu.numa_nodes[0]))
            _write(device / "local_cpulist", format_cpulist(gpu.cpus))
        for hca in self.hcas:
            device = root / "bus/pci/devices" / hca.pci
            _write(device / "numa_node", str(hca.numa_node))
            ib = root / "class/infiniband" / hca.name
            ib.mkdir(parents=True)
            (ib / "device").symlink_to(device)
            for name in ("state", "rate", "link_layer"):
                _write(ib / "ports/1" / name, getattr(hca, name))
            for which, (speed, width) in (("current", hca.current_link), ("max", hca.max_link)):
                _write(device / f"{which}_link_speed", speed)
                _write(device / f"{which}_link_width", width)
            for counter, value in hca.counters.items():
                group = "hw_counters" if counter in nic.HW_COUNTERS else "counters"
                _write(ib / "ports/1" / group / counter, str(value))
        if self.peermem_loaded:
            (root / "module" / nic.PEERMEM_MODULE).mkdir(parents=True)
        lo = root / "class/net/lo"  # a virtual interface: no device behind it, so no NIC
        lo.mkdir(parents=True)

    def write_kernel_log(self, tmp_path: Path) -> Path:
        """/dev/kmsg's records of `kernel_log` at tmp_path/kmsg (again, after lines were appended: the earlier
        records keep their sequence numbers, as the kernel's do)."""
        log = tmp_path / "kmsg"
        log.write_text("".join(f"6,{i},{i * 1000},-;{line}\n" for i, line in enumerate(self.kernel_log)))
        return log

    def install(self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeNvmlLib:
        """Point NVML, the topology reader, the Xid reader and SKU detection at this node; returns the fake NVML
        library."""
        sysfs = tmp_path / "sys"
        self.write_sysfs(sysfs)
        log = self.write_kernel_log(tmp_path)
        monkeypatch.setattr(topology, "SYSFS_ROOT", sysfs)
        point_detection_at(monkeypatch, sysfs)
        monkeypatch.setattr(xid, "KERNEL_LOG", log)
        uptime = tmp_path / "uptime"  # the log's lines are 1 ms apart from boot; the node has been up an hour
        uptime.write_text(f"{self.uptime_s:.2f} 0.00\n")
        monkeypatch.setattr(window, "UPTIME", uptime)
        cpuinfo = tmp_path / "cpuinfo"  # bare metal: no hypervisor flag
        cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu vme de pse\n")
        monkeypatch.setattr(nic, "PROC_CPUINFO", cpuinfo)
        driver = tmp_path / "nvidia-version"  # the proprietary kernel module, as the fake NVML's driver version
        driver.write_text(f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {self.nvml().driver_version}\n")
        monkeypatch.setattr(nic, "NVIDIA_VERSION", driver)
        conf = tmp_path / "etc-nccl.conf"
        if self.nccl_conf is not None:
            conf.write_text(self.nccl_conf)
        monkeypatch.setattr(nccl_stack, "SYSTEM_CONF", conf)
        monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.nccl.conf
        # The node's tools (perftest, fio, nccl-tests) are the ones a test puts here, not the host's.
        (tmp_path / "node-bin").mkdir(exist_ok=True)
        monkeypatch.setenv("PATH", str(tmp_path / "node-bin"))
        monkeypatch.setattr(nccl_stack, "loaded_version", lambda: (self.nccl_version, "the fake node's torch"))
        loads = self.net_plugin_loads
        monkeypatch.setattr(nccl_stack, "load_problem", lambda lib: None if loads else f"cannot load {lib}: fake")
        self._install_imex(monkeypatch, tmp_path)
        lib = self.nvml()
        install(monkeypatch, lib)
        # torch on this node sees the GPUs NVML lists, as on a working one (node/preconditions.py asks it); ranks
        # a check starts are other processes, which the fake does not reach: they fail to start, as before.
        monkeypatch.setattr(torch.cuda, "device_count", lambda: len(self.gpus))
        return lib

    def _install_imex(self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
        channels = tmp_path / "dev/nvidia-caps-imex-channels"
        monkeypatch.setattr(imex, "CHANNELS_DIR", channels)
        nodes_config = tmp_path / "etc/nvidia-imex/nodes_config.cfg"
        monkeypatch.setattr(imex, "NODES_CONFIG", nodes_config)
        if self.imex_nodes_config:
            nodes_config.parent.mkdir(parents=True)
            nodes_config.write_text("10.0.0.1\n10.0.0.2\n")
        if self.imex_channels is not None:
            channels.mkdir(parents=True)
            for n in self.imex_channels:
                try:  # a real character device where the host lets us make one
                    os.mknod(channels / f"channel{n}", stat.S_IFCHR | 0o600, os.makedev(IMEX_MAJOR, n))
                except PermissionError:
                    (channels / f"channel{n}").touch()
                    monkeypatch.setattr(imex, "CHANNEL_FILE_TYPE", stat.S_IFREG)
        if self.imex_ctl is not None:
            ctl = tmp_path / "node-bin" / imex.CTL
            answers = [(self.imex_ctl, "-q"), (self.imex_domain or (0, imex_domain_json()), "-N")]
            cases = "".join(
                f"  {flag}) printf '%s\\n' {shlex.quote(text)} >&{1 if status == 0 else 2}; exit {status};;\n"
                for (status, text), flag in answers
            )
            ctl.write_text(f'#!/bin/sh\ncase "$1" in\n{cases}esac\necho "unknown option $1" >&2\nexit 2\n')
            ctl.chmod(0o755)


def imex_domain_json(
    domain: str = "UP", states: tuple[str, str] = ("READY", "READY"), links: tuple[str, str] = ("CONNECTED",) * 2
) -> str:
    """What `nvidia-imex-ctl -N -j -H` prints for a domain of this node (index 0, by its hostname) and one
    other, in the shape NVIDIA's IMEX prints it: every node of nodes_config.cfg keyed by index, each with its
    own connections (`links`: this node's to itself and to the other)."""
    import json
    import socket

    def node(host: str, name: str, state: str, connections: tuple[str, str]) -> dict[str, object]:
        hosts = ("10.0.0.1", "10.0.0.2")
        return {
            "status": state,
            "host": host,
            "hostName": name,
            "connections": {
                str(i): {"host": hosts[i], "status": c, "changed": True} for i, c in enumerate(connections)
            },
            "changed": True,
            "version": "570.133.20",
        }

    nodes = {
        "0": node("10.0.0.1", socket.gethostname(), states[0], links),
        "1": node("10.0.0.2", "gb200-peer", states[1], ("CONNECTED", "CONNECTED")),
    }
    return json.dumps({"nodes": nodes, "timestamp": "11/27/2026 10:00:00.000", "status": domain})


def write_detection_sysfs(root: Path, nvidia_gpus: list[str]) -> None:
    """What SKU detection reads from a sysfs tree at `root`: a PCI bus with an NVIDIA GPU at each of the sysfs
    addresses `nvidia_gpus` (none: no NVIDIA device at all), and a DMI table that is not an Azure VM's, so
    detection never asks the instance metadata service."""
    (root / "bus/pci/devices").mkdir(parents=True, exist_ok=True)
    for address in nvidia_gpus:
        device = root / "bus/pci/devices" / address
        _write(device / "vendor", sku.NVIDIA_PCI_VENDOR)
        _write(device / "class", NVIDIA_3D_CONTROLLER)
    _write(root / "class/dmi/id/chassis_asset_tag", "Default string")


def point_detection_at(monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
    """Make `detect_sku` read the PCI bus and DMI table of the sysfs tree at `root`, not the host's."""
    monkeypatch.setattr(sku, "PCI_DEVICES_DIR", root / "bus/pci/devices")
    monkeypatch.setattr(sku, "DMI_DIR", root / "class/dmi/id")


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def xid_line(gpu: FakeGpu, xid: int, text: str) -> str:
    """A kernel log line as the NVIDIA driver writes it for an Xid event on `gpu`."""
    return (
        f"NVRM: Xid (PCI:{sysfs_pci_address(gpu.pci_bus_id).rsplit('.', 1)[0]}): {xid}, pid=4242, name=python, {text}"
    )


def nd_gb200_v6() -> FakeNode:
    """4 GB200 GPUs, 2 per Grace CPU (NUMA 0 and 1, 72 CPUs each); each GPU's memory is NUMA node 2-5."""
    gpus = []
    for i in range(4):
        node = i // 2
        gpus.append(
            FakeGpu(
                name="NVIDIA GB200",
                pci_bus_id=["00000008:01:00.0", "00000009:01:00.0", "00000018:01:00.0", "00000019:01:00.0"][i],
                uuid=f"GPU-6b1a0c2e-0000-4000-8000-00000000000{i}",
                serial=f"165000000000{i}",
                memory_total_bytes=189_471 * 2**20,
                nvlinks=[True] * 18,
                c2c_enabled=True,
                fabric_state=pynvml.NVML_GPU_FABRIC_STATE_COMPLETED,
                fabric_cluster_uuid=GB200_CLUSTER_UUID,
                fabric_clique_id=32766,
                mig_mode=(0, 0),
                numa_nodes=[node],
                cpus=list(range(72 * node, 72 * node + 72)),
                memory_numa_node=2 + i,
            )
        )
    hcas = [FakeHca(f"mlx5_{i}", f"000{i}:01:00.0", i // 2) for i in range(4)]
    log = [
        "Linux version 6.8.0-1020-azure",
        "NVRM: loading NVIDIA UNIX Open Kernel Module for aarch64  570.133.20",
        xid_line(gpus[0], 13, "Graphics Exception: an application fault, not a GPU one"),
    ]
    return FakeNode(
        {0: "0-71", 1: "72-143", 2: "", 3: "", 4: "", 5: ""},
        gpus,
        hcas,
        log,
        imex_channels=[0],
        imex_ctl=(0, imex.READY),
    )


def nd96asr_v4() -> FakeNode:
    """8 A100 40GB GPUs on 4 NUMA nodes of 24 CPUs, placed as the NDv4 documentation says, one HCA per GPU."""
    layout = [1, 1, 0, 0, 3, 3, 2, 2]
    gpus = [
        FakeGpu(
            name="NVIDIA A100-SXM4-40GB",
            pci_bus_id=f"0000000{i + 1:X}:00:00.0",
            uuid=f"GPU-a1000000-0000-4000-8000-00000000000{i}",
            serial=f"132000000000{i}",
            memory_total_bytes=40_960 * 2**20,
            clocks_mhz=clocks_mhz(1410, 1215),
            pcie=(4, 4, 16, 16),
            nvlinks=[True] * 12,
            numa_nodes=[node],
            cpus=list(range(24 * node, 24 * node + 24)),
        )
        for i, node in enumerate(layout)
    ]
    hcas = [
        FakeHca(f"mlx5_ib{i}", f"01{i:02x}:00:00.0", node, rate="200 Gb/sec (4X HDR)") for i, node in enumerate(layout)
    ]
    return FakeNode({n: f"{24 * n}-{24 * n + 23}" for n in range(4)}, gpus, hcas)
