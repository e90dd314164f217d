"""A fake NVML library beneath the real nvidia-ml-py bindings, so the real `pynvml` code runs in tests.

pynvml loads libnvidia-ml.so into `pynvml.nvmlLib` and looks each C symbol up on it by name; `install` puts a
FakeNvmlLib there instead. Its methods are those C symbols and take the same ctypes arguments; a symbol it lacks
surfaces as NVMLError_FunctionNotFound, as with an old driver. Each FakeGpu is one GPU's state: tests inject a
fault by changing a field (`gpu.lost = True`, `gpu.nvlinks[3] = False`, ...). Test-only: nothing outside
tests/ imports this.
"""

from __future__ import annotations

import ctypes
import functools
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pynvml
import pytest

SUCCESS: int = pynvml.NVML_SUCCESS
IDLE = 0x1  # nvmlClocksEventReasonGpuIdle
HW_SLOWDOWN, HW_THERMAL_SLOWDOWN, SW_POWER_CAP = 0x08, 0x40, 0x04

_CLOCKS = {pynvml.NVML_CLOCK_SM: "sm", pynvml.NVML_CLOCK_GRAPHICS: "graphics", pynvml.NVML_CLOCK_MEM: "mem"}
_ECC_KINDS = {
    pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED: "uncorrectable",
    pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED: "correctable",
}
_ECC_LOCATIONS = {pynvml.NVML_MEMORY_LOCATION_SRAM: "sram", pynvml.NVML_MEMORY_LOCATION_DRAM: "dram"}


class NotSupported(Exception):
    """Raised inside a fake symbol: the GPU answers NVML_ERROR_NOT_SUPPORTED."""


class VersionMismatch(Exception):
    """Raised inside a fake symbol: a versioned struct came with another version than the symbol's
    (NVML_ERROR_ARGUMENT_VERSION_MISMATCH), as the real library answers."""


def supported(value: Any) -> Any:
    if value is None:
        raise NotSupported
    return value


def clocks_mhz(graphics: int, mem: int) -> dict[str, int | None]:
    """Clock domain (+ "_app" / "_max") -> MHz, all at their maximum; an idle GPU would run lower."""
    return {
        f"{domain}{kind}": mhz
        for domain, mhz in (("sm", graphics), ("graphics", graphics), ("mem", mem))
        for kind in ("", "_app", "_max")
    }


def default_clocks() -> dict[str, int | None]:
    return clocks_mhz(1980, 2619)


