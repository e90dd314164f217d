"""The generic readers of a baseline file's loaded YAML: a mapping that remembers the line of each key, and
the field checks every section uses. Each error is a BaselineError of one line naming the file, the line and
the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pytest_gbvalidate.baselines.model import BaselineError, _is_count, _names, _shown


class _Mapping(dict[str, Any]):
    """A YAML mapping that remembers the line of each key (1-based), for error messages."""

    line: int = 0
    key_lines: dict[str, int]


class Fields:
    """Reads the fields of one file's mappings; its errors name that file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def error(self, where: _Mapping, key: str | None, field_path: str, message: str) -> BaselineError:
        """An error at `key` of `where` (its line), or at `where` itself for a field that is missing."""
        line = where.key_lines.get(key, where.line) if key is not None else where.line
        return BaselineError(f"{self.path}:{line}: {field_path}: {message}")

    def at(self, where: _Mapping, key: str, section: str, message: str) -> BaselineError:
        """`error` at `key` of `where`, the field `<section>.<key>`."""
        return self.error(where, key, f"{section}.{key}", message)

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
