"""Per-SKU baselines: schema, loading, and the comparison that turns a measurement into a verdict.

Pure Python (PyYAML only), no pytest: a CLI or a dashboard can reuse it. A baseline file looks like::

    schema_version: 1
    sku: ND_H100_v5
    description: Azure ND H100 v5 (8x H100 80GB)
    detect: {azure_vm_sizes: [Standard_ND96isr_H100_v5], gpu_name_contains: H100 80GB HBM3, gpu_count: 8}
    metrics:
      h2d_bandwidth_gbps:
        unit: GB/s
        direction: higher          # higher or lower is better
        scope: gpu                 # node | gpu | gpu_pair | link | message_size | layout
        status: provisional        # measured (on a golden node) | provisional
        expected: 51
        fail: 48                   # absolute limit in the metric's unit, or "10%" of expected
        warn: 50.4
        provenance: where the numbers come from
      all_reduce_busbw_gbps:
        ...
        values:                    # per scope label; each entry overrides the metric-level fields
          8GiB: {expected: 478.87, provenance: ...}
    health:                        # optional: gates of the health suite (HealthBaseline)
      critical_xids: [48, 79]
      ecc_limits: {sram_uncorrectable: 0}
      provenance: where the gates come from
    topology:                      # optional: the layout the topology suite expects (TopologyBaseline)
      gpu_numa_nodes: [1, 1, 0, 0]
      provenance: where the layout comes from

Every error names the file, the line and the field.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import yaml

from pytest_gbvalidate.metrics import CATALOG, DIRECTIONS, PER_LABEL_SCOPE_KINDS, SCOPE_KINDS, UNITS
from pytest_gbvalidate.workloads.llama import parallel as llama_parallel
from pytest_gbvalidate.workloads.llama.config import CONFIGS as LLAMA_CONFIGS
from pytest_gbvalidate.workloads.llama.config import LlamaConfig

SCHEMA_VERSION = 1
STATUSES = ("measured", "provisional")
_TOP_KEYS = {"schema_version", "sku", "description", "detect", "metrics", "health", "topology"}
_DETECT_KEYS = {"azure_vm_sizes", "gpu_name_contains", "gpu_count"}
_OVERRIDE_KEYS = {"status", "expected", "fail", "warn", "provenance", "params"}
_METRIC_KEYS = _OVERRIDE_KEYS | {"unit", "direction", "scope", "values"}


class BaselineError(Exception):
    """A baseline is missing, malformed or breaks the schema. The message is one line an operator can act on."""


# --- YAML with line numbers --------------------------------------------------------------------------------


class _Mapping(dict[str, Any]):
    """A YAML mapping that remembers the line of each key (1-based), for error messages."""

    line: int = 0
    key_lines: dict[str, int]


# The most nodes the aliases (*name) of one baseline may stand for, counted as expanded: a value an alias
# repeats counts every time, with everything inside it. A baseline uses a few aliases or none (cpu.yaml: 3
# scalars); a "billion laughs" document of nested aliases (a few hundred bytes standing for billions of
# nodes) is refused as soon as it passes the bound, before anything walks it.
MAX_ALIAS_NODES = 1000


@functools.cache
def _loader() -> type[yaml.SafeLoader]:
    """A SafeLoader that builds _Mappings, rejects duplicate keys and bounds what aliases expand to (and
    refuses a recursive one). Built on first use: the plugin module loads in every pytest run, and PyYAML is
    needed only by one that reads baselines."""
    import yaml

    def construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> _Mapping:
        loader.flatten_mapping(node)
        mapping = _Mapping()
        mapping.line = node.start_mark.line + 1
        mapping.key_lines = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                raise BaselineError(f"{key_node.start_mark.line + 1}: keys must be strings, got {_shown(key)}")
            if key in mapping:
                raise BaselineError(f"{key_node.start_mark.line + 1}: duplicate key {_shown(key)}")
            mapping[key] = loader.construct_object(value_node, deep=True)
            mapping.key_lines[key] = key_node.start_mark.line + 1
        return mapping

    class Loader(yaml.SafeLoader):
        def __init__(self, stream: str) -> None:
            super().__init__(stream)
            self.expanded: dict[yaml.Node, int] = {}  # each node composed so far -> its size, aliases expanded
            self.alias_nodes = 0

        def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
            event = self.peek_event()  # type: ignore[no-untyped-call]  # the stubs leave it untyped
            node = super().compose_node(parent, index)
            if node is None:
                return None
            if isinstance(event, yaml.AliasEvent):
                line = event.start_mark.line + 1 if event.start_mark is not None else 0
                size = self.expanded.get(node)
                if size is None:  # its anchor's node is still being composed: the alias is inside it
                    raise BaselineError(f"{line}: alias {_shown(event.anchor)} is inside its own anchor")
                self.alias_nodes += size
                if self.alias_nodes > MAX_ALIAS_NODES:
                    raise BaselineError(
                        f"{line}: alias {_shown(event.anchor)}: aliases stand for more than {MAX_ALIAS_NODES} "
                        "nodes (a baseline needs a few aliases or none)"
                    )
            elif isinstance(node, yaml.SequenceNode):
                self.expanded[node] = 1 + sum(self.expanded[child] for child in node.value)
            elif isinstance(node, yaml.MappingNode):
                self.expanded[node] = 1 + sum(self.expanded[k] + self.expanded[v] for k, v in node.value)
            else:
                self.expanded[node] = 1
            return node

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    return Loader


# --- the model -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Limit:
    """A fail or warn limit: an absolute threshold in the metric's unit, or a percentage of the expected value."""

    absolute: float | None = None
    relative_pct: float | None = None

    def threshold(self, expected: float | None, direction: str) -> float:
        if self.absolute is not None:
            return self.absolute
        # Both are present: a relative limit without an expected value is rejected when the file is loaded.
        assert self.relative_pct is not None
        assert expected is not None
        sign = -1.0 if direction == "higher" else 1.0
        return expected * (1.0 + sign * self.relative_pct / 100.0)

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
        if self.values:
            return self.values.get(scope)
        return self.default


