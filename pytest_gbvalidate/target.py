"""The target of a run: the SKU it checks and that SKU's baseline, resolved from the settings or detected, and
what the baseline says the node has (GPUs, ranks, parameters, gated sizes); what that asks of the ranks a check
runs on (`require_ranks`) and what each of them is called in a report (`rank_labels`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_gbvalidate.ranks import CPU_RANKS
from pytest_gbvalidate.settings import AUTO, Settings

if TYPE_CHECKING:
    from pytest_gbvalidate import baselines as bl
    from pytest_gbvalidate.ranks.gang import Gang
    from pytest_gbvalidate.sku import Detection


@dataclass(frozen=True)
class Target:
    """The SKU this run checks and its baseline (None while recording a SKU that has no baseline yet)."""

    sku: str
    source: str
    baselines_dir: Path
    baseline: bl.Baseline | None
    node_gpu_count: int | None = None  # the GPUs NVML sees, asked only when there is no baseline to say

    @property
    def baseline_file(self) -> Path:
        return self.baselines_dir / f"{self.sku}.yaml"

    @property
    def is_gpu(self) -> bool:
        """Every SKU is a GPU SKU unless its baseline says it has none (`detect: {gpu_count: 0}`, as `cpu` does),
        or, recording a SKU with no baseline yet, the node has none."""
        return self.gpu_count != 0

    @property
    def device_type(self) -> str:
        return "cuda" if self.is_gpu else "cpu"

    @property
    def local_world_size(self) -> int:
        """Ranks a gang starts on this node: one per GPU the SKU promises, or CPU_RANKS on a CPU-only SKU."""
        return self.gpu_count or CPU_RANKS

    def reference(self, metric: str, scope: str) -> bl.Reference | None:
        metric_baseline = None if self.baseline is None else self.baseline.metrics.get(metric)
        return None if metric_baseline is None else metric_baseline.reference(scope)

    def params(self, metric: str, scope: str | None = None) -> dict[str, Any]:
        """Measurement parameters the baseline gives for a metric (buffer sizes, a sweep's sizes, its NCCL
        environment), or for one of its scope labels where that label has its own; empty when none."""
        metric_baseline = None if self.baseline is None else self.baseline.metrics.get(metric)
        if metric_baseline is None:
            return {}
        ref = metric_baseline.default if scope is None else metric_baseline.reference(scope)
        return {} if ref is None else dict(ref.params)

    @property
    def gpu_count(self) -> int | None:
        """GPUs per node the SKU promises (0 on a CPU-only SKU; None where its baseline does not say); while
        recording a SKU with no baseline yet, the GPUs the node has."""
        return self.node_gpu_count if self.baseline is None else self.baseline.detect.gpu_count

    def gate_labels(self, metric: str) -> list[str]:
        """The scope labels the baseline gives values for (the sizes a sweep is gated at)."""
        metric_baseline = None if self.baseline is None else self.baseline.metrics.get(metric)
        return [] if metric_baseline is None else list(metric_baseline.values)


def require_ranks(target: Target, world_size: int, minimum: int, what: str) -> None:
    """Skip a check that needs `minimum` ranks when the node has fewer GPUs (a 1-GPU SKU); fail it when the SKU
    promises enough GPUs and the gang still has fewer ranks."""
    if world_size >= minimum:
        return
    promised = target.gpu_count
    if promised is not None and promised >= minimum:
        pytest.fail(
            f"{what} needs at least {minimum} ranks: {target.sku} promises {promised} GPUs per node, but the gang "
            f"has {world_size} rank(s)",
            pytrace=False,
        )
    pytest.skip(f"{what} needs at least {minimum} ranks; this run's gang has {world_size}")


def rank_labels(target: Target, gang: Gang) -> list[str]:
    """What each rank of the gang is, for a check that runs on all of them at once: `gpu3` (`node1/gpu3` across
    nodes) on a GPU SKU, `rank1` on the CPU."""
    if not target.is_gpu:
        return [f"rank{r}" for r in range(gang.world_size)]
    if len(gang.hosts) == 1:
        return [f"gpu{r}" for r in range(gang.world_size)]
    per_node = gang.world_size // len(gang.hosts)
    return [f"node{r // per_node}/gpu{r % per_node}" for r in range(gang.world_size)]


@dataclass(frozen=True)
class ReferenceTools:
    """Whether this run also runs NVIDIA's reference tools (--gb-reference-tools), and how."""

    enabled: bool
    reason: str  # why not, when not
    env: dict[str, str]  # the NCCL environment the ranks get, for nccl-tests
    timeout_s: float


def reference_tools(asked: bool, world_rank: int | None, env: dict[str, str], timeout_s: float) -> ReferenceTools:
    """Whether this run also runs the reference tools: when asked for, from a single-node pytest only."""
    if not asked:
        reason = "reference tools not asked for (--gb-reference-tools, GBVALIDATE_REFERENCE_TOOLS, gb_reference_tools)"
    elif world_rank is not None:
        reason = "reference tools run from a single-node pytest, not under torchrun / srun"
    else:
        reason = ""
    return ReferenceTools(not reason, reason, env, timeout_s)


def resolve_target(config: pytest.Config, settings: Settings) -> Target:
    """The SKU this run checks (the setting, or detection through the pytest_gbvalidate_detect_sku hook) and
    its baseline; every problem is a usage error that says where it came from."""
    from pytest_gbvalidate import baselines as bl
    from pytest_gbvalidate.sku import Detection, DetectionError, nvml_gpu_names

    directory = settings.baselines.value
    if not directory.is_dir():
        raise pytest.UsageError(f"baselines directory {directory} ({settings.baselines.source}) does not exist")
    try:
        if settings.sku.value == AUTO:
            every = bl.load_all(directory)
            detection = config.hook.pytest_gbvalidate_detect_sku(config=config, baselines=every)
            loaded = {b.sku: b for b in every}
        else:
            detection, loaded = Detection(settings.sku.value, settings.sku.source), {}
        path = bl.baseline_path(directory, detection.sku)
        if detection.sku in loaded:
            baseline: bl.Baseline | None = loaded[detection.sku]
        elif os.path.lexists(path):  # whatever is there (a directory, a FIFO, a dangling link): the loader says why
            baseline = bl.load_baseline(path)
        elif settings.record.value is not None:  # a SKU recorded for the first time: a rank per GPU NVML sees
            names = nvml_gpu_names()
            return Target(detection.sku, detection.source, directory, None, 0 if names is None else len(names))
        else:
            raise pytest.UsageError(_unknown_sku_message(detection, directory))
    except bl.BaselineError as exc:
        raise pytest.UsageError(f"bad baseline: {exc}") from None
    except DetectionError as exc:
        raise pytest.UsageError(f"SKU auto-detection ({settings.sku.source}): {exc}") from None
    return Target(detection.sku, detection.source, directory, baseline)


def _unknown_sku_message(detection: Detection, directory: Path) -> str:
    from pytest_gbvalidate import baselines as bl

    known = ", ".join(bl.known_skus(directory)) or "none"
    return (
        f"unknown SKU {detection.sku!r} ({detection.source}); known SKUs in {directory}: {known}. "
        f"To bring up a new SKU, record a baseline on a golden node: "
        f"pytest --gb-sku={detection.sku} --gb-record={bl.baseline_path(directory, detection.sku)} suites/"
    )
