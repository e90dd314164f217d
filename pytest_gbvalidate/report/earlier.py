"""The node's earlier report (`--gb-compare PATH`, or `last` in --gb-history) and its kept runs, read for the
comparison: checked to be a report of this version, of this node and SKU (hostname, and each GPU's serial and UUID by
PCI bus id), each figure's value by its measurement key. The comparison itself is compare.py's. No pytest here."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_gbvalidate.files import InputError, read_json
from pytest_gbvalidate.labels import printable
from pytest_gbvalidate.report import history, schema
from pytest_gbvalidate.report.records import MeasurementRecord, RunReportRecord, measurement_key
from pytest_gbvalidate.rules import noise


class CompareError(Exception):
    """The earlier report cannot be used: unreadable, not ours, or from another node. A usage error."""


@dataclass(frozen=True)
class GpuIdentity:
    index: int
    pci_bus_id: str
    uuid: str
    serial: str | None


@dataclass(frozen=True)
class EarlierReport:
    path: Path
    date: str  # the earlier run's start time
    status: str
    sku: str | None
    hostname: str | None
    gpus: tuple[GpuIdentity, ...] | None  # None: the earlier run did not read the inventory
    measurements: Mapping[tuple[str, str, str, str], MeasurementRecord]
    # With --gb-history: the node's kept runs of this SKU (oldest first), and each figure across them (noise.of_runs).
    runs: tuple[Mapping[tuple[str, str, str, str], float], ...] = ()
    run_to_run: Mapping[tuple[str, str, str, str], noise.RunToRun] = field(default_factory=dict)


def load_earlier(path: Path) -> EarlierReport:
    """Read an earlier JSON report; a partial one (a killed run's) is used for what it measured: the caller says so."""
    try:
        data = read_json(path)
    except InputError as exc:
        raise CompareError(str(exc)) from None
    problem = schema.problem(data)
    if problem is not None:
        raise CompareError(f"{path} is not a pytest-gbvalidate report of this version: {problem}")
    report: RunReportRecord = data
    try:  # the date every line about the comparison shows: a time, as the fleet's readers require
        history.start_time(report)
    except ValueError:
        raise CompareError(f"{path}: start_time {report['start_time'][:40]!a} is not an ISO 8601 time") from None
    measurements: dict[tuple[str, str, str, str], MeasurementRecord] = {}
    for record in report["measurements"]:
        value = noise.finite(record["value"])
        if value is not None:  # a later measurement of the same figure replaces an earlier one
            measurements[measurement_key(record)] = record | {"value": value}
    gpus_section = report.get("gpus")
    devices = gpus_section.get("devices") if isinstance(gpus_section, dict) else None
    gpus = None
    if isinstance(devices, list):
        try:
            gpus = tuple(
                GpuIdentity(int(d["index"]), str(d["pci_bus_id"]), str(d["uuid"]), d.get("serial")) for d in devices
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CompareError(
                f"{path}: a GPU of its `gpus` section lacks index, pci_bus_id or uuid ({exc!r})"
            ) from None
    sku, node = report["sku"], report.get("node")
    sku_name, hostname = (None if sku is None else sku["name"]), (None if node is None else node["hostname"])
    return EarlierReport(path, report["start_time"], report["status"], sku_name, hostname, gpus, measurements)


def node_runs(paths: Sequence[Path], sku: str, hostname: str) -> tuple[dict[tuple[str, str, str, str], float], ...]:
    """This node's kept reports `paths` (oldest first) as runs, oldest first: the last noise.MAX_RUNS finished
    reports of this node and SKU, each figure's value."""
    runs: list[dict[tuple[str, str, str, str], float]] = []
    for path in reversed(paths):
        if len(runs) == noise.MAX_RUNS:
            break
        try:
            earlier = load_earlier(path)
        except CompareError:
            continue
        if (earlier.hostname, earlier.sku, earlier.status) != (hostname, sku, "finished"):
            continue
        values = {key: noise.finite(record["value"]) for key, record in earlier.measurements.items()}
        runs.insert(0, {key: value for key, value in values.items() if value is not None})
    return tuple(runs)


def with_history(earlier: EarlierReport, runs: Sequence[Mapping[tuple[str, str, str, str], float]]) -> EarlierReport:
    """`earlier` with the node's kept `runs` (node_runs') behind it: each figure's run-to-run spread from them."""
    values: dict[tuple[str, str, str, str], list[float]] = {}
    for run in runs:
        for key, value in run.items():
            values.setdefault(key, []).append(value)
    run_to_run = {key: spread for key, figures in values.items() if (spread := noise.of_runs(figures)) is not None}
    return dataclasses.replace(earlier, runs=tuple(runs), run_to_run=run_to_run)


@dataclass(frozen=True)
class SameNode:
    """The same-node check's outcome: GPUs replaced since the earlier run (scope label -> what changed), and notes."""

    replaced: Mapping[str, str]
    notes: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"replaced_gpus": dict(self.replaced), "notes": list(self.notes)}


def check_same_node(
    earlier: EarlierReport, sku: str, hostname: str, gpus_now: tuple[GpuIdentity, ...] | str | None
) -> SameNode:
    """Raise CompareError when the earlier report is another node's (or another SKU's). `gpus_now`: this node's
    GPUs, the reason they could not be read, or None on a SKU without GPUs."""
    where = str(earlier.path)  # the caller names the setting
    if earlier.hostname != hostname:
        shown = f"is the report of node '{printable(earlier.hostname)}'" if earlier.hostname else "names no node"
        raise CompareError(f"{where} {shown}; this is node '{printable(hostname)}'")
    if earlier.sku != sku:
        shown = "names no SKU" if earlier.sku is None else f"checked SKU '{printable(earlier.sku)}'"
        raise CompareError(f"{where} {shown}; this run checks SKU '{sku}'")
    notes = [f"same node {hostname}, earlier run of {earlier.date}"]
    if earlier.status != "finished":
        notes.append(f"the earlier run did not finish (status {earlier.status}): compared where it measured")
    replaced: dict[str, str] = {}
    if isinstance(gpus_now, str):
        notes.append(f"GPUs not compared by serial: {gpus_now}")
    elif gpus_now is not None and earlier.gpus is None:
        notes.append("GPUs not compared by serial: the earlier report has no GPU inventory (health checks not run)")
    elif gpus_now is not None and earlier.gpus is not None:
        before = {g.pci_bus_id.lower(): g for g in earlier.gpus}
        for now in gpus_now:
            old = before.get(now.pci_bus_id.lower())
            if old is None:
                notes.append(f"gpu{now.index} at {now.pci_bus_id}: no GPU there in the earlier report")
                replaced[f"gpu{now.index}"] = "no GPU at its PCI bus id in the earlier report"
            elif (old.serial, old.uuid) != (now.serial, now.uuid):
                what = f"replaced since the earlier run (serial {old.serial} -> {now.serial}, {old.uuid} -> {now.uuid})"
                replaced[f"gpu{now.index}"] = what
                notes.append(f"gpu{now.index} at {now.pci_bus_id}: {what}")
        missing = sorted(set(before) - {g.pci_bus_id.lower() for g in gpus_now})
        notes += [f"no GPU answers at {pci} now (gpu{before[pci].index} in the earlier report)" for pci in missing]
        if not replaced and not missing:
            notes.append(f"all {len(gpus_now)} GPUs have the serials of the earlier run")
    return SameNode(replaced, tuple(notes))


def gpus_of_this_node(is_gpu: bool) -> tuple[GpuIdentity, ...] | str | None:
    """This node's GPUs by PCI bus id (None on a SKU without GPUs; NVML's error when it cannot say)."""
    if not is_gpu:
        return None
    from pytest_gbvalidate.node import nvml

    try:
        with nvml.session():
            inventory = nvml.read_inventory()
    except nvml.NvmlError as exc:
        return f"NVML: {exc}"
    return tuple(GpuIdentity(g.index, g.pci_bus_id, g.uuid, g.serial) for g in inventory.gpus.values())
