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
        scope: gpu                 # node | gpu | gpu_pair | link | message_size
        status: provisional        # measured (on a golden node) | provisional
        expected: 51
        fail: 48                   # absolute limit in the metric's unit, or "10%" of expected
        warn: 50.4
        provenance: where the numbers come from
      all_reduce_busbw_gbps:
        ...
        values:                    # per scope label; each entry overrides the metric-level fields
          8GiB: {expected: 478.87, provenance: ...}

Every error names the file, the line and the field.
"""

from __future__ import annotations

import functools
import itertools
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import yaml

from pytest_gbvalidate.metrics import CATALOG, DIRECTIONS, PER_LABEL_SCOPE_KINDS, SCOPE_KINDS, UNITS

SCHEMA_VERSION = 1
STATUSES = ("measured", "provisional")
_TOP_KEYS = {"schema_version", "sku", "description", "detect", "metrics"}
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


@functools.cache
def _loader() -> type[yaml.SafeLoader]:
    """A SafeLoader that builds _Mappings and rejects duplicate keys. Built on first use: the plugin module
    loads in every pytest run, and PyYAML is needed only by one that reads baselines."""
    import yaml

    def construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> _Mapping:
        loader.flatten_mapping(node)
        mapping = _Mapping()
        mapping.line = node.start_mark.line + 1
        mapping.key_lines = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                raise BaselineError(f"{key_node.start_mark.line + 1}: keys must be strings, got {key!r}")
            if key in mapping:
                raise BaselineError(f"{key_node.start_mark.line + 1}: duplicate key {key!r}")
            mapping[key] = loader.construct_object(value_node, deep=True)
            mapping.key_lines[key] = key_node.start_mark.line + 1
        return mapping

    class Loader(yaml.SafeLoader):
        pass

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
class Baseline:
    sku: str
    path: Path
    description: str
    detect: Detect
    metrics: dict[str, MetricBaseline]


# --- loading ----------------------------------------------------------------------------------------------


def baseline_path(directory: Path, sku: str) -> Path:
    return directory / f"{sku}.yaml"


def known_skus(directory: Path) -> list[str]:
    return sorted(p.stem for p in directory.glob("*.yaml"))


def load_baseline(path: Path) -> Baseline:
    """Read and validate one baseline file. Raises BaselineError naming the file, line and field."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise BaselineError(f"{path}: cannot read: {exc.strerror or exc}") from None
    import yaml

    try:
        doc = yaml.load(text, Loader=_loader())  # noqa: S506 -- a SafeLoader subclass
    except BaselineError as exc:
        raise BaselineError(f"{path}:{exc}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise BaselineError(f"{where}: YAML syntax error: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise BaselineError(f"{path}: YAML error: {exc}") from None
    return _Parser(path).baseline(doc)


def load_all(directory: Path) -> list[Baseline]:
    return [load_baseline(baseline_path(directory, sku)) for sku in known_skus(directory)]


class _Parser:
    def __init__(self, path: Path) -> None:
        self.path = path

    def error(self, where: _Mapping, key: str | None, field_path: str, message: str) -> BaselineError:
        line = where.key_lines.get(key, where.line) if key is not None else where.line
        return BaselineError(f"{self.path}:{line}: {field_path}: {message}")

    def mapping(self, value: Any, parent: _Mapping, key: str | None, field_path: str, allowed: set[str]) -> _Mapping:
        if not isinstance(value, _Mapping):
            raise self.error(parent, key, field_path, f"must be a mapping, got {type(value).__name__}")
        unknown = sorted(set(value) - allowed)
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
        if doc["schema_version"] != SCHEMA_VERSION:
            raise self.error(doc, "schema_version", "schema_version", f"must be {SCHEMA_VERSION}")
        if doc["sku"] != self.path.stem:
            raise self.error(doc, "sku", "sku", f"{doc['sku']!r} does not match the file name {self.path.name!r}")
        metrics_doc = self.mapping(doc["metrics"], doc, "metrics", "metrics", set(doc["metrics"] or ()))
        return Baseline(
            sku=doc["sku"],
            path=self.path,
            description=str(doc.get("description", "")),
            detect=self.detect(doc),
            metrics={name: self.metric(metrics_doc, name) for name in metrics_doc},
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
        if unit not in UNITS:
            raise self.error(m, "unit", f"{fp}.unit", f"unknown unit {unit!r} (known: {_names(UNITS)})")
        if direction not in DIRECTIONS:
            raise self.error(m, "direction", f"{fp}.direction", f"{direction!r} is not one of {_names(DIRECTIONS)}")
        if scope_kind not in SCOPE_KINDS:
            raise self.error(m, "scope", f"{fp}.scope", f"{scope_kind!r} is not one of {_names(SCOPE_KINDS)}")
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
            values_doc = self.mapping(m["values"], m, "values", f"{fp}.values", set(m["values"] or ()))
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
            raise self.error(m, "status", f"{fp}.status", f"{status!r} is not one of {_names(STATUSES)}")
        provenance = m.get("provenance", base.provenance)
        if not isinstance(provenance, str) or (check and not provenance.strip()):
            raise self.error(m, "provenance", f"{fp}.provenance", "must be a non-empty string naming the source")
        expected = base.expected
        if "expected" in m:
            expected = m["expected"]
            if not _is_number(expected):
                raise self.error(m, "expected", f"{fp}.expected", f"must be a finite number, got {expected!r}")
            expected = float(expected)
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
            fail=self.limit(m, "fail", fp) if "fail" in m else base.fail,
            warn=self.limit(m, "warn", fp) if "warn" in m else base.warn,
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

    def limit(self, m: _Mapping, key: str, fp: str) -> Limit:
        raw = m[key]
        if isinstance(raw, str) and raw.strip().endswith("%"):
            try:
                pct = float(raw.strip()[:-1])
            except ValueError:
                pct = math.nan
            if not math.isfinite(pct) or pct <= 0:
                raise self.error(m, key, f"{fp}.{key}", f"{raw!r}: a relative limit is a positive percentage")
            return Limit(relative_pct=pct)
        if not _is_number(raw):
            raise self.error(m, key, f"{fp}.{key}", f"{raw!r}: give a number in the metric's unit or a percentage")
        return Limit(absolute=float(raw))

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
                if ref.direction == "higher" and lim.relative_pct >= 100:
                    raise self.error(m, key, f"{fp}.{key}", "must be below 100% for a higher-is-better metric")
        better = _better(ref.direction)
        ordered = [("fail", ref.fail_limit), ("warn", ref.warn_limit), ("expected", ref.expected)]
        present = [(k, v) for k, v in ordered if v is not None]
        for (k1, v1), (k2, v2) in itertools.pairwise(present):
            if better(v1, v2):
                word = "above" if ref.direction == "higher" else "below"
                raise self.error(m, k1, f"{fp}.{k1}", f"{v1:g} is {word} {k2} {v2:g} ({ref.direction} is better)")


def _better(direction: str) -> Any:
    return (lambda a, b: a > b) if direction == "higher" else (lambda a, b: a < b)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _names(items: Any) -> str:
    return ", ".join(sorted(items))


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
    sku: str, previous: Baseline | None, measurements: list[dict[str, Any]], provenance: str
) -> dict[str, Any]:
    """A baseline document whose expected values are this run's medians. Limits, params and the detect
    section carry over from `previous` (the baseline the run was checked against) where it had them."""
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
            entry.update(_limits(old.default if old else None, anchor, direction))
            entry["values"] = {label: {"expected": statistics.median(v)} for label, v in labels.items()}
        else:
            expected = statistics.median(r["value"] for r in records)
            entry["expected"] = expected
            entry.update(_limits(old.default if old else None, expected, direction))
        if old is not None and old.default.params:
            entry["params"] = dict(old.default.params)
        metrics[name] = entry
    doc: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "sku": sku}
    doc["description"] = previous.description if previous else f"{sku}, recorded from a golden node"
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
    doc["metrics"] = metrics
    return doc


def _limits(old: Reference | None, expected: float, direction: str) -> dict[str, Any]:
    """The old limits where they still order fail <= warn <= expected around the new value, else the defaults."""
    fail = old.fail if old is not None and old.fail is not None else DEFAULT_FAIL
    warn = old.warn if old is not None and old.warn is not None else DEFAULT_WARN
    better = _better(direction)
    fail_at, warn_at = fail.threshold(expected, direction), warn.threshold(expected, direction)
    if better(fail_at, warn_at) or better(warn_at, expected):
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
                        f"{baseline.path}: metrics.{where}.params.nccl_env.{var}: {text!r} conflicts with "
                        f"{found[var][0]!r} asked for by metrics.{found[var][1]}"
                    )
                found.setdefault(var, (text, where))
    return found
