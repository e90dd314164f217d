"""Data movement and compute, measured per GPU (`[gpu3]`), per ordered GPU pair (`[gpu0->gpu1]`) or per node,
each asserted against the SKU's baseline in the test that made it.

Every measurement runs on a rank of the session's gang (`gb_gang`), alone on its node: the rank of the measured
GPU does the work while the others wait, so a hang or crash is bounded by --gb-timeout and fails only its test,
and under torchrun / srun every node measures its own GPUs and every rank reaches the same verdict.

Sizes follow nvbandwidth's defaults (512 MiB buffers) unless the baseline's `params` say otherwise; timing is
device events on GPUs (the host clock on the CPU), warm-up excluded, the median of >= 10 iterations. A figure about
to fail, warn or regress is measured again before its verdict, and the better pass counts (`gb_expect.each`'s
`again`): a busy node is fast in one of them, a degraded one in neither.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest

from pytest_gbvalidate.bench.gemm import GemmResult, fp8_speedup_x
from pytest_gbvalidate.bench.on_rank import copy_on_rank, gemm_on_rank, has_fp8_on_rank, host_gemm_on_rank, p2p_on_rank
from pytest_gbvalidate.bench.timing import MIN_TIMED_ITERATIONS
from pytest_gbvalidate.expect import Expect, Measured
from pytest_gbvalidate.labels import gpu_label, gpu_pair_label
from pytest_gbvalidate.node import neighbours
from pytest_gbvalidate.probes import Gpu
from pytest_gbvalidate.ranks.gang import Gang, NodeResult, run_on_local_rank
from pytest_gbvalidate.rules import noise
from pytest_gbvalidate.target import Target

# The quick level takes the host's copy and GEMM, each GPU's copies both ways and its bf16 GEMM (each well under
# a second on a GPU); d2d, P2P and fp8 wait for the standard level.
pytestmark = pytest.mark.gb_level("standard")

HOST_COPY_SIZE_BYTES = 256 * 2**20  # large against the last-level cache, so the copy streams from DRAM
DEVICE_COPY_SIZE_BYTES = 512 * 2**20  # nvbandwidth's default --bufferSize
GEMM_SIZE = 8192  # m = n = k of a GPU GEMM (the size the public fp8 figures use)
HOST_GEMM_SIZE = 1024  # of the CPU matmul: long enough to time, short enough for a smoke run
ITERATIONS, COPY_WARMUP, GEMM_WARMUP = 20, 3, 5


def _copy_params(target: Target, metric: str, default_size: int) -> tuple[int, int, int]:
    params = target.params(metric)
    size = int(params.get("size_bytes", default_size))
    return size, int(params.get("warmup", COPY_WARMUP)), int(params.get("iterations", ITERATIONS))


def _gemm_params(target: Target, metric: str, default_size: int) -> tuple[int, int, int, int, int]:
    params = target.params(metric)
    m, n, k = (int(params.get(axis, default_size)) for axis in "mnk")
    return m, n, k, int(params.get("warmup", GEMM_WARMUP)), int(params.get("iterations", ITERATIONS))


def _scope(label: str, result: NodeResult, results: list[NodeResult]) -> str:
    """The label as is on one node; naming the node where several nodes' results sit side by side."""
    if len(results) == 1:
        return label
    node = f"node{result.node_rank}"
    return node if label == "node" else f"{node}/{label}"


def _details(result: NodeResult, **extra: Any) -> dict[str, Any]:
    return {"host": result.host, "rank": result.rank, **extra}


def _copy_measurements(metric: str, label: str, results: list[NodeResult]) -> list[Measured]:
    return [
        Measured(
            metric,
            r.value.bandwidth_gbps,
            _scope(label, r, results),
            _details(
                r,
                size_bytes=r.value.size_bytes,
                iterations=r.value.iterations,
                samples_gbps=r.value.samples_gbps,
                cpu_wait_pct=neighbours.as_pct(r.value.cpu_wait_share),
                src=r.value.src_device,
                dst=r.value.dst_device,
                host_binding=r.value.host_binding,
            ),
        )
        for r in results
    ]


def _expect_copies(gb_expect: Expect, metric: str, label: str, measure: Callable[[], list[NodeResult]]) -> None:
    gb_expect.each(
        _copy_measurements(metric, label, measure()),
        again=lambda: _copy_measurements(metric, label, measure()),
    )


def _gemm_measurements(metric: str, label: str, results: list[NodeResult]) -> list[Measured]:
    return [
        Measured(
            metric,
            r.value.tflops,
            _scope(label, r, results),
            _details(
                r,
                shape=[r.value.m, r.value.n, r.value.k],
                iterations=r.value.iterations,
                samples_tflops=r.value.samples_tflops,
                cpu_wait_pct=neighbours.as_pct(r.value.cpu_wait_share),
                relative_error=r.value.relative_error,
            ),
        )
        for r in results
    ]


# --- per node: the host (every SKU; the cpu SKU's own checks) ---------------------------------------------


