"""Llama 3 pretraining: the SKU's model and parallel layout (its baseline's `pretrain` section) trained on
synthetic tokens for a bounded number of steps. The loss must go down; the median step time, tokens/s per GPU,
model TFLOPS per GPU and MFU are checked against the baseline values recorded for the same engine, precision
and layout (the measurement's scope is the layout's label). The node's telemetry is sampled through the run.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest

from pytest_gbvalidate.baselines import PretrainSpec
from pytest_gbvalidate.bench.timing import MIN_TIMED_ITERATIONS
from pytest_gbvalidate.expect import Expect, Measured
from pytest_gbvalidate.probes import NodeGpus, Telemetry
from pytest_gbvalidate.ranks.gang import Gang
from pytest_gbvalidate.target import Target
from pytest_gbvalidate.workloads.llama import memory
from pytest_gbvalidate.workloads.llama.nemo import EnginePython
from pytest_gbvalidate.workloads.llama.parallel import Layout, LayoutError, check_world, engine_mismatch, weak_scaled
from pytest_gbvalidate.workloads.llama.request import EngineOptions, TrainRequest
from pytest_gbvalidate.workloads.llama.results import PretrainResult, summarize
from pytest_gbvalidate.workloads.llama.train import train_worker

pytestmark = pytest.mark.gb_level("full")

# A hang guard, not the measurement's bound (the step counts are): generous for an 8B step of about a minute.
SECONDS_PER_STEP_LIMIT = 600.0
START_LIMIT_S = 600.0


def test_pretrain(
    gb_target: Target, gb_expect: Expect, gb_telemetry: Telemetry, gpus: NodeGpus, request: pytest.FixtureRequest
) -> None:
    spec = pretrain_spec(gb_target)
    plan = None
    # The node's GPUs (utilization, memory, SM clock, power) and host, sampled through the whole run: their
    # summaries land in this test's JUnit properties and the JSON report, and in the step time's details.
    with gb_telemetry() as sampler:
        if spec.layout.engine == "native":
            gang: Gang = request.getfixturevalue("gb_gang")
            plan = memory_plan(spec, weak_scaled(spec.layout, gang.world_size), gb_target, gpus, request)
            run = train_native(spec, gang)
        else:
            # A work directory for NeMo's files only: every rank of a torchrun world is a pytest session, and
            # pytest's temporary directories are numbered and cleaned up in one place they would all share.
            python = request.getfixturevalue("gb_engine_python")
            run = train_with_nemo(spec, gb_target.local_world_size, request.getfixturevalue("tmp_path"), python)
    details = run.details()
    details["telemetry"] = sampler.summary()
    junit = request.node.user_properties
    if plan is not None:
        details["memory_estimate"] = [dataclasses.asdict(r) | {"total_gib": r.total_gib} for r in plan]
        junit.append(("gb_memory_estimate_gib", round(memory.busiest(plan).total_gib, 2)))
    junit.append(("gb_loss_curve", json.dumps([round(x, 4) for x in run.losses])))
    junit.extend((f"gb_{k}", details[k]) for k in ("tokens_per_s_per_gpu", "model_tflops_per_gpu", "mfu_pct"))
    if run.peak is not None:  # what the MFU divides by: public peaks differ, and an MFU says against what
        junit.append(("gb_mfu_peak", run.peak.describe()))
    junit.append(("gb_peak_memory", json.dumps(details["peak_memory"])))

    # The loss first: a node that computes garbage fast must fail even where no step time is recorded yet.
    assert run.loss_decreased, run.loss_message()
    model = spec.model
    figures = [
        (f"{model}_step_time_s", run.step_time_s),
        (f"{model}_tokens_per_s_per_gpu", run.tokens_per_s_per_gpu),
        (f"{model}_model_tflops_per_gpu", run.model_tflops_per_gpu),
        (f"{model}_mfu_pct", run.mfu_pct),
    ]
    checks = []
    for metric, value in figures:
        if value is None:
            continue  # MFU without a peak in the baseline
        refuse_other_engines(gb_target, metric, run)
        # Each figure comes from the timed steps: their spread is its noise (rules/noise.py), the same in percent for
        # the step time and the rates made from it.
        noise_of: dict[str, Any] = {"samples_step_time_s": run.step_times_s}
        if metric.endswith("_mfu_pct"):
            noise_of |= run.peak_details()
        checks.append(
            Measured(metric, value, run.scope, details | noise_of if metric.endswith("step_time_s") else noise_of)
        )
    # All recorded before any verdict: a figure the baseline has no value for yet must not hide the others.
    gb_expect.each(checks)


def pretrain_spec(target: Target) -> PretrainSpec:
    spec = None if target.baseline is None else target.baseline.pretrain
    if spec is None:
        pytest.skip(f"the {target.sku} baseline has no pretrain section")
    return spec


def train_native(spec: PretrainSpec, gang: Gang) -> PretrainResult:
    """The built-in engine on the gang's ranks. The layout must fill the gang exactly: checked here, before
    any rank does work."""
    layout = weak_scaled(spec.layout, gang.world_size)  # across N nodes: N times the replicas and the batch
    try:
        check_world(layout, gang.world_size)
    except LayoutError as exc:
        pytest.fail(f"pretrain layout from the baseline: {exc}", pytrace=False)
    if spec.timed_steps < MIN_TIMED_ITERATIONS:
        pytest.fail(
            f"pretrain.timed_steps: {spec.timed_steps}; a median needs >= {MIN_TIMED_ITERATIONS}", pytrace=False
        )
    options = EngineOptions(compile=spec.compile)
    request = TrainRequest(
        spec.config, layout, spec.warmup_steps, spec.timed_steps, spec.learning_rate, options=options
    )
    results = gang.run(train_worker, request, timeout_s=timeout_s(spec))
    return summarize(request, results, spec.peak)


def memory_plan(
    spec: PretrainSpec, layout: Layout, target: Target, gpus: NodeGpus, request: pytest.FixtureRequest
) -> list[memory.RankMemory]:
    """The memory each rank will need, printed before any rank starts; the test fails here, not by running out of
    memory half-way, when the busiest rank's estimate exceeds what a rank has: its GPU's memory as NVML reports
    it, or on the CPU an equal share of the host memory now available."""
    plan = memory.estimate(spec.config, layout, chunked_loss=EngineOptions().chunked_loss, compiled=spec.compile)
    busiest = memory.busiest(plan)
    if target.is_gpu:
        total_gib = min(gpu.memory_total_bytes for gpu in gpus.devices) / memory.GIB
        capacity_gib = memory.usable_gib(total_gib)
        capacity = (
            f"the smallest GPU has {total_gib:.1f} GiB, {capacity_gib:.1f} for the tensors (less "
            f"{memory.FIXED_HEADROOM_GIB:g} GiB for the CUDA context, NCCL and cuBLAS, and "
            f"{memory.FRAGMENTATION_FRACTION:.0%} for fragmentation)"
        )
    else:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        capacity_gib = available / target.local_world_size / memory.GIB
        capacity = f"each of {target.local_world_size} ranks has {capacity_gib:.1f} GiB of the host's available memory"
    say(
        request,
        f"gbvalidate: pretrain {layout.label}, memory per rank (estimate, busiest): {busiest.line()}; {capacity}",
    )
    if busiest.total_gib > capacity_gib:
        stages = "; ".join(r.line() for r in plan)
        pytest.fail(
            f"pretrain layout {layout.label} cannot fit: pipeline {stages} (estimates; {capacity}). Recompute more "
            "(activation_checkpointing: full), or lower MBS, or raise PP or TP in the baseline's pretrain section",
            pytrace=False,
        )
    return plan


def say(request: pytest.FixtureRequest, line: str) -> None:
    """A line on the terminal now, past pytest's output capture."""
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capture is None:
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line(line)


def train_with_nemo(spec: PretrainSpec, gpus: int, workdir: Path, python: EnginePython) -> PretrainResult:
    from pytest_gbvalidate.workloads.llama import nemo

    try:
        return nemo.run_pretrain(spec, gpus, workdir, timeout_s=timeout_s(spec), python=python)
    except (nemo.EngineUnavailable, nemo.EngineFailed) as exc:
        pytest.fail(str(exc), pytrace=False)


def timeout_s(spec: PretrainSpec) -> float:
    return START_LIMIT_S + SECONDS_PER_STEP_LIMIT * (spec.warmup_steps + spec.timed_steps)


def refuse_other_engines(target: Target, metric: str, run: PretrainResult) -> None:
    recorded = target.baseline.metrics.get(metric) if target.baseline is not None else None
    problem = engine_mismatch(metric, list(recorded.values) if recorded is not None else [], run.scope)
    if problem is not None:
        pytest.fail(f"{problem} ({target.baseline_file})", pytrace=False)
