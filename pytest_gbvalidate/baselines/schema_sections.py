"""The sections of a baseline file beside its metrics: `pretrain` (what the pretraining check runs),
`health` (the gates of the health suite) and `topology` (the layout the topology suite expects), each
checked field by field into its part of the model."""

from __future__ import annotations

import dataclasses
import re

from pytest_gbvalidate.baselines.fields import Fields, _Mapping
from pytest_gbvalidate.baselines.model import (
    DEFAULT_LEARNING_RATE,
    Detect,
    HealthBaseline,
    PretrainSpec,
    TopologyBaseline,
    _is_count,
    _is_number,
    _names,
    _shown,
)
from pytest_gbvalidate.rules import xids
from pytest_gbvalidate.rules.xids import XidAction
from pytest_gbvalidate.workloads.llama import parallel as llama_parallel
from pytest_gbvalidate.workloads.llama.config import CONFIGS as LLAMA_CONFIGS

_PRETRAIN_REQUIRED = {
    *("model", "precision", "engine", "warmup_steps", "timed_steps", "provenance", *llama_parallel.SIZES),
}
_PRETRAIN_KEYS = _PRETRAIN_REQUIRED | {
    *("seq_len", "activation_checkpointing", "compile", "learning_rate", "peak_tflops_per_gpu", "peak_tflops_source"),
    *("fp8_recipe", "engine_python"),
}

# The pretraining check's time limit grows with its steps (suites/test_pretrain.py: 10 minutes a step): the baselines
# and docs use 2 to 34 warm-up steps and 10 timed; a thousand is far beyond any figure's need and still ends.
_STEP_BOUNDS: dict[str, tuple[int, int | None]] = {"warmup_steps": (0, 1000), "timed_steps": (1, 1000)}


def _pretrain_layout(f: Fields, p: _Mapping, model: str) -> tuple[dict[str, int], llama_parallel.Layout]:
    """The pretrain section's counts (the layout's sizes, the sequence length, the steps) and its layout, checked
    against the model at that sequence length."""
    counts = {}
    for key in (*llama_parallel.SIZES, "seq_len", "warmup_steps", "timed_steps"):
        value = p.get(key, LLAMA_CONFIGS[model].seq_len if key == "seq_len" else None)
        least, most = _STEP_BOUNDS.get(key, (1, None))
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise f.error(p, key, f"pretrain.{key}", f"must be an integer >= {least}, got {_shown(value)}")
        if most is not None and value > most:
            raise f.error(p, key, f"pretrain.{key}", f"must be an integer from {least} to {most}, got {value}")
        counts[key] = value
    checkpointing = p.get("activation_checkpointing", "none")
    if isinstance(checkpointing, bool):  # true: every block recomputed, as files before the modes had it
        checkpointing = "full" if checkpointing else "none"
    if checkpointing not in llama_parallel.CHECKPOINTING:
        modes = f"{', '.join(llama_parallel.CHECKPOINTING)} (or true for full, false for none)"
        raise f.at(p, "activation_checkpointing", "pretrain", f"must be one of {modes}, got {_shown(checkpointing)}")
    named = (
        ("engine", llama_parallel.ENGINES),
        ("precision", llama_parallel.PRECISIONS),
        ("fp8_recipe", llama_parallel.FP8_RECIPES),  # optional: the first is the default
    )
    for key, known in named:
        if p.get(key, known[0]) not in known:
            raise f.error(p, key, f"pretrain.{key}", f"{_shown(p[key])} is not one of {', '.join(known)}")
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
        raise f.error(p, key, f"pretrain.{key}", f"invalid layout for {model} at seq {cfg.seq_len}: {message}")
    return counts, layout


def pretrain(f: Fields, doc: _Mapping) -> PretrainSpec | None:
    if "pretrain" not in doc:
        return None
    p = f.mapping(doc["pretrain"], doc, "pretrain", "pretrain", _PRETRAIN_KEYS)
    missing = sorted(_PRETRAIN_REQUIRED - set(p))
    if missing:
        raise f.error(p, None, f"pretrain.{missing[0]}", "missing")
    model = p["model"]
    if not (isinstance(model, str) and model in LLAMA_CONFIGS):
        raise f.error(p, "model", "pretrain.model", f"unknown model {_shown(model)} (known: {_names(LLAMA_CONFIGS)})")
    counts, layout = _pretrain_layout(f, p, model)
    learning_rate = p.get("learning_rate", DEFAULT_LEARNING_RATE)
    if not _is_number(learning_rate) or learning_rate <= 0:
        raise f.error(p, "learning_rate", "pretrain.learning_rate", "must be a positive number")
    peak, source = p.get("peak_tflops_per_gpu"), p.get("peak_tflops_source", "")
    if peak is not None and (not _is_number(peak) or peak <= 0):
        raise f.error(p, "peak_tflops_per_gpu", "pretrain.peak_tflops_per_gpu", "must be a positive number")
    if not isinstance(source, str) or (peak is not None and not source.strip()):
        raise f.error(p, "peak_tflops_source", "pretrain.peak_tflops_source", "must name where the peak comes from")
    compile_blocks = p.get("compile", True)
    if not isinstance(compile_blocks, bool):
        raise f.error(p, "compile", "pretrain.compile", f"must be true or false, got {_shown(compile_blocks)}")
    provenance = f.provenance(p, "pretrain")
    engine_python = p.get("engine_python")
    if engine_python is not None and not (
        isinstance(engine_python, str) and engine_python.strip() and p["engine"] != "native"
    ):
        got = f"got {_shown(engine_python)} with engine {p['engine']}"
        command = "the command a NeMo engine's driver runs under (e.g. /opt/nemo/bin/python)"
        raise f.at(p, "engine_python", "pretrain", f"{command}, for engine nemo or megatron_bridge only; {got}")
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


