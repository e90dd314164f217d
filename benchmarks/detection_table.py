"""The gate's detection table: every path that judges a figure, on healthy figures and on falls, side by side.

    python benchmarks/detection_table.py --out /tmp/dt [--trials 10] [--measured-trials 10] [--drift-trials 3]
                                         [--size-mib 64] [--seed 0] [--one-pass]

Rows are the paths a figure is judged by, each through the project's own functions (nothing judged here is
reimplemented):

- baseline: the bundled baseline (baselines/cpu.yaml's host copy; ND_H100_v5.yaml's h2d for GPU-like noise),
  verdicts.compare with verdicts.resolution_of, as gb_expect calls it;
- recorded: recording.recorded_baseline from healthy measurements (a --gb-record run: the better of two passes),
  written, read back with loading.parse_baseline, then verdicts.compare;
- compare: compare.compare_one against one earlier healthy run, no history;
- history: compare.compare_one against the last of 8 healthy runs, with_history of all 8;
- drift: the figure losing fall/12 more each run for 12 runs, each judged with the node's history so far (the 8
  healthy runs and the drift's own): caught where any of the 12 regressed;
- fleet: rules.outliers.judge over 8 healthy nodes and the judged one, each with its noise.

Columns: a healthy figure measured on an idle machine, one beside a busy neighbour, and falls of 10, 25, 50 and
90%. Each cell counts, over its trials, the caught (fail / regressed / outlier), the unresolved, the missed (pass /
ok / within_noise) and the warned figures; on a healthy column everything flagged (caught or warned) is a false
alarm. Two noise sources, each its own table:

- measured: real host copies on this machine (bench/copy.copy_bandwidth, the code the cpu SKU's host-copy check
  runs, --size-mib MiB, 3 warm-up and 10 timed copies: the cpu SKU's 256 MiB x 20 would not fit the time), in this
  process; each figure the median of its samples, its noise noise.of_samples. Falls are injected into the
  measurement: tests/helpers/slow_device.slowed stretches every timed copy to 1 / (1 - fall) of its time. The busy
  neighbour is a child process group spinning every core while the figure is measured. The healthy idle
  references (recording, history, earlier run, the fleet's 8 nodes: this machine measured 8 times) are drawn per
  trial, without repeats within a trial, from one pool of 20 idle measurements; the busy figures from one pool of
  12 (a drift trial beside a busy neighbour takes all 12 in an order of its own);
- gpu-like: synthetic samples (seeded numpy, 20 per figure) around an H100's h2d figure: each node 1% apart,
  each run 0.5%, each sample 1-2% (a run's spread drawn uniformly); beside a busy neighbour a third of the samples
  are up to 15% slower (interference only slows); a fall scales the run's underlying value.

Each figure is measured again as the checks measure it (gb_expect.measure_again, rules/sampling.py): where its
path flags it (caught, warned or unresolved) a second pass, more while it is unresolved, up to sampling.MAX_PASSES,
the best pass counting with its own noise. A further pass is drawn as the first was: measured again (a fall), drawn
again from its pool (idle, busy), a new synthetic run (GPU-like). Each path drives its own passes, as if it were the
run's only judge; the budget is not applied (a pass here takes milliseconds); a drift's runs and the fleet's node
are one pass each. `--one-pass` judges the first pass alone (the table before 2026-12-06). The mean passes per
figure are printed under the tables.

Each path's resolution (rules/resolution.py; the fleet's: the larger of noise.margin_pct of the fleet's typical
spread and how far below the median its MAD rule reaches, beside its practical margin of the needed resolution) is
printed as the median over the cell's trials, with the resolution its metric needs, and so is the fall each path
allows by design: how far below the node's healthy figure its threshold lies (the bundled baseline's fail limit, the
recording's, the earlier figure less the allowed change, the fleet's median less the needed resolution): a fall
finer than that passes by design. A figure past its threshold by at least twice its resolution must never pass; the
lines after the tables name every trial where one did, every healthy false alarm, and every GPU-like fall of 10% or
more not caught.
DIR/detection_table.json keeps every count, the resolutions, what each path allowed and the run's settings. No
pytest runs inside; the whole run is meant to take under 3 minutes on a 2-core machine (the measured drift
dominates: --drift-trials).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests.helpers.slow_device

PATHS = ("baseline", "recorded", "compare", "history", "drift", "fleet")
IDLE, BUSY = "healthy idle", "healthy busy"
FALLS = {"fall 10%": 0.10, "fall 25%": 0.25, "fall 50%": 0.50, "fall 90%": 0.90}
COLUMNS = (IDLE, BUSY, *FALLS)
OUTCOMES = ("caught", "unresolved", "missed", "warn")
HISTORY_RUNS, FLEET_NODES, DRIFT_RUNS = 8, 8, 12
IDLE_POOL, BUSY_POOL = 20, 12
NOW, EARLIER_DATE = "2026-11-29T06:00:00+00:00", "2026-11-29T05:00:00+00:00"
# The spinner: one process per core, in a process group of its own (ended by its id).
SPIN = (
    "import os\n"
    "for _ in range((os.cpu_count() or 1) - 1):\n    if os.fork() == 0:\n        break\n"
    "while True:\n    pass\n"
)


@dataclass(frozen=True)
class Figure:
    """One measured figure: the median of its samples, with their noise."""

    value: float
    samples: tuple[float, ...]
    cpu_wait_pct: float | None = None  # the share of its time it waited for a CPU (node/neighbours.py)

    @property
    def details(self) -> dict[str, Any]:
        """As the suites' check reports it: its samples and, where read, the share of its time it waited for a CPU."""
        found: dict[str, Any] = {"samples_gbps": list(self.samples)}
        if self.cpu_wait_pct is not None:
            found["cpu_wait_pct"] = self.cpu_wait_pct
        return found

    @property
    def noise(self) -> Any:
        from pytest_gbvalidate.rules import noise

        return noise.from_details(self.details)


