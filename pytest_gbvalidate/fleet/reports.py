"""Reading the nodes' JSON run reports and sorting them: the fleet's nodes (one report per hostname, the latest),
multi-node runs, and the reports that are not merged. Which report counts as what, in this order:

1. corrupt (the summary fails: such a node has not shown it is healthy): unreadable, not JSON, not a report of this
   `report_version` whose every field has its declared type (report/records.py), or saying what its writer never
   does (_problem: no hostname, an unreadable or future start time, ...) or contradicting itself (_contradiction).
2. another SKU: its `sku.name` is not the fleet's (`--sku`, else the most common among the finished reports; a
   report without one is the fleet's). Listed; one that did not pass its own checks fails the summary.
3. multi-node run: `gang.nodes` > 1 (absent means 1), summarised apart from the per-node rows.
4. superseded: an earlier report (by `start_time`, then the command line's order) of a hostname that has a later
   one, or an earlier multi-node run over the same hostnames as a later one. Listed, no effect on the exit code;
   but where the later one is still running, narrowed or of a lesser level, the earlier one speaks (_earlier_stands).
5. the rest are the fleet's nodes. A node whose latest report is `interrupted` is partial (exit 1); one whose latest
   is still `running` gave no verdict (exit 1, no drain line). Neither's measurements count in the statistics.

Every text a report holds is escaped as it is read (labels.printable_exactly), so nothing from a file reaches the
terminal, Markdown, CSV or a drain command as more than text, and two hostnames that differ are never shown, or
counted, as one.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
import os
import re
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from pytest_gbvalidate.files import InputError, read_json
from pytest_gbvalidate.labels import printable, printable_exactly
from pytest_gbvalidate.levels import LEVELS
from pytest_gbvalidate.node.fabric import nvlink_domain
from pytest_gbvalidate.report import history, node_verdict, schema
from pytest_gbvalidate.report.node_verdict import EXIT_UNRESOLVED, NodeVerdict
from pytest_gbvalidate.report.node_verdict import NO_VERDICT as NO_VERDICT  # where the fleet's modules take it
from pytest_gbvalidate.report.records import HostRecord, MeasurementRecord, RunReportRecord, TestRecord
from pytest_gbvalidate.rules import resolution as rs

FINISHED, RUNNING = "finished", "running"
# What a finished run's report may say (pytest.ExitCode, and ours for a run that could not tell: 2, interrupted, is
# written as the status `interrupted`).
FINISHED_EXIT_STATUSES = (0, 1, 2, 3, 4, 5, EXIT_UNRESOLVED)
CORRUPT, OTHER_SKU, SUPERSEDED = "corrupt", "other SKU", "superseded"
NARROWED = "narrowed"  # a subset's run after a whole one of its node: listed, the whole one counts
UNFINISHED = "unfinished"  # a run still `running` after a report of its node: listed, the earlier one counts
LESSER_LEVEL = "lesser level"  # a run of a lesser level after a failed fuller one: listed, the failure counts
CONFIRMATION = "confirmation"  # a second run of a node's failed checks: listed; `fleet summary --confirm` reads it


@dataclass(frozen=True)
class Report:
    """A report that reads as one: `data` is the whole JSON object, checked against the report's records."""

    path: Path
    data: RunReportRecord
    order: int  # position on the command line: breaks ties of start_time
    # `<cluster UUID>/<clique>` of the NVLink domain its GPUs joined (node/fabric.py), as it may be shown; None: none
    nvlink_domain: str | None = None
    vbios: str | None = None  # each VBIOS version its GPUs run, `/`-joined, as it may be shown; None: none reported

    @property
    def hostname(self) -> str:
        return self.data["node"]["hostname"]

    @property
    def sku(self) -> str | None:
        return None if (sku := self.data["sku"]) is None else sku["name"]

    @property
    def status(self) -> str:
        return self.data["status"]

    @property
    def finished(self) -> bool:
        return self.status == FINISHED

    @property
    def level(self) -> str:
        """The check level the run took on (levels.LEVELS, escaped); empty where a run stopped before it had one."""
        return str(self.data.get("level") or "")

    @property
    def narrowed_by(self) -> list[str]:
        """What narrowed the run's checks beyond its level (`-k`, ...); empty for its whole selection."""
        return self.data.get("narrowed_by", [])

    @property
    def reruns_failed(self) -> bool:
        """Whether the run is a second run of an earlier one's failed checks (`--gb-rerun-failed`, run/rerun.py)."""
        return any(n.startswith("--gb-rerun-failed ") for n in self.narrowed_by)

    @property
    def nodes(self) -> int:
        """How many nodes the run spanned: `gang.nodes`, 1 where absent."""
        return 1 if (gang := self.data.get("gang")) is None else gang["nodes"]

    @property
    def hosts(self) -> list[HostRecord]:
        """The nodes of a multi-node run by node rank, where the report says them (`gang.hosts`)."""
        return [] if (gang := self.data.get("gang")) is None else gang["hosts"]

    @property
    def hostnames(self) -> tuple[str, ...]:
        """The hostnames of a multi-node run's nodes, sorted: the rendezvous numbers the nodes anew each run."""
        return tuple(sorted(h["hostname"] for h in self.hosts))

    @property
    def start_time(self) -> dt.datetime | None:
        return _start_time(self.data)

    @property
    def tests(self) -> list[TestRecord]:
        return list(self.data["tests"])

    @property
    def measurements(self) -> list[MeasurementRecord]:
        return list(self.data["measurements"])

    @functools.cached_property
    def verdict(self) -> NodeVerdict:
        """What the report says about its node (report/node_verdict.py); worked out once: every row asks it."""
        return node_verdict.of_report(self.data)


