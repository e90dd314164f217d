"""The node's RDMA NICs as sysfs shows them: each card's PCIe link, its InfiniBand error counters, its ports, the
GPUDirect RDMA module and the PCIe bridges' ACS. No pytest. Every value read is untrusted: a file missing or that the
kernel calls unknown is *unknown* (a check skips it, naming the file), a value in no format the kernel writes is *bad*
(one line naming the file and the value); nothing raises. Every reader takes the sysfs root (the tests' fake tree).

Sources: a card below its own maximum is the kernel's mlx5_core "limited by ... x8" finding imbue-ai/cluster-health
fails on; the counters and limits are NVSentinel's NIC health monitor's (link counter detection: FATAL_ON_ANY, and
symbol errors above 120 an hour, per the IBTA's 10^-12 bit error rate; link_error_recovery above 5 a minute is
degraded); ACS on PCIe bridges is gpud's components/pci."""

from __future__ import annotations

import re
import struct
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from pytest_gbvalidate.node import topology
from pytest_gbvalidate.node.topology import IbPort
from pytest_gbvalidate.node.window import MIN_RATE_SPAN_S

PROC_CPUINFO = Path("/proc/cpuinfo")
NVIDIA_VERSION = Path("/proc/driver/nvidia/version")
PEERMEM_MODULE = "nvidia_peermem"
# The kernel's link speeds (drivers/pci/pci.h, PCIE_SPEED2STR) and the generation each is.
GENERATIONS: dict[float, int] = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}
_SPEED = re.compile(r"(\d+(?:\.\d+)?) GT/s(?: PCIe)?")  # "32.0 GT/s PCIe"; before Linux 4.19 "8 GT/s"
_UNKNOWN_SPEEDS = {"unknown", "unknown speed"}  # what pci_speed_string says for a speed it cannot name
AZURE_VM = ("Microsoft Corporation", "Virtual Machine")  # DMI sys_vendor, product_name of a Hyper-V guest
PCI_BRIDGE_CLASS = 0x0604
ACS_CAPABILITY = 0x000D  # PCIe extended capability id of Access Control Services
# The ACS Control bits that send peer-to-peer traffic up to the root complex (PCIe base spec 7.7.11.3):
# P2P Request Redirect and P2P Completion Redirect (bits 2 and 3), what lspci shows as ReqRedir+ CmpltRedir+.
ACS_REDIRECT_BITS = {2: "ReqRedir", 3: "CmpltRedir"}
LinkVerdict = Literal["ok", "below_max", "below_expected", "unknown", "bad"]
Severity = Literal["fail", "warn"]
CounterName = Literal[
    "link_downed",
    "excessive_buffer_overrun_errors",
    "local_link_integrity_errors",
    "rnr_nak_retry_err",
    "symbol_error",
    "link_error_recovery",
]
COUNTERS: tuple[CounterName, ...] = get_args(CounterName)
# Any increase fails (NVSentinel: fatal).
FATAL_ON_ANY: frozenset[CounterName] = frozenset(
    {"link_downed", "excessive_buffer_overrun_errors", "local_link_integrity_errors", "rnr_nak_retry_err"}
)
HW_COUNTERS: frozenset[CounterName] = frozenset({"rnr_nak_retry_err"})  # under hw_counters/, where the driver has it


@dataclass(frozen=True)
class Reading:
    """One value read from a file: `ok` with its text, `unknown` or `bad` (see above); `problem` names the file."""

    state: Literal["ok", "unknown", "bad"]
    text: str = ""
    problem: str = ""


def read_text(path: Path) -> Reading:
    try:
        text = path.read_text(encoding="ascii", errors="replace").strip()
    except FileNotFoundError:
        return Reading("unknown", problem=f"{path}: no such file")
    except OSError as exc:
        return Reading("unknown", problem=f"{path}: cannot be read ({exc.strerror or exc})")
    return Reading("ok", text)


def _shown(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:40] + "...")


