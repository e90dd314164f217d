"""Per-SKU baselines: schema, loading, and the comparison that turns a measurement into a verdict.

Pure Python (PyYAML only), no pytest: a CLI or a dashboard can reuse it. The model (model.py), reading a file
(loading.py) against its schema (schema.py: the top level; schema_metrics.py: the metrics; schema_sections.py:
pretrain, health and topology; fields.py: their field readers), verdicts (verdicts.py) and recording (recording.py).

A baseline file looks like::

    schema_version: 1
    sku: ND_H100_v5
    description: Azure ND H100 v5 (8x H100 80GB)
    detect: {azure_vm_sizes: [Standard_ND96isr_H100_v5], gpu_name_contains: H100 80GB HBM3, gpu_count: 8}
    resolution:                    # optional: the finest change its figures must resolve (rules/resolution.py)
      pct: 6                       # percent (a log ratio); a metric may declare its own as resolution_pct
      provenance: where that figure comes from
    metrics:
      h2d_bandwidth_gbps:          # in metrics.CATALOG, which gives its unit, direction and scope
        status: provisional        # measured (on a golden node) | provisional
        expected: 51
        fail: 48                   # absolute limit in the metric's unit, or "10%" of expected
        warn: 50.4
        provenance: where the numbers come from
      all_reduce_busbw_gbps:
        ...
        values:                    # per scope label; each entry overrides the metric-level fields
          8GiB: {expected: 478.87, provenance: ...}
      site_fsck_s:                 # a site's own metric gives them (a catalog one may, and must agree)
        unit: s
        direction: lower           # higher or lower is better
        scope: node                # node | gpu | gpu_pair | node_pair | link | message_size | layout
        ...
    health:                        # optional: gates of the health suite (HealthBaseline)
      xid_actions: {drain: [13]}   # a site's action for Xid codes, where it differs from NVIDIA's catalog
      ecc_limits: {sram_uncorrectable: 0}
      provenance: where the gates come from
    topology:                      # optional: the layout the topology suite expects (TopologyBaseline)
      gpu_numa_nodes: [1, 1, 0, 0]
      provenance: where the layout comes from

Every error names the file, the line and the field.
"""

from pytest_gbvalidate.baselines.loading import MAX_ALIAS_NODES, MAX_DEPTH, load_all, load_baseline
from pytest_gbvalidate.baselines.model import (
    DEFAULT_LEARNING_RATE,
    DEFAULT_NEEDED,
    SCHEMA_VERSION,
    STATUSES,
    Baseline,
    BaselineError,
    Detect,
    HealthBaseline,
    Limit,
    MetricBaseline,
    PretrainSpec,
    Reference,
    TopologyBaseline,
    baseline_path,
    known_skus,
    nccl_env,
)
from pytest_gbvalidate.baselines.recording import dump_baseline, recorded_baseline
from pytest_gbvalidate.baselines.verdicts import FAIL, INFO, PASS, UNRESOLVED, WARN, Verdict, compare

__all__ = [
    "DEFAULT_LEARNING_RATE",
    "DEFAULT_NEEDED",
    "FAIL",
    "INFO",
    "MAX_ALIAS_NODES",
    "MAX_DEPTH",
    "PASS",
    "SCHEMA_VERSION",
    "STATUSES",
    "UNRESOLVED",
    "WARN",
    "Baseline",
    "BaselineError",
    "Detect",
    "HealthBaseline",
    "Limit",
    "MetricBaseline",
    "PretrainSpec",
    "Reference",
    "TopologyBaseline",
    "Verdict",
    "baseline_path",
    "compare",
    "dump_baseline",
    "known_skus",
    "load_all",
    "load_baseline",
    "nccl_env",
    "recorded_baseline",
]
