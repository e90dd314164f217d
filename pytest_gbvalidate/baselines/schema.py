"""The schema of a baseline file, checked field by field on the loaded YAML: `baseline_from` turns it into the
model or raises a BaselineError naming the file, the line and the field. The top level and `detect` are
here; the metrics are checked in schema_metrics.py, the other sections in schema_sections.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pytest_gbvalidate.baselines.fields import Fields, _Mapping
from pytest_gbvalidate.baselines.model import (
    DEFAULT_NEEDED,
    SCHEMA_VERSION,
    Baseline,
    BaselineError,
    Detect,
    _is_count,
    _names,
    _shown,
)
from pytest_gbvalidate.baselines.schema_metrics import metric, needed_pct
from pytest_gbvalidate.baselines.schema_sections import health, pretrain, topology
from pytest_gbvalidate.rules.resolution import Needed

_TOP_KEYS = {
    *("schema_version", "sku", "description", "detect", "resolution", "metrics", "health", "topology", "pretrain"),
}
_RESOLUTION_KEYS = {"pct", "provenance"}
_DETECT_KEYS = {"azure_vm_sizes", "gpu_name_contains", "gpu_count"}
MAX_GPUS = 64  # in one node; the largest today hold 8 (16 on a few)


def baseline_from(path: Path, doc: Any) -> Baseline:
    """The baseline the loaded YAML `doc` of the file at `path` describes."""
    f = Fields(path)
    if not isinstance(doc, _Mapping):
        raise BaselineError(f"{path}:1: the file must be a YAML mapping with {_names(_TOP_KEYS)}")
    doc = f.mapping(doc, doc, None, "<top>", _TOP_KEYS)
    for required in ("schema_version", "sku", "metrics"):
        if required not in doc:
            raise f.error(doc, None, required, "missing")
    if not _is_count(doc["schema_version"]) or doc["schema_version"] != SCHEMA_VERSION:
        raise f.error(doc, "schema_version", "schema_version", f"must be {SCHEMA_VERSION}")
    if doc["sku"] != path.stem:
        raise f.error(doc, "sku", "sku", f"{_shown(doc['sku'])} does not match the file name {_shown(path.name)}")
    description = doc.get("description", "")
    if not isinstance(description, str):
        raise f.error(doc, "description", "description", f"must be a string, got {type(description).__name__}")
    metrics_doc = f.mapping(doc["metrics"], doc, "metrics", "metrics", None)
    found = detect(f, doc)
    needed = resolution(f, doc)
    metrics = {name: metric(f, metrics_doc, name, needed) for name in metrics_doc}
    return Baseline(
        doc["sku"], path, description, found, metrics, pretrain(f, doc), needed, health(f, doc), topology(f, doc, found)
    )


def detect(f: Fields, doc: _Mapping) -> Detect:
    if "detect" not in doc:
        return Detect()
    d = f.mapping(doc["detect"], doc, "detect", "detect", _DETECT_KEYS)
    sizes = d.get("azure_vm_sizes", [])
    if not (isinstance(sizes, list) and all(isinstance(s, str) for s in sizes)):
        raise f.error(d, "azure_vm_sizes", "detect.azure_vm_sizes", "must be a list of strings")
    name = d.get("gpu_name_contains")
    if name is not None and not isinstance(name, str):
        raise f.error(d, "gpu_name_contains", "detect.gpu_name_contains", "must be a string")
    count = d.get("gpu_count")
    if count is not None and (not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= MAX_GPUS):
        # Every per-GPU check is a test case per GPU (and a rank each): the count bounds what a run generates.
        raise f.error(d, "gpu_count", "detect.gpu_count", f"must be an integer from 0 to {MAX_GPUS}")
    return Detect(tuple(sizes), name, count)


def resolution(f: Fields, doc: _Mapping) -> Needed:
    """The resolution the SKU's metrics need unless one declares its own (`resolution: {pct, provenance}`)."""
    if "resolution" not in doc:
        return DEFAULT_NEEDED
    r = f.mapping(doc["resolution"], doc, "resolution", "resolution", _RESOLUTION_KEYS)
    if "pct" not in r:
        raise f.error(r, None, "resolution.pct", "missing")
    f.provenance(r, "resolution")  # required: the figure says where it comes from, in the file
    return Needed(needed_pct(f, r, "pct", "resolution.pct"), "resolution.pct")
