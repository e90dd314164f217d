"""NVLS and multi-node NVLink all_reduce end to end on the cpu gang: the suite's checks skip on cpu saying why,
and the same check code (suites/test_collectives.py's check_nccl_case), run on a gloo gang whose rank 1 reads a real
NCCL log of a fallback (tests/helpers/rank_faults.py, `nccl_log:NAME`), fails saying NCCL did not use NVLS /
MNNVL (a communicator init line's MNNVL 0, or connections between nodes over InfiniBand instead of P2P/MNNVL), in
the fault table's nvlink_fabric category, with each size's NCCL environment and NCCL's transports recorded."""

from __future__ import annotations

import json

import pytest

from tests.helpers.reports import schema_problems
from tests.helpers.runs import REPO, collectives_lab, junit_cases

BASELINE = """\
schema_version: 1
sku: LABCPU
description: a CPU-only lab SKU, for the NVLS and MNNVL checks' failures
detect: {gpu_count: 0}
metrics:
"""
for _metric in ("all_reduce_nvls_busbw_gbps", "mnnvl_all_reduce_busbw_gbps"):
    BASELINE += f"""\
  {_metric}:
    status: provisional
    fail: 0.000001
    params: {{min_bytes: 1048576, max_bytes: 2097152, warmup: 1, iterations: 10}}
    provenance: the plugin's tests (a limit no working harness misses)
    values:
      2MiB: {{}}
"""

CHECKS = """\
import pytest

from pytest_gbvalidate.bench import nccl_log
from suites.test_collectives import MNNVL_SETTINGS, NVLS_ENV, NVLS_SETTINGS, check_nccl_case


def nvls(log):
    return nccl_log.nvls_problem(log, "AllReduce")


def test_nvls_all_reduce_busbw(gb_target, gb_gang, gb_expect):
    check_nccl_case("all_reduce_nvls_busbw_gbps", NVLS_ENV, NVLS_SETTINGS, nvls, gb_target, gb_gang, gb_expect)


def test_nvls_used(gb_target, gb_gang, gb_expect):
    check_nccl_case("all_reduce_nvls_busbw_gbps", NVLS_ENV, NVLS_SETTINGS, nvls, gb_target, gb_gang, gb_expect)


@pytest.mark.parametrize("log", ["mnnvl_0", "over_ib", "untold"])
def test_mnnvl_all_reduce_busbw(log, gb_target, gb_gang, gb_expect):
    check_nccl_case(
        "mnnvl_all_reduce_busbw_gbps", {}, MNNVL_SETTINGS, nccl_log.mnnvl_problem, gb_target, gb_gang, gb_expect
    )
"""

FAULTS = {
    "test_lab.py::test_nvls_all_reduce_busbw": "nccl_log:NVLS_NOT_AVAILABLE",
    "test_lab.py::test_nvls_used": "nccl_log:NVLS_USED",
    "test_lab.py::test_mnnvl_all_reduce_busbw[mnnvl_0]": "nccl_log:MNNVL_OFF",
    "test_lab.py::test_mnnvl_all_reduce_busbw[over_ib]": "nccl_log:NET_IB",
    "test_lab.py::test_mnnvl_all_reduce_busbw[untold]": "nccl_log:MNNVL_UNTOLD",
}


