"""The node's NUMA map: which NUMA node and CPUs each GPU and each NIC is close to, read from sysfs (the kernel's
view: /sys/devices/system/node, /sys/bus/pci/devices, /sys/class/infiniband, /sys/class/net) and joined with NVML's
view of each GPU (nvml.GpuInfo), so the two can be cross-checked. NUMA nodes without CPUs are kept: Grace systems
expose each GPU's memory as one. Every reader takes the sysfs root (the tests' fake tree). No pytest, no NVML calls."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_gbvalidate.node.nvml import GpuInfo

SYSFS_ROOT = Path("/sys")


def parse_cpulist(text: str) -> tuple[int, ...]:
    """The kernel's list format, '0-3,8,10-11', as CPU numbers."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        try:
            cpus.extend(range(int(first), int(last or first) + 1))
        except ValueError:
            raise ValueError(f"not a CPU list: {text.strip()!r}") from None
    return tuple(cpus)


def format_cpulist(cpus: Iterable[int]) -> str:
    ranges: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def sysfs_pci_address(bus_id: str) -> str:
    """NVML writes '00000000:1B:00.0'; sysfs names the same device '0000:1b:00.0'."""
    domain, rest = bus_id.strip().lower().split(":", 1)
    return f"{int(domain, 16):04x}:{rest}"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _node_id(text: str | None) -> int | None:
    """sysfs says -1 where the firmware gave a device no NUMA node."""
    if text is None or not re.fullmatch(r"-?\d+", text):
        return None
    node = int(text)
    return None if node < 0 else node


@dataclass(frozen=True)
class NumaNode:
    node: int
    cpus: tuple[int, ...]  # empty for a memory-only node (a Grace system's GPU memory)


def numa_nodes(sysfs: Path) -> dict[int, NumaNode]:
    """Every NUMA node. A kernel built without NUMA has no node directory: then one node holds every CPU."""
    nodes = {}
    for path in (sysfs / "devices/system/node").glob("node[0-9]*"):
        node = int(path.name[4:])
        nodes[node] = NumaNode(node, parse_cpulist(_read(path / "cpulist") or ""))
    if not nodes:
        nodes[0] = NumaNode(0, online_cpus(sysfs))
    return dict(sorted(nodes.items()))


def online_cpus(sysfs: Path) -> tuple[int, ...]:
    return parse_cpulist(_read(sysfs / "devices/system/cpu/online") or "")


@dataclass(frozen=True)
class GpuPlacement:
    """One GPU as NVML places it and as sysfs places its PCI device."""

    index: int
    pci_bus_id: str
    in_sysfs: bool
    sysfs_numa_node: int | None
    sysfs_cpus: tuple[int, ...] | None
    nvml_numa_nodes: tuple[int, ...] | None
    nvml_cpus: tuple[int, ...] | None
    memory_numa_node: int | None  # the GPU's own memory as a CPU-less NUMA node (Grace systems)

    def disagreements(self) -> list[str]:
        """Where NVML and sysfs disagree about this GPU; empty when they agree."""
        if not self.in_sysfs:
            return [f"no PCI device {sysfs_pci_address(self.pci_bus_id)} in sysfs"]
        found = []
        if self.sysfs_numa_node is not None and self.nvml_numa_nodes is not None:
            nvml_side = set(self.nvml_numa_nodes) | {self.memory_numa_node}
            if self.sysfs_numa_node not in nvml_side:
                found.append(
                    f"NUMA node: NVML says {_nodes(self.nvml_numa_nodes)}, sysfs numa_node says {self.sysfs_numa_node}"
                )
        if self.sysfs_cpus is not None and self.nvml_cpus is not None and set(self.sysfs_cpus) != set(self.nvml_cpus):
            found.append(
                f"CPUs: NVML affinity says {format_cpulist(self.nvml_cpus) or 'none'}, "
                f"sysfs local_cpulist says {format_cpulist(self.sysfs_cpus) or 'none'}"
            )
        return found

    @property
    def compared(self) -> bool:
        """Whether NVML and sysfs both said something to compare."""
        return (self.sysfs_numa_node is not None and self.nvml_numa_nodes is not None) or (
            self.sysfs_cpus is not None and self.nvml_cpus is not None
        )


def _nodes(nodes: Iterable[int]) -> str:
    return ",".join(map(str, nodes)) or "none"


@dataclass(frozen=True)
class IbPort:
    port: int
    state: str  # ACTIVE, DOWN, INIT, ARMED, ...
    rate_gbps: float | None
    link_layer: str  # InfiniBand or Ethernet (RoCE)


@dataclass(frozen=True)
class Nic:
    name: str  # mlx5_0, eth1, ...
    kind: str  # "infiniband" (an HCA in /sys/class/infiniband) or "net" (an interface in /sys/class/net)
    device: str  # the bus address of the device behind it
    numa_node: int | None
    ports: tuple[IbPort, ...]


