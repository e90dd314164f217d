"""The silent data corruption check: on the cpu SKU the gang's two ranks agree with each other and the CPU
reference; a rank whose matmul flips one bit is caught, named by the reference where the error is large and by
bit-identity where no tolerance could see it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from pytest_gbvalidate.bench import sdc
from tests.test_faults import CONFTEST, REPO
from tests.test_plugin import SUITES, junit_cases

SDC = SUITES / "test_sdc.py"


def test_the_cpu_ranks_agree_with_each_other_and_the_reference(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(str(SDC), "--gb-sku=cpu", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


@pytest.mark.parametrize(
    ("fault", "named"),
    [
        # 2**64 or 2**128 off: beyond every tolerance, the reference names the rank
        ("flip_high", "rank1: gemm_bf16 is off the CPU reference by"),
        # one unit in the last place: within tolerance; two ranks disagree bit for bit and neither has a majority
        ("flip_low", "gemm_bf16: no majority among the ranks (rank0 "),
    ],
)
def test_a_flipped_bit_on_one_rank_fails_the_check(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, fault: str, named: str
) -> None:
    shutil.copy(SDC, pytester.path / "test_sdc.py")
    pytester.makeconftest(CONFTEST)
    monkeypatch.setenv("GBV_TEST_FAULTS", json.dumps({"test_silent_data_corruption": fault}))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    result = pytester.runpytest_subprocess(
        "test_sdc.py", "--gb-sku=cpu", "--junitxml=r.xml", "--gb-report=r.json", "-p", "no:cacheprovider"
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    message = junit_cases(Path(pytester.path / "r.xml"))["test_silent_data_corruption"]["message"] or ""
    assert named in message, message
    assert "rank0: " not in message  # the healthy rank is never the one named
    if fault == "flip_high":  # the fp32 GEMM is flipped too; the model pass uses no torch.matmul
        assert "rank1: gemm_fp32 is off the CPU reference" in message and "model" not in message
    report = json.loads((pytester.path / "r.json").read_text())
    (test,) = [t for t in report["tests"] if t["outcome"] == "failed"]
    assert (test["fault"]["category"], test["fault"]["disposition"]) == ("gpu_hardware", "ISOLATE")


def test_on_a_node_of_many_gpus_the_one_that_differs_bit_for_bit_is_named() -> None:
    """A one-bit difference that every tolerance accepts: the majority of the node's GPUs names the odd one."""
    reference = {name: torch.ones(3) for name in sdc.COMPUTATIONS}

    def answer(digest: str) -> list[dict[str, sdc.Outcome]]:
        return [{name: sdc.Outcome(digest, torch.ones(3)) for name in sdc.COMPUTATIONS}] * 2  # both passes

    per_rank = [answer("a1"), answer("a1"), answer("b2"), answer("a1")]
    found = sdc.problems(["gpu0", "gpu1", "gpu2", "gpu3"], per_rank, reference)
    assert found == [
        f"gpu2: {name} differs bit for bit from the 3 other ranks, which agree (b2 vs a1)" for name in sdc.COMPUTATIONS
    ]
    assert sdc.problems(["gpu0", "gpu1", "gpu2", "gpu3"], [answer("a1")] * 4, reference) == []
