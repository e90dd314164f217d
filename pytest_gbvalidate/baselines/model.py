"""The baseline model: one SKU's file as frozen dataclasses, and the helpers validation, recording and messages
share. No YAML, no pytest."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_gbvalidate.rules import noise
from pytest_gbvalidate.rules import resolution as rs
from pytest_gbvalidate.rules.resolution import Needed
from pytest_gbvalidate.rules.xids import XidAction
from pytest_gbvalidate.workloads.llama import parallel as llama_parallel
from pytest_gbvalidate.workloads.llama.config import CONFIGS as LLAMA_CONFIGS
from pytest_gbvalidate.workloads.llama.config import LlamaConfig
from pytest_gbvalidate.workloads.llama.flops import Peak

SCHEMA_VERSION = 1
STATUSES = ("measured", "provisional")
DEFAULT_LEARNING_RATE = 3e-4  # Llama 3 8B's peak learning rate (Meta), also NeMo's llama3_8b recipe default

# The resolution a metric needs where its baseline declares none: twice the combined run-to-run spread of two GPU
# figures, each 2% at most (docs/noise.md: one H100's figures moved 0.3-2% between runs).
DEFAULT_NEEDED = Needed(6.0, "the default")


class BaselineError(Exception):
    """A baseline is missing, malformed or breaks the schema. The message is one line an operator can act on."""


@dataclass(frozen=True)
class Limit:
    """A fail or warn limit: an absolute threshold in the metric's unit, or a percentage of the expected value."""

    absolute: float | None = None
    relative_pct: float | None = None

    def threshold(self, expected: float | None, direction: str) -> float:
        if self.absolute is not None:
            return self.absolute
        assert self.relative_pct is not None
        assert expected is not None  # the loader refuses a relative limit without an expected value
        return rs.moved_linearly(expected, self.relative_pct, direction)

    def __str__(self) -> str:
        return f"{self.relative_pct:g}%" if self.relative_pct is not None else f"{self.absolute:g}"


@dataclass(frozen=True)
class Reference:
    """What one measurement is compared with: a metric's baseline at one scope label."""

    metric: str
    unit: str
    direction: str
    scope_kind: str
    status: str
    expected: float | None
    fail: Limit | None
    warn: Limit | None
    provenance: str
    params: dict[str, Any] = field(default_factory=dict)
    spread_pct: float | None = None  # the recorded node's spread (percent), counted in a verdict's resolution
    needed: Needed = DEFAULT_NEEDED  # the resolution the metric needs (rules/resolution.py)

    @property
    def fail_limit(self) -> float | None:
        return None if self.fail is None else self.fail.threshold(self.expected, self.direction)

    @property
    def warn_limit(self) -> float | None:
        return None if self.warn is None else self.warn.threshold(self.expected, self.direction)

    @property
    def has_reference(self) -> bool:
        return self.expected is not None or self.fail is not None


@dataclass(frozen=True)
class MetricBaseline:
    default: Reference
    values: dict[str, Reference]

    def reference(self, scope: str) -> Reference | None:
        """The reference for a scope label: its own entry where `values` has one, else the metric's."""
        return self.values.get(scope) if self.values else self.default


@dataclass(frozen=True)
class Detect:
    """How `--gb-sku=auto` recognises this SKU."""

    azure_vm_sizes: tuple[str, ...] = ()
    gpu_name_contains: str | None = None
    gpu_count: int | None = None


@dataclass(frozen=True)
class HealthBaseline:
    """What the health suite holds the SKU's GPUs to. A field left out: that check skips and says so."""

    provenance: str
    min_driver_version: str | None = None
    min_nccl_version: str | None = None  # of the NCCL torch loads
    nccl_net_plugin: str | None = None  # the NCCL net plugin library (SHARP on InfiniBand), loaded as NCCL loads it
    nvlinks_per_gpu: int | None = None
    # A site's action for an Xid code where it differs from NVIDIA's catalog (rules/xid_catalog.yaml).
    xid_actions: dict[int, XidAction] = field(default_factory=dict)
    ecc_limits: dict[str, int] = field(default_factory=dict)  # counter -> the most a healthy GPU may have
    # In a multi-node NVLink domain (GB200 NVL72): every GPU in the fabric, one clique, IMEX channel and daemon READY.
    multi_node_nvlink: bool | None = None
    c2c: bool | None = None  # every GPU's NVLink-C2C to its Grace CPU is enabled
    # The PCIe link every RDMA NIC trains at, at least ({gen, width}): the card's published host interface.
    nic_pcie: dict[str, int] = field(default_factory=dict)
    gpudirect_rdma: bool | None = None  # the NICs read and write GPU memory: nvidia_peermem must be loaded
    nvlink_error_limits: dict[str, int] = field(default_factory=dict)  # counter -> the most any one link may have
    # The least thermal margin a GPU may show, C below NVML's T.Limit (NVSentinel ADR-042: -2 on H100, GB200).
    thermal_margin_offset_c: int | None = None

    def as_doc(self) -> dict[str, Any]:
        return _section_doc(self)


@dataclass(frozen=True)
class TopologyBaseline:
    """The layout the topology suite expects. A field left out is a check the SKU has no expectation for."""

    provenance: str
    gpu_numa_nodes: tuple[int, ...] | None = None  # the CPU NUMA node of each GPU, by GPU index
    gpus_per_numa_node: int | None = None  # GPUs on each NUMA node that has any
    nic_on_gpu_numa_node: bool | None = None  # every GPU has a NIC on its NUMA node
    ib_rate_gbps: float | None = None  # every InfiniBand port is Active at this rate

    def as_doc(self) -> dict[str, Any]:
        return _section_doc(self)


