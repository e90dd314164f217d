"""The schema of a baseline file, checked field by field on the loaded YAML: `_Parser` turns it into the model
or raises a BaselineError naming the file, the line and the field."""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from pathlib import Path
from typing import Any

from pytest_gbvalidate.baselines.model import (
    _WHOLE_UNITS,
    _ZERO_UNITS,
    DEFAULT_LEARNING_RATE,
    SCHEMA_VERSION,
    STATUSES,
    Baseline,
    BaselineError,
    Detect,
    HealthBaseline,
    Limit,
    MetricBaseline,
    PretrainSpec,
    Reference,
    TopologyBaseline,
    _better,
    _is_count,
    _is_number,
    _names,
    _shown,
)
from pytest_gbvalidate.labels import parse_size_label
from pytest_gbvalidate.metrics import CATALOG, DIRECTIONS, SCOPE_KINDS, UNITS
from pytest_gbvalidate.workloads.llama import parallel as llama_parallel
from pytest_gbvalidate.workloads.llama.config import CONFIGS as LLAMA_CONFIGS

_TOP_KEYS = {"schema_version", "sku", "description", "detect", "metrics", "health", "topology", "pretrain"}
_DETECT_KEYS = {"azure_vm_sizes", "gpu_name_contains", "gpu_count"}
_OVERRIDE_KEYS = {"status", "expected", "fail", "warn", "provenance", "params"}
_METRIC_KEYS = _OVERRIDE_KEYS | {"unit", "direction", "scope", "values"}
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
    "compile",
    "learning_rate",
    "peak_tflops_per_gpu",
    "peak_tflops_source",
    "fp8_recipe",
    "engine_python",
}


# The params the suites read (suites/, sweeps.py) and the values they can run with.
_PARAM_BOUNDS: dict[str, tuple[float, float]] = {
    "iterations": (1, 10_000),
    "warmup": (0, 10_000),
    "size_bytes": (1, 2**40),
    "min_bytes": (1, 2**40),
    "max_bytes": (1, 2**40),
    "slow_pct": (0.1, 99),
    "batch": (1, 4096),
    "prompt_len": (1, 2**20),
    "new_tokens": (1, 2**20),
}
_FRACTIONAL_PARAMS = frozenset({"slow_pct"})
MAX_GPUS = 64  # in one node; the largest today hold 8 (16 on a few)


class _Mapping(dict[str, Any]):
    """A YAML mapping that remembers the line of each key (1-based), for error messages."""

    line: int = 0
    key_lines: dict[str, int]


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
        if count is not None and (not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= MAX_GPUS):
            # Every per-GPU check is a test case per GPU (and a rank each): the count bounds what a run generates.
            raise self.error(d, "gpu_count", "detect.gpu_count", f"must be an integer from 0 to {MAX_GPUS}")
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
                if scope_kind == "message_size":  # the sweep runs the sizes the labels name
                    try:
                        parse_size_label(str(label))
                    except ValueError:
                        raise self.error(
                            values_doc, label, lfp, "is not a message size (8B, 1KiB, 128MiB, 8GiB)"
                        ) from None
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
            self.check_params(m, params, fp)
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

    def check_params(self, m: _Mapping, params: dict[str, Any], fp: str) -> None:
        """The params the checks read, of the types and ranges they need (a site's own checks may add others)."""
        for key, value in params.items():
            bounds = _PARAM_BOUNDS.get(key)
            if bounds is None:
                continue
            least, most = bounds
            whole = isinstance(value, int) and not isinstance(value, bool)
            fits = (whole or (key in _FRACTIONAL_PARAMS and _is_number(value))) and least <= value <= most
            if not fits:
                kind = "a number" if key in _FRACTIONAL_PARAMS else "an integer"
                raise self.error(
                    m, "params", f"{fp}.params.{key}", f"must be {kind} from {least:g} to {most:g}, got {_shown(value)}"
                )

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
        checkpointing = p.get("activation_checkpointing", "none")
        if isinstance(checkpointing, bool):  # true: every block recomputed, as files before the modes had it
            checkpointing = "full" if checkpointing else "none"
        if checkpointing not in llama_parallel.CHECKPOINTING:
            raise self.error(
                p,
                "activation_checkpointing",
                "pretrain.activation_checkpointing",
                f"must be one of {', '.join(llama_parallel.CHECKPOINTING)} (or true for full, false for none), "
                f"got {_shown(checkpointing)}",
            )
        named = (
            ("engine", llama_parallel.ENGINES),
            ("precision", llama_parallel.PRECISIONS),
            ("fp8_recipe", llama_parallel.FP8_RECIPES),  # optional: the first is the default
        )
        for key, known in named:
            if p.get(key, known[0]) not in known:
                raise self.error(p, key, f"pretrain.{key}", f"{_shown(p[key])} is not one of {', '.join(known)}")
        layout = llama_parallel.Layout(
            **{k: counts[k] for k in llama_parallel.SIZES},
            precision=p["precision"],
            engine=p["engine"],
            activation_checkpointing=checkpointing,
            fp8_recipe=p.get("fp8_recipe", llama_parallel.FP8_RECIPES[0]),
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
        compile_blocks = p.get("compile", True)
        if not isinstance(compile_blocks, bool):
            raise self.error(p, "compile", "pretrain.compile", f"must be true or false, got {_shown(compile_blocks)}")
        provenance = p["provenance"]
        if not isinstance(provenance, str) or not provenance.strip():
            raise self.error(p, "provenance", "pretrain.provenance", "must be a non-empty string naming the source")
        engine_python = p.get("engine_python")
        if engine_python is not None and not (
            isinstance(engine_python, str) and engine_python.strip() and p["engine"] != "native"
        ):
            raise self.error(
                p,
                "engine_python",
                "pretrain.engine_python",
                "the command a NeMo engine's driver runs under (e.g. /opt/nemo/bin/python), for engine nemo or "
                f"megatron_bridge only; got {_shown(engine_python)} with engine {p['engine']}",
            )
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
            compile=compile_blocks,
            engine_python=engine_python,
        )

    # --- the health and topology sections ---------------------------------------------------------------

    def health(self, doc: _Mapping) -> HealthBaseline | None:
        if "health" not in doc:
            return None
        h = self.mapping(doc["health"], doc, "health", "health", _HEALTH_KEYS)
        versions = {}
        for key, example in (("min_driver_version", "570.133.20"), ("min_nccl_version", "2.9.9")):
            version = versions[key] = h.get(key)
            if version is not None and not (isinstance(version, str) and re.fullmatch(r"\d+(\.\d+)*", version)):
                raise self.error(h, key, f"health.{key}", f"{_shown(version)}: quote it, e.g. '{example}'")
        plugin = h.get("nccl_net_plugin")
        if plugin is not None and not (isinstance(plugin, str) and plugin.strip()):
            raise self.error(h, "nccl_net_plugin", "health.nccl_net_plugin", f"{_shown(plugin)}: a library file name")
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
            min_driver_version=versions["min_driver_version"],
            min_nccl_version=versions["min_nccl_version"],
            nccl_net_plugin=plugin,
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


_HEALTH_KEYS = {
    *("provenance", "min_driver_version", "min_nccl_version", "nccl_net_plugin"),
    *("nvlinks_per_gpu", "critical_xids", "ecc_limits"),
}
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