@dataclass(frozen=True)
class Detect:
    """How `--gb-sku=auto` recognises this SKU."""

    azure_vm_sizes: tuple[str, ...] = ()
    gpu_name_contains: str | None = None
    gpu_count: int | None = None


@dataclass(frozen=True)
class HealthBaseline:
    """What the health suite holds the SKU's GPUs to. A field left out is a check the SKU has no expectation
    for: that check skips and says so."""

    provenance: str
    min_driver_version: str | None = None
    nvlinks_per_gpu: int | None = None
    critical_xids: tuple[int, ...] | None = None
    ecc_limits: dict[str, int] = field(default_factory=dict)  # counter -> the most a healthy GPU may have

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
        if value is not None and value != {}:
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
    health: HealthBaseline | None = None
    topology: TopologyBaseline | None = None


# --- the pretrain section: the SKU's Llama 3 pretraining run ---------------------------------------------------

_TOP_KEYS |= {"pretrain"}
_PRETRAIN_REQUIRED = {
    "model",
    "mbs",
    "gbs",
    "tp",
    "pp",
    "cp",
    "dp",
    "precision",
    "engine",
    "warmup_steps",
    "timed_steps",
    "provenance",
}
_PRETRAIN_KEYS = _PRETRAIN_REQUIRED | {
    "seq_len",
    "activation_checkpointing",
    "learning_rate",
    "peak_tflops_per_gpu",
    "peak_tflops_source",
}
DEFAULT_LEARNING_RATE = 3e-4  # Llama 3 8B's peak learning rate (Meta), also NeMo's llama3_8b recipe default


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

    @property
    def config(self) -> LlamaConfig:
        return dataclasses.replace(LLAMA_CONFIGS[self.model], seq_len=self.seq_len)

    def as_doc(self) -> dict[str, Any]:
        """The section as it is written in a baseline file."""
        layout = self.layout
        doc: dict[str, Any] = {"model": self.model, "seq_len": self.seq_len}
        doc.update({k: getattr(layout, k) for k in llama_parallel.SIZES})
        doc.update(precision=layout.precision, engine=layout.engine)
        doc.update(activation_checkpointing=layout.activation_checkpointing)
        doc.update(warmup_steps=self.warmup_steps, timed_steps=self.timed_steps, learning_rate=self.learning_rate)
        if self.peak_tflops_per_gpu is not None:
            doc.update(peak_tflops_per_gpu=self.peak_tflops_per_gpu, peak_tflops_source=self.peak_tflops_source)
        doc["provenance"] = self.provenance
        return doc


# --- loading ----------------------------------------------------------------------------------------------


def baseline_path(directory: Path, sku: str) -> Path:
    return directory / f"{sku}.yaml"


def known_skus(directory: Path) -> list[str]:
    return sorted(p.stem for p in directory.glob("*.yaml"))


