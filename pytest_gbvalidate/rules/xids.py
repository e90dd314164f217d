"""What an Xid means and what to do about it: NVIDIA's Xid catalog as data (`xid_catalog.yaml` beside this file:
each code's resolution, and the action and repair each calls for), and the rule that judges a GPU's Xid events over
a window: lines deduplicated, grouped in bursts, a job's codes escalated only when they repeat. No pytest here; the
kernel log is read by node/xid.py."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, get_args

CATALOG = Path(__file__).with_name("xid_catalog.yaml")

# drain: the node fails the check, with the repair; job: the job's fault, reported, a drain only when it repeats on one
# GPU (job_escalation); warn: reported as a warning, never a drain; ignore: counted in the report only.
XidAction = Literal["drain", "job", "warn", "ignore"]
# What brings the node back (faults.yaml's categories and the catalog's resolutions say one). rma: the part goes back
# to the vendor; reprovision: rebuilt (image, driver, firmware); fix_job: the job's fault; fix_config: the site's.
RepairAction = Literal["reboot", "gpu_reset", "reprovision", "rma", "fix_job", "fix_config", "none"]
XID_ACTIONS: tuple[XidAction, ...] = get_args(XidAction)
MAX_CODE = 65535  # a site may name a code newer than the catalog; the driver prints them as small numbers
REPAIR_ACTIONS: tuple[RepairAction, ...] = get_args(RepairAction)


class CatalogError(Exception): ...


@dataclass(frozen=True)
class Policy:
    action: XidAction
    repair: RepairAction
    why: str


@dataclass(frozen=True)
class XidCode:
    code: int
    name: str
    resolution: str  # the catalog's immediate resolution; "unused" for a code current drivers do not raise
    policy: Policy


@dataclass(frozen=True)
class Escalation:
    bursts: int  # a job's code in this many bursts on one GPU ...
    within_s: float  # ... within this long is the GPU's fault
    repair: RepairAction
    source: str


@dataclass(frozen=True)
class Catalog:
    codes: Mapping[int, XidCode]
    provenance: str  # the source, its date and driver branch, for messages and docs
    burst_gap_s: float  # lines of one code closer than this are one burst
    escalation: Escalation

    def code(self, xid: int) -> XidCode:
        """The catalog's entry; a code it does not know is reported (warn), never drained or passed unseen."""
        known = self.codes.get(xid)
        if known is not None:
            return known
        why = f"not in the Xid catalog ({self.provenance}): a newer driver's code; set its action in health.xid_actions"
        return XidCode(xid, "UNKNOWN", "unknown", Policy("warn", "none", why))

    def with_actions(self, actions: Mapping[int, XidAction], where: str) -> Catalog:
        """The catalog with a site's actions (a baseline's health.xid_actions, named by `where`). A code made to drain
        keeps its own repair, or a GPU reset where the catalog's is none or the job's."""
        codes = dict(self.codes)
        for xid, action in actions.items():
            entry = self.code(xid)
            repair = entry.policy.repair
            if action == "drain" and repair in ("none", "fix_job"):
                repair = "gpu_reset"
            elif action != "drain":
                repair = "fix_job" if action == "job" else "none"
            codes[xid] = replace(entry, policy=Policy(action, repair, f"set to {action} by {where}"))
        return replace(self, codes=codes)