@dataclass(frozen=True)
class NotMerged:
    """A report left out of the fleet's statistics, with why. `hostname` where the file says one."""

    path: Path
    kind: str  # CORRUPT, OTHER_SKU, SUPERSEDED, NARROWED, UNFINISHED, LESSER_LEVEL or CONFIRMATION
    reason: str
    hostname: str | None
    sku: str | None = None
    verdict: str | None = None  # a report that reads as one: its own (Report.verdict)

    @property
    def fails_fleet(self) -> bool:
        """A corrupt report fails the summary, and so does another SKU's that did not pass its own checks (the
        node's verdict stands, whatever fleet it is compared with); a superseded one does not."""
        return self.kind == CORRUPT or (self.kind == OTHER_SKU and self.verdict != "pass")


@dataclass(frozen=True)
class Sorted:
    sku: str | None  # the fleet's SKU; None where no report says one
    sku_note: str  # where the fleet's SKU came from
    nodes: list[Report]  # one per hostname, the latest; finished or partial; by hostname
    multi_node: list[Report]
    not_merged: list[NotMerged]
    # A node's latest run of the checks that failed in its whole run (`--gb-rerun-failed`), after that run: what
    # `fleet summary --confirm` holds its failures to (fleet/confirm.py). By hostname.
    confirmations: dict[str, Report] = field(default_factory=dict)


def read(path: Path, order: int, now: dt.datetime | None = None) -> Report | NotMerged:
    """The report at `path`, or why it is corrupt (`now`: the time a start time may not be later than)."""
    try:
        data = read_json(path)
    except InputError as exc:  # its message starts with the path, which the listing shows beside it
        return NotMerged(path, CORRUPT, str(exc).removeprefix(f"{path}: "), None)
    if not isinstance(data, dict):
        return NotMerged(path, CORRUPT, f"not a JSON object but a {type(data).__name__}", None)
    node = data.get("node")
    hostname = node.get("hostname") if isinstance(node, dict) else None
    hostname = printable_exactly(hostname) if isinstance(hostname, str) and hostname else None
    if (problem := _problem(data, hostname, now)) is not None:
        return NotMerged(path, CORRUPT, problem, hostname)
    report = cast(RunReportRecord, escaped(fleet_part(data)))  # checked against the records by _problem
    gpus = data.get("gpus")
    devices = gpus.get("devices") if isinstance(gpus, dict) else None
    devices = devices if isinstance(devices, list) else []
    domain = None if (found := nvlink_domain(devices)) is None else printable_exactly(found)
    vbios = sorted({str(d["vbios_version"]) for d in devices if isinstance(d, dict) and d.get("vbios_version")})
    return Report(path, report, order, domain, printable_exactly("/".join(vbios)) if vbios else None)