def load_baseline(path: Path) -> Baseline:
    """Read and validate one baseline file. Raises BaselineError naming the file, line and field."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise BaselineError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise BaselineError(
            f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None
    import yaml

    try:
        doc = yaml.load(text, Loader=_loader())  # noqa: S506 -- a SafeLoader subclass
    except BaselineError as exc:
        raise BaselineError(f"{path}:{exc}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise BaselineError(f"{where}: YAML syntax error: {exc.problem or exc.context}") from None
    except yaml.reader.ReaderError as exc:  # a control character (NUL, ESC, ...) YAML does not allow in a file
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - text.rfind("\n", 0, exc.position)
        char = f"U+{exc.character:04X}" if isinstance(exc.character, int) else repr(exc.character)
        raise BaselineError(f"{path}:{line}:{column}: YAML does not allow the character {char}") from None
    except yaml.YAMLError as exc:
        raise BaselineError(f"{path}: YAML error: {' '.join(str(exc).split())}") from None
    return _Parser(path).baseline(doc)


def load_all(directory: Path) -> list[Baseline]:
    return [load_baseline(baseline_path(directory, sku)) for sku in known_skus(directory)]


class _Parser:
    def __init__(self, path: Path) -> None:
        self.path = path

    def error(self, where: _Mapping, key: str | None, field_path: str, message: str) -> BaselineError:
        line = where.key_lines.get(key, where.line) if key is not None else where.line
        return BaselineError(f"{self.path}:{line}: {field_path}: {message}")

    def mapping(
        self, value: Any, parent: _Mapping, key: str | None, field_path: str, allowed: set[str] | None
    ) -> _Mapping:
        """`value` as a mapping whose keys are `allowed` (None: any key)."""
        if not isinstance(value, _Mapping):
            raise self.error(parent, key, field_path, f"must be a mapping, got {type(value).__name__}")
        unknown = sorted(set(value) - allowed) if allowed is not None else []
        if unknown:
            raise self.error(
                value, unknown[0], f"{field_path}.{unknown[0]}", f"unknown field (allowed: {_names(allowed)})"
            )
        return value

    def baseline(self, doc: Any) -> Baseline:
        if not isinstance(doc, _Mapping):
            raise BaselineError(f"{self.path}:1: the file must be a YAML mapping with {_names(_TOP_KEYS)}")
        doc = self.mapping(doc, doc, None, "<top>", _TOP_KEYS)
        for required in ("schema_version", "sku", "metrics"):
            if required not in doc:
                raise self.error(doc, None, required, "missing")
        if not _is_count(doc["schema_version"]) or doc["schema_version"] != SCHEMA_VERSION:
            raise self.error(doc, "schema_version", "schema_version", f"must be {SCHEMA_VERSION}")
        if doc["sku"] != self.path.stem:
            raise self.error(
                doc, "sku", "sku", f"{_shown(doc['sku'])} does not match the file name {_shown(self.path.name)}"
            )
        description = doc.get("description", "")
        if not isinstance(description, str):
            raise self.error(doc, "description", "description", f"must be a string, got {type(description).__name__}")
        metrics_doc = self.mapping(doc["metrics"], doc, "metrics", "metrics", None)
        detect = self.detect(doc)
        return Baseline(
            sku=doc["sku"],
            path=self.path,
            description=description,
            detect=detect,
            metrics={name: self.metric(metrics_doc, name) for name in metrics_doc},
            pretrain=self.pretrain(doc),
            health=self.health(doc),
            topology=self.topology(doc, detect),
        )

    def detect(self, doc: _Mapping) -> Detect:
        if "detect" not in doc:
            return Detect()
        d = self.mapping(doc["detect"], doc, "detect", "detect", _DETECT_KEYS)
        sizes = d.get("azure_vm_sizes", [])
        if not (isinstance(sizes, list) and all(isinstance(s, str) for s in sizes)):
            raise self.error(d, "azure_vm_sizes", "detect.azure_vm_sizes", "must be a list of strings")
        name = d.get("gpu_name_contains")
        if name is not None and not isinstance(name, str):
            raise self.error(d, "gpu_name_contains", "detect.gpu_name_contains", "must be a string")
        count = d.get("gpu_count")
        if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 0):
            raise self.error(d, "gpu_count", "detect.gpu_count", "must be a non-negative integer")
        return Detect(tuple(sizes), name, count)

    def metric(self, metrics_doc: _Mapping, name: str) -> MetricBaseline:
        fp = f"metrics.{name}"
        m = self.mapping(metrics_doc[name], metrics_doc, name, fp, _METRIC_KEYS)
        for required in ("unit", "direction", "scope", "status"):
            if required not in m:
                raise self.error(m, None, f"{fp}.{required}", "missing")
        unit, direction, scope_kind = m["unit"], m["direction"], m["scope"]
        if not (isinstance(unit, str) and unit in UNITS):
            raise self.error(m, "unit", f"{fp}.unit", f"unknown unit {_shown(unit)} (known: {_names(UNITS)})")
        if direction not in DIRECTIONS:
            raise self.error(
                m, "direction", f"{fp}.direction", f"{_shown(direction)} is not one of {_names(DIRECTIONS)}"
            )
        if scope_kind not in SCOPE_KINDS:
            raise self.error(m, "scope", f"{fp}.scope", f"{_shown(scope_kind)} is not one of {_names(SCOPE_KINDS)}")
        spec = CATALOG.get(name)
        if spec is not None:
            for key, ours in (("unit", spec.unit), ("direction", spec.direction), ("scope", spec.scope_kind)):
                if m[key] != ours:
                    raise self.error(m, key, f"{fp}.{key}", f"{m[key]!r} disagrees with the measured metric ({ours!r})")
        base = Reference(
            metric=name,
            unit=unit,
            direction=direction,
            scope_kind=scope_kind,
            status="provisional",
            expected=None,
            fail=None,
            warn=None,
            provenance="",
        )
        values: dict[str, Reference] = {}
        if "values" in m:
            values_doc = self.mapping(m["values"], m, "values", f"{fp}.values", None)
            if not values_doc:
                raise self.error(m, "values", f"{fp}.values", "must name at least one scope label")
            default = self.overrides(m, base, fp, check=False)
            for label in values_doc:
                lfp = f"{fp}.values.{label}"
                entry = self.mapping(values_doc[label], values_doc, label, lfp, _OVERRIDE_KEYS)
                values[str(label)] = self.overrides(entry, default, lfp, check=True)
        else:
            default = self.overrides(m, base, fp, check=True)
        return MetricBaseline(default=default, values=values)

    def overrides(self, m: _Mapping, base: Reference, fp: str, *, check: bool) -> Reference:
        """Apply the fields one mapping sets on top of `base`; `check` the result once it is complete."""
        status = m.get("status", base.status)
        if status not in STATUSES:
            raise self.error(m, "status", f"{fp}.status", f"{_shown(status)} is not one of {_names(STATUSES)}")
        provenance = m.get("provenance", base.provenance)
        if not isinstance(provenance, str) or (check and not provenance.strip()):
            raise self.error(m, "provenance", f"{fp}.provenance", "must be a non-empty string naming the source")
        expected = base.expected
        if "expected" in m:
            expected = m["expected"]
            if not _is_number(expected):
                raise self.error(m, "expected", f"{fp}.expected", f"must be a finite number, got {_shown(expected)}")
            expected = float(expected)
            self.check_figure(m, "expected", fp, expected, base)
        params = m.get("params", base.params)
        if not isinstance(params, dict):
            raise self.error(m, "params", f"{fp}.params", "must be a mapping")
        if "params" in m:
            self.check_nccl_env(m, params, fp)
        ref = Reference(
            metric=base.metric,
            unit=base.unit,
            direction=base.direction,
            scope_kind=base.scope_kind,
            status=status,
            expected=expected,
            fail=self.limit(m, "fail", fp, base) if "fail" in m else base.fail,
            warn=self.limit(m, "warn", fp, base) if "warn" in m else base.warn,
            provenance=provenance,
            params=dict(params),
        )
        if check:
            self.check(m, ref, fp)
        return ref

    def check_nccl_env(self, m: _Mapping, params: dict[str, Any], fp: str) -> None:
        """`params.nccl_env`: the NCCL environment the metric's figures were taken with (NCCL_* names)."""
        env = params.get("nccl_env")
        if env is None:
            return
        if not isinstance(env, dict) or not env:
            raise self.error(m, "params", f"{fp}.params.nccl_env", "must be a mapping of NCCL_* variables to values")
        for name, value in env.items():
            if not name.startswith("NCCL_") or not isinstance(value, (str, int, float)) or isinstance(value, bool):
                raise self.error(
                    m, "params", f"{fp}.params.nccl_env.{name}", "must be an NCCL_* variable with a string or number"
                )

    def limit(self, m: _Mapping, key: str, fp: str, base: Reference) -> Limit:
        raw = m[key]
        if isinstance(raw, str) and raw.strip().endswith("%"):
            try:
                pct = float(raw.strip()[:-1])
            except ValueError:
                pct = math.nan
            if not math.isfinite(pct) or pct <= 0:
                raise self.error(m, key, f"{fp}.{key}", f"{_shown(raw)}: a relative limit is a positive percentage")
            return Limit(relative_pct=pct)
        if not _is_number(raw):
            raise self.error(
                m, key, f"{fp}.{key}", f"{_shown(raw)}: give a number in the metric's unit or a percentage"
            )
        self.check_figure(m, key, fp, float(raw), base)
        return Limit(absolute=float(raw))

    def check_figure(self, m: _Mapping, key: str, fp: str, value: float, base: Reference) -> None:
        """An expected value or an absolute limit is a figure in the metric's unit: above 0, or 0 or more in a
        unit that counts what a healthy node may have none of (_ZERO_UNITS). A higher-is-better limit of 0
        would fail nothing."""
        if base.unit in _ZERO_UNITS:
            if value < 0:
                raise self.error(
                    m, key, f"{fp}.{key}", f"{value:g}: must be 0 or more (a {base.unit} is never negative)"
                )
            if value == 0 and key != "expected" and base.direction == "higher":
                raise self.error(m, key, f"{fp}.{key}", "0: a limit of 0 fails nothing when higher is better")
        elif value <= 0:
            raise self.error(m, key, f"{fp}.{key}", f"{value:g}: must be above 0 (a figure in {base.unit})")

    def check(self, m: _Mapping, ref: Reference, fp: str) -> None:
        """Cross-field rules, on the effective reference of one scope label."""
        if ref.status == "measured" and ref.expected is None:
            raise self.error(m, None, f"{fp}.expected", "missing (a measured baseline has an expected value)")
        if ref.expected is not None and ref.fail is None:
            raise self.error(m, None, f"{fp}.fail", "missing (a metric with an expected value needs a fail limit)")
        if ref.expected is None and ref.fail is None and ref.warn is not None:
            raise self.error(m, "warn", f"{fp}.warn", "a warn limit needs an expected value or a fail limit")
        for key, lim in (("fail", ref.fail), ("warn", ref.warn)):
            if lim is None:
                continue
            if lim.relative_pct is not None:
                if ref.expected is None:
                    raise self.error(m, key, f"{fp}.{key}", "a relative limit needs an expected value")
                if ref.expected == 0:
                    raise self.error(m, key, f"{fp}.{key}", f"{lim}: a percentage of expected 0 is 0; give a number")
                if ref.direction == "higher" and lim.relative_pct >= 100:
                    raise self.error(m, key, f"{fp}.{key}", "must be below 100% for a higher-is-better metric")
        better = _better(ref.direction)
        ordered = [("fail", ref.fail_limit), ("warn", ref.warn_limit), ("expected", ref.expected)]
        present = [(k, v) for k, v in ordered if v is not None]
        for (k1, v1), (k2, v2) in itertools.pairwise(present):
            if better(v1, v2):
                word = "above" if ref.direction == "higher" else "below"
                raise self.error(m, k1, f"{fp}.{k1}", f"{v1:g} is {word} {k2} {v2:g} ({ref.direction} is better)")
            if v1 == v2 and ref.unit not in _WHOLE_UNITS:
                word = "below" if ref.direction == "higher" else "above"
                raise self.error(
                    m, k1, f"{fp}.{k1}", f"{v1:g} equals {k2}: it must lie {word} it ({ref.direction} is better)"
                )

    def pretrain(self, doc: _Mapping) -> PretrainSpec | None:
        if "pretrain" not in doc:
            return None
        p = self.mapping(doc["pretrain"], doc, "pretrain", "pretrain", _PRETRAIN_KEYS)
        missing = sorted(_PRETRAIN_REQUIRED - set(p))
        if missing:
            raise self.error(p, None, f"pretrain.{missing[0]}", "missing")
        model = p["model"]
        if not (isinstance(model, str) and model in LLAMA_CONFIGS):
            raise self.error(
                p, "model", "pretrain.model", f"unknown model {_shown(model)} (known: {_names(LLAMA_CONFIGS)})"
            )
        counts = {}
        for key in (*llama_parallel.SIZES, "seq_len", "warmup_steps", "timed_steps"):
            value = p.get(key, LLAMA_CONFIGS[model].seq_len if key == "seq_len" else None)
            least = 0 if key == "warmup_steps" else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise self.error(p, key, f"pretrain.{key}", f"must be an integer >= {least}, got {_shown(value)}")
            counts[key] = value
        checkpointing = p.get("activation_checkpointing", False)
        if not isinstance(checkpointing, bool):
            raise self.error(
                p, "activation_checkpointing", "pretrain.activation_checkpointing", "must be true or false"
            )
        for key, known in (("engine", llama_parallel.ENGINES), ("precision", llama_parallel.PRECISIONS)):
            if p[key] not in known:
                raise self.error(p, key, f"pretrain.{key}", f"{_shown(p[key])} is not one of {', '.join(known)}")
        layout = llama_parallel.Layout(
            **{k: counts[k] for k in llama_parallel.SIZES},
            precision=p["precision"],
            engine=p["engine"],
            activation_checkpointing=checkpointing,
        )
        cfg = dataclasses.replace(LLAMA_CONFIGS[model], seq_len=counts["seq_len"])
        broken = llama_parallel.problems(cfg, layout)
        if broken:
            key, message = broken[0]
            raise self.error(p, key, f"pretrain.{key}", f"invalid layout for {model} at seq {cfg.seq_len}: {message}")
        learning_rate = p.get("learning_rate", DEFAULT_LEARNING_RATE)
        if not _is_number(learning_rate) or learning_rate <= 0:
            raise self.error(p, "learning_rate", "pretrain.learning_rate", "must be a positive number")
        peak = p.get("peak_tflops_per_gpu")
        source = p.get("peak_tflops_source", "")
        if peak is not None and (not _is_number(peak) or peak <= 0):
            raise self.error(p, "peak_tflops_per_gpu", "pretrain.peak_tflops_per_gpu", "must be a positive number")
        if not isinstance(source, str) or (peak is not None and not source.strip()):
            raise self.error(
                p, "peak_tflops_source", "pretrain.peak_tflops_source", "must name where the peak comes from"
            )
        provenance = p["provenance"]
        if not isinstance(provenance, str) or not provenance.strip():
            raise self.error(p, "provenance", "pretrain.provenance", "must be a non-empty string naming the source")
        return PretrainSpec(
            model=model,
            seq_len=counts["seq_len"],
            layout=layout,
            warmup_steps=counts["warmup_steps"],
            timed_steps=counts["timed_steps"],
            learning_rate=float(learning_rate),
            peak_tflops_per_gpu=None if peak is None else float(peak),
            peak_tflops_source=source,
            provenance=provenance,
        )

    # --- the health and topology sections ---------------------------------------------------------------

    def health(self, doc: _Mapping) -> HealthBaseline | None:
        if "health" not in doc:
            return None
        h = self.mapping(doc["health"], doc, "health", "health", _HEALTH_KEYS)
        version = h.get("min_driver_version")
        if version is not None and not (isinstance(version, str) and re.fullmatch(r"\d+(\.\d+)*", version)):
            raise self.error(
                h, "min_driver_version", "health.min_driver_version", f"{_shown(version)}: quote it, e.g. '570.133.20'"
            )
        xids = h.get("critical_xids")
        if xids is not None:
            if not (isinstance(xids, list) and xids and all(_is_count(x) and x > 0 for x in xids)):
                raise self.error(h, "critical_xids", "health.critical_xids", "must be a non-empty list of Xid numbers")
            if len(set(xids)) != len(xids):
                raise self.error(h, "critical_xids", "health.critical_xids", "lists an Xid twice")
        limits = {}
        if "ecc_limits" in h:
            e = self.mapping(h["ecc_limits"], h, "ecc_limits", "health.ecc_limits", _ECC_LIMIT_KEYS)
            for key, value in e.items():
                if not _is_count(value):
                    raise self.error(
                        e, key, f"health.ecc_limits.{key}", f"{_shown(value)}: must be a count (0 or more)"
                    )
                limits[key] = int(value)
        return HealthBaseline(
            provenance=self.provenance(h, "health"),
            min_driver_version=version,
            nvlinks_per_gpu=self.positive_int(h, "nvlinks_per_gpu", "health"),
            critical_xids=None if xids is None else tuple(xids),
            ecc_limits=limits,
        )

    def topology(self, doc: _Mapping, detect: Detect) -> TopologyBaseline | None:
        if "topology" not in doc:
            return None
        t = self.mapping(doc["topology"], doc, "topology", "topology", _TOPOLOGY_KEYS)
        nodes = t.get("gpu_numa_nodes")
        if nodes is not None:
            if not (isinstance(nodes, list) and nodes and all(_is_count(n) for n in nodes)):
                raise self.error(
                    t, "gpu_numa_nodes", "topology.gpu_numa_nodes", "must be a list of NUMA node numbers, one per GPU"
                )
            if detect.gpu_count is not None and len(nodes) != detect.gpu_count:
                raise self.error(
                    t,
                    "gpu_numa_nodes",
                    "topology.gpu_numa_nodes",
                    f"names {len(nodes)} GPUs but detect.gpu_count is {detect.gpu_count}",
                )
        nic = t.get("nic_on_gpu_numa_node")
        if nic is not None and not isinstance(nic, bool):
            raise self.error(t, "nic_on_gpu_numa_node", "topology.nic_on_gpu_numa_node", "must be true or false")
        rate = t.get("ib_rate_gbps")
        if rate is not None and not (_is_number(rate) and rate > 0):
            raise self.error(t, "ib_rate_gbps", "topology.ib_rate_gbps", f"{_shown(rate)}: must be a rate in Gb/s")
        return TopologyBaseline(
            provenance=self.provenance(t, "topology"),
            gpu_numa_nodes=None if nodes is None else tuple(nodes),
            gpus_per_numa_node=self.positive_int(t, "gpus_per_numa_node", "topology"),
            nic_on_gpu_numa_node=nic,
            ib_rate_gbps=None if rate is None else float(rate),
        )

    def provenance(self, m: _Mapping, section: str) -> str:
        value = m.get("provenance")
        if not isinstance(value, str) or not value.strip():
            raise self.error(m, "provenance", f"{section}.provenance", "must be a non-empty string naming the source")
        return value

    def positive_int(self, m: _Mapping, key: str, section: str) -> int | None:
        value = m.get(key)
        if value is not None and not (_is_count(value) and value > 0):
            raise self.error(m, key, f"{section}.{key}", f"{_shown(value)}: must be a whole number above 0")
        return value


