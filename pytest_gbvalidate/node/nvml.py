"""NVML probes: the inventory of a node's GPUs and the health readings the suites check, as plain data; each reading
one small call, read live, so a GPU lost mid-run fails its own tests. No pytest; pynvml is imported on first use.
Every NVML failure is raised as NvmlError, with NVML's own text ("GPU is lost"), so a failed check says what NVML
said; a feature this GPU or driver lacks (NVLink on a PCIe card, a function of a newer driver) reads as None. `call`
is the one way in to NVML, for the probes beside this module too (fabric.py, telemetry.py)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pytest_gbvalidate.node.fabric import FabricInfo, fabric_reading

# NVML fills affinity masks into arrays of 64-bit words; these sizes cover 4096 CPUs and 1024 NUMA nodes.
_CPU_SET_WORDS = 64
_NODE_SET_WORDS = 16
_WORD_BITS = 64

# Clock event reasons that mean a fault, heat or the power brake; not idle, application clocks, sync boost, power cap.
SLOWDOWN_REASONS = {
    0x08: "hw_slowdown",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
}
SW_POWER_CAP = 0x04  # the clocks are held down to stay within the power limit: expected under full load
_COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}
ECC_COUNTERS = ("sram_uncorrectable", "sram_correctable", "dram_uncorrectable", "dram_correctable")
# NVLink data-link error counters, since the driver was loaded: replays and recoveries (a link retrained), and
# CRC errors on flits and on data. NVML's names: NVML_NVLINK_ERROR_DL_<name>.
NVLINK_ERROR_COUNTERS = ("replay", "recovery", "crc_flit", "crc_data")
# nvmlValueType_t -> the member of nvmlValue_t that holds a value of that type
_VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
FI_PCIE_REPLAY_COUNTER = 94  # NVML_FI_DEV_PCIE_REPLAY_COUNTER: PCIe replays since the driver loaded
# The T.Limit readings at which the GPU shuts down and slows down (nvidia-smi's "GPU Shutdown T.Limit Temp", e.g.
# -5 C, and "GPU Slowdown T.Limit Temp", -2 C): thresholds on the scale of the margin, not the margin itself.
FI_SHUTDOWN_TLIMIT = 193  # NVML_FI_DEV_TEMPERATURE_SHUTDOWN_TLIMIT
FI_SLOWDOWN_TLIMIT = 194  # NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT
FI_GPU_RECOVERY_ACTION = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: what the driver says the GPU needs
# nvmlDeviceGpuRecoveryAction_t (NVML_GPU_RECOVERY_ACTION_<name>), from 0
_ACTION_NAMES = "NONE GPU_RESET NODE_REBOOT DRAIN_P2P DRAIN_AND_RESET RECOVER_IMEX_DOMAIN BUS_RESET SYSTEM_REBOOT"
RECOVERY_ACTIONS = dict(enumerate(_ACTION_NAMES.split()))


class NvmlError(Exception):
    """An NVML call failed. `code` is NVML's return code; the message names the call and NVML's text."""

    def __init__(self, call: str, text: str, code: int) -> None:
        super().__init__(f"{call}: {text}")
        self.call, self.text, self.code = call, text, code


def call(name: str, *args: Any) -> Any:
    """`pynvml.<name>(*args)`, with NVML's failure raised as NvmlError."""
    import pynvml

    try:
        return getattr(pynvml, name)(*args)
    except pynvml.NVMLError as exc:
        raise NvmlError(name, str(exc), int(exc.value)) from None


def _optional(name: str, *args: Any) -> Any:
    """Like `call`, but None where this GPU or driver lacks the feature."""
    import pynvml

    absent = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    try:
        return call(name, *args)
    except NvmlError as exc:
        if exc.code in absent:
            return None
        raise


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@contextlib.contextmanager
def session() -> Iterator[None]:
    """NVML started for the block and shut down after it, whatever it raises (NVML counts its starts). A shutdown that
    fails is not raised: the block's readings stand, and a driver that died mid-run has failed its checks already."""
    call("nvmlInit")
    try:
        yield
    finally:
        with contextlib.suppress(NvmlError):
            call("nvmlShutdown")


