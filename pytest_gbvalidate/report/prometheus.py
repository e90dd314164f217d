"""The run as a Prometheus text file for node_exporter's textfile collector (`--gb-prometheus PATH`), made from the
finished report by prometheus-client (`pip install 'pytest-gbvalidate[prometheus]'`). No pytest here.

docs/prometheus.md lists the families and shows a file. A state (verdict, outcome, status) is one series per state, 1
for the current one and 0 for the others (kube-state-metrics' `kube_pod_status_phase` encoding), so an alert is
`gbvalidate_measurement_verdict{verdict="fail"} == 1`; a failed test's fault category and repair are labels, so rules
select checks by what the fault table says of them, not by test names. Naming follows prometheus.io's "Metric and label
naming": the `gbvalidate_` prefix, base units (BASE_UNITS), `_seconds` for times, and one family with a `metric` label
rather than a metric name made from data (a site's own metrics need no new name). The labels stay bounded: no test
duration, date or value becomes one; node_exporter adds the node's `instance` itself."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, get_args

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from pytest_gbvalidate.files import InputError, atomic_write_bytes, read_json
from pytest_gbvalidate.node.fabric import nvlink_domain
from pytest_gbvalidate.report import history, node_verdict, records, schema
from pytest_gbvalidate.report.records import CompareVerdict, RunReportRecord, TestRecord, measurement_key
from pytest_gbvalidate.report.writer import text_safe_copy

PREFIX = "gbvalidate"
VERDICTS = (records.PASS, records.WARN, records.FAIL, records.INFO)
OUTCOMES = ("passed", "failed", "skipped")
RUN_STATUSES = ("running", "finished", "interrupted")  # records.RunStatus
RUN_VERDICTS: tuple[str, ...] = get_args(node_verdict.NodeVerdict)  # pass, fail, unresolved, partial, no verdict
COMPARE_VERDICTS: tuple[str, ...] = get_args(CompareVerdict)  # ok, regressed, within_noise, unresolved, gpu_replaced
MEASUREMENT_LABELS = ("metric", "scope", "placement", "tool")

# metrics.UNITS in Prometheus's base units: (the unit label, the factor to it); a unit not here is kept as it is.
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


def _one_hot(family: GaugeMetricFamily, labels: list[str], states: tuple[str, ...], current: str) -> GaugeMetricFamily:
    """`family` with a series per state, 1 for `current` and 0 for the others (a state not among them gets its own)."""
    for state in states if current in states else (*states, current):
        family.add_metric([*labels, state], 1.0 if state == current else 0.0)
    return family


def _test_outcomes(tests: list[TestRecord]) -> dict[str, str]:
    """Each test's outcome over its phases: failed where any failed, else skipped where any was, else passed."""
    outcomes: dict[str, str] = {}
    for test in tests:
        before = outcomes.get(test["test_id"], "passed")
        outcomes[test["test_id"]] = max(before, test["outcome"], key=_WORSE.__getitem__)
    return outcomes


_WORSE = {"passed": 0, "skipped": 1, "failed": 2}


