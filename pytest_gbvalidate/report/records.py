"""The JSON run report's records, declared once: the writer builds the report through them, report.schema.json is
generated from them, and the readers (the fleet summary, --gb-compare) check a report against them.

`REPORT_VERSION` changes when a field is removed or renamed, or its type or meaning changes; not for a new optional
field: a reader ignores fields it does not know."""

# No `from __future__ import annotations` here: TypedDict reads NotRequired from evaluated annotations only.
from collections.abc import Mapping
from typing import Any, Final, Literal

from typing_extensions import NotRequired, TypedDict

from pytest_gbvalidate.levels import Level
from pytest_gbvalidate.rules.xids import RepairAction

REPORT_VERSION = 2
RunStatus = Literal["running", "finished", "interrupted"]
# A number, or the text of one JSON cannot hold ("nan", "inf"): a broken measurement is kept, not dropped.
Number = float | str
# Whose problem a failure is (faults.yaml's classes); a drain reason starts with it (`gbvalidate: [hardware] ...`).
ReasonClass = Literal["hardware", "configuration", "job_leftovers"]
Phase = Literal["setup", "call", "teardown"]  # pytest's `when`, without `collect`
# A measurement's verdict, as every reader takes it: pass, warn or fail against its baseline's limits
# (baselines/verdicts.py); unresolved, too noisy for the resolution its metric needs (rules/resolution.py: neither a
# pass nor a fail); info, gated by nothing; skip, no reference; recorded, measured for a --gb-record with no baseline.
Verdict = Literal["pass", "warn", "fail", "unresolved", "info", "skip", "recorded"]
PASS: Final = "pass"  # noqa: S105 (a verdict, not a password)
WARN: Final = "warn"
FAIL: Final = "fail"
UNRESOLVED: Final = "unresolved"
INFO: Final = "info"
SKIP: Final = "skip"
RECORDED: Final = "recorded"
# Against the earlier report (compare.py): not worse than allowed, worse, worse by no more than its resolution
# allows, too noisy to tell, or not compared (the GPU was replaced).
CompareVerdict = Literal["ok", "regressed", "within_noise", "unresolved", "gpu_replaced"]

CreatedDirectory = TypedDict("CreatedDirectory", {"path": str, "for": str})


class SkuRecord(TypedDict):
    name: str
    source: str  # where the SKU came from: the command line, detection, ...
    baseline_file: str | None  # None: the SKU has no baseline yet (recording one)


class NodeRecord(TypedDict):
    """The node and the software that explains its figures (node/facts.py); the GPU stack on GPU SKUs only."""

    hostname: str
    machine: NotRequired[str]
    python: NotRequired[str]
    pytest_gbvalidate: NotRequired[str]
    torch: NotRequired[str]
    cuda_runtime: NotRequired[str]
    nccl: NotRequired[str]
    driver: NotRequired[str]
    cuda_driver: NotRequired[str]


class SettingRecord(TypedDict):
    """A setting's value as the run used it (paths as text) and where it came from (settings.py)."""

    value: Any
    source: str


class FaultRecord(TypedDict):
    """A failure's category in the fault table (faults.yaml) and what the operator does about it."""

    category: str
    title: str
    action: str
    disposition: str
    why: str | None  # the rule that matched; None for the default category
    reason_class: NotRequired[ReasonClass]  # absent: hardware
    repair: NotRequired[RepairAction]  # what brings the node back


class TestRecord(TypedDict):
    """One phase of a test that ran (`call`) or did not pass (`setup`, `teardown`)."""

    test_id: str
    when: Phase
    outcome: Literal["passed", "failed", "skipped"]
    duration_s: float
    message: str | None  # what went wrong, in one line
    text: str | None  # all of it, as the terminal shows it
    fault: NotRequired[FaultRecord]
    level: NotRequired[Level]  # the level the check belongs to (levels.py)


class WritableInputRecord(TypedDict):
    """An input that decides verdicts, and who besides root and the running user could have written it."""

    input: str  # what it is: `the baseline`, `the earlier report`
    path: str
    problem: str  # the file or directory on its path others can write, and how


class RunToRunRecord(TypedDict):
    """One figure across the node's last `runs` kept runs: their median, robust spread (scaled MAD, percent of the
    median) and the figure's modified z-score among them (a string for an infinite one)."""

    runs: int
    median: float
    spread_pct: float
    z: Number


