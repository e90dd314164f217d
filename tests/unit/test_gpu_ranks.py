"""The multi-rank harness's decisions (benchmarks/gpu_ranks.py): each rank its own NCCL host, the seed baseline it
runs against, the cases and their bounds, and the verdicts it reads from what the ranks left. (Its runs over gloo:
e2e/test_gpu_ranks_run.py.)"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch  # noqa: F401 -- in-process pytester runs drop modules they imported, and torch cannot load twice

from pytest_gbvalidate import baselines as bl
from tests.helpers.scripts import gpu_ranks


@pytest.fixture(scope="module")
def harness() -> ModuleType:
    return gpu_ranks()


def test_each_rank_is_an_nccl_host_of_its_own_on_loopback(harness: ModuleType) -> None:
    base = {"PATH": "/usr/bin", "GBVALIDATE_SKU": "cpu", "PYTEST_ADDOPTS": "-x", "NODE_FAULT": "slow"}
    envs = [harness.node_environment(base, "r1", node, "m") for node in range(4)]
    assert len({env["NCCL_HOSTID"] for env in envs}) == 4  # NCCL's duplicate-GPU check is per host
    for env in envs:
        assert (env["NCCL_SOCKET_IFNAME"], env["NCCL_IB_DISABLE"], env["GLOO_SOCKET_IFNAME"]) == ("lo", "1", "lo")
        assert env["PATH"] == "/usr/bin" and env["GBVALIDATE_RANKS_CASE"] == "m"
        # the operator's plugin settings and a stray fault stay out: each case says its own
        assert not {"GBVALIDATE_SKU", "PYTEST_ADDOPTS", "NODE_FAULT"} & set(env)
        assert str(harness.REPO) in env["PYTHONPATH"].split(":")  # tests.helpers.node_fault for the killed case
    # one harness run's ids differ from another's: two runs on one machine are two sets of hosts
    assert harness.host_id("r1", 0) != harness.host_id("r2", 0)


def test_the_cases_cover_every_multi_rank_path_with_a_bound_each(harness: ModuleType) -> None:
    on_gpu = {c.name: c for c in harness.cases([2, 4], "cuda")}
    assert list(on_gpu) == [
        *("collectives-2", "pairwise-2", "killed-2", "collectives-4", "pairwise-4", "killed-4"),
        *("memory-2", "nvls-2", "pretrain-tiny-pp2", "pretrain-8b4-pp2"),
    ]
    assert {c.expect for c in on_gpu.values()} == {"pass", "no pass", "lost peer", "memory returns"}
    assert all(c.kind in harness.BOUND_S for c in on_gpu.values())
    assert on_gpu["killed-4"].expect == "lost peer" and on_gpu["nvls-2"].expect == "no pass"
    # the 8B shape is for a GPU; the CPU runs the tiny model's pipeline
    assert "pretrain-8b4-pp2" not in {c.name for c in harness.cases([2], "cpu")}
    # the killed case outlives a survivor that sees only its (shorter) timeout, then torch's wait before it aborts
    assert harness.BOUND_S["killed"] > harness.KILLED_CALL_TIMEOUT_S + harness.WATCHDOG_ABORT_WAIT_S
    killed, sweeps = (next(c for c in on_gpu.values() if c.kind == kind) for kind in ("killed", "collectives"))
    assert f"--gb-timeout={harness.KILLED_CALL_TIMEOUT_S}" in harness.pytest_program(killed, Path("/out"), 0)
    assert f"--gb-timeout={harness.CALL_TIMEOUT_S}" in harness.pytest_program(sweeps, Path("/out"), 0)


def test_the_last_rank_dies_and_rank_0_lives_to_write_the_report(harness: ModuleType) -> None:
    killed = next(c for c in harness.cases([4], "cpu") if c.kind == "killed")
    env = harness.fault_environment(killed, Path("/out/killed-4"))
    assert env["PYTEST_PLUGINS"] == "tests.helpers.node_fault" and env["NODE_FAULT"] == "kill"
    assert env["NODE_FAULT_RANK"] == "3" and int(env["NODE_FAULT_CALL"]) > 1
    # what NCCL and torch's watchdog do as the peer dies goes to the agents' logs
    assert env["NCCL_DEBUG"] == "WARN" and env["TORCH_CPP_LOG_LEVEL"] == "INFO"
    assert env["NCCL_DEBUG_FILE"] == "/out/killed-4/nccl.%p.log"  # each rank's own file, not pytest's stdout
    memory = next(c for c in harness.cases([4], "cpu") if c.kind == "memory")
    assert harness.fault_environment(memory, Path("/out/memory-4")) == {}


@pytest.mark.parametrize(("device", "gpu", "count"), [("cpu", None, 0), ("cuda", "NVIDIA H100 80GB HBM3", 1)])
def test_the_seed_baseline_loads_bounds_every_sweep_and_trains_a_pp2_pipeline(
    harness: ModuleType, tmp_path: Path, device: str, gpu: str | None, count: int
) -> None:
    path = tmp_path / f"{harness.SKU}.yaml"
    path.write_text(harness.seed_baseline(device, gpu))
    baseline = bl.load_baseline(path)
    assert (baseline.detect.gpu_count, baseline.detect.gpu_name_contains) == (count, gpu)
    for collective in harness.COLLECTIVES:
        params = baseline.metrics[f"{collective}_busbw_gbps"].default.params
        assert params["max_bytes"] == harness.MAX_BYTES[device] and params["iterations"] >= 10
    assert baseline.pretrain is not None
    assert (baseline.pretrain.layout.pp, baseline.pretrain.layout.world_size) == (2, 2)


def _report(*tests: tuple[str, str, str], status: str = "finished") -> dict[str, Any]:
    return {
        "status": status,
        "tests": [{"test_id": t, "when": "call", "outcome": o, "message": m} for t, o, m in tests],
    }


def test_a_pytest_case_is_judged_by_what_its_report_says(harness: ModuleType) -> None:
    case = {c.kind: c for c in harness.cases([2], "cpu")}
    passed = _report(("s.py::test_a", "passed", ""), ("s.py::test_b", "passed", ""))
    assert harness.judge_pytest(case["collectives"], [0, 0], passed) == ("2 passed", True)
    one_failed = _report(("s.py::test_a", "passed", ""), ("s.py::test_b", "failed", "wrong data"))
    assert harness.judge_pytest(case["collectives"], [1, 1], one_failed)[1] is False
    no_report = ("no report written (agents exited [1, 1])", False)
    assert harness.judge_pytest(case["collectives"], [1, 1], None) == no_report
    # NVLS where it cannot exist: a skip or failure that says why, never a pass, never a silent skip
    said = _report(("s.py::test_nvls", "failed", "NCCL's log shows Ring"), ("s.py::test_mnnvl", "skipped", "no MNNVL"))
    assert harness.judge_pytest(case["nvls"], [1, 1], said)[1] is True
    assert harness.judge_pytest(case["nvls"], [0, 0], _report(("s.py::test_nvls", "passed", "")))[1] is False
    assert harness.judge_pytest(case["nvls"], [0, 0], _report(("s.py::test_nvls", "skipped", "")))[1] is False
    # a rank killed: every test run fails saying so, and the report is finished
    lost = _report(("s.py::test_all_reduce", "failed", "gang lost a peer: sweep_on_rank: Connection closed by peer"))
    seen, ok = harness.judge_pytest(case["killed"], [1, -9], lost)
    assert ok and "lost a peer" in seen
    assert harness.judge_pytest(case["killed"], [1, -9], _report(("t", "passed", "")))[1] is False
    interrupted = _report(("t", "failed", "lost a peer"), status="interrupted")
    assert harness.judge_pytest(case["killed"], [1, -9], interrupted)[1] is False


# The end of a torchrun agent's log whose rank died by a signal (torch 2.11.0, an H200, the killed-4 case).
TORCHRUN_SUMMARY = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
=====================================================
pytest FAILED
-----------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
-----------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-27_13:20:50
  host      : localhost
  rank      : {rank} (local_rank: 0)
  exitcode  : {code} (pid: 1448)
  error_file: <N/A>
  traceback : Signal 6 (SIGABRT) received by PID 1448
=====================================================
"""


