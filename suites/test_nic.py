"""The node's RDMA NICs (node/nic.py): each card's PCIe link, its InfiniBand ports' error counters as rates since
the node's window, ports active alike on every card of a kind, GPUDirect RDMA's module, and ACS on the PCIe
bridges of a bare-metal node. Every check reads sysfs only. On a SKU without GPUs, and on a host without RDMA
devices, they skip saying so; a value the kernel itself cannot tell (a virtual function's link, a missing counter)
is skipped naming its file, never judged."""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import pytest

from pytest_gbvalidate.hooks import GbValidateWarning
from pytest_gbvalidate.node import nic, topology, window
from pytest_gbvalidate.node.window import Window
from pytest_gbvalidate.probes import Expected
from pytest_gbvalidate.target import Target

pytestmark = pytest.mark.gb_level("passive")  # reads the node, measures nothing

IB_WRITE_METRIC = "ib_write_bandwidth_gbps"  # its params.use_cuda says the SKU uses GPUDirect RDMA


def _sysfs(gb_target: Target) -> Path:
    """The sysfs root of a node with RDMA devices; skips on a SKU without GPUs or a host without them."""
    if not gb_target.is_gpu:
        pytest.skip(f"the {gb_target.sku} SKU has no GPUs, so no RDMA NICs to judge")
    sysfs = topology.SYSFS_ROOT
    if not nic.rdma_devices(sysfs):
        pytest.skip(f"no RDMA device in {sysfs / 'class/infiniband'} on this host")
    return sysfs


def _degraded(request: pytest.FixtureRequest, lines: list[str]) -> None:
    """Passes the test with a WARN: a JUnit property, and a GbValidateWarning at the test (which
    `-W error::pytest_gbvalidate.expect.GbValidateWarning` turns into a failure)."""
    if not lines:
        return
    request.node.user_properties.append(("gb_degraded", "; ".join(lines)))
    path, line, _ = request.node.location
    warnings.warn_explicit(GbValidateWarning("; ".join(lines)), GbValidateWarning, path, (line or 0) + 1)


def test_nic_pcie_link(gb_target: Target, gb_expected: Expected) -> None:
    """Every RDMA NIC's PCIe link is at its own maximum (the kernel's mlx5_core "limited by" finding) and, where
    the baseline gives one, at least the SKU's link (`health.nic_pcie`). A link the kernel cannot read or name (a
    virtual function's) is skipped naming its file."""
    sysfs = _sysfs(gb_target)
    expected = nic.expected_link(gb_expected.get("health.nic_pcie"))
    findings = [f for card in nic.nic_links(sysfs) for f in nic.judge_link(card, expected, gb_target.sku)]
    failed = [f.message for f in findings if f.verdict in ("below_max", "below_expected", "bad")]
    unknown = [f.message for f in findings if f.verdict == "unknown"]
    assert not failed, "NIC PCIe links: " + "; ".join(failed + unknown)
    if unknown:
        pytest.skip("NIC PCIe link not readable: " + "; ".join(unknown))
    if expected is None:
        pytest.skip(
            f"every NIC at its own maximum link; the {gb_target.sku} baseline has no health.nic_pcie expectation"
        )


def test_infiniband_error_counters(gb_target: Target, gb_window: Window, request: pytest.FixtureRequest) -> None:
    """Each InfiniBand port's error counters since the node's window (its mark from the last clean check this boot):
    any increase of link_downed, excessive_buffer_overrun_errors, local_link_integrity_errors or rnr_nak_retry_err
    fails, symbol errors above 120 an hour fail, link_error_recovery above 5 a minute warns (NVSentinel). With no
    mark this boot a rate counter is judged since boot, and a fail-on-any counter's window opens at this reading
    (JUnit property `gb_window_opened`): a rise months old would fail every check until a reboot. The marks move on
    after every clean check; a failed check leaves them, so its second run sees the same rise."""
    sysfs = _sysfs(gb_target)
    now_s = time.time()
    uptime = window.uptime_s()
    failed: list[str] = []
    degraded: list[str] = []
    unread: list[str] = []
    first: list[str] = []  # counters read for the first time this boot: the window opens at them
    marks: dict[str, int] = {}
    judged = 0
    for card in nic.card_ports(sysfs):
        for port in card.ports:
            if port.link_layer != "InfiniBand":
                continue
            counters = nic.read_port_counters(sysfs, card.name, port.port)
            unread += [r.problem for r in counters.unread]
            failed += [r.problem for r in counters.unread if r.state == "bad"]
            for counter, value in counters.values.items():
                name = nic.mark_name(card.name, port.port, counter)
                mark = gb_window.read(name)
                if mark is not None:
                    since = nic.Since(mark.value, mark.time_s, True)
                elif counter in nic.FATAL_ON_ANY:
                    # No mark this boot (the first check, or the first since an upgrade): what rose before it may be
                    # months old (a switch rebooted), and would fail every check until a reboot. The window opens
                    # here: this reading is the mark the next check counts a rise from.
                    first.append(f"{name} {value}")
                    marks[name] = value
                    continue
                elif uptime is not None:
                    since = nic.Since(0, now_s - uptime, False)
                else:
                    unread.append(f"{name}: no mark this boot and {window.UPTIME} unreadable: not judged")
                    marks[name] = value
                    continue
                finding = nic.judge_change(nic.change(card.name, port.port, counter, value, since, now_s))
                judged += 1
                marks[name] = value
                if finding is not None:
                    (failed if finding.severity == "fail" else degraded).append(finding.message)
    if first:
        request.node.user_properties.append(("gb_window_opened", "; ".join(first)))
    assert not failed, "InfiniBand error counters: " + "; ".join(failed + degraded)
    # A clean check moves the marks; a failed one leaves them, so its re-run (confirm before drain) sees the same
    # rise, and it fails until a clean run or a reboot.
    problem = gb_window.write(marks, now_s) if marks else None
    if problem is not None:  # our own failure, not the node's: said, never a warning a -W error turns into a fault
        request.node.user_properties.append(("gb_window_problem", problem))
    _degraded(request, degraded)
    if not judged and not first:
        why = "; ".join(unread) or "no InfiniBand port keeps error counters"
        pytest.skip(f"no InfiniBand error counter judged: {why}")
    if unread:
        request.node.user_properties.append(("gb_not_read", "; ".join(unread)))