@dataclass(frozen=True, order=True)
class PcieLink:
    gen: int
    width: int

    def __str__(self) -> str:
        return f"Gen{self.gen} x{self.width}"

    def below(self, other: PcieLink) -> bool:
        """Slower or narrower than `other` in either."""
        return self.gen < other.gen or self.width < other.width


def parse_speed(path: Path, text: str) -> Reading | int:
    """A link speed file's text as its PCIe generation, or why not (the Reading names the file)."""
    if text.strip().lower() in _UNKNOWN_SPEEDS:
        return Reading("unknown", text, f"{path}: {_shown(text)} (the kernel cannot name the link speed)")
    found = _SPEED.fullmatch(text.strip())
    gen = GENERATIONS.get(float(found.group(1))) if found else None
    if gen is None:
        return Reading("bad", text, f"{path}: {_shown(text)} is not a PCIe link speed (e.g. '32.0 GT/s PCIe')")
    return gen


def parse_width(path: Path, text: str) -> Reading | int:
    """A link width file's text as lanes, or why not. Width 0: no lanes (a virtual function's empty link status)."""
    if (found := re.fullmatch(r"x?(\d{1,2})", text.strip())) is None:
        return Reading("bad", text, f"{path}: {_shown(text)} is not a PCIe link width (e.g. '16')")
    width = int(found.group(1))
    if width == 0:
        return Reading("unknown", text, f"{path}: '0' (the device reports no lanes)")
    return width


def read_link(device: Path, which: Literal["current", "max"]) -> PcieLink | Reading:
    """The PCI device's current or max link (`{which}_link_speed`, `{which}_link_width`), or the first bad Reading."""
    values: list[int] = []
    for name, parse in ((f"{which}_link_speed", parse_speed), (f"{which}_link_width", parse_width)):
        path = device / name
        read = read_text(path)
        if read.state != "ok":
            return read
        value = parse(path, read.text)
        if isinstance(value, Reading):
            return value
        values.append(value)
    return PcieLink(values[0], values[1])


@dataclass(frozen=True)
class NicLink:
    """An RDMA device's PCIe link: the card as /sys/class/infiniband names it and its PCI address."""

    name: str  # mlx5_0
    pci: str  # 0000:01:00.0
    current: PcieLink | Reading
    maximum: PcieLink | Reading
    # The port above the card (its sysfs parent): a Gen5 card in a Gen4 slot trains at Gen4 by design, which the
    # kernel's "limited by" finding does not name either. A Reading where there is none (the card's maximum stands).
    upstream: PcieLink | Reading = Reading("unknown")

    def best(self) -> PcieLink | None:
        """The best link the card and the port above it allow together: the lower of each field."""
        if not isinstance(self.maximum, PcieLink):
            return None
        if not isinstance(self.upstream, PcieLink):
            return self.maximum
        return PcieLink(min(self.maximum.gen, self.upstream.gen), min(self.maximum.width, self.upstream.width))

    @property
    def label(self) -> str:
        return f"{self.name} ({self.pci})"

    def unread(self) -> list[Reading]:
        return [r for r in (self.current, self.maximum) if isinstance(r, Reading)]


def rdma_devices(sysfs: Path) -> list[Path]:
    """Every /sys/class/infiniband/<dev> backed by a device, in name order."""
    try:
        found = sorted((sysfs / "class/infiniband").iterdir())
    except OSError:
        return []
    return [d for d in found if (d / "device").exists()]


def nic_links(sysfs: Path) -> list[NicLink]:
    links = []
    for dev in rdma_devices(sysfs):
        device = dev / "device"
        current, maximum = read_link(device, "current"), read_link(device, "max")
        try:  # the PCI address the link points at, and the port above it
            pci, upstream = device.resolve().name, read_link(device.resolve().parent, "max")
        except OSError:
            pci, upstream = device.name, Reading("unknown")
        links.append(NicLink(dev.name, pci, current, maximum, upstream))
    return links


@dataclass(frozen=True)
class LinkFinding:
    nic: NicLink
    verdict: LinkVerdict
    message: str


