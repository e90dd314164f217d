"""The run as a Prometheus text file for node_exporter's textfile collector (`--gb-prometheus PATH`), made from the
finished report by prometheus-client (`pip install 'pytest-gbvalidate[prometheus]'`). No pytest here.

The families (docs/prometheus.md shows a file):

- `gbvalidate_measurement_value`, `..._expected`, `..._fail_limit`, `..._warn_limit`: each measurement the
  baseline has a reference (an expected value) for, labelled by `metric`, `scope`, `placement` and `tool` (a
  measurement's identity, as --gb-compare matches them; the last two only in collective sweeps) and `unit`;
- `gbvalidate_measurement_verdict{..., verdict}`: 1 for the measurement's verdict, 0 for the others (pass, warn,
  fail, info): one series per state, kube-state-metrics' `kube_pod_status_phase` encoding, so an alert is
  `gbvalidate_measurement_verdict{verdict="fail"} == 1`;
- `gbvalidate_measurement_mfu_peak_flops{..., source}`: for each MFU, the dense peak per GPU it divides by (FLOP/s)
  and where that figure comes from;
- `gbvalidate_test_outcome{test, outcome}`: the same one-hot encoding of each test's outcome (passed, failed,
  skipped; failed where any phase failed);
- `gbvalidate_run_status{status}` (one-hot), `gbvalidate_run_exit_code` (pytest's: 0 is a passed gate),
  `gbvalidate_run_start_timestamp_seconds`, `gbvalidate_run_end_timestamp_seconds` (Unix time) and
  `gbvalidate_run_info{sku, level, hostname} 1` (the info-metric pattern: what describes the run, joined onto the
  other series in a query rather than repeated on each).

Naming follows prometheus.io's "Metric and label naming": the `gbvalidate_` prefix, base units (a value is
converted to the unit BASE_UNITS names: GB/s to bytes per second, TFLOPS to floating-point operations per second,
ms to seconds, % to a ratio) and `_seconds` for times. The measurements are one family with a `metric` label, not
a family per metric, as that page asks that no part of a metric name be made from data: a site's own metrics then
appear without a new name. The labels stay bounded: a node has a fixed set of tests, metrics and scopes; no test
duration, date or value becomes a label. node_exporter adds the node's `instance` itself.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from pytest_gbvalidate.files import atomic_write_bytes
from pytest_gbvalidate.report.records import (
    FAIL,
    INFO,
    PASS,
    WARN,
    MeasurementRecord,
    RunReportRecord,
    TestRecord,
    measurement_key,
)
from pytest_gbvalidate.report.writer import text_safe_copy

PREFIX = "gbvalidate"
VERDICTS = (PASS, WARN, FAIL, INFO)
OUTCOMES = ("passed", "failed", "skipped")
RUN_STATUSES = ("running", "finished", "interrupted")  # records.RunStatus
MEASUREMENT_LABELS = ("metric", "scope", "placement", "tool")

# The units of metrics.UNITS in Prometheus's base units: (the unit label, the factor to it). A unit not here (a
# site's own metric's) is kept as it is, value and name.
BASE_UNITS: Mapping[str, tuple[str, float]] = {
    "GB/s": ("bytes_per_second", 1e9),
    "TB/s": ("bytes_per_second", 1e12),
    "TFLOPS": ("flops", 1e12),  # floating-point operations per second
    "s": ("seconds", 1.0),
    "ms": ("seconds", 1e-3),
    "us": ("seconds", 1e-6),
    "tokens/s": ("tokens_per_second", 1.0),
    "%": ("ratio", 0.01),
    "x": ("ratio", 1.0),
    "count": ("count", 1.0),
    "W": ("watts", 1.0),
    "C": ("celsius", 1.0),
    "MHz": ("hertz", 1e6),
    "GiB": ("bytes", 2.0**30),
}


def base_unit(unit: str) -> tuple[str, float]:
    return BASE_UNITS.get(unit, (unit, 1.0))


def _number(value: object) -> float | None:
    """A report's number as a float: the text a non-finite one is kept as ("nan", "inf") too; None for no number."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(str(value))
    except ValueError:
        return None


def _one_hot(family: GaugeMetricFamily, labels: list[str], states: tuple[str, ...], current: str) -> None:
    """A series per state, 1 for `current` and 0 for the others (a state not among them gets a series of its own)."""
    for state in states if current in states else (*states, current):
        family.add_metric([*labels, state], 1.0 if state == current else 0.0)


def _test_outcomes(tests: list[TestRecord]) -> dict[str, str]:
    """Each test's outcome over its phases: failed where any failed, else skipped where any was, else passed."""
    outcomes: dict[str, str] = {}
    for test in tests:
        before = outcomes.get(test["test_id"], "passed")
        outcomes[test["test_id"]] = max(before, test["outcome"], key=_WORSE.__getitem__)
    return outcomes


_WORSE = {"passed": 0, "skipped": 1, "failed": 2}