def _test_faults(tests: list[TestRecord]) -> dict[str, tuple[str, str]]:
    """Each failed test's fault category and repair, from its first failed phase, as fleet/findings.py reads it;
    a test whose first failed phase has no fault is left out."""
    first: dict[str, TestRecord] = {}
    for test in tests:
        if test["outcome"] == "failed":
            first.setdefault(test["test_id"], test)
    return {
        test_id: (test["fault"]["category"], test["fault"].get("repair", ""))
        for test_id, test in first.items()
        if "fault" in test
    }


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
        families = {
            field: GaugeMetricFamily(f"{PREFIX}_measurement_{name}", text, labels=[*MEASUREMENT_LABELS, "unit"])
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
        compared = GaugeMetricFamily(
            f"{PREFIX}_measurement_compare_verdict",
            "With --gb-compare: 1 for the measurement's verdict against the node's earlier report, 0 for the others.",
            labels=[*MEASUREMENT_LABELS, "verdict"],
        )
        # The same measurement twice (it cannot be, in a report of the bundled suites): the later one counts, as
        # --gb-compare reads an earlier report; two series of the same labels would make the file unreadable.
        measurements = self.report["measurements"]
        latest = {measurement_key(r): r for r in measurements if r.get("expected") is not None}
        # A regression matters with or without a baseline's reference.
        latest_compared = {measurement_key(r): r for r in measurements if r.get("compare") is not None}
        for key, record in latest_compared.items():
            _one_hot(compared, list(key), COMPARE_VERDICTS, record["compare"]["verdict"])
        for key, record in latest.items():
            unit, factor = base_unit(record["unit"])
            fields: Mapping[str, Any] = record
            for field, family in families.items():
                value = _number(fields.get(field))
                if value is not None:
                    family.add_metric([*key, unit], value * factor if math.isfinite(value) else value)
            _one_hot(verdict, list(key), VERDICTS, record["verdict"])
        yield from (*families.values(), verdict, compared, self._mfu_peaks())

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
        faults = GaugeMetricFamily(
            f"{PREFIX}_test_fault",
            "1 for a failed test's fault category in the fault table (faults.yaml) and its repair: one series per "
            "failed test.",
            labels=["test", "category", "repair"],
        )
        for test_id, (category, repair) in _test_faults(self.report["tests"]).items():
            faults.add_metric([test_id, category, repair], 1.0)
        yield faults

    def _run(self) -> Iterator[Metric]:
        report = self.report
        status = GaugeMetricFamily(
            f"{PREFIX}_run_status", "1 for the run's status, 0 for the others.", labels=["status"]
        )
        yield _one_hot(status, [], RUN_STATUSES, report["status"])
        verdict = GaugeMetricFamily(
            f"{PREFIX}_run_verdict",
            "1 for what the run says about its node (pass, fail, unresolved, partial, no verdict), 0 for the others.",
            labels=["verdict"],
        )
        yield _one_hot(verdict, [], RUN_VERDICTS, node_verdict.of_report(report))
        streak = consecutive_unresolved(report)
        if streak is not None:
            yield GaugeMetricFamily(
                f"{PREFIX}_node_consecutive_unresolved_runs",
                "The node's runs in a row, this one the last, that were unresolved (its --gb-history): 0 where this "
                "one was not.",
                streak,
            )
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
        node, gpus = report.get("node"), report.get("gpus")
        devices = gpus.get("devices") if isinstance(gpus, Mapping) else None
        domain = (nvlink_domain(devices) if isinstance(devices, list) else None) or ""  # node/fabric.py's, or none
        info = GaugeMetricFamily(
            f"{PREFIX}_run_info",
            "The run's SKU, level, node and the node's NVLink domain: always 1.",
            labels=["sku", "level", "hostname", "nvlink_domain"],
        )
        hostname = "" if node is None else node["hostname"]
        info.add_metric([_sku_name(report) or "", report.get("level", ""), hostname, domain], 1.0)
        yield info


def consecutive_unresolved(report: RunReportRecord) -> int | None:
    """How many of the node's runs in a row, `report`'s the last, were unresolved (node_verdict.py): 0 where this
    one was not; None without a --gb-history to count in, or where its node's directory cannot be listed.

    Counted back through the node's kept reports of the same SKU and level until one whose verdict is pass or fail;
    runs that say nothing of the node (partial, no verdict) are passed over, and so are other SKUs' and levels'
    (a health check's passive runs between two gates). A report that cannot be read, or does not fit the records,
    ends the count: what it said is not known."""
    setting = report["settings"].get("history")
    root = None if setting is None else setting.get("value")
    node = report.get("node")
    if not isinstance(root, str) or node is None:
        return None
    if node_verdict.of_report(report) != node_verdict.UNRESOLVED:
        return 0
    try:
        this_start = history.start_time(report)
        kept = history.entries(history.node_directory(Path(root), node["hostname"]))
    except (ValueError, history.HistoryError):  # no history this report's node could have kept
        return None
    count = 1
    for kept_entry in reversed(kept):
        if kept_entry.start > this_start:  # a later run's (this file made from an earlier report)
            continue
        try:
            data = read_json(kept_entry.path)
        except (InputError, OSError):  # no failure to read the history may cost the run its file
            break
        if schema.problem(data) is not None:
            break
        earlier: RunReportRecord = data
        this_run = earlier["start_time"] == report["start_time"]  # its own record, kept before this file is written
        if this_run or _sku_name(earlier) != _sku_name(report) or earlier.get("level") != report.get("level"):
            continue
        verdict = node_verdict.of_report(earlier)
        if verdict == node_verdict.UNRESOLVED:
            count += 1
        elif verdict in ("pass", "fail"):
            break
    return count


def _sku_name(report: RunReportRecord) -> str | None:
    sku = report["sku"]
    return None if sku is None else sku["name"]


def _unix_seconds(stamp: str) -> float:
    moment = dt.datetime.fromisoformat(stamp)  # the writer's times are UTC
    return (moment if moment.tzinfo is not None else moment.replace(tzinfo=dt.timezone.utc)).timestamp()


def exposition(report: RunReportRecord) -> bytes:
    """The Prometheus text exposition of `report` (version 0.0.4, what node_exporter's textfile collector reads)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_RunCollector(report))
    return generate_latest(registry)


def write(path: Path, report: RunReportRecord) -> None:
    """Write the file atomically (files.py): node_exporter reads the directory whenever it is scraped, and must see
    the old file or the new one, never half of one. Raises OutputError naming the path."""
    atomic_write_bytes(path, exposition(text_safe_copy(report)))  # its client encodes UTF-8 strictly
