"""The lines that take the fleet's nodes out of service, printed for the operator and never run: Slurm's
`scontrol update nodename=N state=drain reason=...`, and Kubernetes' `kubectl cordon N`,
`kubectl taint nodes N gbvalidate/fault=CATEGORY:NoSchedule` and `kubectl label nodes N gbvalidate/fault=CATEGORY`.

Each line names exactly one node, validated (service.py): a hostname that is no single Slurm node name, or no
Kubernetes node name, gets no line of that kind but a note for a person. The taint and the label carry the node's
fault category (of its first failed check; `partial`, `outlier`, `coverage` or a multi-node finding's category
where it failed none), so `kubectl get nodes -l gbvalidate/fault` lists the nodes taken out and why; `--overwrite`
lets the lines run again after a later summary. A category that is no label value gets no taint or label line."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from pytest_gbvalidate.fleet.domains import FABRIC_CATEGORY
from pytest_gbvalidate.fleet.summary import Node, Summary
from pytest_gbvalidate.service import kubernetes_node_name, label_value_problem, slurm_node_name

# The taint's and the label's key: one key, so that removing it (`kubectl label nodes N gbvalidate/fault-`,
# `kubectl taint nodes N gbvalidate/fault-`) undoes the lines.
FAULT_KEY = "gbvalidate/fault"
TAINT_EFFECT = "NoSchedule"  # new pods stay off; running ones stay (NoExecute would evict them)
NOT_DRAINED = "no drain line: the hostname does not name exactly one node; look at it yourself"
NOT_CORDONED = "no kubectl lines: the hostname is no Kubernetes node name (RFC 1123); look at it yourself"


@dataclass(frozen=True)
class OutOfService:
    """A node to take out of service: its hostname as the report says it, the drain reason, the fault category."""

    host: str
    reason: str
    category: str


def out_of_service(summary: Summary) -> list[OutOfService]:
    """Every node of the drain list, in its order, with the category of what took it out."""
    categories = {n.hostname: _category(n) for n in summary.drained}
    for host, found in summary.unreported_suspects.items():
        categories[host] = found[0].category or "unclassified"
    return [OutOfService(host, reason, categories[host]) for host, reason in summary.drain_list()]


def _category(node: Node) -> str:
    """The first failed check's, else what else took the node out (Node.drain's order)."""
    if node.failed:
        return node.failed[0].category or "unclassified"
    if node.domain is not None:
        return FABRIC_CATEGORY
    if node.verdict == "partial":
        return "partial"
    if node.outliers:
        return "outlier"
    if node.suspected:
        return node.suspected[0].category or "unclassified"
    return "coverage"


def drain_commands(summary: Summary) -> list[str]:
    """One `scontrol update ... state=drain` per node to take out of service whose hostname names exactly one
    node (`not_drained` lists the others); host and reason shell-quoted."""
    return [
        f"scontrol update nodename={shlex.quote(name)} state=drain reason={shlex.quote(node.reason)}"
        for node in out_of_service(summary)
        if (name := slurm_node_name(node.host)) is not None
    ]


def not_drained(summary: Summary) -> list[str]:
    """The nodes to take out of service whose hostname is no single node's name: for a person to look at."""
    return [host for host, _ in summary.drain_list() if slurm_node_name(host) is None]


def kubectl_commands(summary: Summary) -> list[str]:
    """Per node to take out of service whose hostname is a Kubernetes node name: cordon, taint and label (the
    last two only where its category is a label value). Names and values are validated, so nothing needs quoting."""
    lines = []
    for node in out_of_service(summary):
        name = kubernetes_node_name(node.host)
        if name is None:
            continue
        lines.append(f"kubectl cordon {name}")
        if label_value_problem(node.category) is None:
            lines.append(f"kubectl taint nodes {name} {FAULT_KEY}={node.category}:{TAINT_EFFECT} --overwrite")
            lines.append(f"kubectl label nodes {name} {FAULT_KEY}={node.category} --overwrite")
    return lines


def kubectl_notes(summary: Summary) -> list[str]:
    """`host: why` for each node to take out of service that gets no kubectl line, or no taint or label line."""
    notes = []
    for node in out_of_service(summary):
        if kubernetes_node_name(node.host) is None:
            notes.append(f"{node.host}: {NOT_CORDONED}")
        elif (problem := label_value_problem(node.category)) is not None:
            notes.append(f"{node.host}: cordon only: its fault category {problem}, so it is no label or taint value")
    return notes  # the hosts and categories are escaped as the reports were read
