"""What takes a node out of service, told once: the drain table. The fleet summary and the health check each list
what they found as causes (Kind) and take from here whether the node drains (any cause), its drain reason and its
fault category (the taint's and label's value: the first cause's).

A reason is `gbvalidate: [class] part; part; +N more`: whose drain it is (NHC's start with "NHC:"), the most
pressing class of its causes (faults.yaml's reason classes, in CLASS_ORDER; a cause without one is hardware's),
and the causes' parts in the table's order, as many as fit in REASON_MAX_CHARS, as scontrol takes it
(service.reason_text). Being stopped, a run too noisy to judge, and the run's own failure (no verdict) are no
cause: see report/node_verdict.py. Pure: no I/O."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from pytest_gbvalidate.fleet.text import join_within
from pytest_gbvalidate.report.node_verdict import UNCLASSIFIED, FailedCheck
from pytest_gbvalidate.report.records import ReasonClass
from pytest_gbvalidate.service import reason_text

# The table: the kinds of cause, in the order a reason names them.
Kind = Literal["domain", "failed", "timeout", "outlier", "multi_node", "coverage"]
KINDS: tuple[Kind, ...] = get_args(Kind)
LEADER = "gbvalidate: "
# Whose problem a node's causes are, most pressing first: a reason names the first its causes have, so one that
# starts `gbvalidate: [job_leftovers]` has no hardware or configuration cause (the health check resumes it).
CLASS_ORDER: tuple[ReasonClass, ...] = get_args(ReasonClass)
# The class of a repeat offender's drain (healthcheck/drains.py): in place of its causes' class, and no check of ours
# resumes a node drained for it (healthcheck/slurm.py NodeState.ours_to_act_on). A repeat offender: a node drained
# (or, from its kept reports, failed) more than REPEAT_AFTER times within REPEAT_DAYS. NVIDIA NVSentinel hands a node
# to a person after more than one remediation in 7 days (its `MultipleRemediations` rule).
REPEAT = "repeat"
REPEAT_DAYS, REPEAT_AFTER = 7.0, 1


def repeats(times_s: Sequence[float], now_s: float) -> int | None:
    """How many of the incidents at `times_s` (and one now) lie within REPEAT_DAYS before `now_s`, where that makes
    a repeat offender (more than REPEAT_AFTER); else None."""
    count = sum(1 for t in times_s if now_s - t <= REPEAT_DAYS * 86400.0) + 1
    return count if count > REPEAT_AFTER else None


# `sinfo -R` shows 20 characters by default and Slurm stores any length: the categories and checks, the details are
# in the summary and the health check's line.
REASON_MAX_CHARS = 120


@dataclass(frozen=True)
class Cause:
    kind: Kind
    part: str  # the reason's part: `link (rma): test_pcie_link[gpu3],test_nvlinks[gpu3]`
    category: str  # the node's fault category where this is its first cause
    reason_class: ReasonClass = "hardware"


def failed(checks: Iterable[FailedCheck]) -> list[Cause]:
    """One cause per fault category of the failed checks, with the repair it calls for where the report says one,
    the checks comma-joined; its class the most pressing of its checks'."""
    by_category: dict[tuple[str, str | None], list[FailedCheck]] = {}
    for check in checks:
        by_category.setdefault((check.category or UNCLASSIFIED, check.repair), []).append(check)
    return [
        Cause(
            "failed",
            f"{category_label(category, repair)}: {','.join(c.name for c in found)}",
            category,
            min((c.reason_class for c in found), key=CLASS_ORDER.index),
        )
        for (category, repair), found in by_category.items()
    ]


def category_label(category: str, repair: str | None) -> str:
    """A fault category as a reason names it: with its repair, where there is one to name."""
    return category if repair in (None, "none") else f"{category} ({repair})"


def reason(causes: Sequence[Cause]) -> str | None:
    """The drain reason of a node with these causes; None where it has none (it stays in service)."""
    if not causes:
        return None
    ordered = sorted(causes, key=lambda c: KINDS.index(c.kind))
    first = min((c.reason_class for c in ordered), key=CLASS_ORDER.index)
    parts = list(dict.fromkeys(c.part for c in ordered))
    return reason_text(join_within(f"{LEADER}[{first}] ", parts, REASON_MAX_CHARS), REASON_MAX_CHARS)


def category(causes: Sequence[Cause]) -> str | None:
    """The node's fault category: its first cause's in the table's order; None without a cause."""
    return min(causes, key=lambda c: KINDS.index(c.kind)).category if causes else None


def as_repeat(reason: str) -> str:
    """`reason` (reason()'s) as a repeat offender's: `gbvalidate: [repeat] ...`, its parts as they were."""
    head, bracket, rest = reason.partition("] ")
    return f"{LEADER}[{REPEAT}] {rest}" if bracket and head.startswith(f"{LEADER}[") else reason