@functools.cache
def load(path: Path = CATALOG) -> Catalog:
    """The catalog shipped with the plugin. A bad file is one line naming it and the field (CatalogError)."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        resolutions = {str(k): _policy(v, f"resolutions.{k}") for k, v in data["resolutions"].items()}
        unused = _policy(data["unused"], "unused")
        codes: dict[int, XidCode] = {}
        for entry in data["codes"]:
            xid, name = int(entry["code"]), str(entry["name"])
            resolution = "unused" if entry.get("unused") else str(entry["resolution"])
            if xid in codes:
                raise CatalogError(f"codes: Xid {xid} is listed twice")
            if resolution not in resolutions and resolution != "unused":
                raise CatalogError(f"codes: Xid {xid}: resolution {resolution!r} has no action in `resolutions`")
            policy = unused if resolution == "unused" else resolutions[resolution]
            if "action" in entry:  # a code whose action differs from its resolution's
                policy = _policy(entry, f"codes: Xid {xid}")
            codes[xid] = XidCode(xid, name, resolution, policy)
        esc = data["job_escalation"]
        provenance = f"{data['source']}, generated {data['generated']}; driver branch: {data['driver_branch']}"
        gap_s, bursts, within_s = float(data["burst_gap_s"]), int(esc["bursts"]), float(esc["within_h"]) * 3600
        escalation = Escalation(bursts, within_s, _repair(esc["repair"], "job_escalation.repair"), str(esc["source"]))
        catalog = Catalog(codes, provenance, gap_s, escalation)
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CatalogError(f"{path}: {type(exc).__name__}: {exc}") from None
    except CatalogError as exc:
        raise CatalogError(f"{path}: {exc}") from None
    return catalog


def _policy(fields: Mapping[str, object], where: str) -> Policy:
    action = str(fields["action"])
    if action not in XID_ACTIONS:
        raise CatalogError(f"{where}.action: {action!r} is not one of {', '.join(XID_ACTIONS)}")
    return Policy(action, _repair(fields["repair"], f"{where}.repair"), str(fields["why"]))


def _repair(value: object, where: str) -> RepairAction:
    if value not in REPAIR_ACTIONS:
        raise CatalogError(f"{where}: {value!r} is not one of {', '.join(REPAIR_ACTIONS)}")
    return value


@dataclass(frozen=True)
class XidEvent:
    """One Xid line of the kernel log for a GPU."""

    pci: tuple[int, int, int]  # PCI (domain, bus, device) of the GPU, as the driver names it
    xid: int
    text: str  # the whole log line
    seq: int | None = None  # the kernel log's sequence number (/dev/kmsg); None for a plain text line
    time_s: float | None = None  # seconds after boot the kernel logged it; None where the line does not say


@dataclass(frozen=True)
class Finding:
    """One code's events in the window: lines, distinct lines, bursts, when."""

    entry: XidCode
    policy: Policy  # the entry's, or the escalation's for a job's code that repeated
    lines: int
    distinct: int
    bursts: int
    first_s: float | None
    last_s: float | None
    example: str

    @property
    def drains(self) -> bool:
        return self.policy.action == "drain"

    def describe(self) -> str:
        """'Xid 79 ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS (RESTART_BM): 3 lines (1 distinct) in 1 burst, 12.0-12.5 s
        after boot; repair: reboot'"""
        when = ""
        if self.first_s is not None and self.last_s is not None:
            last = "" if self.last_s == self.first_s else f"-{self.last_s:.1f}"
            when = f", {self.first_s:.1f}{last} s after boot"
        bursts = f"{self.bursts} burst{'' if self.bursts == 1 else 's'}"
        lines = f"{self.lines} line{'' if self.lines == 1 else 's'} ({self.distinct} distinct)"
        return (
            f"Xid {self.entry.code} {self.entry.name} ({self.entry.resolution}): {lines} in {bursts}{when}; "
            f"repair: {self.policy.repair}"
        )


def bursts(times: list[float | None], gap_s: float) -> int:
    """The bursts lines at these times make: a new one where the gap exceeds `gap_s`; lines without a time make one."""
    known = sorted(t for t in times if t is not None)
    count = sum(1 for before, after in itertools.pairwise(known) if after - before > gap_s) + (1 if known else 0)
    return max(count, 1 if None in times else 0)


def judge(
    events: Iterable[XidEvent], catalog: Catalog, after_seq: int | None, floor_seq: int | None, now_s: float | None
) -> list[Finding]:
    """Each code's finding for one GPU's events, in code order. Events up to `floor_seq` (a repair acknowledged) are
    never judged; a code is judged on the events after `after_seq` (the GPU's last clean check; None: since boot). A
    job's code drains where it made `escalation.bursts` bursts within the escalation window, counted across clean
    checks: one buggy job is the job's, the same fault again and again is the GPU's. `now_s` None: all recent."""

    def after(e: XidEvent, seq: int | None) -> bool:
        return seq is None or e.seq is None or e.seq > seq

    by_code: dict[int, list[XidEvent]] = {}
    for event in events:
        if after(event, floor_seq):
            by_code.setdefault(event.xid, []).append(event)
    findings = []
    for xid, seen in sorted(by_code.items()):
        entry = catalog.code(xid)
        policy, window = entry.policy, [e for e in seen if after(e, after_seq)]
        if policy.action == "job":
            esc = catalog.escalation
            recent = [e for e in seen if now_s is None or e.time_s is None or now_s - e.time_s <= esc.within_s]
            if bursts([e.time_s for e in recent], catalog.burst_gap_s) >= esc.bursts:
                why = f"{esc.bursts} bursts or more on one GPU within {esc.within_s / 3600:g} h ({esc.source})"
                policy, window = Policy("drain", esc.repair, why), recent
        if window:
            findings.append(_finding(entry, policy, window, catalog.burst_gap_s))
    return findings


def _finding(entry: XidCode, policy: Policy, window: list[XidEvent], gap_s: float) -> Finding:
    times = [e.time_s for e in window]
    known = [t for t in times if t is not None]
    return Finding(
        entry=entry,
        policy=policy,
        lines=len(window),
        distinct=len({_event_text(e.text) for e in window}),
        bursts=bursts(times, gap_s),
        first_s=min(known, default=None),
        last_s=max(known, default=None),
        example=window[-1].text,
    )


def _event_text(line: str) -> str:
    """An Xid line from 'NVRM: Xid' on, so the same event logged with another prefix (syslog's) reads the same."""
    at = line.find("NVRM: Xid")
    return line[at:] if at >= 0 else line
