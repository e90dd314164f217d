"""The multi-rank harness (benchmarks/gpu_ranks.py) run on the CPU over gloo, as it runs on a GPU under NCCL: its
torchrun "nodes" on this machine, each its own NCCL host. The cases no other test runs under a torchrun world: a
rank SIGKILLed in the middle of an all_reduce (the survivors' test fails saying so, the report is written, nothing
is left running) and a sweep repeated three times (each rank's memory back where the first left it). The world
paths the other cases take (the collective sweeps, the pairwise check, the PP=2 pipeline across nodes) are
e2e/test_multinode.py's; the verdicts of every case are unit-tested (unit/test_gpu_ranks.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import ModuleType

import pytest

from tests.helpers.rank_faults import processes_with_marker
from tests.helpers.scripts import gpu_ranks

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def harness() -> ModuleType:
    return gpu_ranks()


def test_a_killed_rank_and_a_repeated_sweep_over_two_torchrun_nodes(
    harness: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert harness.main(["--device", "cpu", "--ranks", "2", "--out", str(tmp_path), "-k", "killed,memory"]) == 0
    out = capsys.readouterr().out
    rows = {row["case"]: row for row in json.loads((tmp_path / "gpu_ranks.json").read_text())}
    assert sorted(rows) == ["killed-2", "memory-2"] and all(row["ok"] for row in rows.values()), out
    # the survivor's report, written by rank 0: its test failed naming the lost peer, the run finished
    report = json.loads(next((tmp_path / "killed-2").glob("node*.json")).read_text())
    (failed,) = [t for t in report["tests"] if t["outcome"] == "failed"]
    assert "lost a peer" in failed["message"] and report["status"] == "finished"
    # its process group broken, the survivor ends as soon as its reports are written: by its exit status, the JUnit
    # XML beside the report, not by torch's threads at the interpreter's exit (on a GPU they hung or crashed it)
    logs = "".join(log.read_text() for log in (tmp_path / "killed-2").glob("agent*.log"))
    assert "process group failed; it exits now (1)" in logs and list((tmp_path / "killed-2").glob("node*.xml"))
    assert rows["killed-2"]["seconds"] < harness.BOUND_S["killed"]
    assert "killed-2                 2 lost peer" in out and "MiB held after each sweep: rank 0:" in out
    assert re.search(r"^2 case\(s\) in \d+ s$", out, re.M), out


def test_the_harness_stopped_by_sigterm_ends_the_ranks_it_started(tmp_path: Path) -> None:
    """A timeout's SIGTERM (or Ctrl-C) mid-case: the harness goes, and so do the case's torchrun agents and their
    ranks, which live in sessions of their own (seen on a GPU: a stopped run's four ranks went on sweeping
    and slowed the next program's kernels 4.8 times)."""
    mark = f"GB_RANKS_TEST_STOP={uuid.uuid4().hex}"  # inherited by all the harness starts (no GBVALIDATE_ name)
    name, value = mark.split("=")
    command = [sys.executable, "benchmarks/gpu_ranks.py", "--device", "cpu", "--ranks", "2", "-k", "memory"]
    harness = subprocess.Popen(
        [*command, "--out", str(tmp_path)],
        cwd=REPO,
        env=os.environ | {name: value},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    # the harness, two agents and their two ranks (a busy machine starts them slowly)
    deadline = time.monotonic() + 60
    while len(processes_with_marker(mark)) < 5 and harness.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(processes_with_marker(mark)) >= 5, harness.communicate(timeout=60)[0]
    harness.send_signal(signal.SIGTERM)
    out, _ = harness.communicate(timeout=30)
    assert processes_with_marker(mark) == [], out  # as the harness exits, not whenever the orphans notice
    assert harness.returncode == 128 + signal.SIGTERM, out
    assert "gpu_ranks: stopped by SIGTERM; ending the running case's processes" in out