# What the fleet reads of a report, kept once the whole report is checked: the rest (telemetry, the GPU inventory,
# the NUMA map, each figure's samples and provenance) goes as each report is read, so the summary holds one report's
# parse at a time, not every report given (benchmarks/fleet_memory.py: 1,000 nodes).
FLEET_SECTIONS = frozenset(
    {"report_version", "status", "exit_status", "start_time", "end_time", "sku", "level", "node", "settings"}
    | {"narrowed_by", "tests", "measurements", "gang", "world", "suspects", "outputs_lost"}
)
MEASUREMENT_DROPPED = frozenset({"provenance", "message", "scope_kind", "warn_limit", "delta_pct", "status"})


def fleet_part(data: dict[str, Any]) -> dict[str, Any]:
    kept = {name: value for name, value in data.items() if name in FLEET_SECTIONS}
    kept["measurements"] = [
        {name: value for name, value in m.items() if name not in MEASUREMENT_DROPPED}
        | {"details": {name: value for name, value in m["details"].items() if not isinstance(value, list)}}
        for m in data["measurements"]
    ]
    return kept


# Texts this short are mostly names that recur in every report (keys, metrics, scopes, units, verdicts): held once.
SHARED_TEXT_MAX = 64
_NUMBERS = {int, float}


def escaped(value: Any) -> Any:
    """`value` (JSON) with every text in it, keys too, as it may be shown (labels.printable_exactly)."""
    if isinstance(value, str):
        return _shared(value) if len(value) <= SHARED_TEXT_MAX else printable_exactly(value)
    if isinstance(value, list):
        return value if set(map(type, value)) <= _NUMBERS else [escaped(v) for v in value]  # a series: as it is
    if isinstance(value, dict):
        return {escaped(k): escaped(v) for k, v in value.items()}
    return value


@functools.lru_cache(maxsize=2**16)
def _shared(text: str) -> str:
    """A short text as shown, held once however many reports repeat it (worked out once, too)."""
    return sys.intern(printable_exactly(text))


def _problem(data: dict[str, Any], hostname: str | None, now: dt.datetime | None) -> str | None:
    """Why the report cannot count, or None. The latest report of a node counts: one without a readable start time,
    or one from the future (a node's clock set wrong, a file edited), would hide every later failure of the node."""
    if (problem := schema.problem(data)) is not None:
        return printable(problem)
    if hostname is None:
        return "no node.hostname"
    if (length := len(data["node"]["hostname"])) > history.MAX_HOSTNAME:
        return f"node.hostname of {length} characters: a hostname is {history.MAX_HOSTNAME} at most"
    if (start := _start_time(data)) is None:
        return f"start_time {printable(str(data.get('start_time')))!r} is not an ISO 8601 time: undated"
    now = now or dt.datetime.now(dt.timezone.utc)
    if history.in_future(start, now):
        return f"start_time {start.isoformat()} is in the future (now {now.isoformat(timespec='seconds')})"
    status = data["exit_status"]
    if data["status"] == FINISHED and status not in FINISHED_EXIT_STATUSES:
        known = ", ".join(map(str, FINISHED_EXIT_STATUSES))
        return f"exit_status {status!r} of a finished run: pytest's and ours are {known}"
    gang = data.get("gang")
    if gang is not None and not gang["nodes"] == len(gang["hosts"]) >= 1:
        return f"gang.nodes is {gang['nodes']} and gang.hosts names {len(gang['hosts'])}: a gang has 1 node or more"
    return _contradiction(cast(RunReportRecord, data))


# How far (percent, a log ratio) a value may lie past the limit beside it and still have passed: the limit is
# written to six significant digits.
LIMIT_ROUNDING_PCT = 1e-3


