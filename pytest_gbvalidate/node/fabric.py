"""A GPU's NVLink fabric registration (multi-node NVLink, GB200 on) as NVML's versioned fabric info struct holds it:
its state, its result, what the health mask reports wrong (HEALTH_FAULTS) and the NVLink domain the fabric manager
placed the GPU in. Decoding only: nvml.py makes the call (`nvmlDeviceGetGpuFabricInfoV`) and fills the struct."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

_FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}


@dataclass(frozen=True)
class FabricInfo:
    """One GPU's NVLink fabric registration; cluster UUID and clique id: its NVLink domain (rack) and partition."""

    state: str  # not_started, in_progress, completed
    status: str | None  # "Success", or NVML's text for the error the registration ended with
    degraded_bandwidth: bool | None  # None: the health mask does not report it
    cluster_uuid: str
    clique_id: int
    health_faults: tuple[str, ...] = ()  # what the health mask reports wrong, in words (`a route unhealthy`)


def fabric_reading(info: Any) -> FabricInfo | None:
    """The registration from a filled `c_nvmlGpuFabricInfo_v2_t`; None where the GPU has no NVLink fabric. NVML
    defines the result only once the state is completed (before, the field holds whatever it holds)."""
    import pynvml

    state = _FABRIC_STATES.get(int(info.state), str(info.state))
    if state == "not_supported":
        return None
    status = None
    if state == "completed":
        status = str(pynvml.NVMLError(int(info.status))) if info.status else "Success"
    health = health_fields(int(info.healthMask))
    degraded = {"TRUE": True, "FALSE": False}.get(health.get("DEGRADED_BW") or "")
    faults = tuple(
        f"{what}: {value.lower().replace('_', ' ')}" if value not in ("TRUE", "DISCONNECTED") else what
        for field, what, wrong in HEALTH_FAULTS
        if (value := health.get(field)) is not None and value in wrong
    )
    cluster = str(uuid.UUID(bytes=bytes(info.clusterUuid)))
    return FabricInfo(state, status, degraded, cluster, int(info.cliqueId), faults)


# The health mask's fields that say something is wrong, what that is, and the values that say so. Every field the
# installed NVML defines is read (health_fields); these are gated. PARTITION_ASSIGNED is read, not gated: which
# partition a GPU is in is the clique check's (test_nvlink_fabric_clique).
HEALTH_FAULTS = (
    ("DEGRADED_BW", "the GPU's NVLink bandwidth degraded", {"TRUE"}),
    ("ROUTE_RECOVERY", "a route recovery in progress", {"TRUE"}),
    ("ROUTE_UNHEALTHY", "a route unhealthy", {"TRUE"}),
    ("ACCESS_TIMEOUT_RECOVERY", "an access timeout recovery in progress", {"TRUE"}),
    (
        "INCORRECT_CONFIGURATION",
        "an incorrect configuration",
        {"INCORRECT_SYSGUID", "INCORRECT_CHASSIS_SN", "NO_PARTITION", "INSUFFICIENT_NVLINKS", "INCOMPATIBLE_GPU_FW"}
        | {"INVALID_LOCATION", "GPU_STATE_INVALID"},
    ),
    ("GFM_STATE", "the global fabric manager disconnected", {"DISCONNECTED"}),
)


def health_fields(mask: int) -> dict[str, str]:
    """Each field of a fabric health mask the installed NVML defines, by its value's name (`TRUE`, `NOT_SUPPORTED`,
    ...; the number where NVML names none), read as nvml.h's NVML_GPU_FABRIC_HEALTH_GET(var, type) does: (mask >>
    SHIFT) & WIDTH, the WIDTH being the field's bit mask (0x3), not a count of bits."""
    import pynvml

    prefix = "NVML_GPU_FABRIC_HEALTH_MASK_"
    shifts = {
        name.removeprefix(f"{prefix}SHIFT_"): int(getattr(pynvml, name))
        for name in dir(pynvml)
        if name.startswith(f"{prefix}SHIFT_")
    }
    ordered = sorted(shifts.items(), key=lambda item: item[1])
    found = {}
    for (field, shift), after in zip(ordered, [*ordered[1:], None], strict=True):
        width = getattr(pynvml, f"{prefix}WIDTH_{field}", None)
        if not isinstance(width, int):
            continue
        # Up to the next field: some vendored copies of nvml.h give DEGRADED_BW a stale WIDTH of 0x11, which
        # would read the next field's bit as this one's.
        bits = width if after is None else (1 << (after[1] - shift)) - 1
        value = (mask >> shift) & bits
        names = [
            n.removeprefix(f"{prefix}{field}_")
            for n in dir(pynvml)
            if n.startswith(f"{prefix}{field}_") and getattr(pynvml, n) == value
        ]
        found[field] = min(names, key=len) if names else str(value)  # the shortest of NVML's aliases
    return found


def nvlink_domain(devices: Iterable[Mapping[str, Any]]) -> str | None:
    """The NVLink domain most of a node's GPUs joined, ``<cluster UUID>/<clique id>``, from a report's ``gpus.devices``;
    None where none registered. A GPU placed elsewhere is the clique check's finding, not a second domain."""
    places = Counter(
        f"{d['fabric_cluster_uuid']}/{d['fabric_clique_id']}"
        for d in devices
        if isinstance(d, Mapping)
        and isinstance(d.get("fabric_cluster_uuid"), str)
        and isinstance(d.get("fabric_clique_id"), int)
    )
    return places.most_common(1)[0][0] if places else None
