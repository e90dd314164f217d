"""Weak scaling: a multi-node pretraining run against the single-node runs of the same model.

A multi-node report (`gang.nodes` N > 1) with a step time (a metric ending `_step_time_s` whose details carry
LAYOUT_FIELDS) is paired with the finished single-node reports of the same workload (StepTime.same_workload) whose
global batch is the multi-node run's per-node batch (gbs_1 * N == gbs_N): the work per node is the same, so ideal
weak scaling keeps the step time. Efficiency = median single-node step time / N-node step time (1.0 is ideal).
Informational: it does not change the exit code (the baselines gate the step times themselves).

Where the details carry `per_node_compute_s` (each node's slowest rank's median time of the work before the gradient
sync) or `per_node_step_time_s`, the per-node times are shown with the straggler (the slowest node, and the spread
(max - min) / median in percent), and the ranks' spread (`rank_spread_pct`) where given: the step time itself cannot
show a straggler, the gradient sync makes every node wait for the slowest.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_gbvalidate.fleet.reports import Report
from pytest_gbvalidate.rules.outliers import is_number

STEP_TIME_SUFFIX = "_step_time_s"
LAYOUT_FIELDS = ("mbs", "gbs", "dp", "seq_len", "model", "layout")
# Compared where both runs' details have them: a bf16 run says nothing about an fp8 one's scaling, nor a PP=1
# node about a PP=2 one's; weak scaling grows the data-parallel replicas only.
SAME_WHERE_GIVEN = ("engine", "precision", "mbs", "tp", "pp", "cp")


@dataclass(frozen=True)
class StepTime:
    host: str
    metric: str
    value_s: float
    details: dict[str, Any]

    @property
    def model(self) -> str:
        return str(self.details["model"])

    @property
    def layout(self) -> str:
        return str(self.details["layout"])

    @property
    def gbs(self) -> int:
        return int(self.details["gbs"])

    def same_workload(self, other: StepTime) -> bool:
        if self.model != other.model or self.details["seq_len"] != other.details["seq_len"]:
            return False
        return all(
            self.details[name] == other.details[name]
            for name in SAME_WHERE_GIVEN
            if name in self.details and name in other.details
        )


@dataclass(frozen=True)
class Straggler:
    host: str
    slowest_s: float
    fastest_s: float
    median_s: float

    @property
    def spread_pct(self) -> float:
        return (self.slowest_s - self.fastest_s) / self.median_s * 100.0 if self.median_s else 0.0


@dataclass(frozen=True)
class WeakScaling:
    """One step time of a multi-node run, with its single-node references; `note`: why `efficiency` is None."""

    run: Report
    nodes: int
    step: StepTime
    references: list[StepTime]
    per_node_s: dict[str, float] = field(default_factory=dict)
    note: str = ""
    per_node_what: str = ""  # what per_node_s times: the work before the gradient sync, or (older reports) the step

    @property
    def reference_s(self) -> float | None:
        return statistics.median(r.value_s for r in self.references) if self.references else None

    @property
    def efficiency(self) -> float | None:
        reference = self.reference_s
        return None if reference is None else reference / self.step.value_s

    @property
    def rank_spread_pct(self) -> float | None:
        """(slowest - fastest) / fastest of the ranks' median times (of the work before the gradient sync, within
        a pipeline stage), as the run reported it."""
        spread = self.step.details.get("rank_spread_pct")
        return float(spread) if is_number(spread) else None

    @property
    def straggler(self) -> Straggler | None:
        if len(self.per_node_s) < 2:
            return None
        host = max(self.per_node_s, key=lambda h: self.per_node_s[h])
        values = list(self.per_node_s.values())
        return Straggler(host, max(values), min(values), statistics.median(values))


def step_times(report: Report) -> list[StepTime]:
    """The report's pretraining step times that say their layout (LAYOUT_FIELDS in details)."""
    found = []
    for m in report.measurements:
        details = m.get("details")
        if not str(m.get("metric", "")).endswith(STEP_TIME_SUFFIX) or not isinstance(details, dict):
            continue
        if not all(name in details for name in LAYOUT_FIELDS) or not _is_int(details["gbs"]):
            continue
        value = m["value"]
        if isinstance(value, (int, float)) and is_number(value) and value > 0:
            found.append(StepTime(report.hostname, str(m["metric"]), float(value), details))
    return found


def weak_scaling(multi_node: Sequence[Report], single_node: Sequence[Report]) -> list[WeakScaling]:
    """Each step time of each multi-node run, paired with the finished single-node runs of the same workload (one
    that missed its baseline's step-time gate still measured one node's step time)."""
    singles = [s for report in single_node if report.finished for s in step_times(report)]
    results = []
    for run in multi_node:
        for step in step_times(run):
            n = run.nodes
            matching = [s for s in singles if s.same_workload(step) and s.gbs * n == step.gbs]
            note = ""
            if not matching:
                gbs = f"{step.gbs}/{n}" if step.gbs % n else str(step.gbs // n)
                note = f"no finished single-node run of {step.model} with gbs {gbs} (the per-node batch)"
            per_node_s, what = _per_node(step.details)
            results.append(WeakScaling(run, n, step, matching, per_node_s, note, what))
    return results


def _per_node(details: dict[str, Any]) -> tuple[dict[str, float], str]:
    """Each node's time and what it times: its work before the gradient sync where the run says it (the sync
    makes every node's step as slow as the slowest one's), else its step time."""
    for key, what in (("per_node_compute_s", "work before the gradient sync"), ("per_node_step_time_s", "step time")):
        per_node = details.get(key)
        if isinstance(per_node, dict) and per_node:
            return {str(host): float(s) for host, s in per_node.items() if is_number(s)}, what
    return {}, ""


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
