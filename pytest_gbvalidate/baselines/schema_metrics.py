"""The `metrics` section of a baseline file: each metric's unit, direction and scope, its reference figures
and limits (per scope label where it has `values`), checked field by field into a MetricBaseline.

A metric the bundled suites measure (metrics.CATALOG) takes its unit, direction and scope from the catalog:
its entry may leave them out, and one that gives them must agree. A site's own metric gives all three."""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import math
import re
from typing import Any

from pytest_gbvalidate.baselines.fields import Fields, _Mapping
from pytest_gbvalidate.baselines.model import (
    _WHOLE_UNITS,
    _ZERO_UNITS,
    STATUSES,
    Limit,
    MetricBaseline,
    Reference,
    _is_number,
    _names,
    _shown,
)
from pytest_gbvalidate.labels import parse_size_label, size_label
from pytest_gbvalidate.metrics import CATALOG, DIRECTIONS, SCOPE_KINDS, UNITS
from pytest_gbvalidate.rules.noise import NOISE_K
from pytest_gbvalidate.rules.resolution import MAX_NEEDED_PCT, MIN_NEEDED_PCT, Needed, is_worse, side_word

_OVERRIDE_KEYS = {"status", "expected", "fail", "warn", "provenance", "params", "spread_pct", "resolution_pct"}
# The largest recorded spread a baseline may carry: its resolution alone (NOISE_K x it) the coarsest a metric needs.
MAX_SPREAD_PCT = MAX_NEEDED_PCT / NOISE_K
_KIND_KEYS = ("unit", "direction", "scope")  # what the catalog fixes for its metrics
_METRIC_KEYS = _OVERRIDE_KEYS | {*_KIND_KEYS, "values"}

# The params the suites read (suites/, sweeps.py) and the values they can run with.
_PARAM_BOUNDS: dict[str, tuple[float, float]] = {
    **{"iterations": (1, 10_000), "warmup": (0, 10_000), "slow_pct": (0.1, 99), "batch": (1, 4096)},
    **dict.fromkeys(("size_bytes", "min_bytes", "max_bytes"), (1, 2**40)),
    **dict.fromkeys(("prompt_len", "new_tokens"), (1, 2**20)),
    # A GEMM's dimensions: the bundled baselines use up to 8192; at 65536 its three bf16 matrices take 24 GiB.
    **dict.fromkeys(("m", "n", "k"), (1, 2**16)),
}
# The message sizes a message_size metric's `values` may gate: from the sweeps' smallest (sweeps.SWEEP_BYTES, two
# float32 elements: below one nothing is measured; a test holds the two equal, as this module may not import the
# sweeps) to max_bytes' largest (a label beyond the free memory would fail the node for the baseline's size).
LEAST_LABEL_BYTES = 8
_LABEL_BYTES = (LEAST_LABEL_BYTES, int(_PARAM_BOUNDS["max_bytes"][1]))
_FRACTIONAL_PARAMS = frozenset({"slow_pct"})
# What a metric name is made of: the bundled metrics' names are, and Prometheus and JUnit carry them as they are.
_METRIC_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# difflib's similarity to a bundled name at which a site metric's is a misspelling: one letter wrong, missing or
# doubled in 10 or more (`h2d_bandwith_gbps`: 0.97; a suffix, `h2d_bandwidth_gbps_numa1` against its stem: 0.86).
NEAR_MISS = 0.9


