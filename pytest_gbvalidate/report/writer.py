"""The JSON run report, rewritten atomically as results arrive, so a crash loses nothing already measured. It is
built only through the records of records.py, and each record is checked against them as it is kept (schema.py, as
every reader checks the report): a report its own readers refuse drops its node out of every fleet summary."""

from __future__ import annotations

import datetime as dt
import json
import math
from pathlib import Path
from typing import Any, Literal

from pytest_gbvalidate.files import OutputError, atomic_write_text
from pytest_gbvalidate.labels import text_safe
from pytest_gbvalidate.report import schema
from pytest_gbvalidate.report.records import (
    REPORT_VERSION,
    MeasurementRecord,
    RunPaceRecord,
    RunReportRecord,
    RunStatus,
    TestRecord,
)

# Sections about the whole node or run, the latest value winning, and sections that collect one record per test.
NodeSection = Literal["gpus", "numa_map", "gang"]
ListSection = Literal["telemetry", "suspects"]
# Lists of the run's own: its plots, the files it could not write.
RunList = Literal["plots", "outputs_lost"]
# The run's own fields (`set`); the tests, measurements and the sections above have methods of their own.
RunField = Literal[
    "sku",
    "level",
    "level_budget_s",
    "level_times",
    "node",
    "settings",
    "nccl_env",
    "created_directories",
    "compare",
    "world",
    "narrowed_by",
    "writable_inputs",
    "plot_note",
    "record",
    "exit_status",
]


def utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def json_safe(value: float) -> float | str:
    """JSON has no NaN or infinity; a broken measurement is kept as text rather than dropped."""
    return value if math.isfinite(value) else str(value)


def as_json(data: RunReportRecord) -> str:
    """The report's text, as every copy of it is written. Text that is not UTF-8 (lone surrogates) is written as
    escapes (labels.text_safe): the readers refuse a report that holds any."""
    text = json.dumps(data, indent=1, default=str, allow_nan=False) + "\n"
    if "\\ud" in text:  # only then: a surrogate escape, of a lone surrogate or of a pair (a valid emoji)
        text = json.dumps(text_safe_copy(data), indent=1, default=str, allow_nan=False) + "\n"
    return text


def text_safe_copy(value: Any) -> Any:
    """`value` (JSON-like data) with every text in it, keys too, as labels.text_safe writes it."""
    if isinstance(value, str):
        return text_safe(value)
    if isinstance(value, dict):
        return {text_safe(str(k)): text_safe_copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [text_safe_copy(v) for v in value]
    return value


class RunReport:
    """The report of this run, and where it is written (None: kept in memory only, as on a worker rank)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.write_error: str | None = None  # the first write that failed
        self.misfit: str | None = None  # the first record kept that does not fit the report's records: a bug
        self.data: RunReportRecord = {
            "report_version": REPORT_VERSION,
            "status": "running",
            "exit_status": None,
            "start_time": utc_now(),
            "end_time": None,
            "sku": None,
            "settings": {},
            "tests": [],
            "measurements": [],
        }

    @property
    def measurements(self) -> list[MeasurementRecord]:
        return list(self.data["measurements"])

    def add_test(self, test: TestRecord) -> None:
        self._check(schema.field_problem("tests", test, len(self.data["tests"])))
        self.data["tests"].append(test)

    def add_measurements(self, records: list[MeasurementRecord]) -> None:
        for record in records:
            self._check(schema.field_problem("measurements", record, len(self.data["measurements"])))
            self.data["measurements"].append(record)

    def set(self, field: RunField, value: Any) -> None:
        """A top-level field of the run (its description, times by level, the exit status...), checked as kept."""
        self._check(schema.field_problem(field, value))
        data: dict[str, Any] = self.data  # type: ignore[assignment]  # any RunField, checked above
        data[field] = value

    def set_pace(self, pace: RunPaceRecord) -> None:
        """The run as a whole against the node's history, in the comparison section (set once the run is described)."""
        self.set("compare", {**self.data["compare"], "pace": pace})

    def set_section(self, name: NodeSection, value: Any) -> None:
        """A section about the whole node or run (`gpus`, `numa_map`, `gang`): the latest value wins."""
        self._check(schema.field_problem(name, value))
        self.data[name] = value

    def add_record(self, section: ListSection | RunList, record: Any) -> None:
        """A record in a list section (`telemetry`, `suspects`, `plots`, `outputs_lost`), created on first use."""
        data: dict[str, Any] = self.data  # type: ignore[assignment]  # a list section, checked below
        found = data.setdefault(section, [])
        self._check(schema.field_problem(section, record, len(found)))
        found.append(record)

    def _check(self, problem: str | None) -> None:
        """Keep the first misfit: the record is kept as made (nothing measured is dropped), and the run says so."""
        self.misfit = self.misfit or problem

    def finish(self, exit_status: int, status: RunStatus) -> None:
        self.data["status"], self.data["exit_status"], self.data["end_time"] = status, exit_status, utc_now()

    def write(self) -> None:
        """Rewrite the file. A write that fails (a full disk, say) leaves the last good file and is remembered in
        `write_error`, not raised: the run goes on, and the session says so and fails at its end."""
        if self.path is None:
            return
        try:
            atomic_write_text(self.path, as_json(self.data))
        except OutputError as exc:
            self.write_error = self.write_error or str(exc)
