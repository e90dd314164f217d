"""A fake NVML library beneath the real nvidia-ml-py bindings, so the real `pynvml` code runs in tests.

pynvml loads libnvidia-ml.so into `pynvml.nvmlLib` and looks each C symbol up on it by name; `install` puts a
FakeNvmlLib there instead. Its methods are those C symbols and take the same ctypes arguments; a symbol it lacks
surfaces as NVMLError_FunctionNotFound, as with an old driver. Test-only: nothing outside tests/ imports this.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any

import pynvml
import pytest

SUCCESS: int = pynvml.NVML_SUCCESS


@dataclass
class FakeGpu:
    name: str = "NVIDIA GB200"


@dataclass
class FakeNvmlLib:
    gpus: list[FakeGpu] = field(default_factory=list)
    driver_version: str = "570.133.20"
    cuda_driver_version: int = 12080
    init_error: int = SUCCESS  # e.g. pynvml.NVML_ERROR_DRIVER_NOT_LOADED

    def nvmlInitWithFlags(self, flags: Any) -> int:
        return self.init_error

    def nvmlShutdown(self) -> int:
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
        handle = ref._obj  # a c_nvmlDevice_t pointer: store index + 1 as its address
        ctypes.memmove(ctypes.addressof(handle), ctypes.byref(ctypes.c_size_t(index.value + 1)), ctypes.sizeof(handle))
        return SUCCESS

    def nvmlDeviceGetName(self, handle: Any, buf: Any, size: Any) -> int:
        buf.value = self.gpu(handle).name.encode()
        return SUCCESS

    def gpu(self, handle: Any) -> FakeGpu:
        address = ctypes.cast(handle, ctypes.c_void_p).value
        assert address is not None
        return self.gpus[address - 1]


def install(monkeypatch: pytest.MonkeyPatch, lib: FakeNvmlLib | None) -> None:
    """Make pynvml use `lib`; with None, behave like a node without the NVIDIA driver (library not found)."""
    monkeypatch.setattr(pynvml, "nvmlLib", lib)
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
    if lib is None:

        def no_library(name: str) -> None:
            raise OSError(f"{name}: cannot open shared object file: No such file or directory")

        monkeypatch.setattr(pynvml, "CDLL", no_library)