def gpu_count() -> int:
    """How many GPUs NVML lists; NVML started (`session`)."""
    return int(call("nvmlDeviceGetCount"))


def gpus_seen() -> int | str:
    """How many GPUs NVML lists, asked in a session of its own; NVML's own words where it cannot count them."""
    try:
        with session():
            return gpu_count()
    except NvmlError as exc:
        return exc.text


def handle(index: int) -> Any:
    return call("nvmlDeviceGetHandleByIndex", index)


def ecc_mode(h: Any) -> tuple[bool, bool] | None:
    """(current, pending) ECC mode; pending is what the GPU comes up with after the next reset."""
    modes = _optional("nvmlDeviceGetEccMode", h)
    return None if modes is None else (bool(modes[0]), bool(modes[1]))


@dataclass(frozen=True)
class EccCount:
    volatile: int | None  # since the driver was loaded
    aggregate: int | None  # over the GPU's life


def ecc_counts(h: Any) -> dict[str, EccCount]:
    """Memory error counts by location (SRAM: caches and register files; DRAM: device memory) and kind."""
    import pynvml

    kinds = {
        "uncorrectable": pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
        "correctable": pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
    }
    locations = {"sram": pynvml.NVML_MEMORY_LOCATION_SRAM, "dram": pynvml.NVML_MEMORY_LOCATION_DRAM}
    counts = {}
    for name in ECC_COUNTERS:
        location, kind = name.split("_")
        volatile, aggregate = (
            _optional("nvmlDeviceGetMemoryErrorCounter", h, kinds[kind], counter, locations[location])
            for counter in (pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC)
        )
        counts[name] = EccCount(volatile, aggregate)
    return counts


@dataclass(frozen=True)
class RowRemaps:
    """Row remapping (A100 and later): spare DRAM rows replacing rows that had errors."""

    corrected_rows: int
    uncorrected_rows: int
    pending: bool  # a remap waits for the next GPU reset
    failed: bool  # a remap failed: the GPU ran out of spare rows


def row_remaps(h: Any) -> RowRemaps | None:
    rows = _optional("nvmlDeviceGetRemappedRows", h)
    return None if rows is None else RowRemaps(int(rows[0]), int(rows[1]), bool(rows[2]), bool(rows[3]))


@dataclass(frozen=True)
class RetiredPages:
    """Dynamic page retirement (before A100): device memory pages taken out of service."""

    single_bit: int  # retired after multiple single-bit errors
    double_bit: int  # retired after a double-bit error
    pending: bool  # a retirement waits for the next reboot


