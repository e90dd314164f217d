"""A rank of a torchrun / srun world: which GPU is its own, from the environment the launcher gives it and the GPUs
it sees; how many ranks share its memory; and CUDA's device order, set before a world rank touches CUDA. (The
plugin's own process: e2e/test_cuda_device_order.py.)"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
import torch
import torch.distributed as dist

from pytest_gbvalidate.ranks import world_gang as gang_module
from pytest_gbvalidate.ranks.gang import GangError, RankContext, device_key, device_sharers
from pytest_gbvalidate.ranks.world import (
    DeviceChoiceError,
    cuda_device_index,
    nccl_error_settings,
    world_from_environment,
)
from pytest_gbvalidate.ranks.world_gang import WorldGang

# The environments of one task, as the launchers set them (only the variables the choice reads, and a few it
# must not be misled by).
SRUN = {"SLURM_PROCID": "2", "SLURM_LOCALID": "2", "SLURM_NTASKS": "4", "SLURM_NODEID": "0"}
SRUN |= {"SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_TASKS_PER_NODE": "4", "SLURM_TASKS_PER_NODE": "4"}
SRUN_2_NODES = {"SLURM_PROCID": "13", "SLURM_LOCALID": "5", "SLURM_NTASKS": "16", "SLURM_NODEID": "1"}
SRUN_2_NODES |= {
    "SLURM_STEP_NUM_TASKS": "16",
    "SLURM_STEP_TASKS_PER_NODE": "8(x2)",
    "SLURM_TASKS_PER_NODE": "8(x2)",
    "SLURM_NTASKS_PER_NODE": "8",
}
TORCHRUN = {"RANK": "11", "WORLD_SIZE": "16", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "8", "GROUP_RANK": "1"}
# torchrun started by srun, one task (one torchrun agent) per node: Slurm's variables describe the agent.
TORCHRUN_IN_SRUN = TORCHRUN | {"LOCAL_RANK": "6", "SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURM_NTASKS": "2"}
TORCHRUN_IN_SRUN |= {"SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_NTASKS_PER_NODE": "1"}
ALL_8 = "0,1,2,3,4,5,6,7"


@pytest.mark.parametrize(
    ("env", "device_count", "index"),
    [
        # srun --gpus-per-task=1: the task sees its one GPU, named by its host index or, with the devices
        # constrained by cgroups, as 0. SLURM_LOCALID 2 is no index into one GPU.
        pytest.param(SRUN | {"CUDA_VISIBLE_DEVICES": "2"}, 1, 0, id="srun-gpus-per-task"),
        pytest.param(SRUN | {"CUDA_VISIBLE_DEVICES": "0"}, 1, 0, id="srun-gpus-per-task-cgroup"),
        pytest.param(SRUN_2_NODES | {"CUDA_VISIBLE_DEVICES": "5"}, 1, 0, id="srun-gpu-bind-single-2-nodes"),
        # srun --gpus-per-node=8 without --gpu-bind: every task sees all of its node's GPUs.
        pytest.param(SRUN_2_NODES | {"CUDA_VISIBLE_DEVICES": ALL_8}, 8, 5, id="srun-no-bind"),
        pytest.param(SRUN | {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, 4, 2, id="srun-no-bind-4"),
        pytest.param(SRUN, 8, 2, id="srun-no-gres"),  # GPUs not under Slurm's control: CUDA_VISIBLE_DEVICES unset
        pytest.param(SRUN | {"SLURM_STEP_TASKS_PER_NODE": "4,3", "SLURM_TASKS_PER_NODE": "4,3"}, 4, 2, id="uneven"),
        # torchrun --nproc-per-node=8: every rank sees the node's GPUs; LOCAL_RANK indexes them.
        pytest.param(TORCHRUN, 8, 3, id="torchrun"),
        pytest.param(TORCHRUN | {"CUDA_VISIBLE_DEVICES": ALL_8}, 8, 3, id="torchrun-visible-all"),
        # --nproc-per-node=4 on the node's last 4 GPUs: LOCAL_RANK 2 is the third visible one (host GPU 6).
        pytest.param(
            TORCHRUN | {"LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "4", "CUDA_VISIBLE_DEVICES": "4,5,6,7"}, 4, 2, id="tr-4"
        ),
        pytest.param(TORCHRUN | {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}, 1, 0, id="torchrun-one-per-node"),
        # torchrun under srun: LOCAL_RANK and LOCAL_WORLD_SIZE, not the agent's SLURM_LOCALID or one task a node.
        pytest.param(TORCHRUN_IN_SRUN, 8, 6, id="torchrun-in-srun"),
        pytest.param({}, 1, 0, id="no-launcher"),
    ],
)
def test_a_rank_s_gpu_is_the_one_it_sees_or_its_local_rank_among_all(
    env: dict[str, str], device_count: int, index: int
) -> None:
    assert cuda_device_index(env, device_count) == index


@pytest.mark.parametrize(
    ("env", "device_count", "message"),
    [
        # srun --ntasks-per-node=4 --gpus-per-task=2 on an 8-GPU node: each task sees 2. Every task fails alike,
        # local rank 0 as well, rather than two of them each taking a guess.
        pytest.param(
            SRUN | {"SLURM_LOCALID": "0", "CUDA_VISIBLE_DEVICES": "0,1"},
            2,
            "SLURM_LOCALID=0 of SLURM_STEP_TASKS_PER_NODE=4 ranks on the node sees 2 GPUs (CUDA_VISIBLE_DEVICES=0,1): "
            "not one per rank",
            id="srun-2-per-task",
        ),
        pytest.param(
            SRUN | {"CUDA_VISIBLE_DEVICES": "4,5"},
            2,
            "SLURM_LOCALID=2 of SLURM_STEP_TASKS_PER_NODE=4 ranks on the node sees 2 GPUs (CUDA_VISIBLE_DEVICES=4,5)",
            id="srun-2-per-task-rank-2",
        ),
        # The layout is uneven, so unknown: a local rank past the GPUs seen still fails, naming both.
        pytest.param(
            SRUN | {"SLURM_STEP_TASKS_PER_NODE": "4,3", "SLURM_TASKS_PER_NODE": "4,3", "CUDA_VISIBLE_DEVICES": "0,1"},
            2,
            "SLURM_LOCALID=2 sees 2 GPUs (CUDA_VISIBLE_DEVICES=0,1): not one per rank",
            id="uneven",
        ),
        # torchrun --nproc-per-node=8 where only 4 GPUs are visible.
        pytest.param(
            TORCHRUN | {"LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "0,1,2,3"},
            4,
            "LOCAL_RANK=1 of LOCAL_WORLD_SIZE=8 ranks on the node sees 4 GPUs (CUDA_VISIBLE_DEVICES=0,1,2,3)",
            id="torchrun-too-many-ranks",
        ),
        pytest.param(
            SRUN | {"CUDA_VISIBLE_DEVICES": ""},
            0,
            "SLURM_LOCALID=2 sees no GPU: 0 GPUs (CUDA_VISIBLE_DEVICES=)",
            id="none",
        ),
        pytest.param(TORCHRUN, 0, "LOCAL_RANK=3 sees no GPU: 0 GPUs (CUDA_VISIBLE_DEVICES unset)", id="none-unset"),
    ],
)
def test_a_rank_that_cannot_tell_its_gpu_says_why(env: dict[str, str], device_count: int, message: str) -> None:
    with pytest.raises(DeviceChoiceError) as excinfo:
        cuda_device_index(env, device_count)
    assert message in str(excinfo.value)
    if device_count:
        assert "srun --gpus-per-task=1" in str(excinfo.value)  # and what to do about it


def test_torchrun_s_local_rank_wins_over_the_srun_task_s() -> None:
    assert world_from_environment(TORCHRUN_IN_SRUN) == (11, 16, 6)
    assert world_from_environment(SRUN_2_NODES) == (13, 16, 5)


class _Stop(Exception):
    """Ends a WorldGang's start-up where it would initialise the process group."""