def test_a_fallback_in_nccls_log_fails_the_check_and_the_suite_skips_on_cpu(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    collectives_lab(pytester, monkeypatch, BASELINE, FAULTS)
    pytester.makepyfile(test_lab=CHECKS)
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("NCCL_ALGO", "Ring")  # the run's own NCCL setting, which the NVLS case overrides
    result = pytester.runpytest_subprocess(
        "test_lab.py",
        "test_collectives.py::test_nvls_all_reduce_busbw",
        "test_collectives.py::test_mnnvl_all_reduce_busbw",
        "-rs",
        "--gb-sku=LABCPU",
        "--gb-baselines=baselines",
        "--gb-report=r.json",
        "--junitxml=r.xml",
        "-p",
        "no:cacheprovider",
        timeout=120,
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "SKIPPED * NVLS is an NCCL algorithm over NVLink switches; this SKU's collectives run on gloo",
            "SKIPPED * multi-node NVLink needs a torchrun / srun world across the VMs of an NVLink domain; this run "
            "is one node",
        ]
    )

    assert schema_problems(pytester.path) == []
    report = json.loads((pytester.path / "r.json").read_text())
    calls = {t["test_id"]: t for t in report["tests"] if t["when"] == "call"}
    nvls = calls["test_lab.py::test_nvls_all_reduce_busbw"]
    assert nvls["outcome"] == "failed"  # though its busbw passes its gate: NCCL's log decides
    assert calls["test_collectives.py::test_nvls_all_reduce_busbw"]["outcome"] == "skipped"
    gated = [m for m in report["measurements"] if m["test_id"] == nvls["test_id"] and m["scope"] == "2MiB"]
    assert [m["verdict"] for m in gated] == ["pass"]
    assert nvls["message"].startswith(
        "Failed: NCCL did not use NVLS: NCCL says NVLS multicast support is not available on dev 0, 4"
    )
    assert nvls["fault"]["category"] == "nvlink_fabric"
    assert "fabric manager" in nvls["fault"]["action"] and "IMEX" in nvls["fault"]["action"]
    mnnvl = calls["test_lab.py::test_mnnvl_all_reduce_busbw[mnnvl_0]"]
    assert mnnvl["message"].startswith(
        "Failed: NCCL did not use multi-node NVLink: rank 1's communicator says MNNVL 0 (8 ranks on 1 nodes"
    )
    assert mnnvl["fault"]["category"] == "nvlink_fabric"
    assert calls["test_lab.py::test_nvls_used"]["outcome"] == "passed"
    # NCCL's connections between the nodes ran over InfiniBand: what it should have used and what it did, with ranks
    over_ib_id = "test_lab.py::test_mnnvl_all_reduce_busbw[over_ib]"
    over_ib = junit_cases(pytester.path / "r.xml")[over_ib_id.split("::")[1]]
    assert over_ib["outcome"] == "failure"
    assert over_ib["message"].startswith(
        "Failed: NCCL did not use multi-node NVLink: 2 connections between nodes ran over NET/IB, not P2P/MNNVL "
        "(first: rank 1 -> rank 8 (tpgds-aihub0008), channel 00/0, via NET/IB/0/GDRDMA; NCCL's connections: "
        "NET/IB 2, P2P/IPC 1)"
    )
    assert calls[over_ib_id]["fault"]["category"] == "nvlink_fabric"
    # A log that says MNNVL 1 and nothing of its connections cannot tell: unresolved, neither a pass nor a drain.
    untold = calls["test_lab.py::test_mnnvl_all_reduce_busbw[untold]"]
    assert untold["message"].startswith(
        "Failed: UNRESOLVED: NCCL did not confirm multi-node NVLink: its log (2 lines) has no channel connection line"
    )
    assert untold["fault"]["category"] == "unresolved"
    over_ib_sizes = [m for m in report["measurements"] if m["test_id"] == over_ib_id]
    assert over_ib_sizes and all(m["details"]["nccl_transports"] == {"NET/IB": 2, "P2P/IPC": 1} for m in over_ib_sizes)

    used = [m for m in report["measurements"] if m["test_id"] == "test_lab.py::test_nvls_used" and m["scope"] == "2MiB"]
    assert len(used) == 1
    details = used[0]["details"]
    # the case's own NCCL_ALGO over the run's Ring; a setting the ranks lack is recorded as unset
    assert details["nccl_env"]["NCCL_ALGO"] == "NVLS"
    assert details["nccl_env"]["NCCL_NVLS_ENABLE"] == "unset"
    assert details["nccl_env"]["NCCL_DEBUG"] == "INFO" and "NCCL_DEBUG_FILE" not in details["nccl_env"]
    assert details["nccl_algorithms"] == ["NVLS/SIMPLE"]
    assert details["nccl_transports"] == {}  # that log has no connection line
    mnnvl_sizes = [
        m for m in report["measurements"] if m["test_id"] == "test_lab.py::test_mnnvl_all_reduce_busbw[mnnvl_0]"
    ]
    assert mnnvl_sizes and all(m["details"]["nccl_env"]["NCCL_MNNVL_ENABLE"] == "unset" for m in mnnvl_sizes)
    assert all(m["details"]["nccl_env"]["NCCL_ALGO"] == "Ring" for m in mnnvl_sizes)