def retired_pages(h: Any) -> RetiredPages | None:
    import pynvml

    if (pending := _optional("nvmlDeviceGetRetiredPagesPendingStatus", h)) is None:
        return None
    single = call("nvmlDeviceGetRetiredPages", h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
    double = call("nvmlDeviceGetRetiredPages", h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
    return RetiredPages(len(single), len(double), bool(pending))


def clocks_event_reasons(h: Any) -> int:
    """The bit mask of reasons the clocks are below their maximum now (NVML's 'clocks event reasons')."""
    return int(call("nvmlDeviceGetCurrentClocksEventReasons", h))


def slowdown_reasons(mask: int) -> list[str]:
    """The names of the slowdowns in a clocks event reason mask that are faults, heat or the power brake."""
    return [name for bit, name in SLOWDOWN_REASONS.items() if mask & bit]


def c2c_enabled(h: Any) -> bool | None:
    """Whether NVLink-C2C to a Grace CPU is enabled; None on a GPU without C2C."""
    info = _optional("nvmlDeviceGetC2cModeInfoV", h)
    return None if info is None else bool(info.isC2cEnabled)


@dataclass(frozen=True)
class GpuProcess:
    pid: int  # in the host's process namespace: in a container, perhaps no process this one can see
    used_bytes: int | None  # None where the driver does not say


def compute_processes(h: Any) -> list[GpuProcess]:
    """The processes holding a CUDA context on the GPU (nvidia-smi's compute apps)."""
    return [
        GpuProcess(int(p.pid), None if p.usedGpuMemory is None else int(p.usedGpuMemory))
        for p in call("nvmlDeviceGetComputeRunningProcesses", h)
    ]


def persistence_mode(h: Any) -> bool | None:
    mode = _optional("nvmlDeviceGetPersistenceMode", h)
    return None if mode is None else bool(mode)


@dataclass(frozen=True)
class PcieLink:
    gen: int
    gen_max: int  # the highest generation this GPU and its slot support together
    width: int
    width_max: int


def pcie_link(h: Any) -> PcieLink | None:
    if (gen := _optional("nvmlDeviceGetCurrPcieLinkGeneration", h)) is None:
        return None
    rest = ("nvmlDeviceGetMaxPcieLinkGeneration", "nvmlDeviceGetCurrPcieLinkWidth", "nvmlDeviceGetMaxPcieLinkWidth")
    return PcieLink(int(gen), *(int(call(name, h)) for name in rest))


def nvlinks(h: Any) -> dict[int, bool]:
    """Link number -> active, for every NVLink this GPU has (none on a GPU without NVLink)."""
    import pynvml

    no_such_link = (pynvml.NVML_ERROR_INVALID_ARGUMENT, pynvml.NVML_ERROR_NOT_SUPPORTED)
    states = {}
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            states[link] = bool(call("nvmlDeviceGetNvLinkState", h, link))
        except NvmlError as exc:
            if exc.code not in no_such_link:
                raise
    return states


def nvlink_errors(h: Any) -> dict[int, dict[str, int | None]]:
    """Link -> counter -> count, for every NVLink this GPU has; None where NVML does not count it."""
    import pynvml

    counts: dict[int, dict[str, int | None]] = {}
    for link in nvlinks(h):
        counts[link] = {}
        for name in NVLINK_ERROR_COUNTERS:
            kind = getattr(pynvml, f"NVML_NVLINK_ERROR_DL_{name.upper()}")
            count = _optional("nvmlDeviceGetNvLinkErrorCounter", h, link, kind)
            counts[link][name] = None if count is None else int(count)
    return counts


def field_values(h: Any, *field_ids: int) -> dict[int, int | float | None]:
    """NVML field values by field id; None where this GPU or driver gives none (the entry's code, or no function)."""
    import pynvml

    read: dict[int, int | float | None] = dict.fromkeys(field_ids)
    for entry in _optional("nvmlDeviceGetFieldValues", h, list(field_ids)) or ():
        if entry.nvmlReturn == pynvml.NVML_SUCCESS and entry.fieldId in read:
            read[int(entry.fieldId)] = getattr(entry.value, _VALUE_MEMBERS.get(entry.valueType, "ullVal"))
    return read


def recovery_action(h: Any) -> int | None:
    """The driver's recovery action for the GPU (RECOVERY_ACTIONS; 0: none); None where the driver has none."""
    action = field_values(h, FI_GPU_RECOVERY_ACTION)[FI_GPU_RECOVERY_ACTION]
    return None if action is None else int(action)


def unrepairable_memory(h: Any) -> bool | None:
    """Whether the GPU's memory has a fault it cannot repair (row remapping and channel repair exhausted)."""
    flag = _optional("nvmlDeviceGetUnrepairableMemoryFlag_v1", h)
    return None if flag is None else bool(flag)


@dataclass(frozen=True)
class RepairStatus:
    """Repairs the GPU made that take effect at its next reset (Blackwell)."""

    channel_repair_pending: bool  # an HBM channel repair
    tpc_repair_pending: bool  # a TPC (texture processing cluster) repair


def repair_status(h: Any) -> RepairStatus | None:
    status = _optional("nvmlDeviceGetRepairStatus", h)
    return None if status is None else RepairStatus(bool(status[0]), bool(status[1]))


@dataclass(frozen=True)
class SramEccStatus:
    """SRAM ECC errors over the GPU's life, and whether they passed the driver's threshold for this GPU."""

    threshold_exceeded: bool
    uncorrectable_parity: int
    uncorrectable_secded: int
    correctable: int


def sram_ecc_status(h: Any) -> SramEccStatus | None:
    import pynvml

    s = pynvml.c_nvmlEccSramErrorStatus_v1_t()
    if _optional("nvmlDeviceGetSramEccErrorStatus", h, pynvml.byref(s)) is None:
        return None
    return SramEccStatus(
        bool(s.bThresholdExceeded), int(s.aggregateUncParity), int(s.aggregateUncSecDed), int(s.aggregateCor)
    )


@dataclass(frozen=True)
class ThermalMargin:
    """The GPU's thermal margin now (nvidia-smi's "GPU T.Limit Temp": degrees C below its T.Limit, negative past it;
    nvmlDeviceGetMarginTemperature) and the margins at which it slows down and shuts down (fields 194, 193)."""

    margin_c: int | None
    slowdown_c: int | None
    shutdown_c: int | None


def thermal_margin(h: Any) -> ThermalMargin:
    limits = field_values(h, FI_SLOWDOWN_TLIMIT, FI_SHUTDOWN_TLIMIT)
    read = (_optional("nvmlDeviceGetMarginTemperature", h), limits[FI_SLOWDOWN_TLIMIT], limits[FI_SHUTDOWN_TLIMIT])
    return ThermalMargin(*(None if value is None else int(value) for value in read))


def pcie_replays(h: Any) -> int | None:
    """PCIe replays (a packet sent again after a link error) since the driver loaded."""
    count = field_values(h, FI_PCIE_REPLAY_COUNTER)[FI_PCIE_REPLAY_COUNTER]
    return None if count is None else int(count)


@dataclass(frozen=True)
class Clocks:
    """MHz: now, as the application clocks set them (`nvidia-smi -ac <memory>,<graphics>`), and the maximum.
    Application clocks are set for the graphics and memory domains; the SMs run at the graphics clock."""

    sm_mhz: int | None
    sm_max_mhz: int | None
    graphics_mhz: int | None
    graphics_app_mhz: int | None
    graphics_max_mhz: int | None
    mem_mhz: int | None
    mem_app_mhz: int | None
    mem_max_mhz: int | None


def clocks(h: Any) -> Clocks:
    import pynvml

    now, app, top = "nvmlDeviceGetClockInfo", "nvmlDeviceGetApplicationsClock", "nvmlDeviceGetMaxClockInfo"
    sm, gr, mem = pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_GRAPHICS, pynvml.NVML_CLOCK_MEM
    readings = [(now, sm), (top, sm), (now, gr), (app, gr), (top, gr), (now, mem), (app, mem), (top, mem)]
    return Clocks(*(_optional(name, h, domain) for name, domain in readings))


@dataclass(frozen=True)
class GpuInfo:
    """What one GPU is and how it is set up, read once when the session starts."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str
    serial: str | None
    memory_total_bytes: int
    driver_version: str
    cuda_driver_version: str
    vbios_version: str | None
    ecc_mode: tuple[bool, bool] | None  # (current, pending)
    persistence_mode: bool | None
    compute_mode: str | None
    power_limit_w: float | None
    clocks: Clocks
    pcie: PcieLink | None
    nvlinks: dict[int, bool]  # link -> active
    c2c_enabled: bool | None  # NVLink-C2C to a Grace CPU
    fabric_state: str | None  # NVLink fabric registration (multi-node NVLink): not_started ... completed
    fabric_status: str | None  # NVML's word on the registration's result: defined once the state is completed
    # The fabric's health mask (GB200 on): the NVLink bandwidth degraded (True), not (False), or not reported.
    fabric_degraded_bandwidth: bool | None
    mig_mode: tuple[bool, bool] | None  # (current, pending)
    numa_nodes: tuple[int, ...] | None  # the NUMA nodes NVML says are closest to the GPU
    cpu_affinity: tuple[int, ...] | None  # the CPUs NVML says are closest to the GPU
    memory_numa_node: int | None  # the NUMA node that is this GPU's own memory (Grace systems)
    fabric_cluster_uuid: str | None = None  # the NVLink domain the fabric manager placed the GPU in
    fabric_clique_id: int | None = None  # ... and the partition of it

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Inventory:
    """The GPUs NVML lists. A GPU that NVML counts but that fails to answer is in `failed`, with the error."""

    count: int
    gpus: dict[int, GpuInfo]
    failed: dict[int, str]
    handles: dict[int, Any]

    def as_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "devices": [g.as_dict() for g in self.gpus.values()],
            "failed": {str(i): e for i, e in self.failed.items()},
        }


def read_inventory() -> Inventory:
    """Every GPU's inventory, NVML started (`session`). Raises NvmlError if NVML cannot count the GPUs."""
    count = gpu_count()
    driver = _text(call("nvmlSystemGetDriverVersion"))
    cuda = int(call("nvmlSystemGetCudaDriverVersion"))
    cuda_version = f"{cuda // 1000}.{cuda % 1000 // 10}"
    gpus, failed, handles = {}, {}, {}
    for index in range(count):
        try:
            h = handle(index)
            gpus[index] = _gpu_info(index, h, driver, cuda_version)
            handles[index] = h
        except NvmlError as exc:
            failed[index] = str(exc)
    return Inventory(count, gpus, failed, handles)


def _gpu_info(index: int, h: Any, driver: str, cuda_version: str) -> GpuInfo:
    import pynvml

    pci = call("nvmlDeviceGetPciInfo", h)
    power_limit_mw = _optional("nvmlDeviceGetPowerManagementLimit", h)
    compute_mode = _optional("nvmlDeviceGetComputeMode", h)
    serial, vbios = _optional("nvmlDeviceGetSerial", h), _optional("nvmlDeviceGetVbiosVersion", h)
    mig, enabled = _optional("nvmlDeviceGetMigMode", h), pynvml.NVML_DEVICE_MIG_ENABLE
    numa_nodes, cpus = _affinity(h)
    registration = fabric(h)
    return GpuInfo(
        index=index,
        uuid=_text(call("nvmlDeviceGetUUID", h)),
        name=_text(call("nvmlDeviceGetName", h)),
        pci_bus_id=_text(pci.busId),
        serial=None if serial is None else _text(serial),
        memory_total_bytes=int(call("nvmlDeviceGetMemoryInfo", h).total),
        driver_version=driver,
        cuda_driver_version=cuda_version,
        vbios_version=None if vbios is None else _text(vbios),
        ecc_mode=ecc_mode(h),
        persistence_mode=persistence_mode(h),
        compute_mode=None if compute_mode is None else _COMPUTE_MODES.get(compute_mode, str(compute_mode)),
        power_limit_w=None if power_limit_mw is None else power_limit_mw / 1000.0,
        clocks=clocks(h),
        pcie=pcie_link(h),
        nvlinks=nvlinks(h),
        c2c_enabled=c2c_enabled(h),
        fabric_state=None if registration is None else registration.state,
        fabric_status=None if registration is None else registration.status,
        fabric_degraded_bandwidth=None if registration is None else registration.degraded_bandwidth,
        mig_mode=None if mig is None else (mig[0] == enabled, mig[1] == enabled),
        numa_nodes=numa_nodes,
        cpu_affinity=cpus,
        memory_numa_node=_optional("nvmlDeviceGetNumaNodeId", h),
        fabric_cluster_uuid=None if registration is None else registration.cluster_uuid,
        fabric_clique_id=None if registration is None else registration.clique_id,
    )


def _affinity(h: Any) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
    import pynvml

    nodes = _optional("nvmlDeviceGetMemoryAffinity", h, _NODE_SET_WORDS, pynvml.NVML_AFFINITY_SCOPE_NODE)
    cpus = _optional("nvmlDeviceGetCpuAffinity", h, _CPU_SET_WORDS)
    return (None if nodes is None else _bits(nodes)), (None if cpus is None else _bits(cpus))


def _bits(words: Any) -> tuple[int, ...]:
    return tuple(w * _WORD_BITS + b for w, word in enumerate(words) for b in range(_WORD_BITS) if word >> b & 1)


def fabric(h: Any) -> FabricInfo | None:
    """The GPU's NVLink fabric registration (fabric.py decodes it); None where the GPU or driver has no fabric."""
    import pynvml

    info = pynvml.c_nvmlGpuFabricInfo_v2_t()
    info.version = pynvml.nvmlGpuFabricInfo_v2
    if _optional("nvmlDeviceGetGpuFabricInfoV", h, pynvml.byref(info)) is None:
        return None
    return fabric_reading(info)
