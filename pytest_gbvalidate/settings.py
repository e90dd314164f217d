"""Settings with one precedence -- command line, then environment, then ini file, then default -- and errors
that say where a bad value came from. No pytest here: the plugin hands in what each source holds."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, cast

from pytest_gbvalidate import setting_values as sv
from pytest_gbvalidate.levels import DEFAULT_LEVEL, LEVELS, Level
from pytest_gbvalidate.node import window
from pytest_gbvalidate.rules.allowed import compare_fail_default
from pytest_gbvalidate.setting_values import ComputeDomain, SettingError, World, ancestors
from pytest_gbvalidate.setting_values import bundled_baselines as bundled_baselines  # re-exported: tests import it

if TYPE_CHECKING:
    from pytest_gbvalidate.compare import AllowedRegression
    from pytest_gbvalidate.report.records import SettingRecord

T = TypeVar("T")

AUTO = "auto"


@dataclass(frozen=True)
class Setting(Generic[T]):
    value: T
    source: str  # e.g. "--gb-sku on the command line", "GBVALIDATE_SKU in the environment", "default"

    @property
    def is_default(self) -> bool:
        return self.source == "default"


@dataclass(frozen=True)
class Sources:
    """The raw values each source holds, keyed by setting name (`sku`, `baselines`, `report`, `strict`)."""

    cli: Mapping[str, str | bool | None]
    env: Mapping[str, str]
    ini: Mapping[str, str]
    ini_file: Path | None
    cwd: Path


@dataclass(frozen=True)
class Settings:
    """Every setting of the run, each with where its value came from (TABLE says how each is given)."""

    sku: Setting[str]
    level: Setting[Level]  # how much of the suites the run takes on (levels.py)
    baselines: Setting[Path]
    report: Setting[Path | None]
    prometheus: Setting[Path | None]  # a node_exporter textfile collector's file, written at the end of the run
    history: Setting[Path | None]  # the directory of every node's kept reports, DIR/<hostname>/<time>.json
    window: Setting[Path | None]  # the node's window (node/window.py): None, every check judges since boot
    strict: Setting[bool]
    timeout: Setting[float | None]  # seconds one call on the ranks may take; None: the SKU's default
    compare: Setting[Path | Literal["last"] | None]  # an earlier JSON report of this node; last: the history's
    compare_fail: Setting[AllowedRegression | None]  # None: rules/allowed.compare_fail_default()
    scratch: Setting[Path | None]  # the local scratch volume the storage checks write to
    reference_tools: Setting[bool]  # also run nccl-tests / nvbandwidth when on PATH
    engine_python: Setting[tuple[str, ...] | None]  # the NeMo driver's command; None: the baseline's or this Python
    world: Setting[World]  # whether a launcher's variables make this process a rank of a world (ranks/world.py)
    compute_domain: Setting[ComputeDomain]  # whether IMEX is judged (setting_values.py)
    node_idle: Setting[bool]  # no job runs on the node now: a process on its GPUs is one a job left behind
    record: Setting[Path | None]  # command line only: a one-off action, not a standing configuration
    rerun_failed: Setting[Path | None]  # command line only: the earlier report whose failed checks to run again
    list_skus: Setting[bool]
    # Missing directories that writing the report or the recorded baseline will create, as pytest's --junitxml
    # creates its own: (where the path came from, the outermost missing directory).
    created_dirs: tuple[tuple[str, Path], ...] = ()

    @property
    def explicit(self) -> bool:
        """True when the user asked for gbvalidate in any way, so a bad value must fail the run."""
        return any(not self.get(spec.name).is_default for spec in TABLE)

    def get(self, name: str) -> Setting[Any]:
        return cast("Setting[Any]", getattr(self, name))

    def report_section(self) -> dict[str, SettingRecord]:
        """Every setting with its value (as JSON holds it) and its source, for the JSON report."""
        return {
            spec.name: {"value": _jsonable(self.get(spec.name).value), "source": self.get(spec.name).source}
            for spec in TABLE
        }


def _jsonable(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return list(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


def env_name(name: str) -> str:
    return f"GBVALIDATE_{name.upper()}"


def ini_name(name: str) -> str:
    return f"gb_{name}"


def cli_flag(name: str) -> str:
    return f"--gb-{name.replace('_', '-')}"


@dataclass(frozen=True)
class SettingSpec:
    """One row of the settings table: how a setting is given and read. Its command-line option, environment
    variable and ini key follow from its name (`--gb-compare-fail`, `GBVALIDATE_COMPARE_FAIL`, `gb_compare_fail`);
    a command-line-only setting has neither of the other two."""

    name: str
    parse: Callable[[str, Path], Any]  # the raw text and the directory a relative path is taken from
    default: Callable[[], Any]
    metavar: str | None = None  # None: an on-switch (`store_true`), given without a value
    cli_only: bool = False

    @property
    def help(self) -> str:
        return _HELP[self.name]

    @property
    def option(self) -> str:
        return cli_flag(self.name)

    @property
    def env(self) -> str | None:
        return None if self.cli_only else env_name(self.name)

    @property
    def ini(self) -> str | None:
        return None if self.cli_only else ini_name(self.name)


def resolve(sources: Sources) -> Settings:
    picked = {spec.name: _pick(sources, spec) for spec in TABLE}
    compare, history = picked["compare"], picked["history"]
    if compare.value == sv.LAST and history.value is None:
        raise SettingError(
            f"{compare.source}: 'last' compares with this node's latest report in the history directory, and none "
            f"is named: {cli_flag('history')} DIR, {env_name('history')} or {ini_name('history')}"
        )
    if sources.cli.get("compare_fail") is not None and compare.value is None:
        # On the command line it is this run's choice, and alone it would allow regressions against nothing. In
        # the environment or an ini file it is standing configuration, for the runs that also compare.
        raise SettingError(
            f"{picked['compare_fail'].source}: sets the regression --gb-compare allows, and no earlier report is "
            f"named: {cli_flag('compare')} PATH|last, {env_name('compare')} or {ini_name('compare')}"
        )
    # The history directory's own missing directories count from the directory itself, not from its parent.
    files = [(s.source, s.value) for s in (picked["report"], picked["prometheus"], picked["record"])]
    files += [] if history.value is None else [(history.source, history.value / "-")]
    created = tuple(
        (source, missing) for source, path in files if path is not None and (missing := ancestors(path)[1]) is not None
    )
    return Settings(**picked, created_dirs=created)


_EMPTY = "set but empty: give a value, or leave it unset for the default"


def _pick(sources: Sources, spec: SettingSpec) -> Setting[Any]:
    name = spec.name
    candidates: list[tuple[str | bool | None, str, Path]] = [
        (sources.cli.get(name), f"{spec.option} on the command line", sources.cwd)
    ]
    if spec.env is not None:
        candidates.append((sources.env.get(spec.env), f"{spec.env} in the environment", sources.cwd))
    if spec.ini is not None and sources.ini_file is not None:
        ini_dir = sources.ini_file.parent
        # An ini key that is present but empty reads as "", exactly as an absent one does (pytest hands addini's
        # default, "", for both), so in the ini file empty means unset and falls through to the default.
        ini = sources.ini.get(name) or None
        candidates.append((ini, f"{spec.ini} in {sources.ini_file}", ini_dir))
    for raw, source, base in candidates:
        if raw is None:
            continue
        if isinstance(raw, bool):
            return Setting(raw, source)  # an on-switch of the command line: already parsed
        if not raw.strip():
            # `GBVALIDATE_SKU=` or `--gb-sku=$SKU` from a CI template whose variable was unset: falling through
            # to the default would turn an explicit SKU into `auto` (on a node whose GPUs vanished, `cpu`).
            raise SettingError(f"{source}: {raw!a}: {_EMPTY}")
        try:
            return Setting(spec.parse(raw, base), source)
        except SettingError as exc:
            # ascii(): a value with look-alike or invisible characters is shown escaped, never as what it mimics.
            raise SettingError(f"{source}: {raw!a}: {exc}") from None
    return Setting(spec.default(), "default")


# Each setting's help text, for its option and its ini key.
_HELP = {
    "sku": "SKU to check against, or 'auto' to detect it (Azure metadata, NVML, else 'cpu'). Default: auto.",
    "level": f"how much to check: {', '.join(LEVELS)} (each runs the checks of the levels below it too). "
    f"Default: {DEFAULT_LEVEL}, the acceptance gate.",
    "baselines": "directory of <SKU>.yaml baselines. Default: the baselines shipped with pytest-gbvalidate.",
    "report": "write the JSON run report here (rewritten as results arrive).",
    "prometheus": "at the end of the run, write its measurements, verdicts and outcomes here as a Prometheus text "
    "file for node_exporter's textfile collector (name it *.prom; needs pytest-gbvalidate[prometheus]).",
    "history": "at the end of the run, keep its JSON report as DIR/<hostname>/<UTC start time>.json (the node's "
    "history, for --gb-compare=last and `python -m pytest_gbvalidate.fleet history`).",
    "window": "the file that keeps where the kernel log and the error counters stood at each check's last clean "
    "run, so an Xid or an error is judged once and counters as rates since then; 'none': judge everything since "
    f"boot. Default: {window.DEFAULT_PATH} (emptied by a reboot).",
    "strict": "fail, rather than skip, a measurement the baseline has no reference for.",
    "timeout": "seconds one call on the ranks may take before the gang is torn down and the test fails, "
    f"{sv.MIN_TIMEOUT_S:g} to {sv.MAX_TIMEOUT_S:g} (a week). Default: 300 on GPU SKUs, 30 on cpu.",
    "compare": "also compare every measurement with the same one in this earlier JSON report of the same node, or "
    "with 'last': its latest report in --gb-history; a regression beyond the allowed percentage fails the test (as "
    "pytest-benchmark's --benchmark-compare).",
    "compare_fail": "the regression --gb-compare allows, [METRIC:]PCT%, comma-separated (e.g. 5% or "
    f"'3%,all_reduce_busbw_gbps:2%'). Default: {compare_fail_default()}.",
    "scratch": "the local scratch directory the storage checks write to (the node's NVMe volume). Default: a "
    "temporary directory on cpu; on GPU SKUs the storage checks skip without one.",
    "reference_tools": "also run nccl-tests (all_reduce_perf, ...) and nvbandwidth when they are on PATH, and report "
    "their figures beside ours.",
    "engine_python": "the Python the NeMo engines' driver runs under, with any launcher before it (e.g. "
    "/opt/nemo/bin/python, or 'srun --container-image=nvcr.io/nvidia/nemo:25.04 python'). Default: the baseline's "
    "pretrain.engine_python, else this interpreter.",
    "world": "auto: under torchrun or srun this process is one rank of the launcher's world (srun's tasks, not a "
    "batch script); none: it is one node's own run whatever a launcher set (e.g. per-node checks started on every "
    "node by one srun). Default: auto.",
    "compute_domain": "whether this node is to be in a multi-node NVLink compute domain now, so that IMEX must be "
    "ready: expected; none (IMEX is not judged); auto: judged where IMEX is set up on the node (a channel device or "
    "the nvidia-imex daemon), not on an idle node outside any domain. Default: auto.",
    "node_idle": "no job runs on this node now: a process on its GPUs is one a job left behind, and fails "
    "test_no_leftover_gpu_processes (the Slurm health check sets it where Slurm says the node is idle).",
    "record": "write a baseline for this node from this run's measurements to PATH (the file name is the SKU).",
    "rerun_failed": "run only the checks that failed in this earlier JSON report (run/rerun.py; same paths as that "
    "run).",
    "list_skus": "list known SKUs and exit.",
}

# Every setting, in the order `--help` lists them. Options, environment variables, ini keys, `--help` and the
# report's `settings` section are all made from this table.
TABLE: tuple[SettingSpec, ...] = (
    SettingSpec("sku", sv.parse_sku, lambda: AUTO, "NAME"),
    SettingSpec("level", sv.parse_level, lambda: DEFAULT_LEVEL, "LEVEL"),
    SettingSpec("baselines", sv.parse_dir, bundled_baselines, "DIR"),
    SettingSpec("report", sv.parse_output_path, lambda: None, "PATH"),
    SettingSpec("prometheus", sv.parse_prometheus_path, lambda: None, "PATH"),
    SettingSpec("history", sv.parse_history_dir, lambda: None, "DIR"),
    SettingSpec("window", sv.parse_window, lambda: window.DEFAULT_PATH, "PATH|none"),  # read when asked: tests move it
    SettingSpec("strict", sv.parse_bool, lambda: False),
    SettingSpec("timeout", sv.parse_timeout, lambda: None, "SECONDS"),
    SettingSpec("compare", sv.parse_compare, lambda: None, "PATH|last"),
    SettingSpec("compare_fail", sv.parse_allowed_regression, lambda: None, "[METRIC:]PCT%"),
    SettingSpec("scratch", sv.parse_scratch_dir, lambda: None, "DIR"),
    SettingSpec("reference_tools", sv.parse_bool, lambda: False),
    SettingSpec("engine_python", sv.parse_command, lambda: None, "COMMAND"),
    SettingSpec("world", lambda raw, _: sv.one_of(raw, sv.WORLDS), lambda: AUTO, "WORLD"),
    SettingSpec("compute_domain", lambda raw, _: sv.one_of(raw, sv.COMPUTE_DOMAINS), lambda: AUTO, "MODE"),
    SettingSpec("node_idle", sv.parse_bool, lambda: False),
    SettingSpec("record", sv.parse_record_path, lambda: None, "PATH", cli_only=True),
    SettingSpec("rerun_failed", sv.parse_input_file, lambda: None, "REPORT", cli_only=True),
    SettingSpec("list_skus", sv.parse_bool, lambda: False, cli_only=True),
)