def metric(f: Fields, metrics_doc: _Mapping, name: str, needed: Needed) -> MetricBaseline:
    fp = f"metrics.{name}"
    if not (isinstance(name, str) and _METRIC_NAME.fullmatch(name)):
        raise f.error(metrics_doc, name, f"metrics.{_shown(name)}", "a metric name is ASCII letters, digits and '_'")
    if name not in CATALOG:
        near = difflib.get_close_matches(name, list(CATALOG), n=1, cutoff=NEAR_MISS)
        if near:  # a site's own metric needs a name of its own: a misspelt bundled one would leave that ungated
            raise f.error(
                metrics_doc, name, fp, f"is not a bundled metric, and a letter or two away from {near[0]!r}: misspelt?"
            )
    m = f.mapping(metrics_doc[name], metrics_doc, name, fp, _METRIC_KEYS)
    unit, direction, scope_kind = _kind(f, m, name, fp)
    if "status" not in m:
        raise f.error(m, None, f"{fp}.status", "missing")
    base = Reference(name, unit, direction, scope_kind, "provisional", None, None, None, "", needed=needed)
    values: dict[str, Reference] = {}
    if "values" in m:
        values_doc = f.mapping(m["values"], m, "values", f"{fp}.values", None)
        if not values_doc:
            raise f.error(m, "values", f"{fp}.values", "must name at least one scope label")
        default = _overrides(f, m, base, fp, check=False)
        for label in values_doc:
            lfp = f"{fp}.values.{label}"
            if scope_kind == "message_size":  # the sweep runs the sizes the labels name
                _check_size_label(f, values_doc, label, lfp)
            entry = f.mapping(values_doc[label], values_doc, label, lfp, _OVERRIDE_KEYS)
            values[str(label)] = _overrides(f, entry, default, lfp, check=True)
    else:
        default = _overrides(f, m, base, fp, check=True)
    return MetricBaseline(default=default, values=values)


def _check_size_label(f: Fields, values_doc: _Mapping, label: str, lfp: str) -> None:
    try:
        size = parse_size_label(str(label))
    except ValueError:
        raise f.error(values_doc, label, lfp, "is not a message size (8B, 1KiB, 128MiB, 8GiB)") from None
    least, most = _LABEL_BYTES
    if not least <= size <= most:
        raise f.error(values_doc, label, lfp, f"a gated message size is from {size_label(least)} to {size_label(most)}")


def _kind(f: Fields, m: _Mapping, name: str, fp: str) -> tuple[str, str, str]:
    """The metric's unit, direction and scope kind: the catalog's for a metric it has (the entry may restate
    them, and must then agree), else the entry's own, all three required."""
    spec = CATALOG.get(name)
    known: dict[str, str] = {}
    if spec is not None:
        known = {"unit": spec.unit, "direction": spec.direction, "scope": spec.scope_kind}
    for key in _KIND_KEYS:
        if key not in m and key not in known:
            raise f.error(m, None, f"{fp}.{key}", "missing (not a bundled metric: give its unit, direction and scope)")
    unit, direction, scope_kind = (m.get(key, known.get(key)) for key in _KIND_KEYS)
    if not (isinstance(unit, str) and unit in UNITS):
        raise f.error(m, "unit", f"{fp}.unit", f"unknown unit {_shown(unit)} (known: {_names(UNITS)})")
    if direction not in DIRECTIONS:
        raise f.error(m, "direction", f"{fp}.direction", f"{_shown(direction)} is not one of {_names(DIRECTIONS)}")
    if scope_kind not in SCOPE_KINDS:
        raise f.error(m, "scope", f"{fp}.scope", f"{_shown(scope_kind)} is not one of {_names(SCOPE_KINDS)}")
    for key, ours in known.items():
        if key in m and m[key] != ours:
            raise f.error(m, key, f"{fp}.{key}", f"{m[key]!r} disagrees with the measured metric ({ours!r})")
    return unit, direction, scope_kind


