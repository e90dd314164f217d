"""The health and topology suites end to end: pytester runs of the real suites against fake nodes (fake NVML
beneath the real pynvml, fake sysfs and kernel log under tmp_path), with faults injected per test, reading back
the JUnit XML and JSON report. Plus the cpu SKU's suites for real on this machine, and a GPU SKU on a node with
no driver in a fresh pytest process."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pynvml
import pytest
import torch  # noqa: F401 -- in-process pytester runs drop modules they imported, and torch cannot load twice

from pytest_gbvalidate.healthcheck.cli import main as healthcheck_main
from pytest_gbvalidate.node import window
from pytest_gbvalidate.node.topology import parse_cpulist
from pytest_gbvalidate.node.window import Window
from tests.helpers.fakenode import nd96asr_v4, nd_gb200_v6, xid_line
from tests.helpers.fakenvml import HW_SLOWDOWN, HW_THERMAL_SLOWDOWN, FakeNvmlLib, install
from tests.helpers.kernel_logs import (
    XID_13_APP,
    XID_45_TEARDOWN,
    XID_63_REMAP_EVENT,
    XID_79_OFF_THE_BUS,
    XID_145_NVLINK5,
    XID_149_NVLINK5,
    XID_154_RECOVERY,
    on,
)
from tests.helpers.runs import (
    HEALTH,
    NO_TELEMETRY,
    REPO,
    SUITES,
    TOPOLOGY,
    XUNIT1,
    junit_cases,
    run_suites,
    with_outcome,
)

pytestmark = (
    pytest.mark.torch_version
)  # the aggregate copy check's torch.accelerator; the NCCL stack check names torch's version

PER_GPU_HEALTH = (
    "test_ecc_enabled",
    "test_ecc_errors",
    "test_row_remapping",
    "test_retired_pages",
    "test_no_critical_xid",
    "test_no_slowdown",
    "test_persistence_mode",
    "test_pcie_link",
    "test_nvlinks",
    "test_nvlink_fabric",
    "test_c2c_enabled",
    "test_nvlink_errors",
    "test_application_clocks",
    "test_gpu_recovery_action",
    "test_memory_unrepairable",
    "test_memory_repair_pending",
    "test_sram_threshold",
    "test_thermal_margin",
    "test_pcie_replay_rate",
    "test_nvlink_crc_error_rate",
)
# The ND96asr_v4 baseline has no C2C, NVLink error or thermal offset gates: those checks skip before they read.
LIVE_READINGS = set(PER_GPU_HEALTH) - {
    "test_retired_pages",
    "test_no_critical_xid",
    "test_c2c_enabled",
    "test_nvlink_errors",
    "test_thermal_margin",
}


def test_a_healthy_gb200_node_passes_and_reports_its_gpus_numa_map_and_telemetry(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    node = nd_gb200_v6()
    node.install(monkeypatch, tmp_path)
    result, cases, report = run_suites(pytester, "ND_GB200_v6")
    assert result.ret == pytest.ExitCode.OK
    assert not with_outcome(cases, "failure") and not with_outcome(cases, "error")
    for name, message in with_outcome(cases, "skipped").items():  # only what the baseline has no gate for
        expected: tuple[str, ...] = ("ND_GB200_v6 baseline has no ", "no NCCL_TOPO_FILE in ", "ib_write_bw (perftest) ")
        if name.startswith("test_no_leftover_gpu_processes"):  # no --gb-node-idle: a job's processes are its own
            expected = ("a job may run on this node (default)",)
        assert message.startswith(expected), (name, message)
    for test in PER_GPU_HEALTH:
        assert {f"{test}[gpu{i}]" for i in range(4)} <= set(cases)
    assert cases["test_imex"]["outcome"] == cases["test_nvlink_fabric_clique"]["outcome"] == "passed"
    assert dict(cases["test_nvlinks[gpu2]"]["props"]) == {
        "gb_gpu": "gpu2",
        "gb_gpu_pci_bus_id": "00000018:01:00.0",
        "gb_gpu_uuid": "GPU-6b1a0c2e-0000-4000-8000-000000000002",
    }

    devices = report["gpus"]["devices"]
    assert [d["pci_bus_id"] for d in devices] == [g.pci_bus_id for g in node.gpus]
    gpu3 = devices[3]
    assert gpu3["uuid"] == node.gpus[3].uuid and gpu3["serial"] == "1650000000003"
    assert (gpu3["driver_version"], gpu3["cuda_driver_version"], gpu3["vbios_version"]) == (
        "570.133.20",
        "12.8",
        "97.00.00.00.01",
    )
    assert gpu3["c2c_enabled"] is True and gpu3["fabric_state"] == "completed" and gpu3["memory_numa_node"] == 5

    numa = report["numa_map"]
    assert {n for n, v in numa["nodes"].items() if not v["has_cpus"]} == {"2", "3", "4", "5"}
    assert [g["numa_node"] for g in numa["gpus"]] == [0, 0, 1, 1]
    assert [(n["name"], n["numa_node"]) for n in numa["nics"]] == [(f"mlx5_{i}", i // 2) for i in range(4)]

    (telemetry,) = report["telemetry"]
    assert telemetry["test_id"].endswith("test_telemetry_reads_every_sensor")
    assert telemetry["summary"]["gpu3.power_w"] == {"mean": 95.0, "p5": 95.0, "p95": 95.0}
    assert len(telemetry["series"]["gpu0.temperature_c"]) == telemetry["sample_count"] == len(telemetry["t_s"])
    props = dict(cases["test_telemetry_reads_every_sensor"]["props"])
    assert props["gb_telemetry.gpu1.temperature_c.p95"] == "31.0" and "gb_telemetry.cpu.utilization_pct.mean" in props


def test_the_nd96asr_v4_layout_matches_its_published_numa_map(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    nd96asr_v4().install(monkeypatch, tmp_path)
    result, cases, report = run_suites(pytester, "ND96asr_v4", suites=(TOPOLOGY,))
    assert result.ret == pytest.ExitCode.OK
    assert all(cases[f"test_gpu_numa_node[gpu{i}]"]["outcome"] == "passed" for i in range(8))
    assert [g["numa_node"] for g in report["numa_map"]["gpus"]] == [1, 1, 0, 0, 3, 3, 2, 2]


def test_each_injected_fault_fails_the_right_check_on_the_right_gpu(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    node = nd_gb200_v6()
    gpu0, gpu1, gpu2, gpu3 = node.gpus
    gpu0.ecc_errors["sram_uncorrectable"] = (0, 2)
    gpu0.row_remaps = (0, 1, 1, 0)
    gpu1.clocks_event_reasons = HW_SLOWDOWN | HW_THERMAL_SLOWDOWN
    node.kernel_log.append(xid_line(gpu1, 79, "GPU has fallen off the bus."))
    gpu2.nvlinks[7] = False
    gpu2.persistence_mode = 0
    gpu3.pcie = (5, 5, 8, 16)
    assert gpu3.clocks_mhz["graphics_max"] == 1980
    gpu3.clocks_mhz["graphics_app"] = 1500
    node.install(monkeypatch, tmp_path)

    result, cases, report = run_suites(pytester, "ND_GB200_v6", *NO_TELEMETRY, suites=(HEALTH,))
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    expected = {
        "test_ecc_errors[gpu0]": "gpu0 (00000008:01:00.0): ECC errors: sram_uncorrectable 2 aggregate, limit 0",
        "test_row_remapping[gpu0]": "gpu0 (00000008:01:00.0): a row remap is pending: reset the GPU to apply it",
        "test_no_slowdown[gpu1]": "gpu1 (00000009:01:00.0): clocks held down by hw_slowdown, hw_thermal_slowdown",
        "test_no_critical_xid[gpu1]": "Xid 79 ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS (RESTART_BM): 1 line",
        "test_nvlinks[gpu2]": "gpu2 (00000018:01:00.0): 17 NVLink(s) up, expected 18; down: 7",
        "test_persistence_mode[gpu2]": "gpu2 (00000018:01:00.0): persistence mode is off",
        "test_pcie_link[gpu3]": "PCIe link trained at gen 5 x8, the GPU and slot support gen 5 x16",
        "test_application_clocks[gpu3]": "graphics 1500 of 1980 MHz, memory 2619 of 2619 MHz: `nvidia-smi -i 3 -ac",
    }
    failed = with_outcome(cases, "failure")
    assert set(failed) == set(expected)
    for name, text in expected.items():
        assert text in failed[name], (name, failed[name])
    assert not with_outcome(cases, "error")
    assert cases["test_no_critical_xid[gpu0]"]["outcome"] == "passed"  # Xid 13 is an application fault

    # Each failure carries its fault category and the operator's action: JSON, JUnit and the terminal.
    categories = {
        "test_ecc_errors[gpu0]": ("gpu_hardware", "ISOLATE"),  # uncorrectable SRAM
        "test_row_remapping[gpu0]": ("gpu_reset", "RESET"),  # pending, not failed
        "test_no_slowdown[gpu1]": ("thermal_power", "MONITOR"),
        "test_no_critical_xid[gpu1]": ("reboot", "REBOOT"),  # Xid 79: the catalog's RESTART_BM
        "test_nvlinks[gpu2]": ("link", "ISOLATE"),
        "test_persistence_mode[gpu2]": ("configuration", "MONITOR"),
        "test_pcie_link[gpu3]": ("link", "ISOLATE"),
        "test_application_clocks[gpu3]": ("configuration", "MONITOR"),
    }
    faults = {t["test_id"].rsplit("::")[-1]: t["fault"] for t in report["tests"] if t["outcome"] == "failed"}
    assert {name: (f["category"], f["disposition"]) for name, f in faults.items()} == categories
    assert faults["test_pcie_link[gpu3]"]["action"].startswith("check the cable or port")
    assert "fault" not in next(t for t in report["tests"] if t["outcome"] == "passed")
    assert dict(cases["test_row_remapping[gpu0]"]["props"])["gb_fault_category"] == "gpu_reset"
    assert dict(cases["test_no_critical_xid[gpu1]"]["props"])["gb_fault_repair"] == "reboot"
    assert {f["repair"] for f in faults.values()} == {"rma", "gpu_reset", "reboot", "fix_config"}
    result.stdout.fnmatch_lines(
        [
            "*gbvalidate: failures by fault category*",
            "gpu_hardware (ISOLATE): replace the GPU* (repair: rma)",
            "  *test_ecc_errors[[]gpu0[]]: *sram_uncorrectable*",
        ]
    )


def test_xid_events_are_judged_by_nvidia_s_catalog_once_each_with_their_repair(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Real drivers' lines (tests/helpers/kernel_logs.py). gpu0: an application's Xid 13 and 45, a row-remap event 63
    and a recovery-action change 154, none a fault of the node; gpu1: a fresh NVLink5 Xid; gpu2: 95 and 140; gpu3:
    10,000 identical lines of one NVLink5 event. Then a repair is acknowledged, and the next run judges only what
    came after it."""
    node = nd_gb200_v6()
    gpu0, gpu1, gpu2, gpu3 = node.gpus
    node.kernel_log += [on(gpu0, line) for line in (XID_13_APP, XID_45_TEARDOWN, XID_63_REMAP_EVENT, XID_154_RECOVERY)]
    node.kernel_log += [on(gpu1, XID_145_NVLINK5)]
    node.kernel_log += [xid_line(gpu2, 95, "Uncontained memory error"), xid_line(gpu2, 140, "ECC unrecovered error")]
    node.kernel_log += [on(gpu3, XID_149_NVLINK5)] * 10_000
    node.install(monkeypatch, tmp_path)
    xid_checks = ("-k", "critical_xid")

    result, cases, report = run_suites(pytester, "ND_GB200_v6", *xid_checks, suites=(HEALTH,))
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    failed = with_outcome(cases, "failure")
    assert set(failed) == {f"test_no_critical_xid[gpu{i}]" for i in (1, 2, 3)}
    assert (
        "gpu1 (00000009:01:00.0): Xid events since boot: Xid 145 NVLINK_RLW_ERROR (WORKFLOW_NVLINK5_ERR): 1 line "
        "(1 distinct) in 1 burst, 0.0 s after boot; repair: reboot"
    ) in failed["test_no_critical_xid[gpu1]"]
    assert "Xid 95 ROBUST_CHANNEL_UNCONTAINED_ERROR (RESET_GPU)" in failed["test_no_critical_xid[gpu2]"]
    assert "Xid 140 UNRECOVERABLE_ECC_ERROR_ESCAPE (RESET_GPU)" in failed["test_no_critical_xid[gpu2]"]
    assert (
        "Xid 149 NVLINK_NETIR_ERROR (WORKFLOW_NVLINK5_ERR): 10000 lines (1 distinct) in 1 burst"
        in (failed["test_no_critical_xid[gpu3]"])
    )
    faults = {t["test_id"].rsplit("::")[-1]: t["fault"] for t in report["tests"] if t["outcome"] == "failed"}
    assert {name: (f["category"], f["repair"]) for name, f in faults.items()} == {
        "test_no_critical_xid[gpu1]": ("reboot", "reboot"),
        "test_no_critical_xid[gpu2]": ("gpu_reset", "gpu_reset"),
        "test_no_critical_xid[gpu3]": ("reboot", "reboot"),
    }
    seen = dict(cases["test_no_critical_xid[gpu0]"]["props"])["gb_xid_events"]
    assert "Xid 13 " in seen and "Xid 45 " in seen and "Xid 63 " in seen and "Xid 154 " in seen  # reported only
    assert cases["test_no_critical_xid[gpu0]"]["outcome"] == "passed"

    # The same log again: gpu0's clean check closed its window, the failed GPUs' stay open (confirm before drain).
    result, cases, _ = run_suites(pytester, "ND_GB200_v6", *xid_checks, suites=(HEALTH,))
    assert set(with_outcome(cases, "failure")) == {f"test_no_critical_xid[gpu{i}]" for i in (1, 2, 3)}
    assert "gb_xid_events" not in dict(cases["test_no_critical_xid[gpu0]"]["props"])

    # The GPUs reset and the repair noted: the events before it never fail the node again; a new one after it does.
    assert healthcheck_main(["repaired"]) == 0
    node.kernel_log.append(on(gpu0, XID_79_OFF_THE_BUS))
    node.write_kernel_log(tmp_path)
    result, cases, _ = run_suites(pytester, "ND_GB200_v6", *xid_checks, suites=(HEALTH,))
    failed = with_outcome(cases, "failure")
    assert set(failed) == {"test_no_critical_xid[gpu0]"} and "Xid 79 " in failed["test_no_critical_xid[gpu0]"]
    assert "Xid events since the last clean check" in failed["test_no_critical_xid[gpu0]"]


