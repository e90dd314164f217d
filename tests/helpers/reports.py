"""Every JSON run report a test makes is held to the strict schema of the report's records (report/records.py):
a field written outside them, or of another type, fails the test that made it."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jsonschema


@functools.cache
def _validator() -> jsonschema.protocols.Validator:
    from pytest_gbvalidate.report.schema import json_schema

    schema = json_schema(strict=True)
    return jsonschema.Draft202012Validator(schema)


def reports_under(directory: Path) -> list[tuple[Path, Any]]:
    """The JSON files under `directory` that say they are run reports (they hold `report_version`)."""
    found = []
    for path in sorted(directory.rglob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and "report_version" in data:
            found.append((path, data))
    return found


def schema_problems(directory: Path) -> list[str]:
    """Each report under `directory` that does not fit, with the first field that does not and why."""
    problems = []
    for path, data in reports_under(directory):
        error = jsonschema.exceptions.best_match(_validator().iter_errors(data))
        if error is not None:
            where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
            problems.append(f"{path}: {where.lstrip('.') or 'the report'}: {error.message}")
    return problems