def _overrides(f: Fields, m: _Mapping, base: Reference, fp: str, *, check: bool) -> Reference:
    """Apply the fields one mapping sets on top of `base`; `check` the result once it is complete."""
    status = m.get("status", base.status)
    if status not in STATUSES:
        raise f.error(m, "status", f"{fp}.status", f"{_shown(status)} is not one of {_names(STATUSES)}")
    provenance = m.get("provenance", base.provenance)
    if not isinstance(provenance, str) or (check and not provenance.strip()):
        raise f.error(m, "provenance", f"{fp}.provenance", "must be a non-empty string naming the source")
    expected = base.expected
    if "expected" in m:
        expected = m["expected"]
        if not _is_number(expected):
            raise f.error(m, "expected", f"{fp}.expected", f"must be a finite number, got {_shown(expected)}")
        expected = float(expected)
        _check_figure(f, m, "expected", fp, expected, base)
    spread_pct = base.spread_pct
    if "spread_pct" in m:
        spread_pct = m["spread_pct"]
        if not _is_number(spread_pct) or not 0 <= spread_pct <= MAX_SPREAD_PCT:
            shown = f"must be a number from 0 to {MAX_SPREAD_PCT:g} (percent), got {_shown(spread_pct)}"
            raise f.error(m, "spread_pct", f"{fp}.spread_pct", shown)
        spread_pct = float(spread_pct)
    needed = base.needed
    if "resolution_pct" in m:
        needed = Needed(needed_pct(f, m, "resolution_pct", f"{fp}.resolution_pct"), f"{fp}.resolution_pct")
    params = m.get("params", base.params)
    if not isinstance(params, dict):
        raise f.error(m, "params", f"{fp}.params", "must be a mapping")
    if "params" in m:
        _check_nccl_env(f, m, params, fp)
        _check_params(f, m, params, fp)
    ref = dataclasses.replace(
        base,
        status=status,
        expected=expected,
        fail=_limit(f, m, "fail", fp, base) if "fail" in m else base.fail,
        warn=_limit(f, m, "warn", fp, base) if "warn" in m else base.warn,
        provenance=provenance,
        params=dict(params),
        spread_pct=spread_pct,
        needed=needed,
    )
    if check:
        _check(f, m, ref, fp)
    return ref


def _check_params(f: Fields, m: _Mapping, params: dict[str, Any], fp: str) -> None:
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
            raise f.error(
                m, "params", f"{fp}.params.{key}", f"must be {kind} from {least:g} to {most:g}, got {_shown(value)}"
            )
    if params.get("min_bytes", 0) > params.get("max_bytes", math.inf):  # both checked integers above
        raise f.error(
            m, "params", f"{fp}.params.min_bytes", f"{params['min_bytes']} is above max_bytes {params['max_bytes']}"
        )


def _check_nccl_env(f: Fields, m: _Mapping, params: dict[str, Any], fp: str) -> None:
    """`params.nccl_env`: the NCCL environment the metric's figures were taken with (NCCL_* names)."""
    env = params.get("nccl_env")
    if env is None:
        return
    if not isinstance(env, dict) or not env:
        raise f.error(m, "params", f"{fp}.params.nccl_env", "must be a mapping of NCCL_* variables to values")
    for name, value in env.items():
        if not _NCCL_NAME.fullmatch(name) or not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise f.error(
                m, "params", f"{fp}.params.nccl_env.{name}", "must be an NCCL_* variable with a string or number"
            )
        if name in _NODE_OWN_NCCL_VARIABLES:
            raise f.error(m, "params", f"{fp}.params.nccl_env.{name}", _NODE_OWN_NCCL_VARIABLES[name])


# NCCL's variable names (NCCL_ALGO, NCCL_IB_HCA): a name with '=' or a space could not be one variable.
_NCCL_NAME = re.compile(r"NCCL_[A-Z0-9_]+")
# NCCL variables that say which node a process is, never how a SKU is measured: one value given to every node of
# a fleet would make NCCL take them all for one host (shared memory and P2P between machines).
_NODE_OWN_NCCL_VARIABLES = {
    "NCCL_HOSTID": "names a node, not a SKU: each node's own environment sets it, never a baseline",
}