_HEALTH_KEYS = {"provenance", "min_driver_version", "nvlinks_per_gpu", "critical_xids", "ecc_limits"}
_TOPOLOGY_KEYS = {"provenance", "gpu_numa_nodes", "gpus_per_numa_node", "nic_on_gpu_numa_node", "ib_rate_gbps"}
# Per-GPU ceilings on memory error counters (nvml.ecc_counts; volatile and aggregate counts are both held to
# them) and on row remapping / page retirement states (pending and failed count as 1).
_ECC_LIMIT_KEYS = {
    "sram_uncorrectable",
    "sram_correctable",
    "dram_uncorrectable",
    "dram_correctable",
    "row_remaps_pending",
    "row_remap_failures",
    "retired_pages",
    "retired_pages_pending",
}


# Every unit in metrics.UNITS is a bandwidth, throughput, time, power, clock, size or GPU temperature, above 0 on
# a working node, except these two: a count (of errors, retries) or a share (of time throttled) that a healthy
# node may keep at 0, lower being better. No unit is signed (a delta would be): no figure is ever negative.
_ZERO_UNITS = frozenset({"count", "%"})
# A count is a whole number: a limit may equal the expected value ("expected: 0, fail: 0": any error fails).
# In every other unit fail < warn < expected strictly (higher is better; the mirror for lower), so a measurement
# at the expected value never fails and the warn band is never empty.
_WHOLE_UNITS = frozenset({"count"})


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _better(direction: str) -> Any:
    return (lambda a, b: a > b) if direction == "higher" else (lambda a, b: a < b)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _names(items: Any) -> str:
    return ", ".join(sorted(items))