def health(f: Fields, doc: _Mapping) -> HealthBaseline | None:
    if "health" not in doc:
        return None
    h = f.mapping(doc["health"], doc, "health", "health", _HEALTH_KEYS)
    versions = {}
    for key, example in (("min_driver_version", "570.133.20"), ("min_nccl_version", "2.9.9")):
        version = versions[key] = h.get(key)
        if version is not None and not (isinstance(version, str) and re.fullmatch(r"\d+(\.\d+)*", version)):
            raise f.error(h, key, f"health.{key}", f"{_shown(version)}: quote it, e.g. '{example}'")
    plugin = h.get("nccl_net_plugin")
    if plugin is not None and not (isinstance(plugin, str) and plugin.strip()):
        raise f.error(h, "nccl_net_plugin", "health.nccl_net_plugin", f"{_shown(plugin)}: a library file name")
    if "critical_xids" in h:  # a list of codes that fail, read since boot: the catalog decides now
        why = (
            "no longer read: NVIDIA's Xid catalog decides what each code calls for (docs/checks.md, Xid events); "
            "remove it, and where your site acts otherwise list the codes under their action in health.xid_actions "
            "(e.g. {drain: [13], ignore: [94]}; actions: drain, job, warn, ignore)"
        )
        raise f.at(h, "critical_xids", "health", why)
    xid_actions = _xid_actions(f, h)
    limits = _counts(f, h, "ecc_limits", _ECC_LIMIT_KEYS)
    flags = {}
    for key in ("multi_node_nvlink", "c2c", "gpudirect_rdma"):
        flag = flags[key] = h.get(key)
        if flag is not None and not isinstance(flag, bool):
            raise f.error(h, key, f"health.{key}", f"{_shown(flag)}: must be true or false")
    offset = h.get("thermal_margin_offset_c")
    if offset is not None and not (isinstance(offset, int) and not isinstance(offset, bool) and -50 <= offset <= 50):
        why = f"{_shown(offset)}: must be whole degrees C from -50 to 50 (e.g. -2: 2 C past the T.Limit)"
        raise f.at(h, "thermal_margin_offset_c", "health", why)
    return HealthBaseline(
        provenance=f.provenance(h, "health"),
        min_driver_version=versions["min_driver_version"],
        min_nccl_version=versions["min_nccl_version"],
        nccl_net_plugin=plugin,
        nvlinks_per_gpu=f.positive_int(h, "nvlinks_per_gpu", "health"),
        xid_actions=xid_actions,
        ecc_limits=limits,
        multi_node_nvlink=flags["multi_node_nvlink"],
        c2c=flags["c2c"],
        nic_pcie=_nic_pcie(f, h),
        gpudirect_rdma=flags["gpudirect_rdma"],
        nvlink_error_limits=_counts(f, h, "nvlink_error_limits", _NVLINK_ERROR_LIMIT_KEYS),
        thermal_margin_offset_c=offset,
    )


def _xid_actions(f: Fields, h: _Mapping) -> dict[int, XidAction]:
    """health.xid_actions: ACTION -> the Xid codes a site acts on otherwise than NVIDIA's catalog (rules/xids.py)
    says, or that a newer driver raises and the catalog does not list yet."""
    if "xid_actions" not in h:
        return {}
    m = f.mapping(h["xid_actions"], h, "xid_actions", "health.xid_actions", set(xids.XID_ACTIONS))
    actions: dict[int, XidAction] = {}
    for action in (a for a in xids.XID_ACTIONS if a in m):
        codes, field = m[action], f"health.xid_actions.{action}"
        if not (isinstance(codes, list) and codes):
            raise f.error(m, action, field, f"{_shown(codes)}: must be a list of Xid codes")
        for code in codes:
            if not (_is_count(code) and 0 < code <= xids.MAX_CODE):
                shown = f"{_shown(code)}: not an Xid code (a whole number, 1 to {xids.MAX_CODE})"
                raise f.error(m, action, field, shown)
            if code in actions:
                raise f.error(m, action, field, f"Xid {code} has an action already: {actions[code]}")
            actions[int(code)] = action
    return actions