@pytest.mark.gb_level("quick")
def test_host_copy_bandwidth(gb_target: Target, gb_gang: Gang, gb_expect: Expect) -> None:
    metric = "host_copy_bandwidth_gbps"
    size, warmup, iterations = _copy_params(gb_target, metric, HOST_COPY_SIZE_BYTES)
    _expect_copies(
        gb_expect, metric, "node", lambda: run_on_local_rank(gb_gang, 0, copy_on_rank, "host", size, warmup, iterations)
    )


@pytest.mark.gb_level("quick")
def test_host_gemm_bf16_tflops(gb_target: Target, gb_gang: Gang, gb_expect: Expect) -> None:
    metric = "host_gemm_bf16_tflops"
    m, n, k, warmup, iterations = _gemm_params(gb_target, metric, HOST_GEMM_SIZE)

    def measure() -> list[Measured]:
        results = run_on_local_rank(gb_gang, 0, host_gemm_on_rank, "bf16", m, n, k, warmup, iterations)
        return _gemm_measurements(metric, "node", results)

    gb_expect.each(measure(), again=measure)


# --- per GPU ---------------------------------------------------------------------------------------------------


def _device_copy(kind: str, metric: str, index: int, target: Target, gang: Gang, gb_expect: Expect) -> None:
    size, warmup, iterations = _copy_params(target, metric, DEVICE_COPY_SIZE_BYTES)
    _expect_copies(
        gb_expect,
        metric,
        gpu_label(index),
        lambda: run_on_local_rank(gang, index, copy_on_rank, kind, size, warmup, iterations),
    )


def _gemm(dtype: str, metric: str, index: int, target: Target, gang: Gang, rounds: int = 1) -> list[NodeResult]:
    """One GPU's GEMM; of a check measuring in `rounds`, one round's share of the iterations."""
    m, n, k, warmup, iterations = _gemm_params(target, metric, GEMM_SIZE)
    iterations = iterations if rounds == 1 else _per_round(iterations, rounds)
    return run_on_local_rank(gang, index, gemm_on_rank, dtype, m, n, k, warmup, iterations)


@pytest.fixture(scope="module")
def bf16_gemms() -> dict[str, GemmResult]:
    """This run's bf16 GEMMs by scope (`gpu3`, `node1/gpu3`): the fp8 GEMM's speedup is taken against them."""
    return {}


@pytest.mark.gb_level("quick")
def test_h2d_bandwidth(gpu: Gpu, gb_target: Target, gb_gang: Gang, gb_expect: Expect) -> None:
    """Pinned host memory on the GPU's NUMA node to the GPU."""
    _device_copy("h2d", "h2d_bandwidth_gbps", gpu.index, gb_target, gb_gang, gb_expect)


@pytest.mark.gb_level("quick")
def test_d2h_bandwidth(gpu: Gpu, gb_target: Target, gb_gang: Gang, gb_expect: Expect) -> None:
    """The GPU to pinned host memory on its NUMA node."""
    _device_copy("d2h", "d2h_bandwidth_gbps", gpu.index, gb_target, gb_gang, gb_expect)


def test_d2d_bandwidth(gpu: Gpu, gb_target: Target, gb_gang: Gang, gb_expect: Expect) -> None:
    """Within the GPU's own memory."""
    _device_copy("d2d", "d2d_bandwidth_gbps", gpu.index, gb_target, gb_gang, gb_expect)


def test_p2p_bandwidth(gb_gpu_pair: tuple[int, int], gb_target: Target, gb_gang: Gang, gb_expect: Expect) -> None:
    """From one GPU to another of the same node, in the direction of the pair."""
    metric = "p2p_bandwidth_gbps"
    src, dst = gb_gpu_pair
    size, warmup, iterations = _copy_params(gb_target, metric, DEVICE_COPY_SIZE_BYTES)
    _expect_copies(
        gb_expect,
        metric,
        gpu_pair_label(src, dst),
        lambda: run_on_local_rank(gb_gang, src, p2p_on_rank, dst, size, warmup, iterations),
    )


@pytest.mark.gb_level("quick")
def test_gemm_bf16_tflops(
    gpu: Gpu, gb_target: Target, gb_gang: Gang, gb_expect: Expect, bf16_gemms: dict[str, GemmResult]
) -> None:
    results = _gemm("bf16", "gemm_bf16_tflops", gpu.index, gb_target, gb_gang)
    bf16_gemms.update({_scope(gpu.label, r, results): r.value for r in results})

    def again() -> list[Measured]:
        return _gemm_measurements(
            "gemm_bf16_tflops", gpu.label, _gemm("bf16", "gemm_bf16_tflops", gpu.index, gb_target, gb_gang)
        )

    gb_expect.each(_gemm_measurements("gemm_bf16_tflops", gpu.label, results), again=again)


