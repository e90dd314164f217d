"""Unit tests of the NVML probes (pytest_gbvalidate/node/nvml.py) through the real pynvml over a fake library."""

from __future__ import annotations

from collections.abc import Iterator

import pynvml
import pytest

from pytest_gbvalidate.node import nvml
from pytest_gbvalidate.node.fabric import FabricInfo
from tests.helpers.fakenode import GB200_CLUSTER_UUID, nd_gb200_v6
from tests.helpers.fakenvml import HW_SLOWDOWN, IDLE, SW_POWER_CAP, FakeGpu, FakeNvmlLib, install


@pytest.fixture
def lib(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeNvmlLib]:
    """A started NVML over a fake library; a test puts its GPUs in `lib.gpus`."""
    fake = FakeNvmlLib([])
    install(monkeypatch, fake)
    with nvml.session():
        yield fake


def test_inventory_of_a_gb200_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, nd_gb200_v6().nvml())
    with nvml.session():
        inventory = nvml.read_inventory()
    assert (inventory.count, sorted(inventory.gpus), inventory.failed) == (4, [0, 1, 2, 3], {})
    gpu = inventory.gpus[3]
    assert gpu == nvml.GpuInfo(
        index=3,
        uuid="GPU-6b1a0c2e-0000-4000-8000-000000000003",
        name="NVIDIA GB200",
        pci_bus_id="00000019:01:00.0",
        serial="1650000000003",
        memory_total_bytes=189_471 * 2**20,
        driver_version="570.133.20",
        cuda_driver_version="12.8",
        vbios_version="97.00.00.00.01",
        ecc_mode=(True, True),
        persistence_mode=True,
        compute_mode="default",
        power_limit_w=700.0,
        clocks=nvml.Clocks(1980, 1980, 1980, 1980, 1980, 2619, 2619, 2619),
        pcie=nvml.PcieLink(5, 5, 16, 16),
        nvlinks=dict.fromkeys(range(18), True),
        c2c_enabled=True,
        fabric_state="completed",
        fabric_status="Success",
        fabric_degraded_bandwidth=None,
        mig_mode=(False, False),
        numa_nodes=(1,),
        cpu_affinity=tuple(range(72, 144)),  # bits beyond the first 64-bit word of the mask
        memory_numa_node=5,
        fabric_cluster_uuid=GB200_CLUSTER_UUID,
        fabric_clique_id=32766,
    )
    assert gpu.as_dict()["clocks"]["graphics_app_mhz"] == 1980


def test_what_a_gpu_lacks_reads_as_none(lib: FakeNvmlLib) -> None:
    bare = FakeGpu(
        "NVIDIA L4",
        serial=None,
        vbios_version=None,
        ecc_mode=None,
        persistence_mode=None,
        power_limit_mw=None,
        clocks_mhz={"sm": 2040, "sm_max": 2040, "graphics_max": 2040, "mem": 6251, "mem_max": 6251},
        pcie=None,
    )
    lib.gpus.append(bare)
    gpu = nvml.read_inventory().gpus[0]
    assert (gpu.serial, gpu.vbios_version, gpu.ecc_mode, gpu.persistence_mode, gpu.power_limit_w) == (None,) * 5
    assert (gpu.clocks.graphics_app_mhz, gpu.clocks.mem_app_mhz, gpu.clocks.graphics_max_mhz) == (None, None, 2040)
    assert (gpu.pcie, gpu.nvlinks, gpu.c2c_enabled, gpu.fabric_state, gpu.mig_mode) == (None, {}, None, None, None)
    assert gpu.memory_numa_node is None
    assert nvml.ecc_counts(nvml.handle(0))["sram_uncorrectable"] == nvml.EccCount(None, None)  # ECC off


def test_a_gpu_that_does_not_answer_is_listed_with_its_error(lib: FakeNvmlLib) -> None:
    lib.gpus += [FakeGpu(pci_bus_id="00000000:01:00.0"), FakeGpu(pci_bus_id="00000000:02:00.0", lost=True)]
    inventory = nvml.read_inventory()
    assert inventory.count == 2 and list(inventory.gpus) == [0]
    assert inventory.failed == {1: "nvmlDeviceGetHandleByIndex: GPU is lost"}
    assert inventory.as_dict()["failed"] == {"1": "nvmlDeviceGetHandleByIndex: GPU is lost"}


