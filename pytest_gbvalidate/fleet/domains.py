"""The NVLink domain as a unit. On GB200 NVL72 the rack's compute trays share one NVLink domain (the cluster UUID
and clique NVML's fabric info gives each GPU, node/fabric.py): a switch-tray or fabric-manager fault fails the
fabric checks of every node of the domain at once, and the action is one (the domain's switch trays). Where most of
a domain's nodes here fail a fabric check, the summary names one domain-level finding and takes the domain's nodes
out together, passing ones too: a job placed on the rest of a broken domain meets the same fabric. Fewer failing
nodes are each their own (a tray's cable, a GPU's registration) and drain one by one. Pure: no I/O."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from pytest_gbvalidate.fleet.findings import FailedCheck
from pytest_gbvalidate.fleet.reports import Report

# The fault table's category of the checks of the NVLink fabric (faults.yaml).
FABRIC_CATEGORY = "nvlink_fabric"
# A domain speaks as one only with at least this many nodes here: with one, its node is its own finding.
MIN_NODES = 2
# The cluster UUID's first characters in a drain reason (120 characters in all): its 8-4-4-4-12 form's first group.
SHORT_UUID_CHARS = 8


class DomainNode(Protocol):
    """What the finding reads of a node (fleet/summary.py's Node)."""

    @property
    def report(self) -> Report: ...
    @property
    def failed(self) -> list[FailedCheck]: ...


@dataclass(frozen=True)
class DomainFinding:
    """Most of one NVLink domain's nodes here fail a fabric check together."""

    domain: str  # `<cluster UUID>/<clique>`
    hosts: tuple[str, ...]  # every node of the domain with a report here, sorted
    failing: tuple[str, ...]  # those that fail a fabric check

    @property
    def short(self) -> str:
        cluster, _, clique = self.domain.partition("/")
        return f"{cluster[:SHORT_UUID_CHARS]}/{clique}" if clique else cluster[:SHORT_UUID_CHARS]

    def reason_part(self) -> str:
        """A drain reason's part for each of the domain's nodes."""
        return f"nvlink domain {self.short} fails: {len(self.failing)} of {len(self.hosts)} nodes"

    def line(self) -> str:
        """The finding, one line, one action."""
        return (
            f"NVLink domain {self.domain}: {len(self.failing)} of its {len(self.hosts)} nodes here fail their fabric "
            f"checks together ({', '.join(self.failing)}): check the domain's NVLink switch trays and its fabric "
            f"manager; its {len(self.hosts)} nodes are taken out as a unit"
        )


def domain_findings(nodes: Sequence[DomainNode]) -> list[DomainFinding]:
    """One finding per NVLink domain where more than half of its nodes here (finished reports) fail a fabric check."""
    members: dict[str, list[DomainNode]] = {}
    for node in nodes:
        if node.report.finished and node.report.nvlink_domain is not None:
            members.setdefault(node.report.nvlink_domain, []).append(node)
    found = []
    for domain, group in sorted(members.items()):
        failing = [n.report.hostname for n in group if any(c.category == FABRIC_CATEGORY for c in n.failed)]
        if len(group) >= MIN_NODES and 2 * len(failing) > len(group):
            hosts = tuple(sorted(n.report.hostname for n in group))
            found.append(DomainFinding(domain, hosts, tuple(sorted(failing))))
    return found
