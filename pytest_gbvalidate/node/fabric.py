"""A GPU's NVLink fabric registration (multi-node NVLink, GB200 on) as NVML's versioned fabric info struct holds it:
the registration's state, its result once completed, and whether the health mask says the NVLink bandwidth is
degraded. Decoding only: nvml.py makes the call (`nvmlDeviceGetGpuFabricInfoV`) and fills the struct."""

from __future__ import annotations

from typing import Any

_FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}


def fabric_reading(info: Any) -> tuple[str | None, str | None, bool | None]:
    """(registration state, its result, degraded bandwidth) from a filled `c_nvmlGpuFabricInfo_v2_t`. NVML defines
    the result only once the state is completed (before, the field holds whatever it holds); the health mask's
    degraded-bandwidth field is 1 true, 2 false, 0 not supported."""
    import pynvml

    state = _FABRIC_STATES.get(int(info.state), str(info.state))
    if state == "not_supported":
        return None, None, None
    status = None
    if state == "completed":
        status = str(pynvml.NVMLError(int(info.status))) if info.status else "Success"
    width = (1 << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_DEGRADED_BW) - 1
    degraded = (int(info.healthMask) >> pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW) & width
    return (
        state,
        status,
        {
            pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE: True,
            pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_FALSE: False,
        }.get(degraded),
    )
