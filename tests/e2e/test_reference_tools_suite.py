"""The reference tools beside our own measurements (--gb-reference-tools) end to end: nccl-tests and nvbandwidth
as stand-in binaries on PATH printing (or writing as JSON) tests/helpers/tool_output.py's outputs, read back
from the JSON report and JUnit XML."""

from __future__ import annotations

import json
import shutil
import stat
from pathlib import Path

import pytest
import torch  # imported here too: in-process pytester runs drop modules they imported, torch cannot load twice

from tests.helpers.fakenvml import FakeGpu, FakeNvmlLib, install
from tests.helpers.runs import SUITES, junit_cases
from tests.helpers.tool_output import NCCL_JSON, NCCL_OUTPUT, NVB_JSON, NVB_OUTPUT

LAB_GPU = """\
schema_version: 1
sku: LABGPU
description: a two-GPU lab SKU for the reference tool tests
detect: {gpu_count: 2}
metrics:
  h2d_bandwidth_gbps: {unit: GB/s, direction: higher, scope: gpu, status: provisional, expected: 200, fail: 10%,
                       provenance: the plugin's tests}
  p2p_bandwidth_gbps: {unit: GB/s, direction: higher, scope: gpu_pair, status: provisional, fail: 690,
                       provenance: the plugin's tests}
  all_reduce_busbw_gbps:
    status: provisional
    fail: 10%
    params: {nccl_env: {NCCL_ALGO: Ring}, max_bytes: 1073741824}
    provenance: the plugin's tests
    values:
      1GiB: {expected: 350}
"""


