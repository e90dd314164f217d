"""Memory bandwidth checks. Each measurement is asserted against the SKU's baseline in the test that made it."""

from __future__ import annotations

import torch

from pytest_gbvalidate.bench.copy import copy_bandwidth
from pytest_gbvalidate.session import Expect, Target

HOST_COPY_SIZE_BYTES = 256 * 2**20  # large against the last-level cache, so the copy streams from DRAM


def test_host_copy_bandwidth(gb_target: Target, gb_expect: Expect) -> None:
    metric = "host_copy_bandwidth_gbps"
    params = gb_target.params(metric)
    size_bytes = int(params.get("size_bytes", HOST_COPY_SIZE_BYTES))
    cpu = torch.device("cpu")
    result = copy_bandwidth(cpu, cpu, size_bytes, iterations=int(params.get("iterations", 20)))
    gb_expect(
        metric,
        result.bandwidth_gbps,
        details={"size_bytes": size_bytes, "iterations": result.iterations, "samples_gbps": result.samples_gbps},
    )