def test_how_each_rank_ended_is_read_from_torchrun_s_summaries(harness: ModuleType) -> None:
    """A rank that died mid-test leaves rank 0's report "running" with nothing in it: the agents' logs say how
    each rank ended."""
    logs = "".join(TORCHRUN_SUMMARY.format(rank=r, code=c) for r, c in ((0, -6), (2, -11), (3, -9), (1, 1)))
    exits = harness.rank_exits("Fatal Python error: Aborted\n" + logs)
    assert exits == {0: -6, 1: 1, 2: -11, 3: -9}
    assert harness.exits_line(exits) == "ranks ended: 0 SIGABRT, 1 exit 1, 2 SIGSEGV, 3 SIGKILL"
    assert harness.rank_exits("rank 0 finished\n") == {}


def test_a_survivor_of_the_killed_case_ends_by_its_exit_status_not_a_signal(harness: ModuleType) -> None:
    """Seen on an H200: the report finished, then ranks 0 and 1 died by SIGABRT in torch's watchdog."""
    killed = next(c for c in harness.cases([4], "cpu") if c.kind == "killed")
    assert harness.judge_survivors(killed, {0: 1, 1: 1, 2: 1, 3: -9}) is None  # the fault's own SIGKILL
    assert harness.judge_survivors(killed, {3: -9}) is None  # survivors that exited 0 leave no summary
    why = harness.judge_survivors(killed, {0: -6, 1: -6, 2: 1, 3: -9})
    assert why == "a survivor died by a signal (0 SIGABRT, 1 SIGABRT)"