SHOWN_WIDTH = 80  # the most characters of a value an error message echoes


class _Shown(Exception):
    pass


def _shown(value: Any) -> str:
    """`value` as an error message echoes it: its repr, cut to SHOWN_WIDTH characters with an ellipsis. Built
    piece by piece and stopped there, so a value that aliases nest a billion times over costs no more."""
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
            put(repr(v[: SHOWN_WIDTH + 1] if isinstance(v, str) else v))

    try:
        walk(value)
    except _Shown:
        return "".join(out)[: SHOWN_WIDTH - 3] + "..."
    return "".join(out)


# --- comparing --------------------------------------------------------------------------------------------

PASS, WARN, FAIL = "pass", "warn", "fail"
INFO = "info"  # measured and reported, compared with nothing (a size of a sweep that no baseline gates)


@dataclass(frozen=True)
class Verdict:
    """One measurement against its reference. `message` is written to triage itself in a CI log."""

    metric: str
    scope: str
    value: float
    unit: str
    direction: str
    expected: float | None
    fail_limit: float | None
    warn_limit: float | None
    verdict: str
    status: str
    provenance: str

    @property
    def delta_pct(self) -> float | None:
        if self.expected in (None, 0) or not math.isfinite(self.value):
            return None
        assert self.expected is not None
        return (self.value - self.expected) / abs(self.expected) * 100.0

    @property
    def message(self) -> str:
        parts = [f"{self.metric} [{self.scope}]: measured {_fmt(self.value)} {self.unit}"]
        if self.expected is not None:
            parts.append(f"expected {_fmt(self.expected)} {self.unit}")
        if self.fail_limit is not None:
            parts.append(f"fail limit {_fmt(self.fail_limit)} {self.unit}")
        if self.warn_limit is not None:
            parts.append(f"warn limit {_fmt(self.warn_limit)} {self.unit}")
        if self.delta_pct is not None:
            parts.append(f"delta {self.delta_pct:+.1f}%")
        parts.append(f"{self.direction} is better")
        text = ", ".join(parts) + f" -> {self.verdict.upper()}"
        if self.verdict != PASS:
            text += f" ({self.status} baseline: {self.provenance})"
        return text

    def as_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "scope": self.scope,
            "value": self.value,
            "unit": self.unit,
            "direction": self.direction,
            "expected": self.expected,
            "limit": _round(self.fail_limit),
            "warn_limit": _round(self.warn_limit),
            "delta_pct": None if self.delta_pct is None else round(self.delta_pct, 3),
            "verdict": self.verdict,
            "status": self.status,
            "provenance": self.provenance,
            "message": self.message,
        }