class _RunCollector:
    """The report's families, for a registry of their own (no process or platform metrics of this interpreter)."""

    def __init__(self, report: RunReportRecord) -> None:
        self.report = report

    def collect(self) -> Iterator[Metric]:
        # A family without a series (no warn limits, say) is left out: a HELP line with nothing under it says nothing.
        for family in (*self._measurements(), *self._tests(), *self._run()):
            if family.samples:
                yield family

    def _measurements(self) -> Iterator[Metric]:
        labels = [*MEASUREMENT_LABELS, "unit"]
        families = {
            field: GaugeMetricFamily(f"{PREFIX}_measurement_{name}", text, labels=labels)
            for field, name, text in (
                ("value", "value", "The measured value, in the unit of its unit label."),
                ("expected", "expected", "The baseline's expected value."),
                ("limit", "fail_limit", "The baseline's fail limit: beyond it the check fails."),
                ("warn_limit", "warn_limit", "The baseline's warn limit: beyond it the check warns."),
            )
        }
        verdict = GaugeMetricFamily(
            f"{PREFIX}_measurement_verdict",
            "1 for the measurement's verdict against its baseline, 0 for the other verdicts.",
            labels=[*MEASUREMENT_LABELS, "verdict"],
        )
        # The same measurement twice (it cannot be, in a report of the bundled suites): the later one counts, as
        # --gb-compare reads an earlier report; two series of the same labels would make the file unreadable.
        latest: dict[tuple[str, str, str, str], MeasurementRecord] = {}
        for record in self.report["measurements"]:
            if record.get("expected") is not None:
                latest[measurement_key(record)] = record
        for key, record in latest.items():
            unit, factor = base_unit(record["unit"])
            fields: Mapping[str, Any] = record
            for field, family in families.items():
                value = _number(fields.get(field))
                if value is not None:
                    family.add_metric([*key, unit], value * factor if math.isfinite(value) else value)
            _one_hot(verdict, list(key), VERDICTS, record["verdict"])
        yield from families.values()
        yield verdict
        yield self._mfu_peaks()

    def _mfu_peaks(self) -> Metric:
        """What each MFU divides by, and where that figure comes from: public peaks differ, so an MFU series says
        against what (one series per MFU measurement; the source is a bounded label, one per baseline)."""
        family = GaugeMetricFamily(
            f"{PREFIX}_measurement_mfu_peak_flops",
            "The dense peak per GPU an MFU measurement divides by, in FLOP/s, and its source.",
            labels=[*MEASUREMENT_LABELS, "source"],
        )
        peaks = {}
        for record in self.report["measurements"]:
            details: Mapping[str, Any] = record["details"]
            peak, source = _number(details.get("peak_tflops_per_gpu")), details.get("peak_tflops_source")
            if record["metric"].endswith("_mfu_pct") and peak is not None and isinstance(source, str):
                peaks[measurement_key(record)] = (peak * 1e12, source)
        for key, (flops, source) in peaks.items():
            family.add_metric([*key, source], flops)
        return family

    def _tests(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            f"{PREFIX}_test_outcome",
            "1 for the test's outcome (failed where any phase failed), 0 for the other outcomes.",
            labels=["test", "outcome"],
        )
        for test_id, outcome in _test_outcomes(self.report["tests"]).items():
            _one_hot(family, [test_id], OUTCOMES, outcome)
        yield family

    def _run(self) -> Iterator[Metric]:
        report = self.report
        status = GaugeMetricFamily(
            f"{PREFIX}_run_status", "1 for the run's status, 0 for the others.", labels=["status"]
        )
        _one_hot(status, [], RUN_STATUSES, report["status"])
        yield status
        if report["exit_status"] is not None:
            yield GaugeMetricFamily(
                f"{PREFIX}_run_exit_code", "pytest's exit status: 0 when every check passed.", report["exit_status"]
            )
        for name, stamp in (("start", report["start_time"]), ("end", report["end_time"])):
            if stamp is not None:
                yield GaugeMetricFamily(
                    f"{PREFIX}_run_{name}_timestamp_seconds",
                    f"When the run {'started' if name == 'start' else 'ended'}, in seconds since the Unix epoch.",
                    _unix_seconds(stamp),
                )
        sku, node = report["sku"], report.get("node")
        info = GaugeMetricFamily(
            f"{PREFIX}_run_info", "The run's SKU, level and node: always 1.", labels=["sku", "level", "hostname"]
        )
        hostname = "" if node is None else node["hostname"]
        info.add_metric(["" if sku is None else sku["name"], report.get("level", ""), hostname], 1.0)
        yield info


def _unix_seconds(stamp: str) -> float:
    moment = dt.datetime.fromisoformat(stamp)
    if moment.tzinfo is None:  # the writer's times are UTC
        moment = moment.replace(tzinfo=dt.timezone.utc)
    return moment.timestamp()


def exposition(report: RunReportRecord) -> bytes:
    """The Prometheus text exposition of `report` (version 0.0.4, what node_exporter's textfile collector reads)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_RunCollector(report))
    return generate_latest(registry)


def write(path: Path, report: RunReportRecord) -> None:
    """Write the file atomically (files.py): node_exporter reads the directory whenever it is scraped, and must see
    the old file or the new one, never half of one. Raises OutputError naming the path."""
    atomic_write_bytes(path, exposition(text_safe_copy(report)))  # its client encodes UTF-8 strictly