def _section_doc(section: HealthBaseline | TopologyBaseline) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if f.name == "xid_actions" and value:  # as the file has it: ACTION -> codes
            by_action: dict[str, list[int]] = {}
            for code, action in sorted(value.items()):
                by_action.setdefault(action, []).append(code)
            doc[f.name] = by_action
        elif value is not None and value != {}:
            doc[f.name] = list(value) if isinstance(value, tuple) else value
    return doc


@dataclass(frozen=True)
class Baseline:
    sku: str
    path: Path
    description: str
    detect: Detect
    metrics: dict[str, MetricBaseline]
    pretrain: PretrainSpec | None = None
    resolution: Needed = DEFAULT_NEEDED
    health: HealthBaseline | None = None
    topology: TopologyBaseline | None = None


@dataclass(frozen=True)
class PretrainSpec:
    """What the pretraining check runs on this SKU: model, sequence length, parallel layout, step counts, and
    the dense bf16 peak per GPU its MFU is measured against (None: MFU is not reported)."""

    model: str
    seq_len: int
    layout: llama_parallel.Layout
    warmup_steps: int
    timed_steps: int
    learning_rate: float
    peak_tflops_per_gpu: float | None
    peak_tflops_source: str
    provenance: str
    compile: bool = True  # the built-in engine compiles each block (torch.compile); its first steps absorb it
    engine_python: str | None = None  # the NeMo engines' driver runs under this command, not this interpreter

    @property
    def config(self) -> LlamaConfig:
        return dataclasses.replace(LLAMA_CONFIGS[self.model], seq_len=self.seq_len)

    @property
    def peak(self) -> Peak | None:
        """What the MFU divides by, with its source; None where the baseline gives no peak."""
        return None if self.peak_tflops_per_gpu is None else Peak(self.peak_tflops_per_gpu, self.peak_tflops_source)

    def as_doc(self) -> dict[str, Any]:
        """The section as it is written in a baseline file."""
        layout = self.layout
        doc: dict[str, Any] = {"model": self.model, "seq_len": self.seq_len, **layout.sizes()}
        doc.update(precision=layout.precision, engine=layout.engine)
        if layout.precision == "fp8":
            doc.update(fp8_recipe=layout.fp8_recipe)
        doc.update(activation_checkpointing=layout.activation_checkpointing, compile=self.compile)
        doc.update(warmup_steps=self.warmup_steps, timed_steps=self.timed_steps, learning_rate=self.learning_rate)
        if self.peak_tflops_per_gpu is not None:
            doc.update(peak_tflops_per_gpu=self.peak_tflops_per_gpu, peak_tflops_source=self.peak_tflops_source)
        if self.engine_python is not None:
            doc["engine_python"] = self.engine_python
        doc["provenance"] = self.provenance
        return doc


def baseline_path(directory: Path, sku: str) -> Path:
    return directory / f"{sku}.yaml"


def known_skus(directory: Path) -> list[str]:
    return sorted(p.stem for p in directory.glob("*.yaml"))


# A count (of errors) or a share (of time throttled) a healthy node may keep at 0; every other unit in metrics.UNITS
# is above 0 on a working node. No unit is signed: no figure is ever negative.
_ZERO_UNITS = frozenset({"count", "%"})
# A count is whole: a limit may equal the expected value ("expected: 0, fail: 0"). In every other unit fail < warn <
# expected strictly (mirrored for lower): the expected value never fails, the warn band is never empty.
_WHOLE_UNITS = frozenset({"count"})


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_number(value: Any) -> bool:
    return noise.finite(value) is not None


def _names(items: Any) -> str:
    return ", ".join(sorted(items))


SHOWN_WIDTH = 80  # the most characters of a value an error message echoes


class _Shown(Exception): ...


def _shown(value: Any) -> str:
    """`value` as an error message echoes it: its ASCII repr, cut to SHOWN_WIDTH characters with an ellipsis (built
    piece by piece and stopped there: a value that aliases nest a billion times costs no more)."""
    out: list[str] = []
    room = SHOWN_WIDTH + 1

    def put(text: str) -> None:
        nonlocal room
        out.append(text[:room])
        room -= len(text)
        if room <= 0:
            raise _Shown

    def walk(v: Any) -> None:
        if isinstance(v, (dict, list)):
            put("{" if isinstance(v, dict) else "[")
            for i, item in enumerate(v.items() if isinstance(v, dict) else v):
                put(", " if i else "")
                if isinstance(v, dict):
                    walk(item[0])
                    put(": ")
                    item = item[1]
                walk(item)
            put("}" if isinstance(v, dict) else "]")
        else:
            # ascii(): a Cyrillic letter that passes for a Latin one is shown as \u0430, a terminal escape as \x1b
            put(ascii(v[: SHOWN_WIDTH + 1] if isinstance(v, str) else v))

    try:
        walk(value)
    except _Shown:
        return "".join(out)[: SHOWN_WIDTH - 3] + "..."
    return "".join(out)


def nccl_env(baseline: Baseline) -> dict[str, tuple[str, str]]:
    """Every `params.nccl_env` of the SKU's metrics as {variable: (value, the metric asking)}; two asking for
    different values is an error: one set of ranks runs every collective."""
    found: dict[str, tuple[str, str]] = {}
    for name, metric in baseline.metrics.items():
        for label, ref in (("", metric.default), *metric.values.items()):
            where = f"{name}.values.{label}" if label else name
            for var, value in dict(ref.params.get("nccl_env") or {}).items():
                text = str(value)
                if var in found and found[var][0] != text:
                    raise BaselineError(
                        f"{baseline.path}: metrics.{where}.params.nccl_env.{var}: {_shown(text)} conflicts with "
                        f"{_shown(found[var][0])} asked for by metrics.{found[var][1]}"
                    )
                found.setdefault(var, (text, where))
    return found
