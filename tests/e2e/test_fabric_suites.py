"""The NVLink fabric checks of the health suite end to end (registration, clique, IMEX, C2C, NVLink error
counters): pytester runs of the real suite against the fake GB200 node, faults injected, read back from the
JUnit XML. Each fault fails its own check on its own GPU, and nothing else."""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest

from tests.helpers.fakenode import imex_domain_json, nd96asr_v4, nd_gb200_v6
from tests.helpers.runs import HEALTH, NO_TELEMETRY, run_suites, with_outcome

FABRIC_CHECKS = ("-k", "fabric or imex or c2c or nvlink_errors")
DEGRADED_BW = (
    pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW
)
ROUTE_UNHEALTHY = (
    pynvml.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_TRUE << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY
)


def test_each_fabric_fault_fails_the_right_check_on_the_right_gpu(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    node = nd_gb200_v6()
    gpu0, gpu1, gpu2, gpu3 = node.gpus
    gpu0.fabric_state = pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS
    gpu1.fabric_clique_id = 7
    gpu2.c2c_enabled = False
    gpu2.fabric_health_mask = DEGRADED_BW | ROUTE_UNHEALTHY
    assert gpu3.nvlink_errors is not None
    gpu3.nvlink_errors[(5, pynvml.NVML_NVLINK_ERROR_DL_REPLAY)] = 3
    gpu3.nvlink_errors[(11, pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA)] = 1
    node.imex_channels = []
    node.imex_ctl = (1, "connect failed: Connection refused")
    node.install(monkeypatch, tmp_path)

    result, cases, _ = run_suites(pytester, "ND_GB200_v6", *NO_TELEMETRY, suites=(HEALTH,))
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    expected = {
        "test_nvlink_fabric[gpu0]": "gpu0 (00000008:01:00.0): fabric registration is in_progress, not completed",
        "test_nvlink_fabric_clique": (
            "gpu1 is in clique 7 of cluster 1e6c5a7d-2b3f-4c8e-9a01-5d2f7b9c4e60: the node's other GPUs are in "
            "clique 32766 of cluster 1e6c5a7d-2b3f-4c8e-9a01-5d2f7b9c4e60"
        ),
        "test_nvlink_fabric[gpu2]": (
            "gpu2 (00000018:01:00.0): the fabric reports the GPU's NVLink bandwidth degraded; the fabric reports a "
            "route unhealthy"
        ),
        "test_c2c_enabled[gpu2]": "gpu2 (00000018:01:00.0): NVLink-C2C to the Grace CPU is disabled",
        "test_nvlink_errors[gpu3]": (
            "gpu3 (00000019:01:00.0): NVLink errors: link 5 replay 3, limit 0; link 11 crc_data 1, limit 0"
        ),
        "test_imex": (
            f"IMEX: no IMEX channel device in {tmp_path}/dev/nvidia-caps-imex-channels; "
            "`nvidia-imex-ctl -q` exited 1: connect failed: Connection refused"
        ),
    }
    failed = with_outcome(cases, "failure")
    assert set(failed) == set(expected), failed
    for name, text in expected.items():
        assert text in failed[name], (name, failed[name])
    assert not with_outcome(cases, "error")
    assert cases["test_nvlink_fabric[gpu1]"]["outcome"] == "passed"  # registered, in another clique
    assert cases["test_nvlink_errors[gpu2]"]["outcome"] == "passed"


def test_imex_channels_missing_or_a_daemon_not_ready_each_fail_naming_what(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    node = nd_gb200_v6()
    node.imex_channels = None  # the driver made no channels directory
    node.imex_ctl = (0, "WAITING_FOR_PEERS")
    node.install(monkeypatch, tmp_path)
    _, cases, _ = run_suites(pytester, "ND_GB200_v6", "-k", "imex", suites=(HEALTH,))
    failed = with_outcome(cases, "failure")
    assert set(failed) == {"test_imex"}
    assert (
        f"IMEX: {tmp_path}/dev/nvidia-caps-imex-channels does not exist: no IMEX channel was created; "
        "the IMEX daemon is 'WAITING_FOR_PEERS', not READY"
    ) in failed["test_imex"]


@pytest.mark.parametrize(
    ("domain", "outcome", "said"),
    [
        (
            imex_domain_json("DEGRADED", ("READY", "UNAVAILABLE")),
            "passed",
            "the IMEX domain is DEGRADED: gb200-peer UNAVAILABLE",
        ),
        (
            imex_domain_json("DEGRADED", ("READY", "READY"), ("CONNECTED", "DISCONNECTED")),
            "failure",
            "IMEX: this node reaches none of the 1 other READY nodes of its IMEX domain (gb200-peer DISCONNECTED)",
        ),
    ],
    ids=["another-node-down", "this-node-cut-off"],
)
def test_the_imex_domain_fails_the_node_only_for_its_own_place_in_it(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, domain: str, outcome: str, said: str
) -> None:
    """The domain as this node's daemon sees it (`nvidia-imex-ctl -N`): another node UNAVAILABLE is said in the
    JUnit property `imex_domain` and the node passes; this node connected to none of the READY nodes fails."""
    node = nd_gb200_v6()
    node.imex_domain = (0, domain)
    node.install(monkeypatch, tmp_path)
    _, cases, _ = run_suites(pytester, "ND_GB200_v6", "-k", "imex", suites=(HEALTH,))
    case = cases["test_imex"]
    assert case["outcome"] == outcome
    if outcome == "passed":
        assert ("imex_domain", said) in case["props"], case
    else:
        assert said in (case["message"] or ""), case


def test_gpus_without_a_fabric_skip_saying_why_unless_the_baseline_asks_for_one(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    nd96asr_v4().install(monkeypatch, tmp_path)  # NVML reports no fabric; the baseline asks for none
    _, cases, _ = run_suites(pytester, "ND96asr_v4", *FABRIC_CHECKS, suites=(HEALTH,))
    skipped = with_outcome(cases, "skipped")
    assert set(skipped) == set(cases), cases
    assert (
        "gpu7 (00000008:00:00.0): NVML reports no NVLink fabric for this GPU (a GPU outside an NVLink"
        in (skipped["test_nvlink_fabric[gpu7]"])
    )
    assert "no GPU of ND96asr_v4 has completed its NVLink fabric registration" in skipped["test_nvlink_fabric_clique"]
    assert "ND96asr_v4 baseline has no health.multi_node_nvlink expectation" in skipped["test_imex"]
    assert "ND96asr_v4 baseline has no health.c2c expectation" in skipped["test_c2c_enabled[gpu0]"]

    node = nd_gb200_v6()
    for gpu in node.gpus:
        gpu.fabric_state = None  # NVML: not supported
    node.install(monkeypatch, tmp_path / "gb200")
    _, cases, _ = run_suites(pytester, "ND_GB200_v6", *FABRIC_CHECKS, suites=(HEALTH,))
    failed = with_outcome(cases, "failure")
    assert set(failed) == {f"test_nvlink_fabric[gpu{i}]" for i in range(4)} | {"test_nvlink_fabric_clique"}
    assert failed["test_nvlink_fabric[gpu3]"].endswith(
        "NVML reports no NVLink fabric for this GPU; the baseline says this node is in a multi-node NVLink domain"
    )


def test_imex_is_judged_where_a_compute_domain_is_and_a_job_s_leftovers_only_on_an_idle_node(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """An idle GB200 node outside any compute domain (no IMEX channel, no daemon, no static configuration, as a
    Kubernetes ComputeDomain or a Slurm job leaves it between jobs) is not flagged IMEX unhealthy unless the run says
    a domain is expected; a process left on a GPU fails only where the run says no job runs on the node."""
    node = nd_gb200_v6()
    node.imex_channels, node.imex_ctl, node.imex_nodes_config = None, None, False
    node.gpus[1].processes = [(4242, 2 * 2**30)]
    node.install(monkeypatch, tmp_path)
    checks = ("-k", "imex or leftover")

    _, cases, report = run_suites(pytester, "ND_GB200_v6", *checks, suites=(HEALTH,))
    skipped = with_outcome(cases, "skipped")
    assert set(skipped) == set(cases), cases
    assert "no compute domain here (default: auto): no IMEX channel in " in skipped["test_imex"]
    assert "a job may run on this node (default)" in skipped["test_no_leftover_gpu_processes[gpu1]"]
    assert report["settings"]["compute_domain"] == {"value": "auto", "source": "default"}

    idle = ("--gb-compute-domain=expected", "--gb-node-idle")
    _, cases, report = run_suites(pytester, "ND_GB200_v6", *checks, *idle, suites=(HEALTH,))
    failed = with_outcome(cases, "failure")
    assert set(failed) == {"test_imex", "test_no_leftover_gpu_processes[gpu1]"}, failed
    assert (
        "gpu1 (00000009:01:00.0): 1 process(es) left on a node no job runs on: pid 4242 (2.0 GiB)"
        in (failed["test_no_leftover_gpu_processes[gpu1]"])
    )
    fault = {t["test_id"].rsplit("::", 1)[-1]: t.get("fault") for t in report["tests"] if t["outcome"] == "failed"}
    leftover = fault["test_no_leftover_gpu_processes[gpu1]"]
    assert leftover is not None and leftover["category"] == leftover["reason_class"] == "job_leftovers"
