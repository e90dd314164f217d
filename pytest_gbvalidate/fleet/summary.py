"""The fleet summary as data: one row per node (verdict, failed checks with their fault, outlier metrics,
software stack, what multi-node runs found, what it ran less than its peers), per-metric statistics across the
nodes, multi-node runs with their weak scaling, the reports not merged, the nodes to take out of service with their
drain reasons, and the exit code: 1 for each reason Summary.failures() gives, else 0 (nothing to drain). What each
report found is in findings.py; rendering is elsewhere (render.py, junit.py, plots.py).
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pytest_gbvalidate.fleet import confirm as confirmation
from pytest_gbvalidate.fleet import drain, findings
from pytest_gbvalidate.fleet.domains import FABRIC_CATEGORY, DomainFinding, domain_findings
from pytest_gbvalidate.fleet.findings import FailedCheck, MetricStats, NodeOutlier, NodeUnjudged, Suspect
from pytest_gbvalidate.fleet.reports import CORRUPT, NO_VERDICT, OTHER_SKU, NotMerged, Report, Sorted, sort_reports
from pytest_gbvalidate.fleet.scaling import WeakScaling, weak_scaling
from pytest_gbvalidate.report.node_verdict import UNCLASSIFIED, UNRESOLVED
from pytest_gbvalidate.rules import outliers
from pytest_gbvalidate.rules.breaker import Breaker

# The software stack, as the report's `node` section names it, in the order shown.
SOFTWARE = ("torch", "nccl", "driver", "cuda_driver", "cuda_runtime", "pytest_gbvalidate", "python", "vbios")
# What --confirm makes of a failed node (confirm.py): every failure passed its second run, or none was told again.
FLAPPING, UNCONFIRMED = "flapping", "unconfirmed"


@dataclass(frozen=True)
class OutOfService:
    """A node to take out of service: its hostname as the report says it, the drain reason, the fault category."""

    host: str
    reason: str
    category: str


@dataclass
class Node:
    report: Report
    failed: list[FailedCheck]
    outliers: list[NodeOutlier] = field(default_factory=list)
    unjudged: list[NodeUnjudged] = field(default_factory=list)  # figures too noisy to judge: no verdict on them
    suspected: list[Suspect] = field(default_factory=list)
    lacks: list[str] = field(default_factory=list)  # checks most of its peers ran and it did not (`coverage`)
    domain: DomainFinding | None = None  # its NVLink domain fails its fabric checks together (domains.py)
    # --confirm (confirm.py): the failed checks that passed their second run; why a failure is not confirmed
    flapping: list[str] = field(default_factory=list)
    unconfirmed: str | None = None

    @property
    def hostname(self) -> str:
        return self.report.hostname

    @property
    def verdict(self) -> str:
        return self.report.verdict

    @property
    def fleet_verdict(self) -> str:
        """What the fleet says of the node, for its row: the report's verdict, except that a passing node too noisy
        to judge on some figure of the fleet's (`unjudged`) is unresolved, neither passed nor drained."""
        if self.unconfirmed is not None:
            return UNCONFIRMED
        if self.verdict == "fail" and self.flapping and not self.failed:
            return FLAPPING
        return UNRESOLVED if self.verdict == "pass" and self.unjudged and not self.drain else self.verdict

    def confirm_note(self) -> str | None:
        """What --confirm found of the node's failures, one line; None where it found nothing to say."""
        if self.unconfirmed is not None:
            return f"{self.hostname}: failed once, not confirmed: {self.unconfirmed}"
        if self.flapping:
            flapping = ", ".join(self.flapping)
            return f"{self.hostname}: flapping (failed, then passed on a second run; not drained): {flapping}"
        return None

    @property
    def software(self) -> dict[str, str]:
        """The node's stack, and its GPUs' VBIOS (each version its GPUs have, `/`-joined): a node whose firmware
        differs from its peers' is named where the fleet summary lists what differs."""
        node: Mapping[str, object] = self.report.data["node"]
        found = {name: str(node[name]) for name in SOFTWARE if node.get(name) is not None}
        return found | ({"vbios": self.report.vbios} if self.report.vbios else {})

    def causes(self) -> list[drain.Cause]:
        """What takes the node out of service (fleet/drain.py): its NVLink domain (whatever its own run said), failed
        checks that stand (not flapping or unconfirmed), outlier metrics, what multi-node runs found, checks its peers
        ran and it did not. None for a node that gave no verdict, was stopped without a failure, or was only too noisy
        to judge: listed instead."""
        found = [drain.Cause("domain", self.domain.reason_part(), FABRIC_CATEGORY)] if self.domain else []
        if self.verdict in (NO_VERDICT, UNRESOLVED):  # the run's own failure, or its figures too noisy: not judged
            return found
        if self.verdict == "fail" and self.unconfirmed is None:
            found += drain.failed(c for c in self.failed if not c.unresolved)
        found += [drain.Cause("outlier", f"outlier {o.short(compact=True)}", "outlier") for o in self.outliers]
        found += [drain.Cause("multi_node", s.short, s.category or UNCLASSIFIED) for s in self.suspected]
        if self.lacks:
            found.append(drain.Cause("coverage", f"ran less than its peers: {','.join(self.lacks)}", "coverage"))
        return found

    @property
    def drain(self) -> bool:
        return bool(self.causes())

    def drain_reason(self) -> str:
        return drain.reason(self.causes()) or ""