def judge_link(nic: NicLink, expected: PcieLink | None, sku: str = "the SKU") -> list[LinkFinding]:
    """What is wrong with a card's link: below its own maximum or the SKU's expected link, or a value bad or unknown."""
    findings: list[LinkFinding] = []
    for read in nic.unread():
        verdict: LinkVerdict = "bad" if read.state == "bad" else "unknown"
        findings.append(LinkFinding(nic, verdict, f"{nic.label}: {read.problem}"))
    current, best = nic.current, nic.best()
    if isinstance(current, PcieLink) and best is not None and current.below(best):
        supports = "the card supports" if best == nic.maximum else f"the card ({nic.maximum}) in its slot allows"
        message = f"{nic.label}: PCIe link trained at {current}, {supports} {best}"
        findings.append(LinkFinding(nic, "below_max", message))
    if expected is not None and isinstance(current, PcieLink) and current.below(expected):
        message = f"{nic.label}: PCIe link at {current}, the {sku} baseline expects {expected}"
        findings.append(LinkFinding(nic, "below_expected", message))
    return findings


@dataclass(frozen=True)
class RateLimit:
    counter: CounterName
    per_s: float  # the most a healthy port shows, per second
    per: str  # how people say it: "120 per hour"
    severity: Severity


RATE_LIMITS: dict[CounterName, RateLimit] = {
    "symbol_error": RateLimit("symbol_error", 120 / 3600, "120 per hour", "fail"),
    "link_error_recovery": RateLimit("link_error_recovery", 5 / 60, "5 per minute", "warn"),
}


@dataclass(frozen=True)
class PortCounters:
    nic: str
    port: int
    values: dict[CounterName, int]
    unread: tuple[Reading, ...] = ()  # bad or unknown files among those the driver keeps


def read_port_counters(sysfs: Path, nic: str, port: int) -> PortCounters:
    """The error counters of one port: one the driver does not keep (no file) left out, one unread in `unread`."""
    values: dict[CounterName, int] = {}
    unread: list[Reading] = []
    for counter in COUNTERS:
        path = sysfs / "class/infiniband" / nic / "ports" / str(port)
        path = path / ("hw_counters" if counter in HW_COUNTERS else "counters") / counter
        if not path.exists():
            continue
        read = read_text(path)
        if read.state != "ok":
            unread.append(read)
        elif re.fullmatch(r"\d{1,20}", read.text):
            values[counter] = int(read.text)
        else:
            unread.append(Reading("bad", read.text, f"{path}: {_shown(read.text)} is not a count"))
    return PortCounters(nic, port, values, tuple(unread))


def counter_marks(sysfs: Path) -> dict[str, int]:
    """Every InfiniBand port's error counters now, by their marks' names: where a repair opens their window."""
    return {
        mark_name(card.name, port.port, counter): value
        for card in card_ports(sysfs)
        for port in card.ports
        if port.link_layer == "InfiniBand"
        for counter, value in read_port_counters(sysfs, card.name, port.port).values.items()
    }


def mark_name(nic: str, port: int, counter: CounterName) -> str:
    """The counter's mark in the node's window (node/window.py)."""
    return f"ib/{nic}/{port}/{counter}"


@dataclass(frozen=True)
class Since:
    """Where a counter's increase is counted from: its mark in the node's window, or boot (no mark)."""

    value: int
    time_s: float
    from_mark: bool


@dataclass(frozen=True)
class CounterChange:
    nic: str
    port: int
    counter: CounterName
    now: int
    increase: int
    seconds: float
    since: Literal["mark", "boot", "reset"]  # reset: the counter went down since the mark (cleared or reloaded)

    @property
    def rate_per_s(self) -> float:
        if self.seconds <= 0:
            return float("inf") if self.increase else 0.0
        return self.increase / self.seconds

    def where(self) -> str:
        return f"{self.nic} port {self.port}"

    def span(self) -> str:
        """Over what the increase was counted, as people say it."""
        over = _duration(self.seconds)
        return {
            "mark": f"in {over} since the last clean check",
            "boot": f"since boot ({over}; no earlier check this boot)",
            "reset": f"since the counter was cleared (at most {over})",
        }[self.since]


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def change(nic: str, port: int, counter: CounterName, now: int, since: Since, now_s: float) -> CounterChange:
    """The increase of a counter since `since`, over window.MIN_RATE_SPAN_S at least. One below its mark was cleared
    (perfquery -R, a driver reload): its whole value counts, since the mark (NVSentinel's reset rule)."""
    seconds = max(now_s - since.time_s, MIN_RATE_SPAN_S)
    if not since.from_mark:
        return CounterChange(nic, port, counter, now, now, seconds, "boot")
    if now < since.value:
        return CounterChange(nic, port, counter, now, now, seconds, "reset")
    return CounterChange(nic, port, counter, now, now - since.value, seconds, "mark")