def _contradiction(report: RunReportRecord) -> str | None:
    """Where a report contradicts itself, what it says both ways, else None: a run its writer says passed with a
    failed test; a measurement that failed in a test that passed; a measurement's verdict that its own value and
    fail limit deny (a PASS is never past its fail limit, a FAIL of a number never short of it). Such a report
    was edited or written by something else than a run: it is believed in neither direction."""
    failed = [t["test_id"] for t in report["tests"] if t["outcome"] == "failed"]
    if report["status"] == FINISHED and report["exit_status"] == 0 and failed:
        return f"exit_status 0 of a finished run with {len(failed)} failed test(s) ({failed[0]}, ...)"
    passed = {t["test_id"] for t in report["tests"] if t["outcome"] == "passed" and t["when"] == "call"}
    for m in report["measurements"]:
        shown = f"measurement {m['metric']} [{m['scope']}]"
        if m["verdict"] == "fail" and m["test_id"] in passed:
            return f"{shown}: verdict fail in the test {m['test_id']}, which passed"
        value, limit = m["value"], m.get("limit")
        if not isinstance(value, (int, float)) or not isinstance(limit, (int, float)) or not math.isfinite(value):
            continue
        past_pct = rs.worse_pct(value, limit, m["direction"])
        if m["verdict"] == "pass" and past_pct > LIMIT_ROUNDING_PCT:
            return f"{shown}: verdict pass, though its value {value:g} is past its fail limit {limit:g}"
        if m["verdict"] == "fail" and past_pct < -LIMIT_ROUNDING_PCT:
            return f"{shown}: verdict fail, though its value {value:g} is within its fail limit {limit:g}"
    return None


def sort_reports(paths: Sequence[Path], sku: str | None = None) -> Sorted:
    """Read `paths` and sort them into the fleet's nodes, its multi-node runs and the reports not merged."""
    # A file named twice is one report, through a link too (else it would be superseded by itself).
    unique: dict[str, Path] = {}
    for path in paths:
        unique.setdefault(os.path.realpath(path), path)
    readings = [read(path, order) for order, path in enumerate(unique.values())]
    reports = [r for r in readings if isinstance(r, Report)]
    not_merged = [r for r in readings if isinstance(r, NotMerged)]
    fleet_sku, sku_note = _fleet_sku(reports, sku)

    ours = []
    for report in reports:
        if report.sku is not None and report.sku != fleet_sku:
            reason = f"SKU {report.sku}, the fleet's is {fleet_sku}"
            if report.verdict != "pass":
                reason += f"; its own verdict: {report.verdict} (summarise its SKU with --sku {report.sku})"
            not_merged.append(NotMerged(report.path, OTHER_SKU, reason, report.hostname, report.sku, report.verdict))
        else:
            ours.append(report)
    latest: dict[str, Report] = {}
    confirmations: dict[str, Report] = {}
    for report in sorted((r for r in ours if r.nodes == 1), key=_age):
        earlier = latest.get(report.hostname)
        if earlier is not None and (kept := _earlier_stands(earlier, report)) is not None:
            not_merged.append(NotMerged(report.path, *kept, report.hostname, report.sku))
            if kept[0] == CONFIRMATION:
                confirmations[report.hostname] = report
            continue
        if earlier is not None:
            reason = f"{report.hostname} has a later report: {report.path} ({report.data.get('start_time')})"
            not_merged.append(NotMerged(earlier.path, SUPERSEDED, reason, earlier.hostname, earlier.sku))
        latest[report.hostname] = report
        confirmations.pop(report.hostname, None)  # a second run of an earlier run's failures: not this one's
    nodes = sorted(latest.values(), key=lambda r: natural_key(r.hostname))
    # A multi-node run is superseded by a later one over the same hosts; runs that do not name their hosts all count.
    latest_runs: dict[tuple[str, ...], Report] = {}
    multi_node: list[Report] = []
    for report in sorted((r for r in ours if r.nodes > 1), key=_age):
        hosts = report.hostnames
        earlier = latest_runs.get(hosts) if hosts else None
        if earlier is not None:
            multi_node.remove(earlier)
            reason = f"a later run over the same {len(hosts)} nodes: {report.path} ({report.data.get('start_time')})"
            not_merged.append(NotMerged(earlier.path, SUPERSEDED, reason, earlier.hostname, earlier.sku))
        if hosts:
            latest_runs[hosts] = report
        multi_node.append(report)
    return Sorted(fleet_sku, sku_note, nodes, multi_node, not_merged, confirmations)


