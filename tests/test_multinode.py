"""Two nodes on one machine: two torchrun agents (`--nnodes=2 --nproc-per-node=1`, c10d rendezvous on a free
loopback port) each run `pytest --gb-sku=cpu` on the collectives and bandwidth suites. Both must pass, every
collective runs across the two, each node measures its own host, and only the node that got global rank 0 writes
the JSON report and the JUnit XML."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from tests.test_plugin import COLLECTIVE_TESTS, SUITES, junit_cases


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_two_nodes_over_loopback(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GBVALIDATE_", "PYTEST_"))}
    env["GLOO_SOCKET_IFNAME"] = "lo"  # loopback only
    agents = []
    for node in (0, 1):
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes=2",
            "--nproc-per-node=1",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}",
            "--max-restarts=0",
            "-m",
            "pytest",
            "--gb-sku=cpu",
            str(SUITES / "test_collectives.py"),
            str(SUITES / "test_bandwidth.py"),
            "-k",
            "not gemm",  # the collectives and the host copy; a CPU matmul adds time, not coverage
            f"--gb-report={tmp_path / f'node{node}.json'}",
            f"--junitxml={tmp_path / f'node{node}.xml'}",
            "-p",
            "no:cacheprovider",
            "-q",
        ]
        with (tmp_path / f"agent{node}.log").open("w") as log:  # the agent keeps its own copy of the descriptor
            agents.append(subprocess.Popen(command, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT))
    try:
        codes = [agent.wait(timeout=150) for agent in agents]
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
    logs = {node: (tmp_path / f"agent{node}.log").read_text() for node in (0, 1)}
    assert codes == [0, 0], logs

    written = [node for node in (0, 1) if (tmp_path / f"node{node}.json").exists()]
    assert len(written) == 1, logs  # one report, from the node that got global rank 0
    (node,) = written
    assert not (tmp_path / f"node{1 - node}.xml").exists()
    report = json.loads((tmp_path / f"node{node}.json").read_text())
    assert report["status"] == "finished" and report["exit_status"] == 0
    assert report["world"] == {"world_size": 2}
    assert report["gang"] == {"kind": "world", "world_size": 2, "device_type": "cpu", "failed_starts": []}
    cases = junit_cases(tmp_path / f"node{node}.xml")
    passed = {name for name, case in cases.items() if case["outcome"] == "passed"}
    assert passed == {*COLLECTIVE_TESTS, "test_host_copy_bandwidth"}
    for name in COLLECTIVE_TESTS:
        records = [m for m in report["measurements"] if m["test_id"].endswith(name)]
        assert len(records) == 20 and all(m["details"]["wrong"] == 0 for m in records)
    root = ET.parse(tmp_path / f"node{node}.xml").getroot()
    assert root.find("testsuite/properties/property[@name='gb_sku']") is not None
    # each node measured its own host, and the report from rank 0 has both
    copies = [m for m in report["measurements"] if m["metric"] == "host_copy_bandwidth_gbps"]
    assert sorted(m["scope"] for m in copies) == ["node0", "node1"]
    assert sorted(m["details"]["rank"] for m in copies) == [0, 1]
    # the other node ran the same tests to the same verdicts, quietly
    assert "8 passed, 4 skipped, 3 deselected" in logs[1 - node] and "8 passed, 4 skipped, 3 deselected" in logs[node]