def test_memory_returns_when_no_later_sweep_holds_more_than_the_first(harness: ModuleType) -> None:
    mib = 2**20
    assert harness.judge_memory("cuda", [[8 * mib, 8 * mib, 8 * mib], [8 * mib, 8 * mib, 8 * mib]])[1] is True
    seen, ok = harness.judge_memory("cuda", [[8 * mib, 8 * mib, 8 * mib], [8 * mib, 72 * mib, 136 * mib]])
    assert not ok and "rank 1: 8.0, 72.0, 136.0" in seen
    assert harness.judge_memory("cuda", [])[1] is False


def test_a_case_past_its_bound_or_leaving_processes_is_a_defect(harness: ModuleType) -> None:
    case = harness.cases([2], "cpu")[0]
    assert harness.judge_bounds(case, 10.0, False, []) is None
    assert "ran past its bound" in harness.judge_bounds(case, 300.0, True, [])
    assert harness.judge_bounds(case, 10.0, False, [4242]) == "left 1 process(es) behind: 4242"


@pytest.mark.parametrize(
    ("kind", "wanted"),
    [
        (
            "collectives",
            {f"test_{c}_busbw" for c in ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast")},
        ),
        ("pairwise", {"test_pairwise_all_reduce_busbw"}),
        ("killed", {"test_all_reduce_busbw"}),
        ("nvls", {"test_nvls_all_reduce_busbw", "test_mnnvl_all_reduce_busbw"}),
    ],
)
def test_each_pytest_case_selects_exactly_its_checks(
    harness: ModuleType, pytester: pytest.Pytester, kind: str, wanted: set[str]
) -> None:
    """The cases' -k expressions against the suite as collected: the sweeps' case once took the NVLS checks too."""
    case = next(c for c in harness.cases([2], "cuda") if c.kind == kind)
    result = pytester.runpytest_inprocess("--collect-only", "-q", "-p", "no:cacheprovider", *case.select)
    names = {line.split("::")[-1].split("[")[0] for line in result.outlines if "::" in line}
    assert names == wanted, result.outlines