@dataclass(frozen=True)
class Metric:
    """The figure judged: its metric, scope, unit, direction, bundled reference and the resolution it needs."""

    name: str
    scope: str
    scope_kind: str
    unit: str
    samples_key: str
    baseline_file: str
    reference: Any  # baselines.model.Reference
    previous: Any  # baselines.model.Baseline

    def record(self, figure: Figure, value: float | None = None) -> dict[str, Any]:
        """The figure as a report's measurement record (what compare and recording read)."""
        found = figure.noise
        record: dict[str, Any] = {
            "metric": self.name,
            "scope": self.scope,
            "scope_kind": self.scope_kind,
            "value": figure.value if value is None else value,
            "unit": self.unit,
            "direction": "higher",
            "verdict": "pass",
            "details": {self.samples_key: list(figure.samples)},
        }
        if found is not None:
            record["noise"] = found.as_record()
        return record


@dataclass
class Cell:
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    resolutions: list[float] = field(default_factory=list)
    # Each trial's (outcome, resolution %, the fall % the path allows by design: how far below the node's healthy
    # figure its threshold lay; how far past that threshold the judged figure lay; both log ratios, None where the
    # path has no threshold).
    judged: list[tuple[str, float | None, float | None, float | None]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # The fleet's MAD rule: how far below the median (percent of it) a node must lie to be 3.5 scaled MADs out.
    mad_rule_pcts: list[float] = field(default_factory=list)
    passes: list[int] = field(default_factory=list)  # each trial's passes (rules/sampling.py)

    def add(
        self,
        outcome: str,
        resolution_pct: float | None,
        allowed_pct: float | None = None,
        past_pct: float | None = None,
    ) -> None:
        self.counts[outcome] += 1
        if resolution_pct is not None and math.isfinite(resolution_pct):
            self.resolutions.append(resolution_pct)
        self.judged.append((outcome, resolution_pct, allowed_pct, past_pct))

    def allowed(self) -> float | None:
        found = [a for _, _, a, _ in self.judged if a is not None and math.isfinite(a)]
        return statistics.median(found) if found else None

    def must_catch_missed(self) -> int:
        """The trials whose figure lay past the path's threshold by at least twice its resolution and still
        passed: what no path may ever do."""
        return sum(
            1
            for outcome, res, _, past in self.judged
            if outcome == "missed" and past is not None and past > 0 and past >= 2 * (res or 0.0)
        )

    def trials(self) -> int:
        return sum(self.counts.values())

    def resolution(self) -> float | None:
        return statistics.median(self.resolutions) if self.resolutions else None


Table = dict[str, dict[str, Cell]]


def new_table() -> Table:
    return {p: {c: Cell() for c in COLUMNS} for p in PATHS}


# --- the noise sources -----------------------------------------------------------------------------------------


class Source:
    """Where figures come from: healthy references, and the judged figure of each column."""

    name = ""
    metric: Metric

    def references(self, trial: int) -> tuple[list[Figure], list[Figure], list[Figure]]:
        """(the node's 8 healthy runs, oldest first; the recording's 2 passes; the fleet's 8 other nodes)."""
        raise NotImplementedError

    def judged(self, column: str, trial: int) -> Figure:
        raise NotImplementedError

    def healthy(self, trial: int) -> float:
        """The node's healthy figure in this trial: what each fall is a fall from."""
        raise NotImplementedError

    def drift(self, column: str, trial: int) -> Iterator[Figure]:
        """The 12 runs of a drift trial, in order (the caller stops once one is caught)."""
        raise NotImplementedError

    def again(self, column: str, trial: int) -> Figure:
        """A further pass of the column's figure, drawn as its first was."""
        raise NotImplementedError


class Measured(Source):
    """Real host copies on this machine (bench/copy.copy_bandwidth), falls through slow_device.slowed."""

    name = "measured"

    def __init__(self, metric: Metric, size_bytes: int, rng: np.random.Generator) -> None:
        self.metric, self.size_bytes, self.rng = metric, size_bytes, rng
        self.idle = [self.measure(1.0) for _ in range(IDLE_POOL)]
        with busy_neighbour():
            self.busy = [self.measure(1.0) for _ in range(BUSY_POOL)]
        self._draws: dict[int, list[int]] = {}

    def measure(self, speed: float) -> Figure:
        import torch

        from pytest_gbvalidate.bench.copy import copy_bandwidth
        from pytest_gbvalidate.bench.timing import MIN_TIMED_ITERATIONS
        from tests.helpers.slow_device import slowed

        cpu = torch.device("cpu")
        with slowed(speed):
            r = copy_bandwidth(cpu, cpu, self.size_bytes, warmup=3, iterations=MIN_TIMED_ITERATIONS)
        share = r.cpu_wait_share
        return Figure(r.bandwidth_gbps, tuple(r.samples_gbps), None if share is None else round(share * 100, 1))

    def _draw(self, trial: int) -> list[int]:
        if trial not in self._draws:
            self._draws[trial] = [int(i) for i in self.rng.permutation(IDLE_POOL)]
        return self._draws[trial]

    def references(self, trial: int) -> tuple[list[Figure], list[Figure], list[Figure]]:
        order = self._draw(trial)
        history = [self.idle[i] for i in order[:HISTORY_RUNS]]
        passes = [self.idle[i] for i in order[HISTORY_RUNS : HISTORY_RUNS + 2]]
        return history, passes, history  # the fleet: this machine measured 8 times, as 8 nodes

    def healthy(self, trial: int) -> float:
        return statistics.median(f.value for f in self.idle)

    def judged(self, column: str, trial: int) -> Figure:
        if column == IDLE:
            return self.idle[self._draw(trial)[HISTORY_RUNS + 2]]
        if column == BUSY:
            return self.busy[trial % BUSY_POOL]
        return self.measure(1.0 - FALLS[column])

    def again(self, column: str, trial: int) -> Figure:
        if column == IDLE:
            return self.idle[int(self.rng.integers(IDLE_POOL))]
        if column == BUSY:
            return self.busy[int(self.rng.integers(BUSY_POOL))]
        return self.measure(1.0 - FALLS[column])

    def drift(self, column: str, trial: int) -> Iterator[Figure]:
        if column == IDLE:  # the pool's 12 not in this trial's history
            yield from (self.idle[i] for i in self._draw(trial)[HISTORY_RUNS:])
        elif column == BUSY:
            yield from (self.busy[int(i)] for i in self.rng.permutation(BUSY_POOL))
        else:
            for run in range(1, DRIFT_RUNS + 1):
                yield self.measure(1.0 - FALLS[column] * run / DRIFT_RUNS)


class GpuLike(Source):
    """Synthetic samples around an H100's h2d figure (see the module's docstring)."""

    name = "gpu-like"
    NODE_PCT, RUN_PCT, SAMPLES = 1.0, 0.5, 20
    SPREAD_PCT = (1.0, 2.0)
    BUSY_SHARE, BUSY_SLOWER = 1 / 3, 0.15

    def __init__(self, metric: Metric, rng: np.random.Generator) -> None:
        self.metric, self.rng = metric, rng
        assert metric.reference.expected is not None
        self.expected = float(metric.reference.expected)
        self._nodes: dict[int, float] = {}

    def _node(self) -> float:
        return self.expected * (1 + self.NODE_PCT / 100 * float(self.rng.standard_normal()))

    def node(self, trial: int) -> float:
        if trial not in self._nodes:
            self._nodes[trial] = self._node()
        return self._nodes[trial]

    def run(self, node: float, speed: float = 1.0, busy: bool = False) -> Figure:
        value = node * (1 + self.RUN_PCT / 100 * float(self.rng.standard_normal())) * speed
        spread = float(self.rng.uniform(*self.SPREAD_PCT)) / 100
        samples = value * (1 + spread * self.rng.standard_normal(self.SAMPLES))
        if busy:
            hit = self.rng.random(self.SAMPLES) < self.BUSY_SHARE
            samples = np.where(hit, samples * (1 - self.rng.uniform(0, self.BUSY_SLOWER, self.SAMPLES)), samples)
        values = tuple(float(s) for s in samples)
        return Figure(statistics.median(values), values)

    def references(self, trial: int) -> tuple[list[Figure], list[Figure], list[Figure]]:
        node = self.node(trial)
        history = [self.run(node) for _ in range(HISTORY_RUNS)]
        passes = [self.run(node) for _ in range(2)]
        fleet = [self.run(self._node()) for _ in range(FLEET_NODES)]
        return history, passes, fleet

    def healthy(self, trial: int) -> float:
        return self.node(trial)

    def judged(self, column: str, trial: int) -> Figure:
        return self.run(self.node(trial), 1.0 - FALLS.get(column, 0.0), busy=column == BUSY)

    def again(self, column: str, trial: int) -> Figure:
        return self.judged(column, trial)

    def drift(self, column: str, trial: int) -> Iterator[Figure]:
        fall = FALLS.get(column, 0.0)
        for run in range(1, DRIFT_RUNS + 1):
            yield self.run(self.node(trial), 1.0 - fall * run / DRIFT_RUNS, busy=column == BUSY)


@contextlib.contextmanager
def busy_neighbour() -> Iterator[None]:
    """A child process group spinning every core while inside; ended by its id."""
    spinner = subprocess.Popen([sys.executable, "-c", SPIN], start_new_session=True)
    time.sleep(0.3)  # every spinner forked and running
    try:
        yield
    finally:
        os.killpg(spinner.pid, signal.SIGKILL)
        spinner.wait()


# --- the paths, each judged by the project's own functions ------------------------------------------------------


def from_verdict(word: str) -> str:
    return {"fail": "caught", "unresolved": "unresolved", "warn": "warn"}.get(word, "missed")


def from_compare(word: str) -> str:
    return {"regressed": "caught", "unresolved": "unresolved"}.get(word, "missed")


# What a path returns for a figure: its outcome, its resolution (%), the threshold it held it against (the value
# past which it fails or regresses; None where it has none) and the figure it judged (for a drift, its worst run).
Judged = tuple[str, float | None, float | None, float]


def judge_baseline(metric: Metric, figure: Figure, reference: Any = None) -> Judged:
    from pytest_gbvalidate.baselines import verdicts

    ref = metric.reference if reference is None else reference
    verdict = verdicts.compare(ref, figure.value, metric.scope, verdicts.resolution_of(figure.noise, ref))
    resolution = None if verdict.resolution is None else verdict.resolution.pct
    return from_verdict(verdict.verdict), resolution, ref.fail_limit, figure.value


def recorded_reference(metric: Metric, passes: Sequence[Figure]) -> Any:
    """The reference a --gb-record run of these two passes writes (the better pass, as expect.best_of_passes keeps
    it: its details and both figures, its noise read from them as a report's is), read back as the loader reads it;
    None where the recording refuses the node as too noisy."""
    from pytest_gbvalidate.baselines import recording
    from pytest_gbvalidate.baselines.loading import parse_baseline
    from pytest_gbvalidate.expect import Measured, best_of_passes
    from pytest_gbvalidate.rules import noise

    first, second = ([Measured(metric.name, f.value, metric.scope, f.details)] for f in passes)
    (best,) = best_of_passes(first, second, {metric.name: "higher"})
    record = metric.record(Figure(best.value, tuple(best.details[metric.samples_key])))
    record["details"] = dict(best.details)
    found = noise.from_details(best.details)
    if found is not None:
        record["noise"] = found.as_record()
    doc, not_gated = recording.recording(metric.previous.sku, metric.previous, [record], "detection_table")
    if not_gated:  # written not gated: nothing to judge against
        return None
    baseline = parse_baseline(Path(metric.baseline_file), recording.dump_baseline(doc).encode("utf-8"))
    return baseline.metrics[metric.name].reference(metric.scope)


def earlier_report(metric: Metric, figure: Figure, runs: Sequence[Figure] = ()) -> Any:
    from pytest_gbvalidate.report import earlier as er
    from pytest_gbvalidate.report.records import measurement_key

    record: Any = metric.record(figure)  # a MeasurementRecord
    earlier = er.EarlierReport(
        path=Path("earlier.json"),
        date=EARLIER_DATE,
        status="finished",
        sku=metric.previous.sku,
        hostname="node-09",
        gpus=None,
        measurements={measurement_key(record): record},
    )
    if not runs:
        return earlier
    key = measurement_key(record)
    return er.with_history(earlier, [{key: f.value} for f in runs])


def judge_compare(metric: Metric, earlier: Any, figure: Figure) -> Judged:
    """compare.compare_one of `figure` against `earlier`, allowed the resolution the metric needs (no
    --gb-compare-fail)."""
    from pytest_gbvalidate import compare
    from pytest_gbvalidate.report.earlier import SameNode

    needed = metric.reference.needed
    section = compare.compare_one(
        earlier, metric.record(figure), compare.AllowedRegression(), needed, SameNode({}, ()), NOW
    )
    if section is None:
        raise RuntimeError("compare_one found no earlier figure")
    found = section.get("resolution")
    resolution = found.get("pct") if isinstance(found, Mapping) else None
    threshold = float(section["earlier_value"]) * math.exp(-float(section["allowed_pct"] or 0.0) / 100)
    return from_compare(str(section["verdict"])), resolution, threshold, figure.value


def sampled(judge: Callable[[Figure], Judged], first: Figure, again: Callable[[], Figure] | None) -> tuple[Judged, int]:
    """`first` judged by `judge`, measured again by `again` while rules/sampling.py says to (None: one pass), the
    best pass judged: (the judgement, the passes taken)."""
    from pytest_gbvalidate.rules import sampling

    best, passes = first, 1
    judged = judge(best)
    while again is not None:
        flagged, unresolved = judged[0] != "missed", judged[0] == "unresolved"
        if sampling.stop(sampling.Pending(passes, flagged, unresolved, 0.0), math.inf) is not None:
            break
        figure, passes = again(), passes + 1
        best = figure if figure.value > best.value else best  # interference only slows: the best pass counts
        judged = judge(best)
    return judged, passes


def judge_drift(metric: Metric, history: Sequence[Figure], runs: Iterator[Figure]) -> Judged:
    """Each run against the one before, with the node's kept runs (the last noise.MAX_RUNS) behind it; its
    threshold: the needed resolution below the median of the node's healthy runs (its reference runs')."""
    from pytest_gbvalidate.rules import noise

    kept = list(history)
    worst = math.inf
    seen: list[str] = []
    resolutions: list[float] = []
    for figure in runs:
        recent = kept[-noise.MAX_RUNS :]
        outcome, resolution, _, _ = judge_compare(metric, earlier_report(metric, recent[-1], recent), figure)
        worst = min(worst, figure.value)
        seen.append(outcome)
        if resolution is not None:
            resolutions.append(resolution)
        if outcome == "caught":
            break
        kept.append(figure)
    shown = statistics.median(resolutions) if resolutions else None
    threshold = statistics.median(f.value for f in history) * math.exp(-metric.reference.needed.pct / 100)
    for outcome in OUTCOMES:
        if outcome in seen:
            return outcome, shown, threshold, worst
    return "missed", shown, threshold, worst


def judge_fleet(metric: Metric, others: Sequence[Figure], figure: Figure, healthy: bool, cell: Cell) -> Judged:
    """rules.outliers over the other nodes and this one (node-09), each with its noise, as the fleet summary judges
    a metric (the family-wise cut-off, the practical margin of the resolution the metric needs); on a healthy column
    any node drained is a false alarm. Its resolution: the larger of the noise margin of the fleet's typical spread
    and how far below the median the MAD rule asks a node to lie (as a log ratio), which the cell also keeps."""
    from pytest_gbvalidate.rules import noise, outliers
    from pytest_gbvalidate.rules import resolution as rs

    nodes = {f"node-{i + 1:02d}": f for i, f in enumerate(others)}
    nodes["node-09"] = figure
    values = {host: f.value for host, f in nodes.items()}
    noises = {host: f.noise for host, f in nodes.items()}
    mad_k = noise.family_z(len(values), 1)
    judgement = outliers.judge(values, "higher", mad_k, noises=noises, needed_pct=metric.reference.needed.pct)
    drained = {o.host for o in judgement.outliers}
    unjudged = {u.host for u in judgement.unjudged}
    spreads = {host: n.spread_pct for host, n in noises.items() if n is not None}
    typical_pct = outliers.fleet_spread_pct(spreads, list(values), "node-09")
    resolution = noise.margin_pct(typical_pct, typical_pct)
    s = outliers.spread(list(values.values()))
    if s.median > 0:
        mad_rule = s.median - mad_k * s.mad * noise.MAD_TO_SIGMA
        mad_rule_pct = rs.worse_pct(mad_rule, s.median, "higher")
        cell.mad_rule_pcts.append(mad_rule_pct)
        resolution = max(resolution, mad_rule_pct)
    threshold = s.median * math.exp(-metric.reference.needed.pct / 100)  # its practical margin
    if "node-09" in drained or (healthy and drained):
        return "caught", resolution, threshold, figure.value
    return ("unresolved" if "node-09" in unjudged else "missed"), resolution, threshold, figure.value


# --- the table ---------------------------------------------------------------------------------------------------


def fill(
    source: Source, trials: int, drift_trials: int, progress: Callable[[str], None], one_pass: bool = False
) -> Table:
    table = new_table()
    metric = source.metric
    from pytest_gbvalidate.rules import resolution as rs

    def add(cell: Cell, judged: Judged | tuple[Judged, int], healthy: float) -> None:
        if len(judged) == 2:
            judged, passes = judged
            cell.passes.append(passes)
        outcome, resolution, threshold, value = judged
        if threshold is None or threshold <= 0:
            cell.add(outcome, resolution)
        else:
            allowed = rs.worse_pct(threshold, healthy, "higher")
            cell.add(outcome, resolution, allowed, rs.worse_pct(value, threshold, "higher"))

    for trial in range(trials):
        history, passes, fleet = source.references(trial)
        healthy = source.healthy(trial)
        recorded = recorded_reference(metric, passes)
        plain = earlier_report(metric, history[-1])
        kept = earlier_report(metric, history[-1], history)
        for column in COLUMNS:
            figure = source.judged(column, trial)
            again = None if one_pass else functools.partial(source.again, column, trial)
            add(table["baseline"][column], sampled(functools.partial(judge_baseline, metric), figure, again), healthy)
            if recorded is None:
                table["recorded"][column].add("unresolved", None)
                table["recorded"][column].notes.append(f"trial {trial}: recording refused (too noisy)")
            else:
                judged = sampled(functools.partial(judge_baseline, metric, reference=recorded), figure, again)
                add(table["recorded"][column], judged, healthy)
            for path, earlier in (("compare", plain), ("history", kept)):
                judged = sampled(functools.partial(judge_compare, metric, earlier), figure, again)
                add(table[path][column], judged, healthy)
            cell = table["fleet"][column]
            add(cell, judge_fleet(metric, fleet, figure, column in (IDLE, BUSY), cell), healthy)
        if trial < drift_trials:
            for column in COLUMNS:
                runs = list(source.drift(column, trial))  # all drawn, whatever is caught: the draws stay the same
                add(table["drift"][column], judge_drift(metric, history, iter(runs)), healthy)
        progress(f"{source.name}: trial {trial + 1}/{trials} done")
    return table


def cell_text(column: str, cell: Cell) -> str:
    c = cell.counts
    if cell.trials() == 0:
        return "-"
    if column in (IDLE, BUSY):
        return f"FA {c['caught'] + c['warn']} u{c['unresolved']} ok{c['missed']}"
    text = f"c{c['caught']} u{c['unresolved']} m{c['missed']}"
    return text + (f" w{c['warn']}" if c["warn"] else "")


def render(source: Source, table: Table, trials: int, drift_trials: int) -> list[str]:
    metric = source.metric
    ref = metric.reference
    needed = ref.needed
    head = f"{'path':<9} {'res idle':>8} " + " ".join(f"{c:>15}" for c in COLUMNS)
    lines = [
        f"{source.name} noise: {metric.name} [{metric.scope}] against {metric.baseline_file} (expected {ref.expected}"
        f", fail {ref.fail_limit:.4g}, warn {ref.warn_limit}); needed resolution {needed.pct:g}% ({needed.source})",
        f"N = {trials} trials per cell ({drift_trials} for drift); FA: false alarms (caught or warned), "
        "c caught, u unresolved, m missed, w warned; res: median resolution %, healthy idle",
        head,
        "-" * len(head),
    ]
    for path in PATHS:
        res = table[path][IDLE].resolution()
        shown = "-" if res is None else f"{res:.1f}"
        lines.append(f"{path:<9} {shown:>8} " + " ".join(f"{cell_text(c, table[path][c]):>15}" for c in COLUMNS))
    lines += ["", "median resolution % of each cell's figures (falls as log ratios: 11, 29, 69, 230%)"]
    for path in PATHS:
        cells = [table[path][c].resolution() for c in COLUMNS]
        lines.append(f"{path:<9} {'':>8} " + " ".join(f"{'-' if r is None else f'{r:.1f}':>15}" for r in cells))
    lines += [
        "",
        "median fall each path allows by design, % as a log ratio (its threshold below the node's healthy figure)",
    ]
    for path in PATHS:
        cells = [table[path][c].allowed() for c in COLUMNS]
        lines.append(f"{path:<9} {'':>8} " + " ".join(f"{'-' if a is None else f'{a:.1f}':>15}" for a in cells))
    lines += ["", "mean passes per figure (rules/sampling.py; 1 throughout with --one-pass)"]
    for path in ("baseline", "recorded", "compare", "history"):
        means = [statistics.fmean(table[path][c].passes or [1]) for c in COLUMNS]
        lines.append(f"{path:<9} {'':>8} " + " ".join(f"{m:>15.2f}" for m in means))
    if refused(table["recorded"][IDLE]):
        lines.append(
            f"(recorded: refused as too noisy in {refused(table['recorded'][IDLE])} trial(s), counted unresolved: "
            "no recording to judge against)"
        )
    mad_rule = table["fleet"][IDLE].mad_rule_pcts
    shown_rule = f"{statistics.median(mad_rule):.1f}%" if mad_rule else "-"
    lines.append(
        "(fleet: its resolution is the larger of the noise margin of the fleet's typical spread and the MAD "
        f"rule's reach, {shown_rule} below the median at the median of its trials; an outlier must also lie beyond "
        f"the {ref.needed.pct:g}% the metric needs)"
    )
    return lines


def refused(cell: Cell) -> int:
    """The trials whose recording was refused as too noisy: no recording to judge against (the operator is told so
    when recording), counted unresolved, not a miss."""
    return sum(1 for note in cell.notes if "refused" in note)


def findings(source: Source, table: Table) -> list[str]:
    """Every healthy false alarm; every fall past its path's threshold by at least twice its figure's resolution
    that still passed (per trial: no path may do that); and, on GPU-like noise, every fall of 10% or more not
    caught."""
    found = []
    for path in PATHS:
        for column in COLUMNS:
            cell = table[path][column]
            c = cell.counts
            missed = cell.must_catch_missed()
            if missed:
                found.append(
                    f"{source.name} {path} {column}: {missed} of {cell.trials()} passed though past the path's "
                    "threshold by at least twice their resolution"
                )
            if column in (IDLE, BUSY):
                if c["caught"] + c["warn"]:
                    found.append(
                        f"{source.name} {path} {column}: {c['caught'] + c['warn']} false alarm(s) in {cell.trials()}"
                    )
            elif isinstance(source, GpuLike) and c["caught"] < cell.trials() - refused(cell):
                found.append(f"{source.name} {path} {column}: caught {c['caught']} of {cell.trials()}")
    return found


def as_json(table: Table) -> dict[str, Any]:
    return {
        path: {
            column: {
                **cell.counts,
                "trials": cell.trials(),
                "resolution_pct": cell.resolution(),
                "allowed_pct": cell.allowed(),
                "must_catch_missed": cell.must_catch_missed(),
                "notes": cell.notes,
                "mean_passes": round(statistics.fmean(cell.passes), 3) if cell.passes else 1.0,
                **({"fleet_mad_rule_pct": statistics.median(cell.mad_rule_pcts)} if cell.mad_rule_pcts else {}),
            }
            for column, cell in row.items()
        }
        for path, row in table.items()
    }


def metric_of(name: str, scope: str, baseline_file: str, samples_key: str) -> Metric:
    from pytest_gbvalidate.baselines.loading import load_baseline
    from pytest_gbvalidate.metrics import CATALOG

    path = REPO / "baselines" / baseline_file
    previous = load_baseline(path)
    spec = CATALOG[name]
    reference = previous.metrics[name].reference(scope)
    return Metric(name, scope, spec.scope_kind, spec.unit, samples_key, str(path), reference, previous)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="write DIR/detection_table.json")
    parser.add_argument("--trials", type=int, default=10, help="trials per cell, gpu-like noise")
    parser.add_argument("--measured-trials", type=int, default=10, help="trials per cell, measured noise")
    parser.add_argument("--drift-trials", type=int, default=3, help="drift trials per cell, measured noise")
    parser.add_argument("--size-mib", type=int, default=64, help="each host copy's size (measured noise)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--one-pass", action="store_true", help="judge each figure's first pass alone")
    args = parser.parse_args(argv)
    started = time.monotonic()

    def progress(text: str) -> None:
        print(f"[{time.monotonic() - started:6.1f} s] {text}", file=sys.stderr, flush=True)

    rng = np.random.default_rng(args.seed)
    gpu = GpuLike(metric_of("h2d_bandwidth_gbps", "gpu0", "ND_H100_v5.yaml", "samples_gbps"), rng)
    gpu_table = fill(gpu, args.trials, args.trials, progress, args.one_pass)
    progress("measuring the idle and busy pools")
    host = metric_of("host_copy_bandwidth_gbps", "node", "cpu.yaml", "samples_gbps")
    measured = Measured(host, args.size_mib * 2**20, rng)
    progress("pools measured")
    drift_trials = min(args.drift_trials, args.measured_trials)
    measured_table = fill(measured, args.measured_trials, drift_trials, progress, args.one_pass)
    elapsed_s = time.monotonic() - started

    lines = render(measured, measured_table, args.measured_trials, min(args.drift_trials, args.measured_trials))
    pool = [f.value for f in measured.idle]
    busy = [f.value for f in measured.busy]
    lines.append(
        f"(this machine, {args.size_mib} MiB copies: idle median {statistics.median(pool):.2f} GB/s "
        f"[{min(pool):.2f}-{max(pool):.2f}], beside a busy neighbour {statistics.median(busy):.2f} "
        f"[{min(busy):.2f}-{max(busy):.2f}])"
    )
    lines += ["", *render(gpu, gpu_table, args.trials, args.trials), ""]
    found = findings(measured, measured_table) + findings(gpu, gpu_table)
    lines += ["What looks wrong:", *(f"- {f}" for f in found)] if found else ["Nothing looks wrong."]
    lines.append(f"Run took {elapsed_s:.0f} s.")
    print("\n".join(lines))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        doc = {
            "settings": {**{k: v for k, v in vars(args).items() if k != "out"}, "elapsed_s": round(elapsed_s, 1)},
            "measured": as_json(measured_table),
            "measured_pools_gbps": {"idle": pool, "busy": busy},
            "gpu_like": as_json(gpu_table),
            "findings": found,
        }
        (args.out / "detection_table.json").write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
