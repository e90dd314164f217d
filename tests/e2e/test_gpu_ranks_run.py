"""The multi-rank harness (benchmarks/gpu_ranks.py) run on the CPU over gloo, as it runs on a GPU under NCCL: its
torchrun "nodes" on this machine, each its own NCCL host. The cases no other test runs under a torchrun world: a
rank SIGKILLed in the middle of an all_reduce (the survivors' test fails saying so, the report is written, nothing
is left running) and a sweep repeated three times (each rank's memory back where the first left it). The world
paths the other cases take (the collective sweeps, the pairwise check, the PP=2 pipeline across nodes) are
e2e/test_multinode.py's; the verdicts of every case are unit-tested (unit/test_gpu_ranks.py)."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from tests.helpers.scripts import gpu_ranks


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
