"""Baseline files for the baselines' unit tests: a good one (GOOD), the same with health and topology sections
(SECTIONS), and where a test writes one (write)."""

from __future__ import annotations

import textwrap
from pathlib import Path

GOOD = """\
schema_version: 1
sku: TEST
description: a test SKU
detect: {azure_vm_sizes: [Standard_X], gpu_name_contains: X1, gpu_count: 2}
metrics:
  h2d_bandwidth_gbps:
    unit: GB/s
    direction: higher
    scope: gpu
    status: measured
    expected: 50
    fail: 10%
    warn: 48
    provenance: golden node
  step_time_s:
    unit: s
    direction: lower
    scope: node
    status: provisional
    expected: 2.0
    fail: 25%
    provenance: a guess from a paper
  all_reduce_busbw_gbps:
    unit: GB/s
    direction: higher
    scope: message_size
    status: provisional
    fail: 10%
    provenance: nccl-tests
    values:
      1GiB: {expected: 400}
      16GiB: {fail: 430, provenance: a public gate}
"""


SECTIONS = GOOD.replace(
    "metrics:\n",
    """\
health:
  min_driver_version: '570.133.20'
  nvlinks_per_gpu: 18
  xid_actions: {drain: [13], ignore: [63, 92]}
  ecc_limits: {sram_uncorrectable: 0, row_remaps_pending: 0}
  provenance: a public health check
topology:
  gpu_numa_nodes: [1, 0]
  nic_on_gpu_numa_node: true
  ib_rate_gbps: 400
  provenance: the SKU's documentation
metrics:
""",
)


def write(tmp_path: Path, text: str, sku: str = "TEST") -> Path:
    path = tmp_path / f"{sku}.yaml"
    path.write_text(textwrap.dedent(text))
    return path