def test_without_a_driver_init_raises_nvml_own_words(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, None)
    session = nvml.session()
    with pytest.raises(nvml.NvmlError, match=r"^nvmlInit: NVML Shared Library Not Found$") as caught:
        session.__enter__()
    assert caught.value.code == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND


def test_health_readings(lib: FakeNvmlLib) -> None:
    gpu = FakeGpu(
        ecc_errors={"sram_uncorrectable": (1, 3), "dram_correctable": (10, 400)},
        row_remaps=(2, 1, 1, 0),
        retired_pages=(2, 1, 1),
        nvlinks=[True, False, True],
        clocks_event_reasons=IDLE | SW_POWER_CAP | HW_SLOWDOWN,
    )
    lib.gpus.append(gpu)
    h = nvml.handle(0)
    counts = nvml.ecc_counts(h)
    assert counts["sram_uncorrectable"] == nvml.EccCount(1, 3) and counts["dram_correctable"] == nvml.EccCount(10, 400)
    assert counts["sram_correctable"] == nvml.EccCount(0, 0)
    assert nvml.row_remaps(h) == nvml.RowRemaps(corrected_rows=2, uncorrected_rows=1, pending=True, failed=False)
    assert nvml.retired_pages(h) == nvml.RetiredPages(single_bit=2, double_bit=1, pending=True)
    assert nvml.nvlinks(h) == {0: True, 1: False, 2: True}
    assert nvml.c2c_enabled(h) is None and nvml.fabric(h) is None  # a GPU without C2C or an NVLink fabric
    assert nvml.slowdown_reasons(nvml.clocks_event_reasons(h)) == ["hw_slowdown"]  # idle and power cap are normal
    gpu.lost = True
    with pytest.raises(nvml.NvmlError, match="nvmlDeviceGetCurrentClocksEventReasons: GPU is lost"):
        nvml.clocks_event_reasons(h)


def test_every_slowdown_reason_is_named() -> None:
    assert nvml.slowdown_reasons(0xFF) == [
        "hw_slowdown",
        "sw_thermal_slowdown",
        "hw_thermal_slowdown",
        "hw_power_brake_slowdown",
    ]
    assert nvml.slowdown_reasons(IDLE | SW_POWER_CAP) == []


def test_the_fabric_s_result_counts_once_registered_and_its_health_mask_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """NVML defines a registration's status only once its state is completed; the health mask (GB200 on) says
    whether the NVLink bandwidth is degraded. The struct is versioned: the real library refuses it unversioned."""
    degraded = (
        pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW
    )
    healthy = (
        pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_FALSE << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW
    )
    gpus = [
        FakeGpu(fabric_state=pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS, fabric_status=pynvml.NVML_ERROR_UNKNOWN),
        FakeGpu(fabric_state=pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, fabric_health_mask=degraded),
        FakeGpu(fabric_state=pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, fabric_health_mask=healthy),
        FakeGpu(fabric_state=pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, fabric_status=pynvml.NVML_ERROR_NOT_READY),
    ]
    install(monkeypatch, FakeNvmlLib(gpus=gpus))
    with nvml.session():
        inventory = nvml.read_inventory()
    assert inventory.failed == {}
    seen = [(g.fabric_state, g.fabric_status, g.fabric_degraded_bandwidth) for g in inventory.gpus.values()]
    assert seen == [
        ("in_progress", None, None),  # its status field holds an error that means nothing yet
        ("completed", "Success", True),
        ("completed", "Success", False),
        ("completed", str(pynvml.NVMLError(pynvml.NVML_ERROR_NOT_READY)), None),
    ]