def _limit(f: Fields, m: _Mapping, key: str, fp: str, base: Reference) -> Limit:
    raw = m[key]
    if isinstance(raw, str) and raw.strip().endswith("%"):
        try:
            pct = float(raw.strip()[:-1])
        except ValueError:
            pct = math.nan
        if not math.isfinite(pct) or pct <= 0:
            raise f.error(m, key, f"{fp}.{key}", f"{_shown(raw)}: a relative limit is a positive percentage")
        return Limit(relative_pct=pct)
    if not _is_number(raw):
        raise f.error(m, key, f"{fp}.{key}", f"{_shown(raw)}: give a number in the metric's unit or a percentage")
    _check_figure(f, m, key, fp, float(raw), base)
    return Limit(absolute=float(raw))


def _check_figure(f: Fields, m: _Mapping, key: str, fp: str, value: float, base: Reference) -> None:
    """An expected value or absolute limit is above 0, or 0 or more in a unit a healthy node may have none of
    (_ZERO_UNITS); a higher-is-better limit of 0 would fail nothing."""
    if base.unit in _ZERO_UNITS:
        if value < 0:
            raise f.error(m, key, f"{fp}.{key}", f"{value:g}: must be 0 or more (a {base.unit} is never negative)")
        if value == 0 and key != "expected" and base.direction == "higher":
            raise f.error(m, key, f"{fp}.{key}", "0: a limit of 0 fails nothing when higher is better")
    elif value <= 0:
        raise f.error(m, key, f"{fp}.{key}", f"{value:g}: must be above 0 (a figure in {base.unit})")


def _check(f: Fields, m: _Mapping, ref: Reference, fp: str) -> None:
    """Cross-field rules, on the effective reference of one scope label."""
    if ref.status == "measured" and ref.expected is None:
        raise f.error(m, None, f"{fp}.expected", "missing (a measured baseline has an expected value)")
    if ref.expected is not None and ref.fail is None:
        raise f.error(m, None, f"{fp}.fail", "missing (a metric with an expected value needs a fail limit)")
    if ref.expected is None and ref.fail is None and ref.warn is not None:
        raise f.error(m, "warn", f"{fp}.warn", "a warn limit needs an expected value or a fail limit")
    for key, lim in (("fail", ref.fail), ("warn", ref.warn)):
        if lim is None:
            continue
        if lim.relative_pct is not None:
            if ref.expected is None:
                raise f.error(m, key, f"{fp}.{key}", "a relative limit needs an expected value")
            if ref.expected == 0:
                raise f.error(m, key, f"{fp}.{key}", f"{lim}: a percentage of expected 0 is 0; give a number")
            if ref.direction == "higher" and lim.relative_pct >= 100:
                raise f.error(m, key, f"{fp}.{key}", "must be below 100% for a higher-is-better metric")
    ordered = [("fail", ref.fail_limit), ("warn", ref.warn_limit), ("expected", ref.expected)]
    present = [(k, v) for k, v in ordered if v is not None]
    for (k1, v1), (k2, v2) in itertools.pairwise(present):
        if is_worse(v2, v1, ref.direction):
            word = side_word(ref.direction, worse=False)
            raise f.error(m, k1, f"{fp}.{k1}", f"{v1:g} is {word} {k2} {v2:g} ({ref.direction} is better)")
        if v1 == v2 and ref.unit not in _WHOLE_UNITS:
            word = side_word(ref.direction, worse=True)
            raise f.error(m, k1, f"{fp}.{k1}", f"{v1:g} equals {k2}: it must lie {word} it ({ref.direction} is better)")


def needed_pct(f: Fields, m: _Mapping, key: str, field_path: str) -> float:
    """A declared resolution in percent, within the bounds a verdict can use."""
    pct = m[key]
    if not _is_number(pct) or not MIN_NEEDED_PCT <= pct <= MAX_NEEDED_PCT:
        shown = f"must be a number from {MIN_NEEDED_PCT:g} to {MAX_NEEDED_PCT:g} (percent), got {_shown(pct)}"
        raise f.error(m, key, field_path, shown)
    return float(pct)
