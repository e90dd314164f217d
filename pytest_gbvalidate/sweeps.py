"""Message-size sweeps, as the bundled suites run them: how a sweep is planned from a SKU's baseline (sizes,
gated sizes, warm-up and iterations), and how its results are reported and gated size by size. Site suites can use
them too."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_gbvalidate.expect import Expect, Measured
from pytest_gbvalidate.labels import parse_size_label, size_label
from pytest_gbvalidate.target import Target

SWEEP_BYTES = {"gpu": (8, 8 * 2**30), "cpu": (8, 16 * 2**20)}
# Sizes gated when the baseline names none (a SKU being recorded): the sizes public figures are quoted at; on the
# CPU the size whose gloo figures hold stillest (on a 2-vCPU VM, 20-sample passes of a 1 MiB all_reduce ranged
# 0.27 to 3.75 GB/s within one process; between runs 4 MiB figures moved up to 89% as a log ratio, 16 MiB up to
# 62%: docs/noise.md).
DEFAULT_GATES = {"gpu": ("128MiB", "1GiB", "8GiB", "16GiB"), "cpu": ("16MiB",)}
WARMUP, ITERATIONS = 5, 20


@dataclass(frozen=True)
class SweepPlan:
    min_bytes: int
    max_bytes: int
    sizes: list[int]  # powers of two from min to max, and every gated size
    gates: frozenset[str]  # size labels the baseline gives values for
    warmup: int
    iterations: int


def sweep_plan(target: Target, metric: str) -> SweepPlan:
    """8 B to 8 GiB on GPUs (to 16 MiB on the CPU), doubling, plus every size the baseline gates; the metric's
    `params` (min_bytes, max_bytes, warmup, iterations) override the defaults."""
    kind = "gpu" if target.is_gpu else "cpu"
    params = target.params(metric)
    min_bytes = int(params.get("min_bytes", SWEEP_BYTES[kind][0]))
    # A min_bytes above the default top (a baseline gives it alone) sweeps that one size: the schema refuses only
    # a min_bytes above the baseline's own max_bytes.
    max_bytes = int(params.get("max_bytes", max(SWEEP_BYTES[kind][1], min_bytes)))
    gates = target.gate_labels(metric) or [g for g in DEFAULT_GATES[kind] if parse_size_label(g) <= max_bytes]
    gate_bytes = [parse_size_label(g) for g in gates]
    if not 0 < min_bytes <= max_bytes:
        raise ValueError(f"a sweep needs 0 < min_bytes <= max_bytes, got {min_bytes} and {max_bytes}")
    doubling = (min_bytes << i for i in range((max_bytes // min_bytes).bit_length()))  # up to max_bytes
    sizes = sorted({*doubling, *gate_bytes})
    return SweepPlan(
        min_bytes,
        max(sizes),
        sizes,
        frozenset(size_label(b) for b in gate_bytes),
        int(params.get("warmup", WARMUP)),
        int(params.get("iterations", ITERATIONS)),
    )


def one_size_plan(plan: SweepPlan) -> SweepPlan:
    """The plan cut to one message: its smallest gated size (its largest size where it gates none)."""
    size = min(parse_size_label(g) for g in plan.gates) if plan.gates else plan.max_bytes
    gates = plan.gates & {size_label(size)}
    return dataclasses.replace(plan, min_bytes=size, max_bytes=size, sizes=[size], gates=gates)


def expect_sweep(
    gb_expect: Expect,
    metric: str,
    plan: SweepPlan,
    rows: Sequence[tuple[str, float, Mapping[str, Any]]],
    problems: list[str] | None = None,
    again: Callable[[], Sequence[tuple[str, float, Mapping[str, Any]]]] | None = None,
) -> None:
    """Report every size of a sweep -- (label, value, details) -- gate the sizes the plan gates, one by one, and fail
    with every problem (wrong data, a gate missed, a gated size not run) in one message. Sizes not gated are recorded
    only (and compared with --gb-compare's report). A size whose details carry `not_run` (the reason) was not measured.
    `again` measures it again as gb_expect.measure_again says, appending what it finds wrong to `problems`."""
    failures = problems if problems is not None else []

    def measured_of(rows: Sequence[tuple[str, float, Mapping[str, Any]]]) -> list[Measured]:
        return [Measured(metric, value, label, details) for label, value, details in rows if "not_run" not in details]

    measured = measured_of(rows)
    if again is not None:
        measured = gb_expect.measure_again(measured, lambda: measured_of(again()), plan.gates)
    taken = iter(measured)  # measure_again keeps the rows' order, one for each measured row
    labels = {label for label, _, _ in rows}
    gated = []
    for label, _, details in rows:
        in_gates = label in plan.gates
        if "not_run" in details:
            gb_expect.not_measured(metric, str(details["not_run"]), label, gated=in_gates, details=details)
            if in_gates:
                failures.append(f"{metric} at {label}: not run ({details['not_run']})")
            continue
        measurement = next(taken)
        if in_gates:
            gated.append(measurement)
        else:
            gb_expect.record(metric, measurement.value, label, details=measurement.details)
    # A gated size the rows lack was neither measured nor said not run: never a pass on what was not measured.
    failures += [f"{metric} at {label}: gated, and no result at that size" for label in sorted(plan.gates - labels)]
    gb_expect.each(gated, failures)