@dataclass
class FakeGpu:
    name: str = "NVIDIA GB200"
    pci_bus_id: str = "00000000:01:00.0"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000001"
    serial: str | None = "1650000000001"
    vbios_version: str | None = "97.00.00.00.01"
    memory_total_bytes: int = 80 * 2**30
    memory_used_bytes: int = 512 * 2**20
    ecc_mode: tuple[int, int] | None = (1, 1)  # (current, pending)
    persistence_mode: int | None = 1
    compute_mode: int = 0
    power_limit_mw: int | None = 700_000
    power_usage_mw: int = 95_000
    temperature_c: int = 31
    utilization_pct: int = 0
    clocks_mhz: dict[str, int | None] = field(default_factory=default_clocks)  # None: not supported
    pcie: tuple[int, int, int, int] | None = (5, 5, 16, 16)  # gen, max gen, width, max width
    nvlinks: list[bool] = field(default_factory=list)  # active, per link
    c2c_enabled: bool | None = None
    fabric_state: int | None = None  # NVML_GPU_FABRIC_STATE_*; None: not supported
    fabric_status: int = SUCCESS  # NVML defines it once the state is completed
    fabric_health_mask: int = 0  # NVML_GPU_FABRIC_HEALTH_MASK_*, shifted into place
    fabric_cluster_uuid: str = "00000000-0000-0000-0000-000000000000"  # the NVLink domain
    fabric_clique_id: int = 0
    # (link, NVML_NVLINK_ERROR_DL_*) -> count; a counter not listed is 0. None: NVML keeps no NVLink error counters.
    nvlink_errors: dict[tuple[int, int], int] | None = field(default_factory=dict)
    mig_mode: tuple[int, int] | None = None
    numa_nodes: list[int] = field(default_factory=lambda: [0])  # NVML memory affinity
    cpus: list[int] = field(default_factory=lambda: [0, 1])  # NVML CPU affinity
    memory_numa_node: int | None = None  # Grace systems: the GPU memory's own NUMA node
    ecc_errors: dict[str, tuple[int, int]] = field(default_factory=dict)  # "sram_uncorrectable": (volatile, aggr.)
    row_remaps: tuple[int, int, int, int] | None = (0, 0, 0, 0)  # corrected, uncorrected, pending, failed
    retired_pages: tuple[int, int, int] | None = None  # single-bit, double-bit, pending
    clocks_event_reasons: int = IDLE
    lost: bool = False  # fell off the bus: every call answers NVML_ERROR_GPU_IS_LOST
    processes: list[tuple[int, int]] = field(default_factory=list)  # compute processes: (pid, used bytes)
    # The driver's own verdicts. None: this GPU or driver does not give it (a field value answers NOT_SUPPORTED in
    # its entry, a function NOT_SUPPORTED).
    recovery_action: int | None = 0  # NVML_GPU_RECOVERY_ACTION_*
    unrepairable_memory: int | None = 0
    repairs_pending: tuple[int, int] | None = (0, 0)  # channel repair, TPC repair
    sram_threshold_exceeded: int | None = 0  # its counts: ecc_errors' sram_* aggregates
    # The T.Limit margins at which the GPU shuts down and slows down (fields 193, 194), as H100s report them, and the
    # margin now (nvmlDeviceGetMarginTemperature: degrees C below the T.Limit; an idle GPU sits far below it).
    tlimits_c: tuple[int | None, int | None] = (-5, -2)
    margin_c: int | None = 45
    pcie_replays: int | None = 0

    def field_values(self) -> dict[int, tuple[int, int | None]]:
        """NVML field id -> (nvmlValueType_t, value) for the fields this fake keeps."""
        return {
            pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: (pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, self.recovery_action),
            pynvml.NVML_FI_DEV_TEMPERATURE_SHUTDOWN_TLIMIT: (pynvml.NVML_VALUE_TYPE_SIGNED_INT, self.tlimits_c[0]),
            pynvml.NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT: (pynvml.NVML_VALUE_TYPE_SIGNED_INT, self.tlimits_c[1]),
            pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER: (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, self.pcie_replays),
        }


def _out(ref: Any, value: Any) -> None:
    """Write an out-parameter pynvml passed as byref(c_uint())."""
    ref._obj.value = value