@dataclass(frozen=True)
class CounterFinding:
    change: CounterChange
    severity: Severity
    message: str


def judge_change(c: CounterChange) -> CounterFinding | None:
    """A counter's increase against its rule (FATAL_ON_ANY, RATE_LIMITS); None when healthy."""
    if c.increase <= 0:
        return None
    if c.counter in FATAL_ON_ANY:
        return CounterFinding(c, "fail", f"{c.where()}: {c.counter} rose by {c.increase} {c.span()}")
    limit = RATE_LIMITS.get(c.counter)
    if limit is None or c.rate_per_s <= limit.per_s:
        return None
    rate = _rate(c.rate_per_s, limit.per)
    word = "over" if limit.severity == "fail" else "degraded: over"
    message = f"{c.where()}: {c.counter} rose by {c.increase} {c.span()}, {rate} ({word} {limit.per})"
    return CounterFinding(c, limit.severity, message)


def _rate(per_s: float, unit: str) -> str:
    if per_s == float("inf"):
        return "at once"
    if "minute" in unit:
        return f"{per_s * 60:.3g} per minute"
    return f"{per_s * 3600:.3g} per hour"


@dataclass(frozen=True)
class CardPorts:
    name: str
    pci: str
    virtual_function: bool  # a VF on a host with SR-IOV (device/physfn): unassigned VFs are often down
    ports: tuple[IbPort, ...]  # as the NUMA map reads them (topology.py)

    @property
    def label(self) -> str:
        return f"{self.name} ({self.pci})"

    def kind(self) -> str:
        """What makes cards peers: their ports' link layer and number. Not their rate: a port down reports a low one
        (10 Gb/s), which would put its card in a kind of its own, judged by nobody."""
        return f"{'+'.join(sorted({p.link_layer for p in self.ports})) or '?'} {len(self.ports)}-port"

    def active(self) -> int:
        return sum(1 for p in self.ports if p.state == "ACTIVE")


def card_ports(sysfs: Path) -> list[CardPorts]:
    """Each RDMA card's ports, read as the NUMA map reads them."""
    return [
        CardPorts(n.name, n.device, (sysfs / "class/infiniband" / n.name / "device/physfn").exists(), n.ports)
        for n in topology.nics(sysfs)
        if n.kind == "infiniband"
    ]


def fewer_active_ports(cards: Iterable[CardPorts]) -> list[str]:
    """Cards with fewer ACTIVE ports than most of their peers (of their kind; a host's virtual functions apart), each
    named with what its peers have. A kind with a single card, or a tie for the most common count, names none."""
    groups: dict[tuple[bool, str], list[CardPorts]] = {}
    for card in cards:
        groups.setdefault((card.virtual_function, card.kind()), []).append(card)
    found = []
    for (vf, layer), peers in groups.items():
        if len(peers) < 2:
            continue
        counts = Counter(c.active() for c in peers).most_common()
        if len(counts) > 1 and counts[0][1] == counts[1][1]:
            continue
        usual = counts[0][0]
        kind = f"{layer}{' VF' if vf else ''}"
        for card in peers:
            if card.active() < usual:
                down = ", ".join(f"port {p.port} {p.state}" for p in card.ports if p.state != "ACTIVE")
                found.append(
                    f"{card.label}: {card.active()} active port(s), its {len(peers) - 1} {kind} peers have "
                    f"{usual}" + (f" ({down})" if down else "")
                )
    return found


