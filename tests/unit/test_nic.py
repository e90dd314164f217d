"""The RDMA NIC readers (node/nic.py) on fake sysfs trees: link parsing (a bad value names its file, an unknown one
is skipped), counters as rates with and without a mark, a counter cleared since its mark, port homogeneity,
nvidia_peermem, the hypervisor test and ACS in a bridge's config space."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from pytest_gbvalidate.node import nic
from pytest_gbvalidate.node.nic import PcieLink, Since


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def _card(
    sysfs: Path,
    name: str,
    pci: str,
    link: tuple[str, str] = ("32.0 GT/s PCIe", "16"),
    most: tuple[str, str] = ("32.0 GT/s PCIe", "16"),
    states: tuple[str, ...] = ("4: ACTIVE",),
    rate: str = "400 Gb/sec (4X NDR)",
    counters: dict[str, str] | None = None,
) -> None:
    device = sysfs / "bus/pci/devices" / pci
    for which, (speed, width) in (("current", link), ("max", most)):
        _write(device / f"{which}_link_speed", speed)
        _write(device / f"{which}_link_width", width)
    ib = sysfs / "class/infiniband" / name
    ib.mkdir(parents=True)
    (ib / "device").symlink_to(device)
    for n, state in enumerate(states, start=1):
        _write(ib / f"ports/{n}/state", state)
        _write(ib / f"ports/{n}/rate", rate)
        _write(ib / f"ports/{n}/link_layer", "InfiniBand")
    for counter, value in (counters or {}).items():
        group = "hw_counters" if counter == "rnr_nak_retry_err" else "counters"
        _write(ib / "ports/1" / group / counter, value)


@pytest.mark.parametrize(
    ("text", "gen"),
    [("32.0 GT/s PCIe", 5), ("16.0 GT/s PCIe", 4), ("8 GT/s", 3), ("2.5 GT/s PCIe", 1), ("64.0 GT/s PCIe", 6)],
)
def test_speeds_read_as_the_kernel_writes_them(text: str, gen: int) -> None:
    assert nic.parse_speed(Path("s"), text) == gen


def test_a_card_trained_below_its_maximum_fails_naming_it_and_both_links(tmp_path: Path) -> None:
    _card(tmp_path, "mlx5_0", "0000:01:00.0")
    _card(tmp_path, "mlx5_1", "0000:02:00.0", link=("32.0 GT/s PCIe", "8"))
    links = nic.nic_links(tmp_path)
    assert [(c.name, c.pci) for c in links] == [("mlx5_0", "0000:01:00.0"), ("mlx5_1", "0000:02:00.0")]
    assert nic.judge_link(links[0], None) == []
    (finding,) = nic.judge_link(links[1], None)
    assert (finding.verdict, finding.message) == (
        "below_max",
        "mlx5_1 (0000:02:00.0): PCIe link trained at Gen5 x8, the card supports Gen5 x16",
    )


def test_a_card_below_the_skus_link_fails_naming_the_baseline(tmp_path: Path) -> None:
    _card(tmp_path, "mlx5_0", "0000:01:00.0", link=("16.0 GT/s PCIe", "16"), most=("16.0 GT/s PCIe", "16"))
    (finding,) = nic.judge_link(nic.nic_links(tmp_path)[0], PcieLink(5, 16), "ND_H100_v5")
    assert finding.message == "mlx5_0 (0000:01:00.0): PCIe link at Gen4 x16, the ND_H100_v5 baseline expects Gen5 x16"


@pytest.mark.parametrize(
    ("speed", "width", "verdict", "said"),
    [
        ("Unknown", "16", "unknown", "current_link_speed: 'Unknown' (the kernel cannot name the link speed)"),
        ("Unknown speed", "16", "unknown", "current_link_speed: 'Unknown speed'"),
        ("32.0 GT/s PCIe", "0", "unknown", "current_link_width: '0' (the device reports no lanes)"),
        ("fast", "16", "bad", "current_link_speed: 'fast' is not a PCIe link speed"),
        ("3.0 GT/s", "16", "bad", "current_link_speed: '3.0 GT/s' is not a PCIe link speed"),
        ("32.0 GT/s PCIe", "sixteen", "bad", "current_link_width: 'sixteen' is not a PCIe link width"),
    ],
)
def test_a_link_value_that_cannot_be_judged_is_one_line_naming_its_file(
    tmp_path: Path, speed: str, width: str, verdict: str, said: str
) -> None:
    _card(tmp_path, "mlx5_0", "0000:01:00.0", link=(speed, width))
    (finding,) = nic.judge_link(nic.nic_links(tmp_path)[0], PcieLink(5, 16))
    assert finding.verdict == verdict
    assert f"{tmp_path}/class/infiniband/mlx5_0/device/{said}" in finding.message
    assert "\n" not in finding.message


def test_a_missing_link_file_is_unknown(tmp_path: Path) -> None:
    _card(tmp_path, "mlx5_0", "0000:01:00.0")
    (tmp_path / "bus/pci/devices/0000:01:00.0/max_link_width").unlink()
    (finding,) = nic.judge_link(nic.nic_links(tmp_path)[0], None)
    assert finding.verdict == "unknown" and finding.message.endswith("max_link_width: no such file")


def test_counters_are_read_and_a_bad_one_names_its_file(tmp_path: Path) -> None:
    _card(tmp_path, "mlx5_0", "0000:01:00.0", counters={"link_downed": "2", "symbol_error": "N/A"})
    read = nic.read_port_counters(tmp_path, "mlx5_0", 1)
    assert read.values == {"link_downed": 2}
    (bad,) = read.unread
    assert bad.state == "bad" and bad.problem.endswith("ports/1/counters/symbol_error: 'N/A' is not a count")


def test_a_fatal_counter_fails_on_any_increase_since_its_mark() -> None:
    c = nic.change("mlx5_0", 1, "link_downed", 3, Since(2, 1000.0, True), 1600.0)
    finding = nic.judge_change(c)
    assert finding is not None and finding.severity == "fail"
    assert finding.message == "mlx5_0 port 1: link_downed rose by 1 in 10 min since the last clean check"
    assert nic.judge_change(nic.change("mlx5_0", 1, "link_downed", 3, Since(3, 1000.0, True), 1600.0)) is None


def test_without_a_mark_the_counter_since_boot_is_judged_over_the_uptime() -> None:
    # 100 symbol errors in a day of uptime: 4.2 an hour, under 120.
    quiet = nic.change("mlx5_0", 1, "symbol_error", 100, Since(0, 0.0, False), 86_400.0)
    assert (quiet.since, quiet.increase) == ("boot", 100) and nic.judge_change(quiet) is None
    # 100 in the 10 minutes since the mark: 600 an hour.
    noisy = nic.change("mlx5_0", 1, "symbol_error", 1100, Since(1000, 0.0, True), 600.0)
    finding = nic.judge_change(noisy)
    assert finding is not None and finding.severity == "fail"
    assert finding.message == (
        "mlx5_0 port 1: symbol_error rose by 100 in 10 min since the last clean check, 600 per hour (over 120 per hour)"
    )


def test_link_error_recovery_over_five_a_minute_only_warns() -> None:
    c = nic.change("mlx5_1", 1, "link_error_recovery", 12, Since(0, 0.0, True), 60.0)
    finding = nic.judge_change(c)
    assert finding is not None and finding.severity == "warn"
    assert finding.message.endswith("12 per minute (degraded: over 5 per minute)")


def test_a_counter_below_its_mark_was_cleared_and_counts_whole() -> None:
    c = nic.change("mlx5_0", 1, "local_link_integrity_errors", 1, Since(5, 0.0, True), 300.0)
    assert (c.since, c.increase) == ("reset", 1)
    finding = nic.judge_change(c)
    assert finding is not None and "since the counter was cleared (at most 5 min)" in finding.message


def test_a_card_with_fewer_active_ports_than_its_peers_is_named(tmp_path: Path) -> None:
    for i in range(3):
        _card(tmp_path, f"mlx5_{i}", f"000{i}:01:00.0", states=("4: ACTIVE", "4: ACTIVE"))
    _card(tmp_path, "mlx5_3", "0003:01:00.0", states=("4: ACTIVE", "1: DOWN"))
    _card(tmp_path, "mlx5_4", "0004:01:00.0", states=("1: DOWN",), rate="100 Gb/sec (4X EDR)")  # no peer
    assert nic.fewer_active_ports(nic.card_ports(tmp_path)) == [
        "mlx5_3 (0003:01:00.0): 1 active port(s), its 3 InfiniBand 2-port peers have 2 (port 2 DOWN)"
    ]
    # A port that is down reports a low rate: the card is still its peers' (7 up at 400 Gb/s, 1 down at 10).
    for i in range(5, 12):
        _card(tmp_path, f"mlx5_{i}", f"00{i:02x}:01:00.0", states=("4: ACTIVE",))
    _card(tmp_path, "mlx5_12", "000c:01:00.0", states=("1: DOWN",), rate="10 Gb/sec (4X SDR)")
    named = set(nic.fewer_active_ports(nic.card_ports(tmp_path)))
    assert {
        "mlx5_12 (000c:01:00.0): 0 active port(s), its 8 InfiniBand 1-port peers have 1 (port 1 DOWN)",
        "mlx5_4 (0004:01:00.0): 0 active port(s), its 8 InfiniBand 1-port peers have 1 (port 1 DOWN)",
    } < named


def test_cards_split_evenly_name_none(tmp_path: Path) -> None:
    _card(tmp_path, "mlx5_0", "0000:01:00.0", states=("4: ACTIVE",))
    _card(tmp_path, "mlx5_1", "0001:01:00.0", states=("1: DOWN",))
    assert nic.fewer_active_ports(nic.card_ports(tmp_path)) == []


def test_peermem_is_told_by_its_module(tmp_path: Path) -> None:
    _card(tmp_path, "mlx5_0", "0000:01:00.0")
    assert not nic.peermem_loaded(tmp_path)
    (tmp_path / "module/nvidia_peermem").mkdir(parents=True)
    assert nic.peermem_loaded(tmp_path)


def test_the_open_kernel_module_is_told_by_its_version_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    version = tmp_path / "version"
    monkeypatch.setattr(nic, "NVIDIA_VERSION", version)
    assert not nic.open_kernel_modules()  # no driver
    version.write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.133.20  Release Build\n")
    assert nic.open_kernel_modules()
    version.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.133.20  Tue Mar 25 2025\n")
    assert not nic.open_kernel_modules()


def test_a_hypervisor_is_told_by_dmi_or_the_cpu_flag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("flags\t\t: fpu vme\n")
    monkeypatch.setattr(nic, "PROC_CPUINFO", cpuinfo)
    assert nic.hypervisor(tmp_path) is None
    cpuinfo.write_text("flags\t\t: fpu vme hypervisor\n")
    assert "flag hypervisor" in (nic.hypervisor(tmp_path) or "")
    cpuinfo.write_text("")
    _write(tmp_path / "class/dmi/id/sys_vendor", "Microsoft Corporation")
    _write(tmp_path / "class/dmi/id/product_name", "Virtual Machine")
    assert (nic.hypervisor(tmp_path) or "").startswith("a Microsoft Corporation Virtual Machine")


def _config_with_acs(control: int) -> bytes:
    """4 KiB of config space: an AER capability at 0x100, then ACS at 0x148 with this control register."""
    space = bytearray(4096)
    struct.pack_into("<I", space, 0x100, 0x0001 | 1 << 16 | 0x148 << 20)
    struct.pack_into("<IHH", space, 0x148, nic.ACS_CAPABILITY | 1 << 16, 0x5F, control)
    return bytes(space)


def test_acs_redirect_bits_are_found_on_bridges(tmp_path: Path) -> None:
    for address, control in (("0000:00:01.0", 0x1D), ("0000:00:02.0", 0x0)):
        bridge = tmp_path / "bus/pci/devices" / address
        _write(bridge / "class", "0x060400")
        (bridge / "config").write_bytes(_config_with_acs(control))
    short = tmp_path / "bus/pci/devices/0000:00:03.0"
    _write(short / "class", "0x060400")
    (short / "config").write_bytes(bytes(64))  # what a user who is not root reads
    scan = nic.scan_acs(tmp_path)
    assert [(b.address, b.redirect) for b in scan.redirecting()] == [("0000:00:01.0", ("ReqRedir", "CmpltRedir"))]
    assert [b.address for b in scan.unread()] == ["0000:00:03.0"]
    assert nic.acs_control(bytes(4096)) is None


def test_a_card_in_a_slower_slot_is_held_to_what_the_slot_allows(tmp_path: Path) -> None:
    """A Gen5 x16 ConnectX-7 below a Gen4 port trains at Gen4 by design; at Gen4 x8 it is narrow for the slot too."""
    bridge = tmp_path / "devices/pci0000:00/0000:00:01.0"
    _write(bridge / "max_link_speed", "16.0 GT/s PCIe")
    _write(bridge / "max_link_width", "16")
    card = bridge / "0000:01:00.0"
    for which, (speed, width) in (("current", ("16.0 GT/s PCIe", "16")), ("max", ("32.0 GT/s PCIe", "16"))):
        _write(card / f"{which}_link_speed", speed)
        _write(card / f"{which}_link_width", width)
    (tmp_path / "class/infiniband/mlx5_0").mkdir(parents=True)
    (tmp_path / "class/infiniband/mlx5_0/device").symlink_to(card)
    (link,) = nic.nic_links(tmp_path)
    assert link.best() == PcieLink(4, 16) and nic.judge_link(link, None) == []
    _write(card / "current_link_width", "8")
    (link,) = nic.nic_links(tmp_path)
    assert [f.message for f in nic.judge_link(link, None)] == [
        "mlx5_0 (0000:01:00.0): PCIe link trained at Gen4 x8, the card (Gen5 x16) in its slot allows Gen4 x16"
    ]