def compare(ref: Reference, value: float, scope: str) -> Verdict:
    """The verdict for `value` measured at `scope`. A value that is not a finite number always fails."""
    fail_limit, warn_limit = ref.fail_limit, ref.warn_limit
    worse = _better("lower" if ref.direction == "higher" else "higher")
    if not math.isfinite(value) or (fail_limit is not None and worse(value, fail_limit)):
        verdict = FAIL
    elif warn_limit is not None and worse(value, warn_limit):
        verdict = WARN
    else:
        verdict = PASS
    return Verdict(
        metric=ref.metric,
        scope=scope,
        value=value,
        unit=ref.unit,
        direction=ref.direction,
        expected=ref.expected,
        fail_limit=fail_limit,
        warn_limit=warn_limit,
        verdict=verdict,
        status=ref.status,
        provenance=ref.provenance,
    )


def _round(x: float | None) -> float | None:
    """Limits derived from percentages print as 1.0899999999999999; six significant digits are plenty."""
    return None if x is None else float(f"{x:.6g}")


def _fmt(x: float) -> str:
    return f"{x:.4g}" if math.isfinite(x) else str(x)


# --- recording --------------------------------------------------------------------------------------------

# Limits a recorded metric gets when no earlier baseline gave one: SuperBench's rule for its published
# baselines fails 10% below the reference; warn halfway there.
DEFAULT_FAIL, DEFAULT_WARN = Limit(relative_pct=10.0), Limit(relative_pct=5.0)


