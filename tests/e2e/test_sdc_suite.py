"""The silent data corruption check end to end: on the cpu SKU the gang's two ranks agree with each other and the
CPU reference; a rank whose matmul flips one bit is caught, named by the reference where the error is large and by
bit-identity where no tolerance could see it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from typing import Any

import pytest

from tests.helpers.runs import CONFTEST, REPO, SUITES

SDC = SUITES / "test_sdc.py"
FLIPS = ("flip_high", "flip_low")


@pytest.fixture(scope="module")
def sdc_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, ET.Element], dict[str, Any]]:
    """One session of the cpu SKU running the check three times on one gang, from three copies of the suite: as it
    is (test_sdc_healthy.py), and with rank 1's matmuls flipping a bit (test_sdc_<fault>.py), the rank-fault
    conftest of tests/helpers/runs.py injecting the fault into that file's check only. Each file's JUnit testcase,
    by file stem, and the JSON report."""
    directory = tmp_path_factory.mktemp("sdc")
    files = [f"test_sdc_{name}.py" for name in ("healthy", *FLIPS)]
    for name in files:
        shutil.copy(SDC, directory / name)
    (directory / "conftest.py").write_text(CONFTEST)
    plan = {f"test_sdc_{fault}.py::test_silent_data_corruption": fault for fault in FLIPS}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GBVALIDATE_", "PYTEST_"))}
    env |= {"GBV_TEST_FAULTS": json.dumps(plan), "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "pytest", *files, "--gb-sku=cpu", "--junitxml=r.xml", "--gb-report=r.json"]
    command += ["-p", "no:cacheprovider", f"--rootdir={directory}"]
    done = subprocess.run(command, cwd=directory, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, done.stdout + done.stderr
    cases = {case.get("classname", ""): case for case in ET.parse(directory / "r.xml").getroot().iter("testcase")}
    assert sorted(cases) == sorted(name.removesuffix(".py") for name in files), done.stdout
    return cases, json.loads((directory / "r.json").read_text())


def test_the_cpu_ranks_agree_with_each_other_and_the_reference(
    sdc_run: tuple[dict[str, ET.Element], dict[str, Any]],
) -> None:
    cases, report = sdc_run
    healthy = cases["test_sdc_healthy"]
    verdicts = [child.tag for child in healthy if child.tag in ("failure", "error", "skipped")]
    assert verdicts == [], ET.tostring(healthy, encoding="unicode")  # passed
    mine = [t for t in report["tests"] if t["test_id"] == "test_sdc_healthy.py::test_silent_data_corruption"]
    assert {t["outcome"] for t in mine} == {"passed"} and [t["when"] for t in mine].count("call") == 1, mine


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
    sdc_run: tuple[dict[str, ET.Element], dict[str, Any]], fault: str, named: str
) -> None:
    cases, report = sdc_run
    failure = cases[f"test_sdc_{fault}"].find("failure")
    assert failure is not None
    message = failure.get("message") or ""
    assert named in message, message
    assert "rank0: " not in message  # the healthy rank is never the one named
    if fault == "flip_high":  # the fp32 GEMM is flipped too; the model pass uses no torch.matmul
        assert "rank1: gemm_fp32 is off the CPU reference" in message and "model" not in message
    mine = [t for t in report["tests"] if t["test_id"] == f"test_sdc_{fault}.py::test_silent_data_corruption"]
    (test,) = [t for t in mine if t["outcome"] == "failed"]
    assert test["when"] == "call"
    assert (test["fault"]["category"], test["fault"]["disposition"]) == ("gpu_hardware", "ISOLATE")