def test_the_nic_suite_names_a_narrow_card_and_a_port_that_went_down_since_the_last_check(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    node = nd_gb200_v6()
    node.hcas[2].current_link = ("32.0 GT/s PCIe", "8")  # mlx5_2 trained at x8 of its x16
    node.hcas[1].counters["link_downed"] = 3  # 2 at the last check: one more since
    node.hcas[3].counters["link_downed"] = 5  # 5 at the last check too: judged once, not again
    node.hcas[0].counters["link_downed"] = 7  # no mark this boot: a rise of long ago opens the window, no fault
    node.install(monkeypatch, tmp_path)
    marks = Window(window.DEFAULT_PATH)  # the run's default window, this test's own (tests/conftest.py)
    assert marks.write({"ib/mlx5_1/1/link_downed": 2, "ib/mlx5_3/1/link_downed": 5}, time.time() - 600) is None

    result, cases, report = run_suites(pytester, "ND_GB200_v6", suites=(str(SUITES / "test_nic.py"),))
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    failed = with_outcome(cases, "failure")
    assert set(failed) == {"test_nic_pcie_link", "test_infiniband_error_counters"}
    assert (
        "mlx5_2 (0002:01:00.0): PCIe link trained at Gen5 x8, the card supports Gen5 x16; mlx5_2 (0002:01:00.0)"
        ": PCIe link at Gen5 x8, the ND_GB200_v6 baseline expects Gen5 x16" in failed["test_nic_pcie_link"]
    )
    assert "mlx5_0" not in failed["test_nic_pcie_link"] and "mlx5_3" not in failed["test_nic_pcie_link"]
    counters = failed["test_infiniband_error_counters"]
    assert "mlx5_1 port 1: link_downed rose by 1 in 10 min since the last clean check" in counters
    assert "mlx5_3" not in counters and "mlx5_0" not in counters
    assert cases["test_nic_active_ports_match_peers"]["outcome"] == "passed"
    assert cases["test_gpudirect_rdma_module"]["outcome"] == "passed"  # the baseline's use_cuda: peermem loaded
    assert cases["test_pcie_acs_redirect_off"]["message"].startswith("no PCIe bridge in ")
    faults = {
        t["test_id"].rsplit("::")[-1]: t["fault"]["category"] for t in report["tests"] if t["outcome"] == "failed"
    }
    assert faults == {"test_nic_pcie_link": "link", "test_infiniband_error_counters": "link"}
    # A failed check leaves its marks: its second run (confirm before drain) judges the same rise.
    kept = marks.read("ib/mlx5_1/1/link_downed")
    assert kept is not None and kept.value == 2
    assert "ib/mlx5_0/1/link_downed 7" in dict(cases["test_infiniband_error_counters"]["props"])["gb_window_opened"]
    # Once the link is mended and the repair noted, the counters' window opens at their readings then.
    assert healthcheck_main(["repaired"]) == 0
    nic_suite = (str(SUITES / "test_nic.py"),)
    result, cases, _ = run_suites(pytester, "ND_GB200_v6", "-k", "error_counters", suites=nic_suite)
    assert cases["test_infiniband_error_counters"]["outcome"] == "passed"


class LoseGpuAfter:
    """A plugin for the run under test: the GPU falls off the bus once `test_name` has run."""

    def __init__(self, lib: FakeNvmlLib, index: int, test_name: str) -> None:
        self.lib, self.index, self.test_name = lib, index, test_name

    def pytest_runtest_teardown(self, item: pytest.Item) -> None:
        if item.name == self.test_name:
            self.lib.gpus[self.index].lost = True


def test_a_gpu_lost_mid_run_fails_its_own_checks_from_then_on(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    lib = nd96asr_v4().install(monkeypatch, tmp_path)
    result = pytester.runpytest(
        HEALTH, "--gb-sku=ND96asr_v4", "--junitxml=r.xml", plugins=[LoseGpuAfter(lib, 5, "test_gpu_model")]
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    cases = junit_cases(pytester.path / "r.xml")
    assert cases["test_gpu_count"]["outcome"] == "passed"  # the inventory was taken before the loss
    failed = with_outcome(cases, "failure")
    assert set(failed) == {f"{t}[gpu5]" for t in LIVE_READINGS} | {"test_telemetry_reads_every_sensor"}
    for name in set(failed) - {"test_telemetry_reads_every_sensor"}:
        assert failed[name].startswith("Failed: gpu5 (00000006:00:00.0): nvmlDevice"), failed[name]
        assert failed[name].endswith(": GPU is lost"), failed[name]
    assert "gpu5: nvmlDeviceGetUtilizationRates: GPU is lost" in failed["test_telemetry_reads_every_sensor"]
    assert cases["test_nvlinks[gpu7]"]["outcome"] == "passed"  # 12 links, all up; the baseline gives no count


@pytest.mark.parametrize(
    ("lib", "nvml_error", "category"),
    [
        (None, "NVML Shared Library Not Found", "software"),
        (FakeNvmlLib(init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED), "Driver Not Loaded", "reboot"),
    ],
    ids=["no-library", "driver-not-loaded"],
)
def test_without_a_driver_the_run_fails_once_for_it_and_no_gpu_check_runs(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    lib: FakeNvmlLib | None,
    nvml_error: str,
    category: str,
) -> None:
    """A GB200 node whose sysfs, HCAs and kernel log are in order (the checks that read only those pass), and
    whose NVIDIA driver does not answer: one root failure naming NVML's error, with its fault category; every GPU
    check not run, saying why; nothing else failed."""
    nd_gb200_v6().install(monkeypatch, tmp_path)
    install(monkeypatch, lib)
    result, cases, report = run_suites(pytester, "ND_GB200_v6")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert not with_outcome(cases, "error")
    why = f"NVML does not load: {nvml_error}"
    assert with_outcome(cases, "failure") == {"node_gpus_usable": f"the node's GPUs cannot be used: {why}"}
    skipped = with_outcome(cases, "skipped")
    assert {"test_gpu_count", "test_telemetry_reads_every_sensor", "test_nvlinks[gpu3]"} <= set(skipped)
    blocked = f"not run: the node's GPUs cannot be used ({why}); gbvalidate::node_gpus_usable failed"
    assert {m for m in skipped.values() if m != blocked} == {"ib_write_bw (perftest) is not on PATH"}
    assert skipped["test_imex"] == skipped["test_nccl_net_plugin"] == blocked  # GPU checks: four categories once
    passed = {n for n, c in cases.items() if c["outcome"] == "passed"}
    assert passed == {"test_numa_nodes_hold_every_cpu", "test_infiniband_ports_active"}  # sysfs only
    (root,) = [t for t in report["tests"] if t["outcome"] == "failed"]
    assert (root["test_id"], root["fault"]["category"]) == ("gbvalidate::node_gpus_usable", category)


# A plugin for a pytest subprocess: the node it runs on has no NVIDIA driver, whatever the host has.
NO_DRIVER_PLUGIN = """\
import pytest
from tests.helpers.fakenvml import install

def pytest_configure(config):
    install(pytest.MonkeyPatch(), None)
"""


def test_in_a_fresh_process_a_gpu_sku_without_a_driver_fails_once_with_the_nvml_error(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What an operator sees running the GB200 health suite on a node without a working NVIDIA driver."""
    pytester.makepyfile(no_nvidia_driver=NO_DRIVER_PLUGIN)  # importable there: pytester puts its dir on the path
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # and the fakes with it
    result = pytester.runpytest_subprocess(
        HEALTH, "--gb-sku=ND_GB200_v6", "--junitxml=r.xml", "-p", "no:cacheprovider", "-p", "no_nvidia_driver"
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        ["*skipped: * checks: not run: the node's GPUs cannot be used (NVML does not load: *", "*1 failed, * skipped*"]
    )
    cases = junit_cases(pytester.path / "r.xml")
    assert not with_outcome(cases, "error")
    assert all(cases[f"{t}[gpu{i}]"]["outcome"] == "skipped" for t in LIVE_READINGS for i in range(4))
    assert "NVML does not load: NVML Shared Library Not Found" in (cases["node_gpus_usable"]["message"] or "")


def test_topology_faults_fail_the_gpus_and_ports_they_touch(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    baselines = pytester.path / "b"
    shutil.copytree(REPO / "baselines", baselines)
    sku = baselines / "ND96asr_v4.yaml"
    sku.write_text(
        sku.read_text().replace("topology:\n", "topology:\n  nic_on_gpu_numa_node: true\n  ib_rate_gbps: 200\n")
    )
    node = nd96asr_v4()
    node.gpus[2].numa_nodes, node.gpus[2].cpus = [1], list(range(24, 48))  # on NUMA 1, both views agree
    node.hcas[0].state = "1: DOWN"
    node.hcas[1].rate = "100 Gb/sec (4X EDR)"
    node.hcas = [h for h in node.hcas if h.numa_node != 3]  # no NIC on NUMA 3, where GPUs 4 and 5 are
    node.install(monkeypatch, tmp_path)
    gpu6 = topology_device(tmp_path, node.gpus[6].pci_bus_id)
    (gpu6 / "numa_node").write_text("3\n")  # sysfs puts GPU 6 on NUMA 3, NVML on 2

    result, cases, _ = run_suites(pytester, "ND96asr_v4", "--gb-baselines=b", suites=(TOPOLOGY,))
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    failed = with_outcome(cases, "failure")
    assert set(failed) == {
        "test_gpu_numa_node[gpu2]",
        "test_gpu_numa_node[gpu6]",
        "test_gpu_placement_nvml_agrees_with_sysfs[gpu6]",
        "test_gpu_has_a_nic_on_its_numa_node[gpu4]",
        "test_gpu_has_a_nic_on_its_numa_node[gpu5]",
        "test_gpu_has_a_nic_on_its_numa_node[gpu6]",
        "test_infiniband_ports_active",
    }
    assert (
        "gpu2 (00000003:00:00.0) is on NUMA node 1, the ND96asr_v4 layout puts it on 0"
        in failed["test_gpu_numa_node[gpu2]"]
    )
    assert "NUMA node: NVML says 2, sysfs numa_node says 3" in failed["test_gpu_placement_nvml_agrees_with_sysfs[gpu6]"]
    assert (
        "gpu4 (00000005:00:00.0) is on NUMA node 3, which has no NIC"
        in failed["test_gpu_has_a_nic_on_its_numa_node[gpu4]"]
    )
    assert (
        "InfiniBand ports not ACTIVE at 200 Gb/s: mlx5_ib0 port 1: DOWN at 200.0 Gb/s; "
        "mlx5_ib1 port 1: ACTIVE at 100.0 Gb/s" in failed["test_infiniband_ports_active"]
    )


def topology_device(tmp_path: Path, bus_id: str) -> Path:
    from pytest_gbvalidate.node.topology import sysfs_pci_address

    return tmp_path / "sys/bus/pci/devices" / sysfs_pci_address(bus_id)


def test_on_the_cpu_sku_the_real_numa_map_and_cpu_telemetry_are_reported(pytester: pytest.Pytester) -> None:
    # Not the InfiniBand check: whether this machine's ports are up is its own business (the fake nodes above
    # test that check), and a GPU workstation may well have one down.
    result, cases, report = run_suites(pytester, "cpu", "-k", "not infiniband")
    assert result.ret == pytest.ExitCode.OK
    assert cases["test_numa_nodes_hold_every_cpu"]["outcome"] == "passed"
    assert cases["test_telemetry_reads_every_sensor"]["outcome"] == "passed"
    skipped = with_outcome(cases, "skipped")
    assert skipped["test_ecc_errors[nogpu]"] == "needs NVIDIA GPUs; this run checks the cpu SKU, which has none"

    numa = report["numa_map"]
    online = parse_cpulist(Path("/sys/devices/system/cpu/online").read_text())
    assert parse_cpulist(numa["online_cpus"]) == online
    assert sorted(c for n in numa["nodes"].values() for c in parse_cpulist(n["cpus"])) == sorted(online)
    assert numa["gpus"] == [] and "gpus" not in report  # NVML is not asked on a SKU without GPUs
    (telemetry,) = report["telemetry"]
    assert telemetry["sources"] == ["cpu"] and telemetry["errors"] == []
    assert telemetry["sample_count"] >= 3
    assert 0 <= telemetry["summary"]["cpu.utilization_pct"]["mean"] <= 100
    assert telemetry["summary"]["cpu.memory_used_gib"]["p5"] > 0
    props = dict(cases["test_telemetry_reads_every_sensor"]["props"])
    assert float(props["gb_telemetry.cpu.memory_used_gib.mean"]) > 0


def test_gb_telemetry_around_a_workload(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import time

        def test_work(gb_telemetry):
            with gb_telemetry(interval_s=0.02, label="step") as sampler:
                time.sleep(0.2)
            assert sampler.summary()["cpu.utilization_pct"]["p95"] <= 100
            gb_telemetry()  # made but never started: nothing to report
        """
    )
    result = pytester.runpytest("--gb-sku=cpu", *XUNIT1, "--gb-report=r.json")
    result.assert_outcomes(passed=1)
    (record,) = json.loads((pytester.path / "r.json").read_text())["telemetry"]
    assert record["label"] == "step" and record["test_id"] == "test_gb_telemetry_around_a_workload.py::test_work"
    assert record["interval_s"] == 0.02 and record["sample_count"] >= 3
    assert record["t_s"] == sorted(record["t_s"]) and record["duration_s"] >= 0.2
    props = dict(junit_cases(pytester.path / "r.xml")["test_work"]["props"])
    assert {f"gb_telemetry.step.cpu.memory_used_gib.{s}" for s in ("mean", "p5", "p95")} <= set(props)


def test_strict_fails_a_check_the_baseline_has_no_gate_for(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    nd_gb200_v6().install(monkeypatch, tmp_path)
    result = pytester.runpytest(HEALTH, "--gb-sku=ND_GB200_v6", "--gb-strict", "-k", "driver_version")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*ND_GB200_v6 baseline has no health.min_driver_version expectation (--gb-strict)*"])


def test_a_project_gpu_fixture_of_its_own_is_left_alone(pytester: pytest.Pytester) -> None:
    pytester.makeconftest("import pytest\n\n@pytest.fixture\ndef gpu():\n    return 'mine'\n")
    pytester.makepyfile("def test_x(gpu):\n    assert gpu == 'mine'\n")
    result = pytester.runpytest()
    result.assert_outcomes(passed=1)
    result.stdout.no_fnmatch_line("gbvalidate*")


def test_under_xdist_the_numa_map_and_telemetry_reach_the_report(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import time

        def test_map(numa_map):
            assert numa_map.nodes

        def test_sampled(gb_telemetry):
            with gb_telemetry(interval_s=0.01):
                time.sleep(0.05)
        """
    )
    result = pytester.runpytest_subprocess("--gb-sku=cpu", "-n", "2", "--gb-report=r.json", *XUNIT1)
    result.assert_outcomes(passed=2)
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["numa_map"]["nodes"] and report["telemetry"][0]["sample_count"] >= 2
    props = dict(junit_cases(pytester.path / "r.xml")["test_sampled"]["props"])
    assert "gb_telemetry.cpu.utilization_pct.p95" in props


NCCL = ("-k", "nccl")


def test_the_nccl_stack_checks_say_what_they_found_and_where(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    node = nd96asr_v4()
    node.nccl_version, node.nccl_conf, node.net_plugin_loads = "2.8.4", "NCCL_TOPO_FILE=topo.xml\n", False
    node.install(monkeypatch, tmp_path)
    result, cases, report = run_suites(pytester, "ND96asr_v4", *NCCL, suites=(HEALTH,))
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    failed = with_outcome(cases, "failure")
    assert "NCCL 2.8.4 (the fake node's torch) is older than 2.9.9, the minimum" in failed["test_nccl_version"]
    topo = failed["test_nccl_topo_file"]
    assert f"NCCL_TOPO_FILE=topo.xml (from {tmp_path / 'etc-nccl.conf'}) resolves to " in topo
    assert f"{pytester.path / 'topo.xml'}: no such file" in topo  # relative: to the run's working directory
    plugin = "NCCL's net plugin (the baseline's health.nccl_net_plugin): cannot load libnccl-net.so"
    assert plugin in failed["test_nccl_net_plugin"]
    faults = {t["test_id"].rsplit("::")[-1]: t["fault"]["category"] for t in report["tests"] if "fault" in t}
    expected = {"test_nccl_version": "software", "test_nccl_topo_file": "configuration"}
    assert faults == expected | {"test_nccl_net_plugin": "software"}


@pytest.mark.parametrize(
    ("content", "outcome", "message"),
    [
        ('<system version="1"><cpu numaid="0"/></system>', "passed", None),
        ("<system version='1'>", "failure", "not valid XML: no element found"),
        ("<topology/>", "failure", "its root element is <topology>, an NCCL topology has <system>"),
    ],
)
def test_the_topology_file_the_environment_names_must_be_an_nccl_topology(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    content: str,
    outcome: str,
    message: str | None,
) -> None:
    nd96asr_v4().install(monkeypatch, tmp_path)
    topo = tmp_path / "ndv4-topo.xml"
    topo.write_text(content)
    monkeypatch.setenv("NCCL_TOPO_FILE", str(topo))  # the environment wins over NCCL's configuration files
    _, cases, _ = run_suites(pytester, "ND96asr_v4", "-k", "topo_file", suites=(HEALTH,))
    case = cases["test_nccl_topo_file"]
    assert case["outcome"] == outcome, case
    if message is not None:
        assert f"NCCL_TOPO_FILE={topo} (from the environment): {message}" in (case["message"] or "")
    else:
        assert dict(case["props"])["gb_nccl_topo_file"] == str(topo)


DRIVER_VERDICTS = ("-k", "recovery or memory_ or sram or thermal or rate or row_remapping")


def test_the_driver_s_own_verdicts_fail_warn_or_skip_per_gpu(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """One run, a fault per GPU: gpu0 asks for a GPU reset, gpu1 runs 3 C past its slowdown temperature, gpu2's
    driver gives none of the readings (each check skips naming the driver), gpu3's memory is unrepairable with a
    repair pending, its SRAM past the threshold, its links erring fast, and three warnings that pass (drain P2P,
    PCIe replays, 512 uncorrectable remaps). Then a second run, nothing new since: the rates are quiet."""
    node = nd_gb200_v6()
    gpu0, gpu1, gpu2, gpu3 = node.gpus
    gpu0.recovery_action = pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET
    gpu1.margin_c = -3  # 3 C past its T.Limit: past the driver's slowdown margin of -2
    gpu2.recovery_action = gpu2.pcie_replays = gpu2.unrepairable_memory = gpu2.sram_threshold_exceeded = None
    gpu2.repairs_pending, gpu2.margin_c, gpu2.nvlink_errors = None, None, None
    gpu3.recovery_action = pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_P2P
    gpu3.unrepairable_memory, gpu3.repairs_pending, gpu3.sram_threshold_exceeded = 1, (1, 0), 1
    gpu3.row_remaps = (3, 512, 0, 0)
    gpu3.pcie_replays = 600  # 60 a minute over the 10 minutes since boot: over Gen5 x16's 30.7
    assert gpu3.nvlink_errors is not None
    gpu3.nvlink_errors[(4, pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA)] = 90_000  # 150 a second
    node.install(monkeypatch, tmp_path)
    monkeypatch.setattr(window, "uptime_s", lambda: 600.0)

    result, cases, report = run_suites(pytester, "ND_GB200_v6", *DRIVER_VERDICTS, suites=(HEALTH,))
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    expected = {
        "test_gpu_recovery_action[gpu0]": (
            "gpu0 (00000008:01:00.0): the driver's recovery action is GPU_RESET: reset the GPU",
            "gpu_reset",
        ),
        "test_thermal_margin[gpu1]": (
            "gpu1 (00000009:01:00.0): thermal margin -3 C (T.Limit), below the ND_GB200_v6 offset of -2 C (the "
            "driver's: slows at -2 C, shuts down at -5 C)",
            "thermal_power",
        ),
        "test_memory_unrepairable[gpu3]": ("the driver flags its memory unrepairable: replace the GPU", "gpu_hardware"),
        "test_memory_repair_pending[gpu3]": ("a channel repair is pending: reset the GPU to apply it", "gpu_reset"),
        "test_sram_threshold[gpu3]": ("SRAM ECC errors passed the driver's threshold", "gpu_hardware"),
        "test_nvlink_crc_error_rate[gpu3]": (
            "NVLink CRC errors link 4 crc_data 150.0/s (90000 in 600 s since boot)",
            "link",
        ),
    }
    failed = with_outcome(cases, "failure")
    assert set(failed) == set(expected), failed
    faults = {t["test_id"].rsplit("::")[-1]: t["fault"]["category"] for t in report["tests"] if "fault" in t}
    for name, (text, category) in expected.items():
        assert text in failed[name] and faults[name] == category, (name, failed[name], faults[name])
    skipped = with_outcome(cases, "skipped")
    assert {name for name in skipped if name.endswith("[gpu2]")} == {f"{t}[gpu2]" for t in PER_GPU_HEALTH[-7:]}
    for name in (n for n in skipped if n.endswith("[gpu2]")):
        assert skipped[name].startswith("gpu2 (00000018:01:00.0): the "), skipped[name]
        assert skipped[name].endswith(" unavailable on driver 570.133.20"), skipped[name]
    warned = {n: dict(c["props"]).get("gb_health_warning") for n, c in cases.items() if c["outcome"] == "passed"}
    assert "the driver's recovery action is DRAIN_P2P" in (warned["test_gpu_recovery_action[gpu3]"] or "")
    assert "60.0 PCIe replays a minute (600 in 600 s since boot), above the 30.7" in (
        warned["test_pcie_replay_rate[gpu3]"] or ""
    )
    assert "512 rows remapped after uncorrectable errors" in (warned["test_row_remapping[gpu3]"] or "")
    assert {n for n, w in warned.items() if w} == {
        "test_gpu_recovery_action[gpu3]",
        "test_pcie_replay_rate[gpu3]",
        "test_row_remapping[gpu3]",
    }

    # The run again, nothing new (confirm before drain): the failed rate is judged on the same errors and fails
    # again; the warned one passed, so its mark moved and the same count is no rate at all.
    result, cases, _ = run_suites(pytester, "ND_GB200_v6", "-k", "rate", suites=(HEALTH,))
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert cases["test_nvlink_crc_error_rate[gpu3]"]["outcome"] == "failure"
    assert not dict(cases["test_pcie_replay_rate[gpu3]"]["props"]).get("gb_health_warning")
