"""The fleet summary's node rows: one node says the same in the Markdown table, the terminal and nodes.csv."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any

from pytest_gbvalidate.fleet import render
from pytest_gbvalidate.fleet.summary import summarize
from tests.helpers.reports import minimal_report

BANDWIDTH = {"node-01": 10.0, "node-02": 10.1, "node-03": 9.9, "node-04": 5.0}  # node-04: an outlier


def report(host: str, gbps: float, failed: bool = False) -> dict[str, Any]:
    """A finished cpu report with one check and one gated measurement; `failed`: the check failed, with its fault."""
    test: dict[str, Any] = {"test_id": "suites/test_bandwidth.py::test_host_copy_bandwidth", "when": "call"}
    test |= {"outcome": "passed", "message": None, "duration_s": 1.0, "text": None}
    if failed:
        fault = {"category": "performance", "title": "slow", "action": "look", "disposition": "MONITOR", "why": None}
        test |= {"outcome": "failed", "message": "measured 0.1 GB/s -> FAIL", "fault": fault}
    measurement = {"test_id": test["test_id"], "metric": "host_copy_bandwidth_gbps", "scope": "node", "value": gbps}
    measurement |= {"unit": "GB/s", "direction": "higher", "verdict": "pass", "scope_kind": "node", "details": {}}
    return minimal_report() | {
        "exit_status": 1 if failed else 0,
        "level": "full",
        "start_time": "2026-01-01T00:00:00+00:00",
        "node": {"hostname": host, "torch": "2.12.0" if host == "node-02" else "2.13.0", "python": "3.11.7"},
        "tests": [test],
        "measurements": [measurement | {"message": "ok"}],
    }


def test_a_node_row_shows_the_same_cells_in_markdown_the_terminal_and_csv(tmp_path: Path) -> None:
    paths = []
    for host, gbps in BANDWIDTH.items():
        paths.append(tmp_path / f"{host}.json")
        paths[-1].write_text(json.dumps(report(host, gbps, failed=host == "node-03")))
    summary = summarize(paths)
    markdown = render.markdown(summary, [], None, tmp_path)
    table = markdown.split("## Nodes\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    md_rows = {cells[0]: cells for cells in ([c.strip() for c in line.strip("|").split("|")] for line in table[2:])}
    terminal = render.terminal(summary, [], None)
    csv_rows = {row["hostname"]: row for row in csv.DictReader(render.nodes_csv(summary).splitlines())}

    assert table[0] == "| node | verdict | failed checks | outlier metrics | drain | level | torch | python |"
    assert md_rows["node-03"][1:5] == ["FAIL", "test_host_copy_bandwidth (performance)", "-", "yes"]
    assert md_rows["node-04"][1:5] == ["PASS", "-", "host_copy_bandwidth_gbps [node] -50%", "yes"]
    assert md_rows["node-02"][5:] == ["full", "2.12.0", "3.11.7"]
    for n in summary.nodes:
        md_cells = md_rows[n.hostname]
        (line,) = [line for line in terminal if line.startswith(f"{n.hostname} ")]
        assert re.split(r"\s{2,}", line) == md_cells[:4]
        row = csv_rows[n.hostname]
        assert [row["verdict"].upper(), row["drain"], row["level"], row["torch"]] == [md_cells[i] for i in (1, 4, 5, 6)]
        outliers = row["outlier_metrics"].split("; ") if row["outlier_metrics"] else ["-"]
        assert ", ".join(outliers) == md_cells[3]
        # nodes.csv: "suites/a.py::test_x [category]"; the tables: "test_x (category)"
        checks = [re.fullmatch(r".*::(\S+) \[(.*)\]", c) for c in row["failed_checks"].split("; ")]
        names = ", ".join(f"{m[1]} ({m[2]})" for m in checks if m is not None)
        assert (names if row["failed_checks"] else "-") == md_cells[2]


def test_a_node_whose_gpus_run_other_firmware_is_named_where_the_stack_differs(tmp_path: Path) -> None:
    """VBIOS beside the software stack: the node with another version (or a mix on its own GPUs) is named."""
    vbios = {"node-01": ["97.00.5A.00.01"] * 2, "node-02": ["97.00.5A.00.01"] * 2, "node-03": ["96.00.74.00.0F"] * 2}
    vbios["node-04"] = ["97.00.5A.00.01", "96.00.74.00.0F"]
    paths = []
    for host, versions in vbios.items():
        data = report(host, BANDWIDTH[host])
        data["gpus"] = {"devices": [{"index": i, "vbios_version": v} for i, v in enumerate(versions)], "count": 2}
        paths.append(tmp_path / f"{host}.json")
        paths[-1].write_text(json.dumps(data))
    differs = render.software_differences(summarize(paths).nodes)
    assert "vbios: 97.00.5A.00.01 (2 node(s): node-01, node-02), 96.00.74.00.0F (1 node(s): node-03), " in differs[-1]
    assert differs[-1].endswith("96.00.74.00.0F/97.00.5A.00.01 (1 node(s): node-04)")
    assert "vbios" in render.markdown(summarize(paths), [], None, tmp_path).split("## Nodes", 1)[1].splitlines()[2]