def test_every_field_of_the_fabric_health_mask_nvml_defines_is_read() -> None:
    """As nvml.h's NVML_GPU_FABRIC_HEALTH_GET reads a field: (mask >> SHIFT) & WIDTH, the WIDTH a bit mask. Read
    as a count of bits it took route recovery's bit for degraded bandwidth's: a GPU whose bandwidth is not
    degraded while a route recovers read as "not reported"."""
    from pytest_gbvalidate.node.fabric import fabric_reading, health_fields

    def field(name: str, value: str) -> int:
        shift = getattr(pynvml, f"NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_{name}")
        return int(getattr(pynvml, f"NVML_GPU_FABRIC_HEALTH_MASK_{name}_{value}")) << int(shift)

    mask = field("DEGRADED_BW", "FALSE") | field("ROUTE_RECOVERY", "TRUE") | field("ROUTE_UNHEALTHY", "TRUE")
    mask |= field("ACCESS_TIMEOUT_RECOVERY", "FALSE") | field("INCORRECT_CONFIGURATION", "INCORRECT_CHASSIS_SN")
    mask |= field("PARTITION_ASSIGNED", "FALSE") | field("GFM_STATE", "DISCONNECTED")
    assert health_fields(mask) == {
        "DEGRADED_BW": "FALSE",
        "ROUTE_RECOVERY": "TRUE",
        "ROUTE_UNHEALTHY": "TRUE",
        "ACCESS_TIMEOUT_RECOVERY": "FALSE",
        "INCORRECT_CONFIGURATION": "INCORRECT_CHASSIS_SN",
        "PARTITION_ASSIGNED": "FALSE",
        "GFM_STATE": "DISCONNECTED",
    }
    info = pynvml.c_nvmlGpuFabricInfo_v2_t()
    info.state, info.status, info.healthMask = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, 0, mask
    reading = fabric_reading(info)
    assert reading is not None and reading.degraded_bandwidth is False
    assert reading.health_faults == (
        "a route recovery in progress",
        "a route unhealthy",
        "an incorrect configuration: incorrect chassis sn",
        "the global fabric manager disconnected",
    )
    healthy = field("DEGRADED_BW", "FALSE") | field("INCORRECT_CONFIGURATION", "NONE") | field("GFM_STATE", "CONNECTED")
    info.healthMask = healthy
    again = fabric_reading(info)
    assert again is not None and again.health_faults == ()


def test_nvlink_error_counters_are_read_per_link_and_counter(lib: FakeNvmlLib) -> None:
    """Every counter of every link the GPU has; a counter NVML does not keep on this GPU reads as None."""
    gpu = FakeGpu(nvlinks=[True, True], nvlink_errors={(1, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT): 7})
    lib.gpus.extend([gpu, FakeGpu(nvlinks=[True], nvlink_errors=None)])
    counts = nvml.nvlink_errors(nvml.handle(0))
    assert counts == {
        0: {"replay": 0, "recovery": 0, "crc_flit": 0, "crc_data": 0},
        1: {"replay": 0, "recovery": 0, "crc_flit": 7, "crc_data": 0},
    }
    assert nvml.nvlink_errors(nvml.handle(1)) == {0: dict.fromkeys(nvml.NVLINK_ERROR_COUNTERS)}
    gpu.lost = True
    with pytest.raises(nvml.NvmlError, match="GPU is lost"):
        nvml.nvlink_errors(nvml.handle(0))


def test_the_fabric_places_each_gpu_in_a_cluster_and_clique(lib: FakeNvmlLib) -> None:
    lib.gpus.append(
        FakeGpu(
            fabric_state=pynvml.NVML_GPU_FABRIC_STATE_COMPLETED,
            fabric_cluster_uuid="1e6c5a7d-2b3f-4c8e-9a01-5d2f7b9c4e60",
            fabric_clique_id=7,
            c2c_enabled=False,
        )
    )
    h = nvml.handle(0)
    assert nvml.fabric(h) == FabricInfo("completed", "Success", None, "1e6c5a7d-2b3f-4c8e-9a01-5d2f7b9c4e60", 7)
    assert nvml.c2c_enabled(h) is False