def recorded_baseline(
    sku: str,
    previous: Baseline | None,
    measurements: list[dict[str, Any]],
    provenance: str,
    node_gpu_count: int | None = None,
) -> dict[str, Any]:
    """A baseline document whose expected values are this run's medians. Limits, params and the detect
    section carry over from `previous` (the baseline the run was checked against) where it had them; a SKU
    recorded for the first time gets the node's GPU count as its `detect.gpu_count`."""
    by_metric: dict[str, list[dict[str, Any]]] = {}
    for m in measurements:
        if _is_number(m.get("value")) and m.get("verdict") != INFO:
            by_metric.setdefault(m["metric"], []).append(m)
    metrics: dict[str, Any] = {}
    for name, records in by_metric.items():
        first = records[0]
        unit, direction, kind = first["unit"], first["direction"], first["scope_kind"]
        old = previous.metrics.get(name) if previous else None
        entry: dict[str, Any] = {
            "unit": unit,
            "direction": direction,
            "scope": kind,
            "status": "measured",
            "provenance": provenance,
        }
        if kind in PER_LABEL_SCOPE_KINDS:
            labels: dict[str, list[float]] = {}
            for r in records:
                labels.setdefault(r["scope"], []).append(r["value"])
            worst = min if direction == "higher" else max
            anchor = worst(statistics.median(v) for v in labels.values())  # limits must fit every label's value
            entry.update(_limits(old.default if old else None, anchor, direction, unit))
            entry["values"] = {label: {"expected": statistics.median(v)} for label, v in labels.items()}
        else:
            expected = statistics.median(r["value"] for r in records)
            entry["expected"] = expected
            entry.update(_limits(old.default if old else None, expected, direction, unit))
        if old is not None and old.default.params:
            entry["params"] = dict(old.default.params)
        metrics[name] = entry
    doc: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "sku": sku}
    doc["description"] = previous.description if previous else f"{sku}, recorded from a golden node"
    if previous is None and node_gpu_count is not None:
        doc["detect"] = {"gpu_count": node_gpu_count}
    if previous is not None and previous.detect != Detect():
        d = previous.detect
        doc["detect"] = {
            k: v
            for k, v in (
                ("azure_vm_sizes", list(d.azure_vm_sizes)),
                ("gpu_name_contains", d.gpu_name_contains),
                ("gpu_count", d.gpu_count),
            )
            if v not in (None, [])
        }
    # The health gates and the expected layout are not measured: they carry over as they were.
    if previous is not None and previous.health is not None:
        doc["health"] = previous.health.as_doc()
    if previous is not None and previous.topology is not None:
        doc["topology"] = previous.topology.as_doc()
    doc["metrics"] = metrics
    if previous is not None and previous.pretrain is not None:
        doc["pretrain"] = previous.pretrain.as_doc()
    return doc