def peermem_loaded(sysfs: Path) -> bool:
    """Whether the nvidia_peermem module is loaded (/sys/module/nvidia_peermem): NVIDIA's GPUDirect RDMA peer
    memory client, without which the NIC cannot reach GPU memory through the proprietary kernel module."""
    return (sysfs / "module" / PEERMEM_MODULE).is_dir()


def open_kernel_modules() -> bool:
    """Whether the NVIDIA driver loaded is its open kernel module (/proc/driver/nvidia/version says so): then the
    NIC reaches GPU memory through the kernel's DMA-BUF (NCCL uses it on its own, Linux 5.12 on), peermem or not."""
    return "Open Kernel Module" in read_text(NVIDIA_VERSION).text


def hypervisor(sysfs: Path) -> str | None:
    """Why this node looks virtual (an Azure VM by its DMI table, a CPU's `hypervisor` flag), or None on bare metal."""
    dmi = sysfs / "class/dmi/id"
    vendor, product = read_text(dmi / "sys_vendor").text, read_text(dmi / "product_name").text
    if (vendor, product) == AZURE_VM:
        return f"a {vendor} {product} ({dmi}/sys_vendor, product_name)"
    for line in read_text(PROC_CPUINFO).text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "flags" and "hypervisor" in value.split():
            return f"a CPU under a hypervisor ({PROC_CPUINFO}: flag hypervisor)"
    return None


@dataclass(frozen=True)
class BridgeAcs:
    address: str
    redirect: tuple[str, ...] = ()  # the redirect bits set
    problem: str = ""  # why its ACS could not be read (config space short: not root)


@dataclass(frozen=True)
class AcsScan:
    bridges: list[BridgeAcs] = field(default_factory=list)

    def redirecting(self) -> list[BridgeAcs]:
        return [b for b in self.bridges if b.redirect]

    def unread(self) -> list[BridgeAcs]:
        return [b for b in self.bridges if b.problem]


def acs_control(config: bytes) -> int | None:
    """The ACS Control register from a device's PCI config space, or None where it has no ACS capability (or too
    little was read: only root reads past the first 64 bytes)."""
    offset, seen = 0x100, set()
    while 0x100 <= offset <= len(config) - 8 and offset not in seen:
        seen.add(offset)
        (header,) = struct.unpack_from("<I", config, offset)
        if header in (0, 0xFFFFFFFF):
            return None
        if header & 0xFFFF == ACS_CAPABILITY:
            (control,) = struct.unpack_from("<H", config, offset + 6)
            return int(control)
        offset = (header >> 20) & 0xFFC
    return None


def scan_acs(sysfs: Path) -> AcsScan:
    """Every PCI bridge's ACS redirect bits, from its config space (/sys/bus/pci/devices/<bdf>/config)."""
    scan = AcsScan()
    try:
        devices = sorted((sysfs / "bus/pci/devices").iterdir())
    except OSError:
        return scan
    for device in devices:
        klass = read_text(device / "class")
        try:
            if klass.state != "ok" or int(klass.text, 16) >> 8 != PCI_BRIDGE_CLASS:
                continue
        except ValueError:
            continue
        try:
            config = (device / "config").read_bytes()
        except OSError as exc:
            scan.bridges.append(BridgeAcs(device.name, problem=f"{device}/config: {exc.strerror or exc}"))
            continue
        if len(config) <= 0x100:
            problem = f"{device}/config: only {len(config)} bytes readable (the extended space needs root)"
            scan.bridges.append(BridgeAcs(device.name, problem=problem))
            continue
        control = acs_control(config)
        bits = () if control is None else tuple(n for b, n in ACS_REDIRECT_BITS.items() if control >> b & 1)
        scan.bridges.append(BridgeAcs(device.name, bits))
    return scan


def expected_link(value: Mapping[str, int] | None) -> PcieLink | None:
    """The baseline's `health.nic_pcie` ({gen, width}) as a link."""
    return PcieLink(int(value["gen"]), int(value["width"])) if value else None