class ResolutionRecord(TypedDict):
    """What a judged figure's evidence can tell (rules/resolution.py): the smallest change `pct`, from the robust
    spreads `spreads` (name -> percent: samples, reference, run_to_run), against the resolution the metric needs
    (`needed_pct`, from `needed_source`). A figure whose `pct` exceeds `needed_pct` is judged only where its
    verdict holds against its whole resolution; elsewhere it is unresolved."""

    pct: float
    spreads: dict[str, float]
    needed_pct: float
    needed_source: str


class MeasurementCompareRecord(TypedDict):
    """With --gb-compare: the measurement against the same one in the node's earlier report."""

    earlier_value: float
    earlier_date: str
    date: str
    delta_pct: Number | None
    allowed_pct: float | None
    verdict: CompareVerdict
    message: str
    resolution: NotRequired[ResolutionRecord]
    noise_margin_pct: NotRequired[float]  # resolution.pct (percent), kept for readers of this earlier field
    run_to_run: NotRequired[RunToRunRecord]  # --gb-history, from noise.MIN_RUNS kept runs: part of the resolution


class NoiseRecord(TypedDict):
    """How a figure was summarised and how much its samples spread (rules/noise.py): `median` of `count` samples, or
    `best_pass` of `count` passes (each pass's figure in `passes`); `spread_pct` is their scaled MAD in percent of
    the figure (one sample's spread), `error_pct` the figure's own error."""

    summary: str
    count: int
    spread_pct: float
    passes: NotRequired[list[float]]
    # Percent of its measuring time spent waiting for a CPU another task held (node/neighbours.py): a fall those
    # waits explain is no verdict on the node (rules/resolution.py).
    cpu_wait_pct: NotRequired[float]
    error_pct: NotRequired[float]  # percent: the standard error of its median (noise.Noise.error_of)


class MeasurementRecord(TypedDict):
    """One measurement, whatever its verdict. `expected` to `provenance` come from the baseline's reference."""

    test_id: str
    metric: str
    scope: str  # gpu3, 1GiB, gpu0->gpu1, node, ...
    scope_kind: str  # metrics.SCOPE_KINDS
    value: Number | None  # None: planned but not run (the message says why)
    unit: str
    direction: Literal["higher", "lower"]
    details: dict[str, Any]  # what the check adds: sizes, times, tool, placement, per-rank figures
    verdict: Verdict
    message: str
    expected: NotRequired[float | None]
    limit: NotRequired[float | None]
    warn_limit: NotRequired[float | None]
    delta_pct: NotRequired[float | None]
    status: NotRequired[str]  # the baseline's: measured or provisional
    provenance: NotRequired[str]
    compare: NotRequired[MeasurementCompareRecord]
    noise: NotRequired[NoiseRecord]  # where the figure came from samples or passes
    resolution: NotRequired[ResolutionRecord]  # where a reference judged it


class NcclVariableRecord(TypedDict):
    value: str
    source: str  # the baseline's params, or the environment


class AllowedRegressionRecord(TypedDict):
    default_pct: float | None
    by_metric: dict[str, float]


class PaceFirstPassRecord(TypedDict):
    """Where the run's first pass would have regressed its pace: the run measured its checks again (its figures in
    no other section) and its pace is of each figure's better pass; this is the first pass's alone."""

    measured_again: int  # the figures the second pass measured
    worse_pct: float
    z: float | str
    share_z: float | str | None
    verdict: Literal["ok", "regressed"]


class RunPaceRecord(TypedDict):
    """With --gb-compare and --gb-history (from noise.MIN_RUNS + 1 kept runs on): the run as a whole against the
    node's kept runs (compare.run_pace). `regressed` fails the run's `gbvalidate::node_pace` test."""

    figures: int  # the figures the node's runs give a spread for
    runs: int  # the node's kept runs of this SKU they are judged against
    worse_pct: float  # the figures' median change, + to the worse side
    worse_z: float  # their median modified z among the runs, + to the worse side
    earlier_worse_z: list[float]  # the same of each kept run, against the others
    z: float | str  # this run's among those: "inf" where they all agree
    # The share of figures more than pace.SHARE_Z of the runs' spreads worse, each kept run's, and this run's modified
    # z among those (None under noise.MIN_RUNS): a node slower across the board moves its share before its median.
    # Either z beyond the cut-off, and worse_pct beyond allowed_pct, is `regressed`.
    worse_share: NotRequired[float]
    earlier_worse_share: NotRequired[list[float]]
    share_z: NotRequired[float | str | None]
    allowed_pct: float
    verdict: Literal["ok", "regressed"]
    message: str
    first_pass: NotRequired[PaceFirstPassRecord]