@dataclass
class Summary:
    sorted: Sorted
    nodes: list[Node]
    metrics: list[MetricStats]
    scaling: list[WeakScaling]
    mad_k: float | None  # None: the family-wise cut-off of each metric (noise.family_z)
    pct: float | None  # None: each metric's needed resolution, where its reports give it (MetricStats.needed_pct)
    noise_floor_pct: float
    unreported_suspects: dict[str, list[Suspect]]  # host -> findings, for hosts without a node report here
    breaker: Breaker = field(default_factory=Breaker)
    domains: list[DomainFinding] = field(default_factory=list)
    shadow: bool = False  # --shadow: everything judged and written, nothing taken out, exit 0

    @property
    def sku(self) -> str | None:
        return self.sorted.sku

    @property
    def not_merged(self) -> list[NotMerged]:
        return self.sorted.not_merged

    @property
    def multi_node(self) -> list[Report]:
        return self.sorted.multi_node

    @property
    def drained(self) -> list[Node]:
        return [n for n in self.nodes if n.drain]

    @functools.cached_property
    def take_out(self) -> list[OutOfService]:
        """Every node to take out of service, with its reason and category (fleet/drain.py): the drained nodes, then
        the hosts a multi-node run found at fault that have no report of their own here. Built once."""
        found = [(n.hostname, n.causes()) for n in self.nodes]
        for host, suspected in self.unreported_suspects.items():
            found.append((host, [drain.Cause("multi_node", s.short, s.category or UNCLASSIFIED) for s in suspected]))
        return [
            OutOfService(host, drain.reason(causes) or "", drain.category(causes) or UNCLASSIFIED)
            for host, causes in found
            if causes
        ]

    @property
    def tripped(self) -> str | None:
        """Why no drain line is printed, where the breaker tripped (rules/breaker.py); else None."""
        return self.breaker.tripped(len(self.take_out), len(self.nodes) + len(self.unreported_suspects))

    def drain_list(self) -> list[OutOfService]:
        """What the drain lines take out: take_out, or nothing where the breaker tripped."""
        return [] if self.tripped else self.take_out

    @property
    def outliers(self) -> list[tuple[Node, NodeOutlier]]:
        return [(n, o) for n in self.nodes for o in n.outliers]

    @property
    def unjudged(self) -> list[tuple[Node, NodeUnjudged]]:
        return [(n, u) for n in self.nodes for u in n.unjudged]

    @property
    def statistics_note(self) -> str | None:
        """Why there are no outlier statistics, where there are none."""
        if (counted := sum(1 for n in self.nodes if n.report.finished)) < outliers.MIN_NODES:
            return (
                f"outlier statistics need at least {outliers.MIN_NODES} nodes with a finished report; "
                f"{counted} given: medians and spreads only"
            )
        return None

    def failures(self) -> list[str]:
        """Why the exit code is 1; empty when it is 0."""
        why = []
        counts = Counter(n.verdict for n in self.nodes)
        if failing := sum(n.fleet_verdict == "fail" for n in self.nodes):  # flapping and unconfirmed apart
            why.append(f"{failing} node(s) fail their checks")
        if unconfirmed := sum(n.unconfirmed is not None for n in self.nodes):
            why.append(f"{unconfirmed} node(s) failed once, not confirmed (no verdict: run their failed checks again)")
        if outlying := sum(bool(n.outliers and n.drain) for n in self.nodes):
            why.append(f"{outlying} node(s) are outliers")
        if noisy := sum(bool(n.unjudged) for n in self.nodes):
            why.append(f"{noisy} node(s) too noisy to judge on some figure (no verdict: run again on an idle node)")
        if short := sum(bool(n.lacks and n.drain) for n in self.nodes):
            why.append(f"{short} node(s) ran less than their peers")
        if counts["partial"]:
            why.append(f"{counts['partial']} node(s) have a partial report (the run was stopped; not drained)")
        if suspected := sum(bool(n.suspected and n.drain) for n in self.nodes) + len(self.unreported_suspects):
            why.append(f"{suspected} node(s) found at fault by a multi-node run")
        if self.domains:
            why.append(f"{len(self.domains)} NVLink domain(s) fail their fabric checks together (see each domain)")
        if unresolved := counts[UNRESOLVED]:
            why.append(f"{unresolved} node(s) unresolved: too noisy to judge (no verdict: run again on an idle node)")
        if no_verdict := counts[NO_VERDICT]:
            why.append(f"{no_verdict} node(s) gave no verdict (pytest's own error, or no check ran: see their reports)")
        if corrupt := sum(r.kind == CORRUPT for r in self.not_merged):
            why.append(f"{corrupt} report(s) are corrupt")
        if other_sku := sum(r.kind == OTHER_SKU and r.fails_fleet for r in self.not_merged):
            why.append(f"{other_sku} report(s) of another SKU did not pass their own checks")
        if bad_runs := sum(r.verdict != "pass" for r in self.multi_node):
            why.append(f"{bad_runs} multi-node run(s) did not pass")
        if not self.nodes:
            why.append(f"no node report of SKU {self.sku}")
        if self.tripped:
            why.append(self.tripped)
        return why

    @property
    def exit_code(self) -> int:
        return 1 if self.failures() and not self.shadow else 0


