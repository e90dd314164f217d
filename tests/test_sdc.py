"""The silent data corruption check: on the cpu SKU the gang's two ranks agree with each other and the CPU
reference; a rank whose matmul flips one bit is caught, named by the reference where the error is large and by
bit-identity where no tolerance could see it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

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
