"""The rank gang: SPMD calls, and a rank that crashes, hangs or raises fails the call naming it, in bounded
time, with no process left behind; the next call gets a fresh gang."""

from __future__ import annotations

import fnmatch
import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_gbvalidate.ranks import hang as gang_module
from pytest_gbvalidate.ranks.gang import GangError, LocalGang, NodeResult, remove_dead_gang_dirs, run_on_local_rank
from pytest_gbvalidate.ranks.world import (
    WorldError,
    node_rank_from_environment,
    rendezvous_problem,
    world_from_environment,
)
from tests.helpers import gang_functions as f
from tests.helpers.namespaces import with_hostname

pytestmark = pytest.mark.torch_version  # the gang: torch.distributed and torch.accelerator

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gang() -> Iterator[LocalGang]:
    g = LocalGang(2, start_timeout_s=60)
    yield g
    g.close()


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as status:
            return "\nState:\tZ" not in status.read()
    except FileNotFoundError:
        return False


def test_every_rank_runs_the_function_and_results_come_back_in_rank_order(gang: LocalGang) -> None:
    assert gang.run(f.all_reduce_rank, 2, timeout_s=60) == [(0, 2, 6.0), (1, 2, 6.0)]
    starts = gang.starts
    assert gang.run(f.all_reduce_rank, 5, timeout_s=60) == [(0, 2, 15.0), (1, 2, 15.0)]
    assert gang.starts == starts  # the ranks stay up between calls


@pytest.mark.parametrize(
    ("fn", "cause", "detail"),
    [
        (f.crash_on, "crashed", "during crash_on: process exited with code 7"),
        (f.raise_on, "raised", "raise_on: ValueError: wrong data on rank 1"),
        (
            f.hang_on,
            "timed out",
            "hang_on did not finish within 1 s (rank 0 at *barrier; rank 1 at *gang_functions.py*",
        ),
    ],
)
def test_a_failing_rank_fails_the_call_naming_rank_and_cause(
    gang: LocalGang, fn: object, cause: str, detail: str
) -> None:
    gang.run(f.pid, timeout_s=60)  # a gang is up before the fault
    pids = gang.run(f.pid, timeout_s=60)
    start = time.monotonic()
    with pytest.raises(GangError) as excinfo:
        gang.run(fn, 1, timeout_s=1)  # type: ignore[arg-type]
    assert time.monotonic() - start < 10
    err = excinfo.value
    assert (err.rank, err.cause) == (1, cause)
    assert fnmatch.fnmatch(str(err).splitlines()[0], f"rank 1 {cause}: {detail}"), str(err)
    assert not any(alive(p) for p in pids)  # the whole gang was torn down
    assert gang.run(f.all_reduce_rank, 1, timeout_s=60) == [(0, 2, 3.0), (1, 2, 3.0)]  # and comes back