def nics(sysfs: Path) -> list[Nic]:
    """HCAs and network interfaces backed by a device (virtual interfaces such as lo and bridges have none)."""
    found = []
    for kind, directory in (("infiniband", "class/infiniband"), ("net", "class/net")):
        for path in sorted((sysfs / directory).glob("*")):
            device = path / "device"
            if not device.exists():
                continue
            ports = tuple(_ib_port(p) for p in sorted((path / "ports").glob("*"), key=_port_number))
            found.append(Nic(path.name, kind, device.resolve().name, _node_id(_read(device / "numa_node")), ports))
    return found


def _port_number(path: Path) -> int:
    return int(path.name) if path.name.isdigit() else 0


def _ib_port(path: Path) -> IbPort:
    state = (_read(path / "state") or "?").split(":")[-1].strip()  # "4: ACTIVE"
    rate = re.match(r"\s*(\d+(?:\.\d+)?)\s*Gb/sec", _read(path / "rate") or "")  # "400 Gb/sec (4X NDR)"
    return IbPort(_port_number(path), state, float(rate.group(1)) if rate else None, _read(path / "link_layer") or "")


@dataclass(frozen=True)
class NumaMap:
    nodes: dict[int, NumaNode]
    online_cpus: tuple[int, ...]
    gpus: dict[int, GpuPlacement]
    nics: tuple[Nic, ...]

    def cpu_node(self, gpu_index: int) -> int | None:
        """The NUMA node with CPUs the GPU is attached to: sysfs's, else the single one among NVML's; None: unsaid."""
        gpu = self.gpus[gpu_index]
        if gpu.sysfs_numa_node is not None and self._has_cpus(gpu.sysfs_numa_node):
            return gpu.sysfs_numa_node
        with_cpus = [n for n in gpu.nvml_numa_nodes or () if self._has_cpus(n)]
        return with_cpus[0] if len(with_cpus) == 1 else None

    def _has_cpus(self, node: int) -> bool:
        return node in self.nodes and bool(self.nodes[node].cpus)

    def nics_on(self, node: int) -> list[Nic]:
        return [n for n in self.nics if n.numa_node == node]

    def unplaced_cpus(self) -> list[int]:
        """Online CPUs that no NUMA node lists."""
        placed = {cpu for n in self.nodes.values() for cpu in n.cpus}
        return [cpu for cpu in self.online_cpus if cpu not in placed]

    def cpus_in_several_nodes(self) -> list[int]:
        listed = Counter(cpu for n in self.nodes.values() for cpu in set(n.cpus))
        return sorted(cpu for cpu, nodes in listed.items() if nodes > 1)

    def as_dict(self) -> dict[str, Any]:
        """For the JSON report: CPU sets in the kernel's list format, as `numactl -H` shows them."""
        return {
            "nodes": {
                str(n.node): {"cpus": format_cpulist(n.cpus), "has_cpus": bool(n.cpus)} for n in self.nodes.values()
            },
            "online_cpus": format_cpulist(self.online_cpus),
            "gpus": [
                {
                    "index": g.index,
                    "pci_bus_id": g.pci_bus_id,
                    "numa_node": self.cpu_node(g.index),
                    "sysfs_numa_node": g.sysfs_numa_node,
                    "sysfs_cpus": None if g.sysfs_cpus is None else format_cpulist(g.sysfs_cpus),
                    "nvml_numa_nodes": None if g.nvml_numa_nodes is None else list(g.nvml_numa_nodes),
                    "nvml_cpus": None if g.nvml_cpus is None else format_cpulist(g.nvml_cpus),
                    "memory_numa_node": g.memory_numa_node,
                }
                for g in self.gpus.values()
            ],
            "nics": [{**vars(n), "ports": [vars(p) for p in n.ports]} for n in self.nics],
        }


def read_numa_map(sysfs: Path, gpus: Iterable[GpuInfo]) -> NumaMap:
    """The map of this node from sysfs under `sysfs`, with the GPUs NVML listed placed on it."""
    placements = {}
    for gpu in gpus:
        device = sysfs / "bus/pci/devices" / sysfs_pci_address(gpu.pci_bus_id)
        local_cpus = _read(device / "local_cpulist")
        placements[gpu.index] = GpuPlacement(
            index=gpu.index,
            pci_bus_id=gpu.pci_bus_id,
            in_sysfs=device.is_dir(),
            sysfs_numa_node=_node_id(_read(device / "numa_node")),
            sysfs_cpus=None if local_cpus is None else parse_cpulist(local_cpus),
            nvml_numa_nodes=gpu.numa_nodes,
            nvml_cpus=gpu.cpu_affinity,
            memory_numa_node=gpu.memory_numa_node,
        )
    return NumaMap(numa_nodes(sysfs), online_cpus(sysfs), placements, tuple(nics(sysfs)))