def _earlier_stands(earlier: Report, later: Report) -> tuple[str, str] | None:
    """(kind, why) where `later`, a report of the same node, does not speak for it over `earlier`; None where it
    does. A run still `running` (being written, or killed outright) speaks in no direction: it neither clears a
    failure, as a second run, nor hides one. A second run of the failed checks is a confirmation. A subset run again
    (`-k` the failed check) does not speak for the node a whole run judged, nor a lesser level's run (a quick one)
    for a node a fuller one failed."""
    if later.status == RUNNING and earlier.finished:
        return UNFINISHED, f"still running: {earlier.path}, a finished run of {later.hostname}, speaks for it"
    if later.reruns_failed and not earlier.reruns_failed:
        return CONFIRMATION, f"runs the failed checks of {later.hostname} again (fleet summary --confirm reads it)"
    if later.narrowed_by and not earlier.narrowed_by:
        return NARROWED, (
            f"checked a subset ({'; '.join(later.narrowed_by)}): {earlier.path}, a whole run of "
            f"{later.hostname}, still speaks for it"
        )
    if earlier.verdict == "fail" and _level_rank(later) < _level_rank(earlier):
        return LESSER_LEVEL, (
            f"level {later.level}, less than the {earlier.level} run that failed: {earlier.path} still speaks "
            f"for {later.hostname}"
        )
    return None


def _level_rank(report: Report) -> int:
    """The report's level among levels.LEVELS (the fullest highest); an unknown one as the fullest."""
    return LEVELS.index(report.level) if report.level in LEVELS else len(LEVELS)


def _start_time(data: Mapping[str, Any]) -> dt.datetime | None:
    """In UTC; None where it is no ISO 8601 time, or none UTC can hold (0001-01-01T00:00+14:00)."""
    try:
        start = dt.datetime.fromisoformat(str(data.get("start_time")))
        return (start.replace(tzinfo=dt.timezone.utc) if start.tzinfo is None else start).astimezone(dt.timezone.utc)
    except (ValueError, OverflowError):
        return None


def _age(report: Report) -> tuple[dt.datetime, int]:
    """Oldest first; a report without a readable start time counts as the oldest."""
    return report.start_time or dt.datetime.min.replace(tzinfo=dt.timezone.utc), report.order


def _fleet_sku(reports: Sequence[Report], sku: str | None) -> tuple[str | None, str]:
    if sku is not None:
        return sku, "--sku"
    counts = Counter(r.sku for r in reports if r.finished and r.sku is not None)
    if not counts:
        counts = Counter(r.sku for r in reports if r.sku is not None)
    if not counts:
        return None, "no report names a SKU"
    ranked = counts.most_common()  # ties keep the order of first appearance, i.e. the command line's
    name, count = ranked[0]
    tied = [n for n, c in ranked if c == count]
    if len(tied) > 1:
        return name, f"tie between {', '.join(tied)} ({count} reports each): the first given; name one with --sku"
    return name, f"the most common among the reports: {count} of {sum(counts.values())}"


def natural_key(text: str) -> tuple[tuple[int, int, str], ...]:
    """Sort key that puts node9 before node10. A run of digits is compared by its length without leading zeros,
    then as text: the same order as its number's, for runs of any length (int() refuses more than 4300 digits)."""
    return tuple(_natural_part(part) for part in re.split(r"(\d+)", text) if part)


def _natural_part(part: str) -> tuple[int, int, str]:
    if part.isdecimal():
        digits = part.lstrip("0") or "0"
        return (0, len(digits), digits)
    return (1, 0, part)