@pytest.fixture
def environ_restored() -> Iterator[None]:
    """A WorldGang exports RANK, WORLD_SIZE and LOCAL_RANK for torch.distributed, as a rank must: the test's
    process gets its environment back."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def _world_gang_events(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], gpus_seen: int) -> list[object]:
    """Start a WorldGang for a GPU SKU in `env` and record, in order, the device order CUDA would read when it
    initialises (torch.cuda.device_count() is the first call that initialises it) and the device the rank is then
    set to; the process group is not made."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    events: list[object] = []

    def device_count() -> int:
        events.append(("CUDA initialises", os.environ.get("CUDA_DEVICE_ORDER")))
        return gpus_seen

    def init_rank(device: torch.device, *args: object) -> str:
        events.append(("rank set to", str(device)))
        raise _Stop

    monkeypatch.setattr(torch.cuda, "device_count", device_count)
    monkeypatch.setattr(gang_module, "_init_rank", init_rank)
    monkeypatch.setattr(gang_module, "store_problem", lambda *_: None)  # no world's store is run here
    world = world_from_environment(os.environ)
    assert world is not None
    with pytest.raises(_Stop):
        WorldGang(*world, device_type="cuda", timeout_s=10)
    return events


@pytest.mark.usefixtures("environ_restored")
def test_a_world_rank_numbers_gpus_by_pci_bus_before_cuda_initialises(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "CUDA_DEVICE_ORDER" not in os.environ
    events = _world_gang_events(monkeypatch, SRUN_2_NODES | {"CUDA_VISIBLE_DEVICES": "5"}, 1)
    assert events == [("CUDA initialises", "PCI_BUS_ID"), ("rank set to", "cuda:0")]


@pytest.mark.usefixtures("environ_restored")
def test_a_world_rank_keeps_the_operator_s_device_order(monkeypatch: pytest.MonkeyPatch) -> None:
    env = TORCHRUN | {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}
    events = _world_gang_events(monkeypatch, env, 8)
    assert events == [("CUDA initialises", "FASTEST_FIRST"), ("rank set to", "cuda:3")]


@pytest.mark.usefixtures("environ_restored")
def test_a_world_rank_without_a_gpu_of_its_own_fails_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(GangError) as excinfo:
        _world_gang_events(monkeypatch, SRUN | {"CUDA_VISIBLE_DEVICES": "4,5"}, 2)
    assert (excinfo.value.rank, excinfo.value.cause) == (2, "has no GPU of its own")
    assert "SLURM_LOCALID=2" in str(excinfo.value) and "CUDA_VISIBLE_DEVICES=4,5" in str(excinfo.value)


@pytest.mark.usefixtures("environ_restored")
def test_under_nccl_results_travel_on_a_gloo_group_and_a_dead_peer_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """NCCL's watchdog would tear the process down on a dead peer (no report from the run that found it): the
    gathers of results and verdicts use a gloo group of their own, and NCCL is asked to clean up only, over the
    tear-down torchrun hands every worker. The node assumed: any (NCCL itself is not run here; what it does on a
    real dead peer, benchmarks/gpu_ranks.py's killed case on a GPU)."""
    torchrun = TORCHRUN | {"TORCHELASTIC_RUN_ID": "none", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
    for name, value in (torchrun | {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("TORCH_NCCL_TRACE_BUFFER_SIZE", raising=False)
    seen: dict[str, object] = {}
    gathers: list[object] = []

    def init_rank(device: torch.device, *args: object) -> str:
        seen["error handling at init"] = os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING")
        seen["flight recorder at init"] = os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE")
        return "nccl"

    def all_gather_object(out: list[object], obj: object, group: object = None) -> None:
        gathers.append(group)
        if len(gathers) > 1:  # the first is the start-up's; then a peer dies
            raise RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer")
        out[:] = [obj] * len(out)

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(gang_module, "_init_rank", init_rank)
    monkeypatch.setattr(gang_module, "store_problem", lambda *_: None)  # no world's store is run here
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    control = mock.NonCallableMagicMock(spec=dist.ProcessGroup)
    made: list[str] = []

    def new_group(**kwargs: Any) -> object:
        made.append(kwargs["backend"])
        return control

    monkeypatch.setattr(dist, "new_group", new_group)
    monkeypatch.setattr(dist, "all_gather_object", all_gather_object)
    world = world_from_environment(os.environ)
    assert world is not None
    gang = WorldGang(*world, device_type="cuda", timeout_s=10)
    with pytest.raises(GangError) as excinfo:
        gang.run(lambda ctx: 1)
    assert seen == {"error handling at init": "2", "flight recorder at init": "0"}
    assert made == ["gloo"] and gathers == [control] * 2
    assert excinfo.value.cause == "lost a peer" and "Connection closed by peer" in str(excinfo.value)
    ended: list[bool] = []
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "destroy_process_group", lambda group=None: ended.append(True))
    gang.close()
    assert ended == []  # a communicator waiting on the dead peer may not end: left to the process's exit


@pytest.mark.usefixtures("environ_restored")
def test_a_world_gang_ends_the_process_group_it_made_and_leaves_one_it_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """A world of one rank over gloo, in this process: the gang that made its process group ends it (left to
    the process's exit, a finished rank aborted at times as gloo's threads were torn down, failing a healthy
    node's job); a group made before the gang is its maker's."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    one = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0"}
    for name, value in (one | {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}).items():
        monkeypatch.setenv(name, value)
    gang = WorldGang(0, 1, 0, device_type="cpu", timeout_s=30)  # (a launcher's world has two ranks or more)
    assert gang.run(lambda ctx: ctx.rank) == [0] and dist.is_initialized()
    gang.close()
    assert not dist.is_initialized()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        found = WorldGang(0, 1, 0, device_type="cpu", timeout_s=30)
        found.close()
        assert dist.is_initialized()
    finally:
        dist.destroy_process_group()


# --- ranks that share one device ------------------------------------------------------------------------------


def test_ranks_share_a_device_where_its_key_is_the_same() -> None:
    """Several torchrun "nodes" of one machine, each its own NCCL host, may put their ranks on one GPU: what a
    rank may allocate is the free memory divided among the ranks whose buffers live there."""
    keys = ["cuda:GPU-aa", "cuda:GPU-aa", "cuda:GPU-bb", "cuda:GPU-aa"]
    assert [device_sharers(keys, rank) for rank in range(4)] == [3, 3, 1, 3]
    assert device_key(torch.device("cpu"), "node-7", 3) == "node-7:host-memory"


def test_a_gpu_is_named_by_its_uuid_and_an_unreadable_one_is_the_rank_s_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """srun --gpus-per-task=1 shows every task its GPU as cuda:0: only the UUID tells whether two are one. Where
    it cannot be read, no sharing is assumed: a wrong guess would shrink every sweep and fail its gated sizes."""
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: mock.Mock(uuid="GPU-5f2e"))
    assert device_key(torch.device("cuda", 0), "node-7", 0) == device_key(torch.device("cuda", 0), "node-7", 1)
    assert device_key(torch.device("cuda", 0), "node-7", 0) == "cuda:GPU-5f2e"

    def unreadable(device: torch.device) -> object:
        raise RuntimeError("Found no NVIDIA driver on your system")

    monkeypatch.setattr(torch.cuda, "get_device_properties", unreadable)
    keys = [device_key(torch.device("cuda", 0), "node-7", rank) for rank in range(2)]
    assert keys[0] != keys[1] and device_sharers(keys, 0) == 1


@pytest.mark.parametrize(("device", "sharers", "free"), [("cpu", 4, 8 * 2**30), ("cuda", 2, 70 * 2**30)])
def test_a_rank_s_free_memory_is_its_share_of_the_device_s(
    monkeypatch: pytest.MonkeyPatch, device: str, sharers: int, free: int
) -> None:
    from pytest_gbvalidate.bench import collectives

    # psutil as collectives holds it: an earlier in-process pytester run may have dropped the module it imported
    psutil = vars(collectives)["psutil"]
    monkeypatch.setattr(psutil, "virtual_memory", lambda: mock.Mock(available=free))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (free, 80 * 2**30))
    ctx = RankContext(0, 4, 0, torch.device(device, 0) if device == "cuda" else torch.device("cpu"), "x", 0, sharers)
    assert collectives._free_bytes(ctx) == free // sharers


@pytest.mark.parametrize(
    ("env", "settings"),
    [
        ({}, {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2", "TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}),
        # torchrun's own tear-down, handed to every worker: replaced
        (
            {
                "TORCHELASTIC_RUN_ID": "job7",
                "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
                "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
            },
            {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"},
        ),
        # the operator's: a 1 outside torchrun, any other value anywhere, a flight recorder asked for
        ({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}, {"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}),
        (
            {
                "TORCHELASTIC_RUN_ID": "job7",
                "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
                "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
            },
            {},
        ),
    ],
)
def test_a_dead_peer_fails_a_test_and_never_takes_the_rank_down(env: dict[str, str], settings: dict[str, str]) -> None:
    """Seen on a GPU (4 ranks under torchrun, one SIGKILLed): torchrun's tear-down killed every survivor by SIGABRT
    a minute later, rank 0's report left `running`; the flight recorder's thread crashed a finished rank at exit."""
    assert nccl_error_settings(env | {"RANK": "0", "WORLD_SIZE": "4"}) == settings
