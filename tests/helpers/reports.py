"""Every JSON run report a test makes is held to the strict schema of the report's records (report/records.py):
a field written outside them, or of another type, fails the test that made it."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jsonschema

from pytest_gbvalidate.report.writer import RunReport


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
        except (OSError, ValueError, RecursionError):  # not a report: a reader's bad input
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


def minimal_report() -> dict[str, Any]:
    """A finished single-node report with one test and one measurement, as the writer makes them."""
    report = RunReport(None)
    report.data["sku"] = {"name": "cpu", "source": "default", "baseline_file": "baselines/cpu.yaml"}
    report.data["node"] = {"hostname": "node7", "torch": "2.13.0"}
    report.data["settings"] = {"sku": {"value": "auto", "source": "default"}}
    report.add_test(
        {
            "test_id": "t.py::test_x",
            "when": "call",
            "outcome": "passed",
            "duration_s": 0.5,
            "message": None,
            "text": None,
        }
    )
    measurement: Any = {
        "test_id": "t.py::test_x",
        "metric": "host_copy_bandwidth_gbps",
        "scope": "node",
        "scope_kind": "node",
        "value": 12.5,
        "unit": "GB/s",
        "direction": "higher",
        "details": {"size_bytes": 1024},
        "verdict": "pass",
        "message": "ok",
        "expected": 10.0,
    }
    report.add_measurements([measurement])
    report.finish(0, "finished")
    data: dict[str, Any] = json.loads(json.dumps(report.data))
    return data


# A reader's input has a fixed start and end: tests take these texts as parameters, and a parameter's id that
# held the time of collection differed between pytest-xdist's workers whenever their collections straddled a second
# (`Different tests were collected between gw0 and gw1`).
FIXED_TIMES = {"start_time": "2026-11-01T00:00:00+00:00", "end_time": "2026-11-01T00:00:01+00:00"}


def report_text(changes: dict[str, Any] | None = None, *, without: tuple[str, ...] = ()) -> str:
    """`minimal_report()` as JSON, with top-level fields replaced or left out: a reader's input."""
    report = minimal_report() | FIXED_TIMES | (changes or {})
    return json.dumps({k: v for k, v in report.items() if k not in without})
