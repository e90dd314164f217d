"""The lines that take the fleet's nodes out of service, printed for the operator and never run: Slurm's
`scontrol update nodename=N state=drain reason=...`, and Kubernetes' `kubectl cordon N`,
`kubectl taint nodes N gbvalidate/fault=CATEGORY:NoSchedule` and `kubectl label nodes N gbvalidate/fault=CATEGORY`.

Each line names exactly one node, validated (service.py): a hostname that is no single Slurm node name, or no
Kubernetes node name, gets no line of that kind but a note for a person. The taint and the label carry the node's
fault category (fleet/drain.py), so `kubectl get nodes -l gbvalidate/fault` lists the nodes taken out and why;
`--overwrite` lets the lines run again after a later summary. A category that is no label value gets no taint or
label line."""

from __future__ import annotations

import shlex

from pytest_gbvalidate.fleet.summary import Summary
from pytest_gbvalidate.service import kubernetes_node_name, label_value_problem, slurm_node_name

# The taint's and the label's key: one key, so that removing it (`kubectl label nodes N gbvalidate/fault-`,
# `kubectl taint nodes N gbvalidate/fault-`) undoes the lines.
FAULT_KEY = "gbvalidate/fault"
TAINT_EFFECT = "NoSchedule"  # new pods stay off; running ones stay (NoExecute would evict them)
NOT_DRAINED = "no drain line: the hostname does not name exactly one node; look at it yourself"
NOT_CORDONED = "no kubectl lines: the hostname is no Kubernetes node name (RFC 1123); look at it yourself"


def drain_commands(summary: Summary) -> list[str]:
    """One `scontrol update ... state=drain` per node to take out of service whose hostname names exactly one
    node (`not_drained` lists the others); host and reason shell-quoted."""
    return [
        f"scontrol update nodename={shlex.quote(name)} state=drain reason={shlex.quote(node.reason)}"
        for node in summary.drain_list()
        if (name := slurm_node_name(node.host)) is not None
    ]


def not_drained(summary: Summary) -> list[str]:
    """The nodes to take out of service whose hostname is no single node's name: for a person to look at."""
    return [node.host for node in summary.drain_list() if slurm_node_name(node.host) is None]


def kubectl_commands(summary: Summary) -> list[str]:
    """Per node to take out of service whose hostname is a Kubernetes node name: cordon, taint and label (the
    last two only where its category is a label value). Names and values are validated, so nothing needs quoting."""
    lines = []
    for node in summary.drain_list():
        if (name := kubernetes_node_name(node.host)) is None:
            continue
        lines.append(f"kubectl cordon {name}")
        if label_value_problem(node.category) is None:
            lines.append(f"kubectl taint nodes {name} {FAULT_KEY}={node.category}:{TAINT_EFFECT} --overwrite")
            lines.append(f"kubectl label nodes {name} {FAULT_KEY}={node.category} --overwrite")
    return lines


def kubectl_notes(summary: Summary) -> list[str]:
    """`host: why` for each node to take out of service that gets no kubectl line, or no taint or label line."""
    notes = []
    for node in summary.drain_list():
        if kubernetes_node_name(node.host) is None:
            notes.append(f"{node.host}: {NOT_CORDONED}")
        elif (problem := label_value_problem(node.category)) is not None:
            notes.append(f"{node.host}: cordon only: its fault category {problem}, so it is no label or taint value")
    return notes  # the hosts and categories are escaped as the reports were read