def test_nic_active_ports_match_peers(gb_target: Target) -> None:
    """No RDMA card has fewer ACTIVE ports than its peers of the same kind (link layer and maximum rate): a card
    with a port down among cards with all theirs up. No per-SKU table: the node's own cards are the reference."""
    sysfs = _sysfs(gb_target)
    cards = nic.card_ports(sysfs)
    short = nic.fewer_active_ports(cards)
    assert not short, "NIC ports: " + "; ".join(short)


def test_gpudirect_rdma_module(gb_target: Target, gb_expected: Expected) -> None:
    """Where the SKU uses GPUDirect RDMA (`health.gpudirect_rdma`, or the GPU memory its InfiniBand write check
    uses: `ib_write_bandwidth_gbps` params `use_cuda`), the nvidia_peermem module is loaded: without it the NICs
    cannot reach GPU memory and NCCL falls back to staging through host memory."""
    sysfs = _sysfs(gb_target)
    wanted = gb_expected.get("health.gpudirect_rdma")
    source = "health.gpudirect_rdma"
    if wanted is None and gb_target.params(IB_WRITE_METRIC).get("use_cuda"):
        wanted, source = True, f"{IB_WRITE_METRIC} params use_cuda"
    if not wanted:
        pytest.skip(f"the {gb_target.sku} baseline does not expect GPUDirect RDMA (health.gpudirect_rdma)")
    module = sysfs / "module" / nic.PEERMEM_MODULE
    if not nic.peermem_loaded(sysfs) and nic.open_kernel_modules():
        pytest.skip(f"{nic.PEERMEM_MODULE} not loaded; the open kernel module serves GPUDirect RDMA through DMA-BUF")
    assert nic.peermem_loaded(sysfs), (
        f"{nic.PEERMEM_MODULE} is not loaded ({module} missing) though the {gb_target.sku} baseline expects "
        f"GPUDirect RDMA ({source}): modprobe {nic.PEERMEM_MODULE} (and load it at boot)"
    )


def test_pcie_acs_redirect_off(gb_target: Target) -> None:
    """On bare metal, no PCIe bridge redirects peer-to-peer requests or completions to the root complex (ACS
    ReqRedir+ / CmpltRedir+), which sends GPU-to-GPU and GPU-to-NIC traffic through the CPU (gpud components/pci).
    Under a hypervisor ACS is the host's to set (and needed for passthrough): skipped."""
    sysfs = _sysfs(gb_target)
    virtual = nic.hypervisor(sysfs)
    if virtual is not None:
        pytest.skip(f"this node is {virtual}: ACS is the hypervisor's to set")
    scan = nic.scan_acs(sysfs)
    on = [f"{b.address}: {'+ '.join(b.redirect)}+" for b in scan.redirecting()]
    assert not on, (
        "ACS redirects peer-to-peer traffic to the root complex on PCIe bridges: " + "; ".join(on) + " (the kernel "
        "sets it where the IOMMU is on: boot without it, or disable ACS in the BIOS or with setpci at boot, as "
        "NCCL's troubleshooting guide says)"
    )
    if not scan.bridges:
        pytest.skip(f"no PCIe bridge in {sysfs / 'bus/pci/devices'}")
    if scan.unread():
        pytest.skip("PCIe bridges' ACS not readable: " + "; ".join(b.problem for b in scan.unread()[:3]))