class RunCompareRecord(TypedDict):
    """With --gb-compare: the earlier report this run is compared with, and what changed on the node since."""

    path: str
    source: str
    earlier_date: str
    earlier_status: str
    allowed: AllowedRegressionRecord | None  # None: rules/allowed.compare_fail_default()
    allowed_source: str
    replaced_gpus: dict[str, str]  # gpuN -> what it was before
    notes: list[str]
    pace: NotRequired[RunPaceRecord]


class HostRecord(TypedDict):
    node_rank: int  # as the rendezvous numbered the nodes in this run
    hostname: str


class GangRecord(TypedDict):
    """The ranks the run measured on: started here (`local`) or torchrun's / srun's (`world`)."""

    kind: Literal["local", "world"]
    world_size: int
    device_type: str
    nodes: int
    hosts: list[HostRecord]
    failed_starts: list[str]  # start-ups that failed and were tried again, with why


class WorldRecord(TypedDict):
    world_size: int


class SuspectRecord(TypedDict):
    """A node a multi-node check finds at fault: the fleet summary drains it."""

    test_id: str
    host: str  # its hostname
    why: str
    fault: FaultRecord


class TelemetryRecord(TypedDict):
    """One sampler's series around a workload (node/telemetry.py)."""

    test_id: str
    label: str
    interval_s: float
    duration_s: float
    sample_count: int
    sources: list[str]
    errors: list[str]
    summary: dict[str, dict[str, float]]  # series -> mean, p5, p95
    t_s: list[float]
    series: dict[str, list[Number | None]]


class PlotRecord(TypedDict):
    metric: str
    path: str


class RecordedBaselineRecord(TypedDict):
    """What became of --gb-record."""

    path: str
    written: bool
    note: str


class LevelTimeRecord(TypedDict):
    """What the checks of one level took in a run: their tests, and every phase's duration summed (set-up
    included: the ranks start in the set-up of the first test that needs them)."""

    tests: int
    duration_s: float


class RunReportRecord(TypedDict):
    """The whole report. `status` is `running` until the session ends, so a file left by a killed run says it
    is partial."""

    report_version: int
    status: RunStatus
    exit_status: int | None
    start_time: str  # ISO 8601, UTC
    end_time: str | None
    sku: SkuRecord | None  # None until the run resolved its SKU
    level: NotRequired[Level]  # how much the run checks (levels.py); once the run resolved its SKU
    level_budget_s: NotRequired[float]  # what the level may take on the SKU it is made for (levels.BUDGET_S)
    level_times: NotRequired[dict[Level, LevelTimeRecord]]  # by the level of the checks
    node: NotRequired[NodeRecord]  # once the run resolved its SKU
    settings: dict[str, SettingRecord]  # every setting, by name
    created_directories: NotRequired[list[CreatedDirectory]]
    writable_inputs: NotRequired[list[WritableInputRecord]]  # files.writable_by_others
    # What narrowed the checks beyond the level (`-k 'copy'`, `-m ...`, `--deselect ...`, a test id): a subset, which
    # speaks for its node only where no whole run of the node came before it. Absent or empty: the whole level.
    narrowed_by: NotRequired[list[str]]
    tests: list[TestRecord]
    measurements: list[MeasurementRecord]
    nccl_env: NotRequired[dict[str, NcclVariableRecord]]
    compare: NotRequired[RunCompareRecord]
    world: NotRequired[WorldRecord]
    gang: NotRequired[GangRecord]
    gpus: NotRequired[dict[str, Any]]  # the GPU inventory (node/nvml.py)
    numa_map: NotRequired[dict[str, Any]]  # node/topology.py
    telemetry: NotRequired[list[TelemetryRecord]]
    suspects: NotRequired[list[SuspectRecord]]
    plots: NotRequired[list[PlotRecord]]
    plot_note: NotRequired[str]
    record: NotRequired[RecordedBaselineRecord]
    outputs_lost: NotRequired[list[str]]  # the files not written, each with why: such a run does not pass


def measurement_key(record: Mapping[str, Any]) -> tuple[str, str, str, str]:
    """What makes two measurements the same one: metric and scope, and for a collective sweep the placement
    (in place or out of place) and the tool (ours or nccl-tests), which share a metric and a size label."""
    details = record.get("details") or {}
    return record["metric"], record["scope"], str(details.get("placement", "")), str(details.get("tool", ""))