def _per_gpu(symbol: Callable[..., None]) -> Callable[..., int]:
    """A per-GPU NVML symbol: the handle becomes the FakeGpu, a lost GPU answers GPU_IS_LOST, and a field the
    GPU lacks (None) answers NOT_SUPPORTED."""

    @functools.wraps(symbol)
    def call(self: FakeNvmlLib, handle: Any, *args: Any) -> int:
        gpu = self.gpu(handle)
        if gpu.lost:
            return int(pynvml.NVML_ERROR_GPU_IS_LOST)
        try:
            symbol(self, gpu, *args)
        except NotSupported:
            return int(pynvml.NVML_ERROR_NOT_SUPPORTED)
        except VersionMismatch:
            return int(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        except IndexError:
            return int(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return SUCCESS

    return call


@dataclass
class FakeNvmlLib:
    gpus: list[FakeGpu] = field(default_factory=list)
    driver_version: str = "570.133.20"
    cuda_driver_version: int = 12080
    init_error: int = SUCCESS  # e.g. pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    started: int = 0  # NVML's reference count of starts: each successful init, less each shutdown

    def nvmlInitWithFlags(self, flags: Any) -> int:
        if self.init_error == SUCCESS:
            self.started += 1
        return self.init_error

    def nvmlShutdown(self) -> int:
        if self.started == 0:
            return int(pynvml.NVML_ERROR_UNINITIALIZED)
        self.started -= 1
        return SUCCESS

    def nvmlSystemGetDriverVersion(self, buf: Any, size: Any) -> int:
        buf.value = self.driver_version.encode()
        return SUCCESS

    def nvmlSystemGetCudaDriverVersion(self, ref: Any) -> int:
        ref._obj.value = self.cuda_driver_version
        return SUCCESS

    def nvmlDeviceGetCount_v2(self, ref: Any) -> int:
        ref._obj.value = len(self.gpus)
        return SUCCESS

    def nvmlDeviceGetHandleByIndex_v2(self, index: Any, ref: Any) -> int:
        if not 0 <= index.value < len(self.gpus):
            return int(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if self.gpus[index.value].lost:
            return int(pynvml.NVML_ERROR_GPU_IS_LOST)
        handle = ref._obj  # a c_nvmlDevice_t pointer: store index + 1 as its address
        ctypes.memmove(ctypes.addressof(handle), ctypes.byref(ctypes.c_size_t(index.value + 1)), ctypes.sizeof(handle))
        return SUCCESS

    def gpu(self, handle: Any) -> FakeGpu:
        address = ctypes.cast(handle, ctypes.c_void_p).value
        assert address is not None
        return self.gpus[address - 1]

    # --- inventory ----------------------------------------------------------------------------------------

    @_per_gpu
    def nvmlDeviceGetName(self, gpu: FakeGpu, buf: Any, size: Any) -> None:
        buf.value = gpu.name.encode()

    @_per_gpu
    def nvmlDeviceGetUUID(self, gpu: FakeGpu, buf: Any, size: Any) -> None:
        buf.value = gpu.uuid.encode()

    @_per_gpu
    def nvmlDeviceGetPciInfo_v3(self, gpu: FakeGpu, ref: Any) -> None:
        ref._obj.busId = gpu.pci_bus_id.encode()

    @_per_gpu
    def nvmlDeviceGetSerial(self, gpu: FakeGpu, buf: Any, size: Any) -> None:
        buf.value = supported(gpu.serial).encode()

    @_per_gpu
    def nvmlDeviceGetVbiosVersion(self, gpu: FakeGpu, buf: Any, size: Any) -> None:
        buf.value = supported(gpu.vbios_version).encode()

    @_per_gpu
    def nvmlDeviceGetMemoryInfo(self, gpu: FakeGpu, ref: Any) -> None:
        ref._obj.total = gpu.memory_total_bytes
        ref._obj.used = gpu.memory_used_bytes
        ref._obj.free = gpu.memory_total_bytes - gpu.memory_used_bytes

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any, count_ref: Any, procs: Any) -> int:
        """NVML's two calls: the count (INSUFFICIENT_SIZE where there are processes), then the array."""
        gpu = self.gpu(handle)
        if gpu.lost:
            return int(pynvml.NVML_ERROR_GPU_IS_LOST)
        count = count_ref._obj
        if not gpu.processes:
            count.value = 0
            return SUCCESS
        if procs is None or count.value < len(gpu.processes):
            count.value = len(gpu.processes)
            return int(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        for i, (pid, used) in enumerate(gpu.processes):
            procs[i].pid = pid
            procs[i].usedGpuMemory = used
        count.value = len(gpu.processes)
        return SUCCESS

    @_per_gpu
    def nvmlDeviceGetEccMode(self, gpu: FakeGpu, current: Any, pending: Any) -> None:
        _out(current, supported(gpu.ecc_mode)[0])
        _out(pending, gpu.ecc_mode[1] if gpu.ecc_mode else 0)

    @_per_gpu
    def nvmlDeviceGetPersistenceMode(self, gpu: FakeGpu, ref: Any) -> None:
        _out(ref, supported(gpu.persistence_mode))

    @_per_gpu
    def nvmlDeviceGetComputeMode(self, gpu: FakeGpu, ref: Any) -> None:
        _out(ref, gpu.compute_mode)

    @_per_gpu
    def nvmlDeviceGetPowerManagementLimit(self, gpu: FakeGpu, ref: Any) -> None:
        _out(ref, supported(gpu.power_limit_mw))

    @_per_gpu
    def nvmlDeviceGetClockInfo(self, gpu: FakeGpu, clock: Any, ref: Any) -> None:
        _out(ref, supported(gpu.clocks_mhz.get(_CLOCKS[clock.value])))

    @_per_gpu
    def nvmlDeviceGetApplicationsClock(self, gpu: FakeGpu, clock: Any, ref: Any) -> None:
        _out(ref, supported(gpu.clocks_mhz.get(_CLOCKS[clock.value] + "_app")))

    @_per_gpu
    def nvmlDeviceGetMaxClockInfo(self, gpu: FakeGpu, clock: Any, ref: Any) -> None:
        _out(ref, supported(gpu.clocks_mhz.get(_CLOCKS[clock.value] + "_max")))

    @_per_gpu
    def nvmlDeviceGetCurrPcieLinkGeneration(self, gpu: FakeGpu, ref: Any) -> None:
        _out(ref, supported(gpu.pcie)[0])

    @_per_gpu
    def nvmlDeviceGetMaxPcieLinkGeneration(self, gpu: FakeGpu, ref: Any) -> None:
        _out(ref, supported(gpu.pcie)[1])

    @_per_gpu
    def nvmlDeviceGetCurrPcieLinkWidth(self, gpu: FakeGpu, ref: Any) -> None:
        _out(ref, supported(gpu.pcie)[2])

    @_per_gpu
    def nvmlDeviceGetMaxPcieLinkWidth(self, gpu: FakeGpu, ref: Any) -> None:
        _out(ref, supported(gpu.pcie)[3])

    @_per_gpu
    def nvmlDeviceGetNvLinkState(self, gpu: FakeGpu, link: int, ref: Any) -> None:
        _out(ref, int(gpu.nvlinks[link]))  # IndexError -> INVALID_ARGUMENT, as past the GPU's last link

    @_per_gpu
    def nvmlDeviceGetC2cModeInfoV(self, gpu: FakeGpu, ref: Any) -> None:
        ref._obj.isC2cEnabled = int(supported(gpu.c2c_enabled))

    @_per_gpu
    def nvmlDeviceGetGpuFabricInfoV(self, gpu: FakeGpu, ref: Any) -> None:
        if ref._obj.version != pynvml.nvmlGpuFabricInfo_v2:  # a versioned struct: the caller names its version
            raise VersionMismatch
        ref._obj.state = supported(gpu.fabric_state)
        ref._obj.status = gpu.fabric_status
        ref._obj.healthMask = gpu.fabric_health_mask
        ref._obj.cliqueId = gpu.fabric_clique_id
        ref._obj.clusterUuid[:] = list(uuid.UUID(gpu.fabric_cluster_uuid).bytes)

    @_per_gpu
    def nvmlDeviceGetMigMode(self, gpu: FakeGpu, current: Any, pending: Any) -> None:
        _out(current, supported(gpu.mig_mode)[0])
        _out(pending, gpu.mig_mode[1] if gpu.mig_mode else 0)

    @_per_gpu
    def nvmlDeviceGetMemoryAffinity(self, gpu: FakeGpu, words: int, ref: Any, scope: Any) -> None:
        _set_bits(ref._obj, gpu.numa_nodes)

    @_per_gpu
    def nvmlDeviceGetCpuAffinity(self, gpu: FakeGpu, words: int, ref: Any) -> None:
        _set_bits(ref._obj, gpu.cpus)

    @_per_gpu
    def nvmlDeviceGetNumaNodeId(self, gpu: FakeGpu, ref: Any) -> None:
        _out(ref, supported(gpu.memory_numa_node))

    # --- health -------------------------------------------------------------------------------------------

    @_per_gpu
    def nvmlDeviceGetMemoryErrorCounter(self, gpu: FakeGpu, kind: Any, counter: Any, where: Any, ref: Any) -> None:
        if gpu.ecc_mode is None or not gpu.ecc_mode[0]:
            raise NotSupported
        name = f"{_ECC_LOCATIONS[where.value]}_{_ECC_KINDS[kind.value]}"
        _out(ref, gpu.ecc_errors.get(name, (0, 0))[counter.value])

    @_per_gpu
    def nvmlDeviceGetNvLinkErrorCounter(self, gpu: FakeGpu, link: int, counter: int, ref: Any) -> None:
        gpu.nvlinks[link]  # IndexError -> INVALID_ARGUMENT, as past the GPU's last link
        if not 0 <= counter < pynvml.NVML_NVLINK_ERROR_COUNT:
            raise IndexError
        _out(ref, supported(gpu.nvlink_errors).get((link, counter), 0))

    @_per_gpu
    def nvmlDeviceGetRemappedRows(self, gpu: FakeGpu, corr: Any, unc: Any, pending: Any, failed: Any) -> None:
        for ref, value in zip((corr, unc, pending, failed), supported(gpu.row_remaps), strict=True):
            _out(ref, value)

    @_per_gpu
    def nvmlDeviceGetRetiredPagesPendingStatus(self, gpu: FakeGpu, ref: Any) -> None:
        _out(ref, supported(gpu.retired_pages)[2])

    def nvmlDeviceGetRetiredPages(self, handle: Any, cause: Any, count: Any, pages: Any) -> int:
        gpu = self.gpu(handle)
        if gpu.retired_pages is None:
            return int(pynvml.NVML_ERROR_NOT_SUPPORTED)
        n = gpu.retired_pages[cause.value]
        if pages is None:  # pynvml asks for the size first
            _out(count, n)
            return int(pynvml.NVML_ERROR_INSUFFICIENT_SIZE) if n else SUCCESS
        for i in range(n):
            pages[i] = 0x1000 * (i + 1)
        _out(count, n)
        return SUCCESS

    @_per_gpu
    def nvmlDeviceGetCurrentClocksEventReasons(self, gpu: FakeGpu, ref: Any) -> None:
        _out(ref, gpu.clocks_event_reasons)

    @_per_gpu
    def nvmlDeviceGetFieldValues(self, gpu: FakeGpu, count: Any, ref: Any) -> None:
        """Each entry answers for itself: a field the GPU lacks (None, or one this fake does not keep) says
        NOT_SUPPORTED in its own nvmlReturn, as the real library does; the call itself succeeds."""
        kept = gpu.field_values()
        for i in range(count.value):
            entry = ref._obj[i]  # the array's own memory (a slice would copy)
            kind, value = kept.get(entry.fieldId, (pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, None))
            entry.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED if value is None else SUCCESS
            entry.valueType = kind
            if value is not None:
                member = "siVal" if kind == pynvml.NVML_VALUE_TYPE_SIGNED_INT else "ullVal"
                member = "uiVal" if kind == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT else member
                setattr(entry.value, member, value)

    @_per_gpu
    def nvmlDeviceGetUnrepairableMemoryFlag_v1(self, gpu: FakeGpu, ref: Any) -> None:
        if ref._obj.version != pynvml.nvmlUnrepairableMemory_v1:
            raise VersionMismatch
        ref._obj.unrepairableMemory = supported(gpu.unrepairable_memory)

    @_per_gpu
    def nvmlDeviceGetRepairStatus(self, gpu: FakeGpu, ref: Any) -> None:
        if ref._obj.version != pynvml.nvmlRepairStatus_v1:
            raise VersionMismatch
        ref._obj.bChannelRepairPending, ref._obj.bTpcRepairPending = supported(gpu.repairs_pending)

    @_per_gpu
    def nvmlDeviceGetMarginTemperature(self, gpu: FakeGpu, ref: Any) -> None:
        if ref._obj.version != pynvml.nvmlMarginTemperature_v1:
            raise VersionMismatch
        ref._obj.marginTemperature = supported(gpu.margin_c)

    @_per_gpu
    def nvmlDeviceGetSramEccErrorStatus(self, gpu: FakeGpu, ref: Any) -> None:
        status = ref._obj
        if status.version != pynvml.nvmlEccSramErrorStatus_v1:
            raise VersionMismatch
        status.bThresholdExceeded = supported(gpu.sram_threshold_exceeded)
        status.aggregateUncParity = gpu.ecc_errors.get("sram_uncorrectable", (0, 0))[1]
        status.aggregateCor = gpu.ecc_errors.get("sram_correctable", (0, 0))[1]

    # --- telemetry ----------------------------------------------------------------------------------------

    @_per_gpu
    def nvmlDeviceGetUtilizationRates(self, gpu: FakeGpu, ref: Any) -> None:
        ref._obj.gpu = gpu.utilization_pct

    @_per_gpu
    def nvmlDeviceGetPowerUsage(self, gpu: FakeGpu, ref: Any) -> None:
        _out(ref, gpu.power_usage_mw)

    @_per_gpu
    def nvmlDeviceGetTemperature(self, gpu: FakeGpu, sensor: Any, ref: Any) -> None:
        _out(ref, gpu.temperature_c)


def _set_bits(words: Any, numbers: list[int]) -> None:
    for n in numbers:
        words[n // 64] |= 1 << (n % 64)


def install(monkeypatch: pytest.MonkeyPatch, lib: FakeNvmlLib | None) -> None:
    """Make pynvml use `lib`; with None, behave like a node without the NVIDIA driver (library not found)."""
    monkeypatch.setattr(pynvml, "nvmlLib", lib)
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
    if lib is None:

        def no_library(name: str) -> None:
            raise OSError(f"{name}: cannot open shared object file: No such file or directory")

        monkeypatch.setattr(pynvml, "CDLL", no_library)
