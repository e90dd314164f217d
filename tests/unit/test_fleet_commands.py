"""pytest_gbvalidate/fleet/commands.py: the lines that take nodes out of service, on node reports made here (real
ones: e2e/test_fleet_summary_runs.py). Each line names one node, validated; what cannot be named gets a note."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest

from pytest_gbvalidate.fleet import commands, render
from pytest_gbvalidate.fleet.summary import summarize
from pytest_gbvalidate.rules.breaker import Breaker
from pytest_gbvalidate.service import kubernetes_node_name, label_value_problem, qualified_name_problem
from tests.helpers.fleet_reports import write
from tests.helpers.healthcheck import FAULT, record, report_with

# Most of these fleets' nodes fail: the lines themselves are tested here, not the breaker (test_breaker.py).
NO_BREAKER = Breaker(max_pct=100)


def node(host: str, *tests: dict[str, Any], **changes: Any) -> dict[str, Any]:
    report: dict[str, Any] = report_with([record("t.py::test_x", "passed"), *tests], **changes)
    report["node"] = {"hostname": host, "torch": "2.13.0"}
    return report


def failed(category: str) -> dict[str, Any]:
    return record("t.py::test_gpu_count", "failed", fault=FAULT | {"category": category})


@pytest.mark.broken_reports  # a fault category that is no label value: a report no run writes
def test_each_node_out_of_service_gets_cordon_taint_and_label_lines(tmp_path: Path) -> None:
    reports = [
        node("node-01", record("t.py::test_gpu_count", "passed")),
        node("node-02", failed("gpu_hardware"), exit_status=1),
        node("GPU-03.Cluster.Local", failed("link"), exit_status=1),
        node("node-04", status="interrupted", exit_status=2),  # stopped, nothing failed: not taken out
        node("node-05", failed("not a label value!"), exit_status=1),
        node("node-06", failed("xid"), status="interrupted", exit_status=2),  # stopped after a failure: it stands
        node("n1,n2", failed("link"), exit_status=1),
    ]
    paths = [write(tmp_path, f"r{i}.json", r) for i, r in enumerate(reports)]
    summary = summarize(paths, breaker=NO_BREAKER)
    assert [(n.host, n.category) for n in summary.drain_list()] == [
        ("GPU-03.Cluster.Local", "link"),
        ("n1,n2", "link"),
        ("node-02", "gpu_hardware"),
        ("node-05", "not a label value!"),
        ("node-06", "xid"),
    ]
    assert commands.kubectl_commands(summary) == [
        "kubectl cordon gpu-03.cluster.local",
        "kubectl taint nodes gpu-03.cluster.local gbvalidate/fault=link:NoSchedule --overwrite",
        "kubectl label nodes gpu-03.cluster.local gbvalidate/fault=link --overwrite",
        "kubectl cordon node-02",
        "kubectl taint nodes node-02 gbvalidate/fault=gpu_hardware:NoSchedule --overwrite",
        "kubectl label nodes node-02 gbvalidate/fault=gpu_hardware --overwrite",
        "kubectl cordon node-05",
        "kubectl cordon node-06",
        "kubectl taint nodes node-06 gbvalidate/fault=xid:NoSchedule --overwrite",
        "kubectl label nodes node-06 gbvalidate/fault=xid --overwrite",
    ]
    assert commands.kubectl_notes(summary) == [
        f"n1,n2: {commands.NOT_CORDONED}",
        "node-05: cordon only: its fault category 'not a label value!' is not alphanumeric at both ends with only "
        "[A-Za-z0-9._-] between, so it is no label or taint value",
    ]
    # Slurm's lines name the short hostname; the list is not a node to either
    drained = [shlex.split(line)[2] for line in commands.drain_commands(summary)]
    assert drained == ["nodename=GPU-03", "nodename=node-02", "nodename=node-05", "nodename=node-06"]
    assert commands.not_drained(summary) == ["n1,n2"]


@pytest.mark.broken_reports
def test_every_kubectl_line_holds_valid_names_and_values_only(tmp_path: Path) -> None:
    """Whatever the reports say, a kubectl line is the node's name and the key and value Kubernetes accepts."""
    hosts = ["node-1", "ALL", "x" * 70, "a.b", "UPPER", "evil;rm -rf /", "$(reboot)", "n\u043e", "-x"]
    categories = ["gpu_hardware", "x" * 64, "a b", "", "ok.1", "_x"]
    reports = [node(h, failed(categories[i % len(categories)]), exit_status=1) for i, h in enumerate(hosts)]
    paths = [write(tmp_path, f"r{i}.json", r) for i, r in enumerate(reports)]
    summary = summarize(paths, breaker=NO_BREAKER)
    lines = commands.kubectl_commands(summary)
    labels = {line.split()[4] for line in lines if line.startswith("kubectl label")}
    assert labels == {"gbvalidate/fault=gpu_hardware", "gbvalidate/fault=ok.1", "gbvalidate/fault=unclassified"}
    for line in lines:
        words = shlex.split(line)
        assert " ".join(words) == line  # nothing needed quoting
        name = words[2] if words[1] == "cordon" else words[3]
        assert kubernetes_node_name(name) == name
        if words[1] in ("taint", "label"):
            key, value = words[4].split("=", 1)
            value = value.removesuffix(":NoSchedule")
            assert qualified_name_problem(key) is None and label_value_problem(value) is None


def test_shadow_mode_lists_what_it_would_take_out_prints_no_line_to_run_and_exits_0(tmp_path: Path) -> None:
    reports = [node("node-01"), node("node-02", failed("gpu_hardware"), exit_status=1)]
    paths = [write(tmp_path, f"r{i}.json", r) for i, r in enumerate(reports)]
    acting, shadow = summarize(paths, breaker=NO_BREAKER), summarize(paths, breaker=NO_BREAKER, shadow=True)
    assert acting.exit_code == 1 and shadow.exit_code == 0
    assert shadow.drain_list() == acting.drain_list()  # judged alike
    lines = render.terminal(shadow, [], None)
    reason = "gbvalidate: [hardware] gpu_hardware: test_gpu_count"
    at = lines.index(render.SHADOW_LINE)
    assert lines[at + 1] == f"  would drain node-02: {reason}"
    assert not [line for line in lines if line.strip().startswith(("scontrol", "kubectl"))]
    assert "SHADOW MODE (exit 0), would fail: 1 node(s) fail their checks" in render.headline(shadow)
    markdown = render.markdown(shadow, [], None, tmp_path)
    assert render.SHADOW_LINE in markdown and "```sh" not in markdown and "would fail" in markdown