# The per-GPU figures a GPU must keep up with its siblings in, with or without a baseline value (most of ND GB200
# v6's are provisional: no public figure gates them on day one). DCGM 4.5 flags GPUs whose clocks or power stray
# from the node's average; these are the figures that matter. metric -> (what measures it, its kind).
SIBLING_CHECKS = {
    "h2d_bandwidth_gbps": ("copy", "h2d"),
    "d2h_bandwidth_gbps": ("copy", "d2h"),
    "d2d_bandwidth_gbps": ("copy", "d2d"),
    "gemm_bf16_tflops": ("gemm", "bf16"),
}


# Rounds the siblings are measured in, every GPU in turn each round (noise.in_rounds), and judged round by round
# (stats.sibling_outliers): what drifts over the check's seconds moves every GPU of a round alike. Each round times
# its share of the planned iterations, at least as many as a figure needs. Eight: the more rounds, the better a
# device's own rounds tell its error (stats.sibling_z for four devices: 17.9 at three rounds, 4.8 at six, 4.0 at
# eight; docs/noise.md, behind the constants).
SIBLING_ROUNDS = 8


def _per_round(iterations: int, rounds: int) -> int:
    return max(MIN_TIMED_ITERATIONS, iterations // rounds)


@pytest.mark.gb_gpu
@pytest.mark.parametrize("metric", list(SIBLING_CHECKS))
def test_gpus_keep_up_with_their_siblings(metric: str, gb_target: Target, gb_gang: Gang, gb_expect: Expect) -> None:
    """Every GPU of the node measured in turn, SIBLING_ROUNDS times; fails naming a GPU whose figure is far below
    its siblings' median by the fleet's outlier rule (robust, beyond 10%, beyond the figures' own noise). Each node
    of a torchrun / srun world is judged on its own GPUs."""
    how, kind = SIBLING_CHECKS[metric]

    def measure() -> dict[int, dict[str, tuple[float, Any]]]:
        node_rounds: dict[int, list[dict[str, tuple[float, Any]]]] = {}  # node -> its GPUs' figures, each round
        for _ in range(SIBLING_ROUNDS):
            by_node: dict[int, dict[str, tuple[float, Any]]] = {}
            for index in range(gb_target.gpu_count or 0):
                if how == "copy":
                    size, warmup, iterations = _copy_params(gb_target, metric, DEVICE_COPY_SIZE_BYTES)
                    iterations = _per_round(iterations, SIBLING_ROUNDS)
                    results = run_on_local_rank(gb_gang, index, copy_on_rank, kind, size, warmup, iterations)
                    measured = _copy_measurements(metric, gpu_label(index), results)
                else:
                    results = _gemm(kind, metric, index, gb_target, gb_gang, SIBLING_ROUNDS)
                    measured = _gemm_measurements(metric, gpu_label(index), results)
                for r, (_, value, _, details) in zip(results, measured, strict=True):
                    by_node.setdefault(r.node_rank, {})[gpu_label(index)] = (value, details)
            for node, figures in by_node.items():
                node_rounds.setdefault(node, []).append(figures)
        return {node: noise.in_rounds(rounds) for node, rounds in node_rounds.items()}

    first: dict[int, dict[str, tuple[float, Any]]] = measure()
    second: dict[int, dict[str, tuple[float, Any]]] = {}

    def again(node: int) -> dict[str, tuple[float, Any]]:
        if not second:
            second.update(measure())  # once for every node, when the first node needs it
        return second[node]

    failures = []
    for node in sorted(first):
        try:
            gb_expect.siblings(metric, first[node], again=functools.partial(again, node))
        except pytest.fail.Exception as exc:
            failures.append(str(exc.msg) if len(first) == 1 else f"node{node}: {exc.msg}")
    if failures:
        pytest.fail("\n".join(failures), pytrace=False)


def test_gemm_fp8_tflops(
    gpu: Gpu, gb_target: Target, gb_gang: Gang, gb_expect: Expect, bf16_gemms: dict[str, GemmResult]
) -> None:
    """fp8 GEMM TFLOPS, and fp8 paying off: its speedup over this run's bf16 GEMM of the same GPU at the same shape
    (`gemm_fp8_speedup_x`), from the two measurements; not taken where the bf16 GEMM did not run (deselected) or
    ran at another shape."""
    if not all(r.value for r in run_on_local_rank(gb_gang, gpu.index, has_fp8_on_rank)):
        pytest.skip(f"{gpu.label} has no fp8 tensor cores (compute capability below 8.9)")
    results = _gemm("fp8", "gemm_fp8_tflops", gpu.index, gb_target, gb_gang)
    measurements = _gemm_measurements("gemm_fp8_tflops", gpu.label, results)
    for r in results:
        scope = _scope(gpu.label, r, results)
        bf16, fp8 = bf16_gemms.get(scope), r.value
        speedup = fp8_speedup_x(bf16, fp8)
        if bf16 is not None and speedup is not None:
            details = _details(r, shape=[fp8.m, fp8.n, fp8.k], fp8_tflops=fp8.tflops, bf16_tflops=bf16.tflops)
            measurements.append(Measured("gemm_fp8_speedup_x", speedup, scope, details))
    gb_expect.each(measurements)
