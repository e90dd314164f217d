"""The report's records (records.py) as a JSON Schema, and the same check done without one: the readers of a
report (the fleet summary, --gb-compare) name the first field that does not fit, in one line.

`python -m pytest_gbvalidate.report.schema` prints the schema shipped as report.schema.json (a test keeps the two
equal)."""

from __future__ import annotations

import functools
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any

import typing_extensions

from pytest_gbvalidate.report import records
from pytest_gbvalidate.report.records import REPORT_VERSION, RunReportRecord

SCHEMA_FILE = Path(__file__).with_name("report.schema.json")
_SCHEMA_ID = f"https://pytest-gbvalidate.invalid/report/{REPORT_VERSION}"


def json_schema(*, strict: bool = False) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a report of this version. `strict`: no field beyond the declared ones,
    as this version writes them (the published schema lets a later version add optional fields)."""
    definitions: dict[str, Any] = {}
    root = _schema(RunReportRecord, definitions, strict)
    schema: dict[str, Any] = {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": _SCHEMA_ID}
    schema |= {"title": "pytest-gbvalidate run report", "description": _doc(RunReportRecord)}
    schema |= definitions.pop(root["$ref"].rsplit("/", 1)[1])
    schema["properties"]["report_version"] = {"const": REPORT_VERSION}
    return schema | {"$defs": dict(sorted(definitions.items()))}


def problem(data: Any) -> str | None:
    """The first field of `data` that does not fit a report of this version (`measurements[3].value is a list,
    not number or text or null`), or None. Fields it does not know are left alone."""
    if not isinstance(data, dict):
        return f"not a JSON object but {_kind(data)}"
    version = data.get("report_version")
    if version != REPORT_VERSION:
        shown = "missing" if version is None else repr(version)
        hint = " (a report of version 1 says `schema`)" if "schema" in data and version is None else ""
        return f"report_version is {shown}, not {REPORT_VERSION}{hint}"
    return _problem(data, RunReportRecord, "")


def field_problem(field: str, value: Any, item: int | None = None) -> str | None:
    """What does not fit in `value` as the top-level `field` (with `item`: an item of the list `field`), or None."""
    hint = _fields(RunReportRecord)[0][field]
    if item is not None:
        return _problem(value, _args(hint)[0], f"{field}[{item}]")
    return _problem(value, hint, field)


_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}
_NAMES = {str: "text", int: "an integer", float: "number", bool: "true/false", type(None): "null"}
# The element types a list of each plain type may hold (a number is an int or a float, never a bool).
_PLAIN: dict[Any, set[type]] = {float: {float, int}, int: {int}, str: {str}}


@functools.cache
def _is_typeddict(tp: Any) -> bool:
    return typing_extensions.is_typeddict(tp)


@functools.cache  # the records are fixed: their hints are worked out once, not for every record checked
def _fields(td: Any) -> tuple[dict[str, Any], frozenset[str]]:
    return typing_extensions.get_type_hints(td, vars(records)), frozenset(td.__required_keys__)


@functools.cache  # a report's types are few, asked of every field of every report a fleet reads
def _args(tp: Any) -> tuple[Any, ...]:
    return typing.get_args(tp)


@functools.cache
def _origin(tp: Any) -> Any:
    origin = typing.get_origin(tp)
    return typing.Union if origin is types.UnionType else origin


def _schema(tp: Any, definitions: dict[str, Any], strict: bool) -> dict[str, Any]:
    if tp is Any:
        return {}
    if tp in _JSON_TYPES:
        return {"type": ["number", "integer"]} if tp is float else {"type": _JSON_TYPES[tp]}
    origin = _origin(tp)
    if origin is typing.Literal:
        return {"enum": list(_args(tp))}
    if origin is typing.Union:
        return {"anyOf": [_schema(arg, definitions, strict) for arg in _args(tp)]}
    if origin is list:
        return {"type": "array", "items": _schema(_args(tp)[0], definitions, strict)}
    if origin is dict:
        return {"type": "object", "additionalProperties": _schema(_args(tp)[1], definitions, strict)}
    if _is_typeddict(tp):
        name = tp.__name__
        if name not in definitions:
            definitions[name] = {}  # a placeholder while its fields are walked
            hints, required = _fields(tp)
            definitions[name] = {
                "type": "object",
                **({"description": _doc(tp)} if _doc(tp) else {}),
                "properties": {field: _schema(hint, definitions, strict) for field, hint in hints.items()},
                "required": sorted(required),
                "additionalProperties": not strict,
            }
        return {"$ref": f"#/$defs/{name}"}
    raise TypeError(f"no JSON Schema for {tp!r}")


def _problem(value: Any, tp: Any, where: str) -> str | None:
    return _checker(tp)(value, where)


Checker = typing.Callable[[Any, str], "str | None"]


@functools.cache
def _checker(tp: Any) -> Checker:
    """The check of a value against `tp`, worked out once per type: a fleet reads thousands of reports."""
    if tp is Any:
        return lambda value, where: None
    if tp in _JSON_TYPES:
        allowed = (float, int) if tp is float else (tp,)

        def plain(value: Any, where: str) -> str | None:
            ok = isinstance(value, allowed) and (tp is bool or not isinstance(value, bool))
            return None if ok else _misfit(where, value, _NAMES[tp])

        return plain
    origin, args = _origin(tp), _args(tp)
    if origin is typing.Literal:
        shown = ", ".join(map(repr, args))  # `in` a tuple: a list or an object read is no error, only no match
        return lambda value, where: None if value in args else f"{where} is {value!r}, not one of {shown}"
    if origin is typing.Union:
        options = [(_checker(arg), arg) for arg in args]

        def union(value: Any, where: str) -> str | None:
            found = [check(value, where) for check, _ in options]
            if None in found:
                return None
            deepest = [p for p, (_, arg) in zip(found, options, strict=True) if _matches_shape(value, arg)]
            return deepest[0] if deepest else _misfit(where, value, " or ".join(_name(arg) for _, arg in options))

        return union
    if origin is list:
        item, plain_types = _checker(args[0]), _PLAIN.get(args[0], set())

        def listed(value: Any, where: str) -> str | None:
            if not isinstance(value, list):
                return _misfit(where, value, "a list")
            if set(map(type, value)) <= plain_types:  # a sample series: each checked at C speed
                return None
            return next((p for i, v in enumerate(value) if (p := item(v, f"{where}[{i}]"))), None)

        return listed
    if origin is dict:
        entry = _checker(args[1])

        def mapping(value: Any, where: str) -> str | None:
            if not isinstance(value, dict):
                return _misfit(where, value, "an object")
            return next((p for k, v in value.items() if (p := entry(v, _join(where, str(k))))), None)

        return mapping
    if _is_typeddict(tp):
        hints, required = _fields(tp)
        fields = [(f, _checker(hint)) for f, hint in hints.items()]

        def record(value: Any, where: str) -> str | None:
            if not isinstance(value, dict):
                return _misfit(where, value, "an object")
            missing = sorted(required - value.keys())
            if missing:
                return f"{_join(where, missing[0])} is missing"
            return next((p for f, check in fields if f in value and (p := check(value[f], _join(where, f)))), None)

        return record
    raise TypeError(f"cannot check {tp!r}")


def _matches_shape(value: Any, tp: Any) -> bool:
    """Whether `value` is the container `tp` is (so its own, deeper problem is the one to name)."""
    origin = _origin(tp)
    return (origin is list and isinstance(value, list)) or (
        (origin is dict or _is_typeddict(tp)) and isinstance(value, dict)
    )


def _name(tp: Any) -> str:
    if tp in _NAMES:
        return _NAMES[tp]
    origin = _origin(tp)
    return "a list" if origin is list else "an object" if origin is dict or _is_typeddict(tp) else repr(tp)


def _misfit(where: str, value: Any, expected: str) -> str:
    return f"{where or 'the report'} is {_kind(value)}, not {expected}"


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "true/false", str: "text", list: "a list", dict: "an object"}.get(type(value), type(value).__name__)


def _join(where: str, field: str) -> str:
    return f"{where}.{field}" if where else field


def _doc(td: Any) -> str:
    doc = td.__doc__ or ""
    return "" if doc.startswith(f"{td.__name__}(") else " ".join(doc.split())


if __name__ == "__main__":
    sys.stdout.write(json.dumps(json_schema(), indent=1) + "\n")