def _nic_pcie(f: Fields, h: _Mapping) -> dict[str, int]:
    """health.nic_pcie: {gen: 1-6, width: a PCIe lane count}, both given."""
    if "nic_pcie" not in h:
        return {}
    m = f.mapping(h["nic_pcie"], h, "nic_pcie", "health.nic_pcie", {"gen", "width"})
    for key, allowed in (("gen", (1, 2, 3, 4, 5, 6)), ("width", (1, 2, 4, 8, 16, 32))):
        value = m.get(key)
        if value is None:
            raise f.error(m, None, f"health.nic_pcie.{key}", "missing")
        if not (isinstance(value, int) and not isinstance(value, bool) and value in allowed):
            message = f"{_shown(value)}: must be one of {', '.join(map(str, allowed))}"
            raise f.error(m, key, f"health.nic_pcie.{key}", message)
    return {"gen": int(m["gen"]), "width": int(m["width"])}


def _counts(f: Fields, h: _Mapping, name: str, keys: set[str]) -> dict[str, int]:
    """health.<name>: counter -> a count (0 or more), for the counters among `keys`."""
    if name not in h:
        return {}
    m = f.mapping(h[name], h, name, f"health.{name}", keys)
    counts = {}
    for key, value in m.items():
        if not _is_count(value):
            raise f.error(m, key, f"health.{name}.{key}", f"{_shown(value)}: must be a count (0 or more)")
        counts[key] = int(value)
    return counts


def topology(f: Fields, doc: _Mapping, detect: Detect) -> TopologyBaseline | None:
    if "topology" not in doc:
        return None
    t = f.mapping(doc["topology"], doc, "topology", "topology", _TOPOLOGY_KEYS)
    nodes = t.get("gpu_numa_nodes")
    if nodes is not None:
        if not (isinstance(nodes, list) and nodes and all(_is_count(n) for n in nodes)):
            raise f.at(t, "gpu_numa_nodes", "topology", "must be a list of NUMA node numbers, one per GPU")
        if detect.gpu_count is not None and len(nodes) != detect.gpu_count:
            why = f"names {len(nodes)} GPUs but detect.gpu_count is {detect.gpu_count}"
            raise f.at(t, "gpu_numa_nodes", "topology", why)
    nic = t.get("nic_on_gpu_numa_node")
    if nic is not None and not isinstance(nic, bool):
        raise f.error(t, "nic_on_gpu_numa_node", "topology.nic_on_gpu_numa_node", "must be true or false")
    rate = t.get("ib_rate_gbps")
    if rate is not None and not (_is_number(rate) and rate > 0):
        raise f.error(t, "ib_rate_gbps", "topology.ib_rate_gbps", f"{_shown(rate)}: must be a rate in Gb/s")
    return TopologyBaseline(
        provenance=f.provenance(t, "topology"),
        gpu_numa_nodes=None if nodes is None else tuple(nodes),
        gpus_per_numa_node=f.positive_int(t, "gpus_per_numa_node", "topology"),
        nic_on_gpu_numa_node=nic,
        ib_rate_gbps=None if rate is None else float(rate),
    )


_HEALTH_KEYS = {
    *("provenance", "min_driver_version", "min_nccl_version", "nccl_net_plugin", "nic_pcie", "gpudirect_rdma"),
    *("nvlinks_per_gpu", "critical_xids", "xid_actions", "ecc_limits", "multi_node_nvlink", "c2c"),
    *("nvlink_error_limits", "thermal_margin_offset_c"),
}
# Per-link ceilings on NVLink data-link error counters (nvml.NVLINK_ERROR_COUNTERS), since the driver loaded.
_NVLINK_ERROR_LIMIT_KEYS = {"replay", "recovery", "crc_flit", "crc_data"}
_TOPOLOGY_KEYS = {"provenance", "gpu_numa_nodes", "gpus_per_numa_node", "nic_on_gpu_numa_node", "ib_rate_gbps"}
# Per-GPU ceilings on memory error counters (nvml.ecc_counts; volatile and aggregate counts are both held to
# them) and on row remapping / page retirement states (pending and failed count as 1).
_ECC_LIMIT_KEYS = {
    *("sram_uncorrectable", "sram_correctable", "dram_uncorrectable", "dram_correctable", "row_remaps_pending"),
    *("row_remap_failures", "retired_pages", "retired_pages_pending"),
}