def summarize(
    paths: Sequence[Path],
    sku: str | None = None,
    mad_k: float | None = None,
    pct: float | None = None,
    noise_floor_pct: float = 0.0,
    breaker: Breaker | None = None,
    confirm: bool = False,
    shadow: bool = False,
) -> Summary:
    """With `confirm`, a failed node's failures stand only where a second run of them here failed them again
    (confirm.py); with `shadow`, nothing is taken out (Summary.shadow)."""
    sorted_reports = sort_reports(paths, sku)
    nodes = [Node(r, findings.failed_checks(r)) for r in sorted_reports.nodes]
    for failed in (n for n in nodes if confirm and n.verdict == "fail"):
        confirmation.apply(failed, sorted_reports.confirmations.get(failed.hostname))
    coverage(nodes)
    metrics = findings.metric_stats([n.report for n in nodes if n.report.finished], mad_k, pct, noise_floor_pct)
    by_host = {n.hostname: n for n in nodes}
    for m in metrics:
        for outlier in m.outliers:
            by_host[outlier.host].outliers.append(NodeOutlier(m, outlier))
        for unjudged in m.unjudged:
            by_host[unjudged.host].unjudged.append(NodeUnjudged(m, unjudged))
    unreported: dict[str, list[Suspect]] = {}
    for suspect in findings.suspects(sorted_reports.multi_node):
        node = by_host.get(suspect.host)
        (node.suspected if node is not None else unreported.setdefault(suspect.host, [])).append(suspect)
    scaling = weak_scaling(sorted_reports.multi_node, sorted_reports.nodes)
    domains = domain_findings(nodes)
    for finding in domains:
        for host in finding.hosts:
            by_host[host].domain = finding
    breaker = breaker or Breaker()
    return Summary(
        sorted_reports, nodes, metrics, scaling, mad_k, pct, noise_floor_pct, unreported, breaker, domains, shadow
    )


def coverage(nodes: Sequence[Node]) -> None:
    """Set each finished node's `lacks`: the checks (test ids that ran, passed or failed) that more than half of the
    finished nodes ran and it did not. A node whose run was cut to a subset, or whose GPUs made every check skip,
    must not pass beside nodes that showed more; a subset the whole fleet ran is nobody's lack."""
    ran = {
        n.hostname: {t["test_id"] for t in n.report.tests if t.get("when") == "call" and t["outcome"] != "skipped"}
        for n in nodes
        if n.report.finished
    }
    counts = Counter(test for tests in ran.values() for test in tests)
    usual = {test for test, count in counts.items() if count > len(ran) / 2}
    for n in nodes:
        if n.hostname in ran:
            n.lacks = sorted(test.rsplit("::", 1)[-1] for test in usual - ran[n.hostname])