def stand_in(bin_dir: Path, name: str, output: str) -> None:
    """An executable that prints `output` and notes its arguments and NCCL environment. It names the tools it
    uses by their full paths, so that PATH can be `bin_dir` alone."""
    env, grep, cat = (shutil.which(tool) for tool in ("env", "grep", "cat"))
    (bin_dir / f"{name}.out").write_text(output)
    script = bin_dir / name
    script.write_text(
        f'#!/bin/sh\necho "$@" > {bin_dir}/{name}.args\n{env} | {grep} ^NCCL_ > {bin_dir}/{name}.env\n'
        f"{cat} {bin_dir}/{name}.out\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def lab_gpu_node(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A node of the LABGPU SKU: its two GPUs behind the fake NVML, seen by torch (node/preconditions.py asks),
    the LABGPU baseline under baselines/, and an empty bin/ for the stand-ins (made before PATH is set to bin/
    alone: a GPU host may have the real tools installed)."""
    install(monkeypatch, FakeNvmlLib([FakeGpu(pci_bus_id=f"00000000:0{i}:00.0") for i in range(2)]))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    (pytester.path / "baselines").mkdir()
    (pytester.path / "baselines" / "LABGPU.yaml").write_text(LAB_GPU)
    bin_dir = pytester.path / "bin"
    bin_dir.mkdir()
    return bin_dir


def test_reference_tools_run_and_report_beside_ours(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = lab_gpu_node(pytester, monkeypatch)
    stand_in(bin_dir, "all_reduce_perf", NCCL_OUTPUT)
    stand_in(bin_dir, "nvbandwidth", NVB_OUTPUT)
    monkeypatch.setenv("PATH", str(bin_dir))
    args = ["--gb-sku=LABGPU", "--gb-baselines=baselines", "--junitxml=r.xml", "--gb-report=r.json", "-rs"]
    result = pytester.runpytest(str(SUITES / "test_reference_tools.py"), *args, "--gb-reference-tools", "-v")

    cases = junit_cases(pytester.path / "r.xml")
    outcomes = {name: case["outcome"] for name, case in cases.items()}
    assert outcomes == {
        # the in-place 1GiB result is 1% below expected, but nccl-tests counted 3 wrong elements
        "test_nccl_tests_busbw[all_reduce]": "failure",
        "test_nccl_tests_busbw[all_gather]": "skipped",  # not on PATH
        "test_nccl_tests_busbw[alltoall]": "skipped",
        "test_nccl_tests_busbw[broadcast]": "skipped",
        "test_nccl_tests_busbw[reduce_scatter]": "skipped",
        "test_nvbandwidth[h2d_bandwidth_gbps]": "passed",  # gpu1 at 180: on the limit (10% below 200), not below
        "test_nvbandwidth[d2h_bandwidth_gbps]": "skipped",  # LABGPU has no reference
        "test_nvbandwidth[d2d_bandwidth_gbps]": "skipped",
        "test_nvbandwidth[p2p_bandwidth_gbps]": "failure",  # the read of gpu1->gpu0: 650 < 690
    }
    result.stdout.fnmatch_lines(["*all_gather_perf is not on PATH*"])
    message = cases["test_nccl_tests_busbw[all_reduce]"]["message"] or ""
    assert "reported wrong data (#wrong): 1GiB in_place: 3" in message
    assert "p2p_bandwidth_gbps [gpu1->gpu0]: measured 650 GB/s" in (
        cases["test_nvbandwidth[p2p_bandwidth_gbps]"]["message"] or ""
    )

    args_seen = (bin_dir / "all_reduce_perf.args").read_text().split()
    assert args_seen == ["-b", "8", "-e", "1073741824", "-f", "2", "-g", "2", "-w", "5", "-n", "20", "-c", "1"]
    assert "NCCL_ALGO=Ring" in (bin_dir / "all_reduce_perf.env").read_text()
    assert (bin_dir / "nvbandwidth.args").read_text().split()[:2] == ["-b", "512"]

    report = json.loads((pytester.path / "r.json").read_text())
    tool_records = [m for m in report["measurements"] if m["details"].get("tool", "").startswith("nccl-tests")]
    assert {(m["scope"], m["details"]["placement"], m["verdict"]) for m in tool_records} == {
        ("8B", "out_of_place", "info"),
        ("8B", "in_place", "info"),
        ("128MiB", "out_of_place", "info"),
        ("128MiB", "in_place", "info"),
        ("1GiB", "out_of_place", "pass"),
        ("1GiB", "in_place", "pass"),
    }
    h2d = [m for m in report["measurements"] if m["metric"] == "h2d_bandwidth_gbps"]
    assert [(m["scope"], m["value"], m["details"]["tool"], m["details"]["read_from"]) for m in h2d] == [
        ("gpu0", 201.5, "nvbandwidth", "text"),
        ("gpu1", 180.0, "nvbandwidth", "text"),
    ]
    result.stdout.fnmatch_lines(  # -v: the per-size tables
        ["all_reduce_busbw_gbps (nccl-tests all_reduce_perf; GB/s*", "*1GiB*PASS (expected 350)"]
    )


def test_reference_tools_are_off_unless_asked(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    lab_gpu_node(pytester, monkeypatch)
    result = pytester.runpytest(
        str(SUITES / "test_reference_tools.py"), "--gb-sku=LABGPU", "--gb-baselines=baselines", "-rs"
    )
    result.assert_outcomes(skipped=9)
    result.stdout.fnmatch_lines(["*reference tools not asked for (--gb-reference-tools, GBVALIDATE_REFERENCE_TOOLS*"])


def stand_in_writing_json(bin_dir: Path, name: str, output: str, json_text: str) -> None:
    """A newer nccl-tests: its usage names --output_file, and it writes `json_text` where -J says (printing the
    table as well, as the real one does)."""
    cat, cp = shutil.which("cat"), shutil.which("cp")
    (bin_dir / f"{name}.out").write_text(output)
    (bin_dir / f"{name}.json").write_text(json_text)
    script = bin_dir / name
    script.write_text(
        '#!/bin/sh\nif [ "$1" = "-h" ]; then echo "[-J,--output_file <file> write output to filepath]"; exit 0; fi\n'
        f'echo "$@" > {bin_dir}/{name}.args\n'
        'while [ $# -gt 0 ]; do if [ "$1" = "-J" ]; then out="$2"; fi; shift; done\n'
        f'{cp} {bin_dir}/{name}.json "$out"\n{cat} {bin_dir}/{name}.out\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def test_a_build_that_writes_json_is_read_from_its_json(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = lab_gpu_node(pytester, monkeypatch)
    stand_in_writing_json(bin_dir, "all_reduce_perf", NCCL_OUTPUT, NCCL_JSON)
    monkeypatch.setenv("PATH", str(bin_dir))
    args = ["--gb-sku=LABGPU", "--gb-baselines=baselines", "--gb-report=r.json", "--gb-reference-tools"]
    pytester.runpytest(str(SUITES / "test_reference_tools.py"), *args, "-k", "nccl_tests_busbw and all_reduce")
    args_seen = (bin_dir / "all_reduce_perf.args").read_text().split()
    assert args_seen[-2] == "-J" and args_seen[-1].endswith("all_reduce.json")
    report = json.loads((pytester.path / "r.json").read_text())
    one_gib = [m for m in report["measurements"] if m["scope"] == "1GiB" and m["details"]["placement"] == "in_place"]
    assert [(m["value"], m["details"]["read_from"]) for m in one_gib] == [(351.0, "json")]


def stand_in_nvbandwidth_json(bin_dir: Path, output: str, json_text: str) -> None:
    """An nvbandwidth from v0.5 on: its usage names --json (as boost prints it), and with --json it prints
    `json_text` instead of `output`."""
    cat = shutil.which("cat")
    (bin_dir / "nvbandwidth.text").write_text(output)
    (bin_dir / "nvbandwidth.json").write_text(json_text)
    script = bin_dir / "nvbandwidth"
    script.write_text(
        '#!/bin/sh\nif [ "$1" = "-h" ]; then echo "  -j [ --json ]  Print output in json format"; exit 0; fi\n'
        f'echo "$@" > {bin_dir}/nvbandwidth.args\nout=text\n'
        'for a in "$@"; do if [ "$a" = "--json" ]; then out=json; fi; done\n'
        f"{cat} {bin_dir}/nvbandwidth.$out\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def test_an_nvbandwidth_that_writes_json_is_read_from_its_json(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = lab_gpu_node(pytester, monkeypatch)
    stand_in_nvbandwidth_json(bin_dir, NVB_OUTPUT, NVB_JSON)
    monkeypatch.setenv("PATH", str(bin_dir))
    args = ["--gb-sku=LABGPU", "--gb-baselines=baselines", "--gb-report=r.json", "--gb-reference-tools"]
    pytester.runpytest(str(SUITES / "test_reference_tools.py"), *args, "-k", "nvbandwidth")
    assert (bin_dir / "nvbandwidth.args").read_text().split()[:4] == ["-b", "512", "--json", "-t"]
    report = json.loads((pytester.path / "r.json").read_text())
    h2d = [m for m in report["measurements"] if m["metric"] == "h2d_bandwidth_gbps"]
    assert [(m["scope"], m["value"], m["details"]["read_from"]) for m in h2d] == [
        ("gpu0", 201.5, "json"),
        ("gpu1", 185.25, "json"),
    ]