def test_a_session_shuts_nvml_down_whatever_its_block_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML counts its starts: a start left without its shutdown keeps NVML open for the whole process."""
    fake = FakeNvmlLib([FakeGpu()])
    install(monkeypatch, fake)
    seen = []

    def block() -> None:
        with nvml.session():
            seen.append(fake.started)
            raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        block()
    assert (seen, fake.started) == ([1], 0)


# --- the driver's own verdicts ---------------------------------------------------------------------------------


class OlderDriver(FakeNvmlLib):
    """A driver whose library lacks the newer symbols: pynvml answers FUNCTION_NOT_FOUND for each."""

    LACKS = frozenset(
        {
            "nvmlDeviceGetFieldValues",
            "nvmlDeviceGetUnrepairableMemoryFlag_v1",
            "nvmlDeviceGetRepairStatus",
            "nvmlDeviceGetSramEccErrorStatus",
            "nvmlDeviceGetMarginTemperature",
        }
    )

    def __getattribute__(self, name: str) -> object:
        if name in OlderDriver.LACKS:
            raise AttributeError(name)
        return super().__getattribute__(name)


def test_the_driver_s_verdicts_are_read(lib: FakeNvmlLib) -> None:
    lib.gpus.append(
        FakeGpu(
            recovery_action=pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET,
            unrepairable_memory=1,
            repairs_pending=(1, 0),
            sram_threshold_exceeded=1,
            ecc_errors={"sram_uncorrectable": (1, 5), "sram_correctable": (0, 40)},
            margin_c=-3,
            pcie_replays=2**40,  # an unsigned long long
        )
    )
    h = nvml.handle(0)
    assert nvml.recovery_action(h) == 4 and nvml.RECOVERY_ACTIONS[4] == "DRAIN_AND_RESET"
    assert nvml.unrepairable_memory(h) is True
    assert nvml.repair_status(h) == nvml.RepairStatus(channel_repair_pending=True, tpc_repair_pending=False)
    assert nvml.sram_ecc_status(h) == nvml.SramEccStatus(True, 5, 0, 40)
    assert nvml.thermal_margin(h) == nvml.ThermalMargin(margin_c=-3, slowdown_c=-2, shutdown_c=-5)  # signed: past
    assert nvml.pcie_replays(h) == 2**40


def test_a_healthy_gpu_s_verdicts(lib: FakeNvmlLib) -> None:
    lib.gpus.append(FakeGpu())
    h = nvml.handle(0)
    assert (nvml.recovery_action(h), nvml.unrepairable_memory(h), nvml.pcie_replays(h)) == (0, False, 0)
    assert nvml.repair_status(h) == nvml.RepairStatus(False, False)
    assert nvml.sram_ecc_status(h) == nvml.SramEccStatus(False, 0, 0, 0)


@pytest.mark.parametrize("action", sorted(nvml.RECOVERY_ACTIONS))
def test_each_recovery_action_is_read_by_its_nvml_name(lib: FakeNvmlLib, action: int) -> None:
    lib.gpus.append(FakeGpu(recovery_action=action))
    assert nvml.recovery_action(nvml.handle(0)) == action
    assert getattr(pynvml, f"NVML_GPU_RECOVERY_ACTION_{nvml.RECOVERY_ACTIONS[action]}") == action


def test_a_field_the_driver_does_not_give_reads_as_none(lib: FakeNvmlLib) -> None:
    lib.gpus.append(FakeGpu(recovery_action=None, tlimits_c=(None, -2), margin_c=None, pcie_replays=None))
    h = nvml.handle(0)
    assert (nvml.recovery_action(h), nvml.pcie_replays(h)) == (None, None)
    assert nvml.thermal_margin(h) == nvml.ThermalMargin(None, slowdown_c=-2, shutdown_c=None)  # each for itself
    assert nvml.field_values(h, pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, 9999) == {230: None, 9999: None}


def test_a_gpu_without_the_functions_reads_as_none(lib: FakeNvmlLib) -> None:
    lib.gpus.append(FakeGpu(unrepairable_memory=None, repairs_pending=None, sram_threshold_exceeded=None))
    h = nvml.handle(0)
    assert (nvml.unrepairable_memory(h), nvml.repair_status(h), nvml.sram_ecc_status(h)) == (None, None, None)


def test_an_older_driver_lacks_the_verdicts_and_they_read_as_none(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, OlderDriver([FakeGpu(recovery_action=1, unrepairable_memory=1)]))
    with nvml.session():
        h = nvml.handle(0)
        assert (nvml.recovery_action(h), nvml.unrepairable_memory(h), nvml.repair_status(h)) == (None, None, None)
        assert nvml.sram_ecc_status(h) is None and nvml.pcie_replays(h) is None
        assert nvml.thermal_margin(h) == nvml.ThermalMargin(None, None, None)


def test_a_lost_gpu_s_verdicts_raise_nvml_s_words(lib: FakeNvmlLib) -> None:
    lib.gpus.append(FakeGpu(lost=False))
    h = nvml.handle(0)
    lib.gpus[0].lost = True
    with pytest.raises(nvml.NvmlError, match=r"^nvmlDeviceGetFieldValues: GPU is lost$"):
        nvml.recovery_action(h)
    with pytest.raises(nvml.NvmlError, match=r"^nvmlDeviceGetUnrepairableMemoryFlag_v1: GPU is lost$"):
        nvml.unrepairable_memory(h)