def _limits(old: Reference | None, expected: float, direction: str, unit: str) -> dict[str, Any]:
    """The old limits where they still order fail < warn < expected around the new value (as loading checks
    it: <= in a whole-number unit), else the defaults."""
    fail = old.fail if old is not None and old.fail is not None else DEFAULT_FAIL
    warn = old.warn if old is not None and old.warn is not None else DEFAULT_WARN
    better = _better(direction)
    fail_at, warn_at = fail.threshold(expected, direction), warn.threshold(expected, direction)
    misordered = better(fail_at, warn_at) or better(warn_at, expected)
    if misordered or (unit not in _WHOLE_UNITS and (fail_at == warn_at or warn_at == expected)):
        fail, warn = DEFAULT_FAIL, DEFAULT_WARN
    return {"fail": _limit_value(fail), "warn": _limit_value(warn)}


def _limit_value(limit: Limit) -> str | float:
    return str(limit) if limit.absolute is None else limit.absolute


def dump_baseline(doc: dict[str, Any]) -> str:
    import yaml

    header = "# Recorded by pytest-gbvalidate --gb-record. Review the limits before committing.\n"
    return header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=120)


# --- NCCL environment ---------------------------------------------------------------------------------------


def nccl_env(baseline: Baseline) -> dict[str, tuple[str, str]]:
    """The NCCL environment a SKU's figures were taken with: every `params.nccl_env` of its metrics, as
    {variable: (value, which metric asks for it)}. Two metrics asking for different values is an error: one
    set of ranks runs every collective."""
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