def test_ranks_do_not_outlive_a_killed_parent() -> None:
    script = textwrap.dedent(
        f"""
        import os, sys
        sys.path.insert(0, {str(REPO)!r})
        from pytest_gbvalidate.ranks.gang import LocalGang
        from tests.helpers import gang_functions as f
        if __name__ == "__main__":
            gang = LocalGang(2)
            pids = gang.run(f.pid, timeout_s=60)
            print("GANG", gang._tmpdir, *pids, flush=True)
            os._exit(9)  # killed: no chance to close the gang
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    # Our line only: some torch releases' gloo prints its own ("[Gloo] Rank 0 is connected to 1 peer ranks").
    lines = [line.split()[1:] for line in out.stdout.splitlines() if line.startswith("GANG ")]
    assert len(lines) == 1, (out.stdout, out.stderr)
    tmpdir, *pids = lines[0]
    assert len(pids) == 2, out.stderr
    deadline = time.monotonic() + 10
    while (any(alive(int(p)) for p in pids) or os.path.exists(tmpdir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(alive(int(p)) for p in pids)
    assert not os.path.exists(tmpdir)  # the orphaned ranks removed their rendezvous directory


@pytest.mark.parametrize(
    ("env", "world"),
    [
        ({}, None),
        ({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3"}, (3, 8, 3)),
        ({"SLURM_PROCID": "5", "SLURM_STEP_NUM_TASKS": "8", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1"}, (5, 8, 1)),
        ({"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1", "SLURM_NTASKS": "1"}, None),  # one task: no world
        # An sbatch -n2 batch script and an salloc -n2 shell: the job's task count, but no task of a step.
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_JOB_ID": "7"}, None),
        ({"SLURM_NTASKS": "2", "SLURM_JOB_ID": "7"}, None),
        # srun -n1 inside an sbatch -n4 script: the step's count, not the job's.
        ({"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1", "SLURM_NTASKS": "4"}, None),
        ({"RANK": "0", "WORLD_SIZE": "1"}, None),
        # The shell of `srun -n2 --pty bash` (a real Slurm's environment): task 0 of a step of 2, whose other task
        # is a shell as well, never a rank.
        ({"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_LOCALID": "0", "SLURM_PTY_PORT": "43151"}, None),
    ],
)
def test_world_from_environment(env: dict[str, str], world: tuple[int, int, int] | None) -> None:
    assert world_from_environment(env) == world


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RANK": "1"}, "RANK=1 is set without WORLD_SIZE: torchrun sets both for each rank; unset RANK"),
        ({"WORLD_SIZE": "4"}, "WORLD_SIZE=4 is set without RANK: torchrun sets both"),
        ({"RANK": "4", "WORLD_SIZE": "4"}, "RANK=4 is no rank of a world of WORLD_SIZE=4"),
        ({"RANK": "one", "WORLD_SIZE": "4"}, "RANK=one is not a whole number"),
        ({"RANK": "0", "WORLD_SIZE": "\u0664"}, "WORLD_SIZE='\\u0664' is not a whole number"),  # Arabic-Indic 4
        ({"SLURM_STEP_NUM_TASKS": "2"}, "SLURM_STEP_NUM_TASKS is set without SLURM_PROCID"),
        ({"SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "-1"}, "SLURM_PROCID=-1 is not a whole number"),
        ({"SLURM_STEP_NUM_TASKS": "0", "SLURM_PROCID": "0"}, "SLURM_PROCID=0 is no rank of a world of"),
        # `RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS` by hand: every rank took itself for its node's first, and
        # measured the node at once with the others (host copy 17.3 GB/s alone, 8.1 and 8.4 side by side).
        ({"RANK": "1", "WORLD_SIZE": "2"}, "RANK=1 and WORLD_SIZE=2 are set without LOCAL_RANK: torchrun sets all"),
    ],
)
def test_launcher_variables_that_contradict_each_other_are_an_error_never_a_wait(
    env: dict[str, str], message: str
) -> None:
    with pytest.raises(WorldError) as info:
        world_from_environment(env)
    assert str(info.value).startswith(message)


# --- what multi-node and per-GPU measurements need ------------------------------------------------------------


def test_run_on_local_rank_runs_on_that_rank_alone(gang: LocalGang) -> None:
    (result,) = run_on_local_rank(gang, 1, f.rank_and_device, "x")
    assert isinstance(result, NodeResult)
    assert (result.node_rank, result.rank, result.value) == (0, 1, (1, "cpu", "x")) and result.host
    with pytest.raises(GangError, match="has no such rank: no rank has local rank 5"):
        run_on_local_rank(gang, 5, f.rank_and_device, "x")


def test_the_default_call_timeout_bounds_a_call(gang: LocalGang, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gang, "call_timeout_s", 1.0)
    start = time.monotonic()
    with pytest.raises(GangError, match=r"rank 1 timed out: hang_on did not finish within 1 s \(--gb-timeout\)"):
        gang.run(f.hang_on, 1)
    assert time.monotonic() - start < 10


def test_a_call_a_busy_host_slowed_is_no_hang_and_names_gb_timeout() -> None:
    """Ranks that spent the call waiting for CPUs another task held were slowed, not hung: `gang slowed` (the
    fault table's `unresolved`), never `timed out` (`hung`, REBOOT); the line names --gb-timeout."""
    from pytest_gbvalidate import faults
    from pytest_gbvalidate.node import neighbours
    from pytest_gbvalidate.ranks import gang as gangs

    g = LocalGang(2, start_timeout_s=60, call_timeout_s=2.0, cpu_waits=neighbours)
    try:
        with pytest.raises(GangError) as raised:
            g.run(f.spin_beside_neighbours, 4 * (os.cpu_count() or 1))
    finally:
        g.close(force=True)
    said = str(raised.value)
    assert said.startswith("gang slowed: spin_beside_neighbours did not finish within 2 s (--gb-timeout): its ranks ")
    share = int(said.split("held ")[1].split("%")[0])
    assert share >= gangs.SLOWED_SHARE * 100 and "a busy host, not a hung node" in said
    assert faults.load().classify("t.py::test_x", f"GangError: {said}").category.name == "unresolved"


def test_a_failed_start_is_retried_once(monkeypatch: pytest.MonkeyPatch) -> None:
    g = LocalGang(2, start_timeout_s=60)
    real_start, tries = g._start, []

    def first_try_too_short() -> None:  # as a rank that dies at start-up once, then starts
        tries.append(g.start_timeout_s)
        g.start_timeout_s = 0.01 if len(tries) == 1 else 60
        real_start()

    monkeypatch.setattr(g, "_start", first_try_too_short)
    try:
        assert len(g.run(f.pid, timeout_s=60)) == 2
        assert g.starts == 2 and len(g.failed_starts) == 1
        assert g.failed_starts[0].startswith("gang timed out: start-up did not finish within 0.01 s")
    finally:
        g.close()


def test_a_gang_that_cannot_start_fails_each_call_after_one_retry() -> None:
    g = LocalGang(2, start_timeout_s=0.01)
    try:
        for call in (1, 2):  # a later call (a later test) tries again
            with pytest.raises(GangError, match=r"start-up retried once; the first try: gang timed out: start-up"):
                g.run(f.pid)
            assert g.starts == 2 * call and len(g.failed_starts) == 2 * call
    finally:
        g.close()


def test_a_dead_run_s_rendezvous_directory_is_removed(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / f"gbvalidate-gang-{dead.stdout.strip()}-abc").mkdir()
    (tmp_path / f"gbvalidate-gang-{os.getpid()}-def").mkdir()  # this process: alive
    remove_dead_gang_dirs(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [f"gbvalidate-gang-{os.getpid()}-def"]


@pytest.mark.parametrize(
    ("env", "rank", "node"),
    [
        ({"GROUP_RANK": "3"}, 13, 3),
        ({"SLURM_NODEID": "2"}, 9, 2),
        ({"LOCAL_WORLD_SIZE": "4"}, 9, 2),
        ({}, 9, 0),
        ({"GROUP_RANK": "\u00b2", "LOCAL_WORLD_SIZE": "\u00b2"}, 9, 0),  # `²` is a digit to isdigit(), not to int()
    ],
)
def test_node_rank_from_environment(env: dict[str, str], rank: int, node: int) -> None:
    assert node_rank_from_environment(env, rank) == node


def test_rendezvous_problem_names_what_srun_does_not_set() -> None:
    assert rendezvous_problem({"MASTER_ADDR": "n1", "MASTER_PORT": "29500"}, lambda host: True) is None
    problem = rendezvous_problem({"MASTER_ADDR": "n1"})
    assert problem is not None and problem.startswith("MASTER_PORT not set: under srun export MASTER_ADDR")


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"MASTER_PORT": "29500x"}, "MASTER_PORT='29500x' is no port (a whole number from 1 to 65535)"),
        ({"MASTER_PORT": "70000"}, "MASTER_PORT='70000' is no port"),
        ({"MASTER_PORT": "0"}, "MASTER_PORT='0' is no port"),
        ({"MASTER_ADDR": "no-such-host.invalid"}, "MASTER_ADDR='no-such-host.invalid' does not resolve"),
    ],
    ids=["not-a-number", "too-high", "zero", "unresolvable"],
)
def test_a_rendezvous_the_launcher_set_wrong_is_named_as_its_setting(env: dict[str, str], said: str) -> None:
    """Each failed the node's first test that started ranks, `unclassified`: the launcher's fault, not the node's."""
    problem = rendezvous_problem({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"} | env)
    assert problem is not None and problem.startswith(said) and "the launcher's setting" in problem
    assert rendezvous_problem({"MASTER_ADDR": "localhost", "MASTER_PORT": "65535"}) is None


def test_a_rank_in_a_device_synchronisation_is_waiting_not_the_culprit() -> None:
    """Under NCCL a collective returns at once and a waiting rank sits in a device synchronisation; under gloo in
    the collective. Only a rank elsewhere is a culprit."""
    waiting = [
        "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py:2501 in all_reduce",
        "/usr/lib/python3/site-packages/torch/cuda/__init__.py:985 in synchronize",
        "/usr/lib/python3/site-packages/torch/accelerator/__init__.py:171 in synchronize",
        None,  # no stack came back: not evidence against it
    ]
    assert all(gang_module.waiting_for_a_peer(frame) for frame in waiting)
    assert not gang_module.waiting_for_a_peer("/x/tests/gang_functions.py:40 in hang_on")


def test_gloo_is_given_an_interface_where_it_cannot_hold_the_hostname() -> None:
    from pytest_gbvalidate.ranks.gang import gloo_interface
    from pytest_gbvalidate.ranks.world import WorldError

    assert gloo_interface("a" * 63, {}, local=True) is None
    assert gloo_interface("a" * 64, {}, local=True) == "lo"  # a local gang's ranks are all on this host
    assert gloo_interface("a" * 64, {"GLOO_SOCKET_IFNAME": "eth0"}, local=False) is None  # the operator's choice
    with pytest.raises(WorldError, match=r"hostname is 64 characters, .* set GLOO_SOCKET_IFNAME to the interface"):
        gloo_interface("a" * 64, {}, local=False)


LONG_HOSTNAME_GANG = """
from pytest_gbvalidate.ranks.gang import LocalGang
from tests.helpers import gang_functions as f
gang = LocalGang(2, start_timeout_s=60)
try:
    print(gang.run(f.all_reduce_rank, 2, timeout_s=60))
finally:
    gang.close()
"""


def test_a_local_gang_starts_on_a_host_whose_name_is_the_kernel_s_longest() -> None:
    """64 characters, the kernel's most: gloo failed to start every rank ("File name too long")."""
    command = with_hostname("a" * 64, [sys.executable, "-c", LONG_HOSTNAME_GANG])
    if command is None:
        pytest.skip("a hostname of our own needs a UTS namespace (unshare), which this machine does not allow")
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=REPO)
    # The last line: torch 2.9's gloo prints its connections first.
    last = (done.stdout.strip().splitlines() or [""])[-1]
    assert done.returncode == 0 and last == "[(0, 2, 6.0), (1, 2, 6.0)]", done.stdout + done.stderr


def test_a_rendezvous_nobody_listens_on_is_named_within_the_timeout() -> None:
    """Rank 0 never made its store (it failed, or the address is another node's): the client rank says so."""
    from pytest_gbvalidate.ranks.world_gang import store_problem

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]  # closed again before the probe: nothing listens there
    started = time.monotonic()
    problem = store_problem("127.0.0.1", port, 1.0)
    assert problem is not None and problem.startswith(
        f"no world's store answered at MASTER_ADDR=127.0.0.1 MASTER_PORT={port} within 1 s (did rank 0 start?)"
    )
    assert time.monotonic() - started < 10
