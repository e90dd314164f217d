"""NVIDIA's reference tools beside our own measurements (--gb-reference-tools): nccl-tests (`all_reduce_perf`
and the other `<collective>_perf` binaries) and nvbandwidth, when they are on PATH. Their figures become the
same measurements our suites make -- same metrics, same scope labels, `details.tool` naming the tool -- and are
checked against the same baseline, so the reports show both side by side.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gbvalidate.expect import Expect, Measured
from pytest_gbvalidate.reference_tools import nccl_tests, nvbandwidth, runner
from pytest_gbvalidate.sweeps import expect_sweep, sweep_plan
from pytest_gbvalidate.target import ReferenceTools, Target

pytestmark = pytest.mark.gb_level("standard")

NVBANDWIDTH_METRICS = ("h2d_bandwidth_gbps", "d2h_bandwidth_gbps", "d2d_bandwidth_gbps", "p2p_bandwidth_gbps")
NVBANDWIDTH_BUFFER_BYTES = 512 * 2**20  # its default


def _binary(reference: ReferenceTools, name: str) -> str:
    if not reference.enabled:
        pytest.skip(reference.reason)
    path = runner.find(name)
    if path is None:
        pytest.skip(f"{name} is not on PATH")
    return path


@pytest.mark.gb_gpu  # skipped on the cpu SKU
@pytest.mark.parametrize("collective", sorted(nccl_tests.NCCL_TESTS_BINARIES))
def test_nccl_tests_busbw(
    collective: str, gb_reference_tools: ReferenceTools, gb_target: Target, gb_expect: Expect, tmp_path: Path
) -> None:
    binary = _binary(gb_reference_tools, nccl_tests.NCCL_TESTS_BINARIES[collective])
    metric = f"{collective}_busbw_gbps"
    plan = sweep_plan(gb_target, metric)
    command = nccl_tests.nccl_tests_command(
        binary,
        gpus=gb_target.local_world_size,
        min_bytes=plan.min_bytes,
        max_bytes=plan.max_bytes,
        warmup=plan.warmup,
        iterations=plan.iterations,
    )
    env, timeout_s = gb_reference_tools.env, gb_reference_tools.timeout_s
    json_file = tmp_path / f"{collective}.json"
    as_json = runner.writes_json(binary, nccl_tests.NCCL_TESTS_JSON_OPTION, env=env, timeout_s=timeout_s)
    try:
        text = runner.run([*command, "-J", str(json_file)] if as_json else command, env=env, timeout_s=timeout_s)
        if as_json:
            output = nccl_tests.parse_nccl_tests_json(runner.read_json_file(binary, json_file))
        else:
            output = nccl_tests.parse_nccl_tests(text)
    except runner.ToolError as exc:
        pytest.fail(str(exc), pytrace=False)
    measurements = nccl_tests.nccl_tests_measurements(collective, output)
    wrong = [f"{m.scope} {m.details['placement']}: {m.details['wrong']}" for m in measurements if m.details["wrong"]]
    problems = [f"{binary} reported wrong data (#wrong): {'; '.join(wrong)}"] if wrong else []
    expect_sweep(gb_expect, metric, plan, [(m.scope, m.value, m.details) for m in measurements], problems)


@pytest.fixture(scope="module")
def nvbandwidth_measurements(gb_reference_tools: ReferenceTools, gb_target: Target) -> list[runner.Measurement] | str:
    """One nvbandwidth run for all its tests (JSON where it writes it): the measurements, or why there are none."""
    binary = _binary(gb_reference_tools, "nvbandwidth")
    size = int(gb_target.params("h2d_bandwidth_gbps").get("size_bytes", NVBANDWIDTH_BUFFER_BYTES))
    env, timeout_s = gb_reference_tools.env, gb_reference_tools.timeout_s
    as_json = runner.writes_json(binary, nvbandwidth.NVBANDWIDTH_JSON_OPTION, env=env, timeout_s=timeout_s)
    try:
        text = runner.run(
            nvbandwidth.nvbandwidth_command(binary, buffer_bytes=size, as_json=as_json), env=env, timeout_s=timeout_s
        )
        matrices = nvbandwidth.parse_nvbandwidth_json(text) if as_json else nvbandwidth.parse_nvbandwidth(text)
        return nvbandwidth.nvbandwidth_measurements(matrices)
    except runner.ToolError as exc:
        return str(exc)


@pytest.mark.gb_gpu  # skipped on the cpu SKU
@pytest.mark.parametrize("metric", NVBANDWIDTH_METRICS)
def test_nvbandwidth(metric: str, nvbandwidth_measurements: list[runner.Measurement] | str, gb_expect: Expect) -> None:
    if isinstance(nvbandwidth_measurements, str):
        pytest.fail(nvbandwidth_measurements, pytrace=False)
    found = [m for m in nvbandwidth_measurements if m.metric == metric]
    if not found:
        pytest.fail(f"nvbandwidth reported nothing for {metric}", pytrace=False)
    gb_expect.each([Measured(m.metric, m.value, m.scope, m.details) for m in found])
