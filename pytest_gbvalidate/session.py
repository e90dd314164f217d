"""The per-run state of pytest-gbvalidate and the hooks that use it (plugin.py registers one GbSession).

The SKU and its baseline are resolved once, lazily: at start-up when the user asked for gbvalidate in any way
(a `--gb-*` option, its environment variable or ini key), else when the first collected test uses one of our
fixtures. An unrelated test run in the same environment never detects anything nor imports torch or NVML.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_gbvalidate import report as rp
from pytest_gbvalidate.metrics import CATALOG, MetricSpec
from pytest_gbvalidate.ranks.world import world_from_environment, world_rank
from pytest_gbvalidate.settings import AUTO, Setting, Settings

if TYPE_CHECKING:
    from pytest_gbvalidate import baselines as bl
    from pytest_gbvalidate.ranks.gang import Gang
    from pytest_gbvalidate.sku import Detection

# Loaded in every pytest run of the environment: baselines (PyYAML), detection (urllib, NVML) and node facts
# are imported where they are first used, once gbvalidate is engaged.

ENGAGING_FIXTURES = frozenset({"gb_expect", "gb_target", "gb_gang", "gb_gpu_pair"})
GPU_MARKER = "gb_gpu"
CPU_RANKS = 2  # ranks of a gang on a CPU-only SKU: enough for every collective and PP=2, cheap on 2 cores
# How long one call on the ranks may take (--gb-timeout overrides): a GPU sweep to 16 GiB, or NCCL setting up
# its communicators on many nodes, takes minutes at worst; the CPU smoke run finishes in seconds.
DEFAULT_TIMEOUT_S = {"gpu": 300.0, "cpu": 30.0}
MEASUREMENTS = pytest.StashKey[list[dict[str, Any]]]()
REPORT_RECORDS = pytest.StashKey[list[tuple[str, dict[str, Any]]]]()


class GbValidateWarning(UserWarning):
    """A measurement in its SKU's warn band: the test passes, the reports mark it."""


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


@dataclass(frozen=True)
class ReferenceTools:
    """Whether this run also runs NVIDIA's reference tools (--gb-reference-tools), and how."""

    enabled: bool
    reason: str  # why not, when not
    env: dict[str, str]  # the NCCL environment the ranks get, for nccl-tests
    timeout_s: float


class GbSession:
    def __init__(self, config: pytest.Config, settings: Settings) -> None:
        self.config = config
        self.settings = settings
        # The xdist controller, or the only process; under torchrun / srun, global rank 0 (every rank runs the
        # same tests and reaches the same verdicts; one writes the reports).
        self.world_rank = world_rank(os.environ)
        self.is_controller = not hasattr(config, "workerinput") and self.world_rank in (None, 0)
        self.report = rp.RunReport(settings.report.value if self.is_controller else None)
        self._target: Target | None = None
        self._header_shown = False
        self.node_facts: dict[str, str] = {}
        self._pending_sections: dict[str, Any] = {}
        self.nccl_env: dict[str, dict[str, str]] = {}  # variable -> {value, source}, as the ranks get it
        self.plot_note: str | None = None
        self._gang: Gang | None = None
        self._gang_reported = -1  # failed start-ups already in the report's gang section
        self.record_note: str | None = None  # what became of --gb-record

    # --- resolving the SKU ---------------------------------------------------------------------------------

    @property
    def engaged(self) -> bool:
        return self._target is not None

    @property
    def target(self) -> Target:
        if self._target is None:
            self._target = self._resolve()
            self.nccl_env = self._nccl_environment(self._target)
            if self.is_controller:
                self._describe_run(self._target)
        return self._target

    def _resolve(self) -> Target:
        from pytest_gbvalidate import baselines as bl
        from pytest_gbvalidate.sku import Detection, DetectionError

        s = self.settings
        directory = s.baselines.value
        if not directory.is_dir():
            raise pytest.UsageError(f"baselines directory {directory} ({s.baselines.source}) does not exist")
        try:
            if s.sku.value == AUTO:
                every = bl.load_all(directory)
                detection = self.config.hook.pytest_gbvalidate_detect_sku(config=self.config, baselines=every)
                loaded = {b.sku: b for b in every}
            else:
                detection, loaded = Detection(s.sku.value, s.sku.source), {}
            path = bl.baseline_path(directory, detection.sku)
            if detection.sku in loaded:
                baseline: bl.Baseline | None = loaded[detection.sku]
            elif path.is_file():
                baseline = bl.load_baseline(path)
            elif s.record is not None:
                return Target(detection.sku, detection.source, directory, None, _node_gpu_count())
            else:
                raise pytest.UsageError(_unknown_sku_message(detection, directory))
        except bl.BaselineError as exc:
            raise pytest.UsageError(f"bad baseline: {exc}") from None
        except DetectionError as exc:
            raise pytest.UsageError(f"SKU auto-detection ({s.sku.source}): {exc}") from None
        return Target(detection.sku, detection.source, directory, baseline)

    def _describe_run(self, target: Target) -> None:
        from pytest_gbvalidate.node.facts import software_facts

        self.node_facts = software_facts(gpu=target.is_gpu)
        s = self.settings
        self.report.data.update(
            sku={
                "name": target.sku,
                "source": target.source,
                "baseline_file": str(target.baseline_file) if target.baseline else None,
            },
            node=self.node_facts,
            settings={
                "sku": {"value": s.sku.value, "source": s.sku.source},
                "baselines": {"value": str(s.baselines.value), "source": s.baselines.source},
                "report": {"value": None if s.report.value is None else str(s.report.value), "source": s.report.source},
                "strict": {"value": s.strict.value, "source": s.strict.source},
                "record": None if s.record is None else str(s.record),
                # Directories the report or the recorded baseline is written into that did not exist: created.
                "created_directories": [{"path": str(path), "for": source} for source, path in s.created_dirs],
                "timeout_s": {"value": self.timeout.value, "source": self.timeout.source},
                "reference_tools": {"value": s.reference_tools.value, "source": s.reference_tools.source},
            },
            nccl_env=self.nccl_env,
        )
        world = world_from_environment(os.environ)
        if world is not None:
            self.report.data["world"] = {"world_size": world[1]}
        self.report.write()

    # --- ranks: timeout, NCCL environment, the gang ---------------------------------------------------------

    @property
    def timeout(self) -> Setting[float]:
        """Seconds one call on the ranks may take: --gb-timeout and friends, else the SKU's default."""
        chosen = self.settings.timeout
        if chosen.value is not None:
            return Setting(chosen.value, chosen.source)
        kind = "gpu" if self.target.is_gpu else "cpu"
        return Setting(DEFAULT_TIMEOUT_S[kind], f"default for a {'GPU' if kind == 'gpu' else 'CPU-only'} SKU")

    def _nccl_environment(self, target: Target) -> dict[str, dict[str, str]]:
        """What the ranks' NCCL runs with: the baseline's `params.nccl_env` (what its figures were taken with),
        except where this process's environment already sets a variable -- the operator's word wins, and the
        report says so -- plus every other NCCL_* variable of the environment."""
        from pytest_gbvalidate import baselines as bl

        try:
            asked = {} if target.baseline is None else bl.nccl_env(target.baseline)
        except bl.BaselineError as exc:
            raise pytest.UsageError(f"bad baseline: {exc}") from None
        env: dict[str, dict[str, str]] = {}
        for name, (value, where) in sorted(asked.items()):
            source = f"baseline {target.sku} ({where} params)"
            if name in os.environ and os.environ[name] != value:
                env[name] = {"value": os.environ[name], "source": f"environment (the baseline asks for {value})"}
            else:
                env[name] = {"value": value, "source": source}
        for name in sorted(os.environ):
            if name.startswith("NCCL_") and name not in env:
                env[name] = {"value": os.environ[name], "source": "environment"}
        return env

    def reference_tools(self) -> ReferenceTools:
        s = self.settings.reference_tools
        env = {name: v["value"] for name, v in self.nccl_env.items()}
        if not s.value:
            reason = (
                "reference tools not asked for (--gb-reference-tools, GBVALIDATE_REFERENCE_TOOLS, gb_reference_tools)"
            )
            return ReferenceTools(False, reason, env, self.timeout.value)
        if self.world_rank is not None:
            reason = "reference tools run from a single-node pytest, not under torchrun / srun"
            return ReferenceTools(False, reason, env, self.timeout.value)
        return ReferenceTools(True, "", env, self.timeout.value)

    def make_gang(self) -> Gang:
        """The session's ranks: this process's torchrun / srun world when it is in one, else local ranks (one per
        GPU, or CPU_RANKS on the CPU) started on first use, with the SKU's NCCL environment and the timeout."""
        from pytest_gbvalidate.ranks.gang import LocalGang, WorldGang

        t = self.target
        timeout_s = self.timeout.value
        env = {name: v["value"] for name, v in self.nccl_env.items() if name not in os.environ}
        world = world_from_environment(os.environ)
        gang: Gang
        if world is not None:
            gang = WorldGang(*world, device_type=t.device_type, timeout_s=timeout_s, env=env)
        else:
            # The call timeout bounds every call; the ranks' own collective timeout is only a backstop, longer,
            # so that the call timeout fires first and can say which rank is stuck where.
            gang = LocalGang(
                t.local_world_size,
                device_type=t.device_type,
                env=env,
                collective_timeout_s=2 * timeout_s,
                call_timeout_s=timeout_s,
            )
        self._gang = gang
        self._gang_section()
        return gang

    def _gang_section(self) -> None:
        """The JSON report's `gang` section, sent to the controller like any section (the gang lives in an xdist
        worker under -n), and sent again whenever a start-up of the ranks failed and was retried."""
        gang = self._gang
        if gang is None:
            return
        failed_starts = list(getattr(gang, "failed_starts", []))  # a torchrun / srun world is never started by us
        if self._gang_reported == len(failed_starts):
            return
        self._gang_reported = len(failed_starts)
        kind = "world" if world_from_environment(os.environ) is not None else "local"
        section = {"kind": kind, "world_size": gang.world_size, "device_type": self.target.device_type}
        self.set_report_section("gang", section | {"failed_starts": failed_starts})

    def header_lines(self) -> list[str]:
        if not self.engaged or self._header_shown:
            return []
        self._header_shown = True
        t = self.target
        baseline = str(t.baseline_file) if t.baseline else "none yet (recording)"
        facts = self.node_facts
        stack = ", ".join(f"{k} {facts[k]}" for k in ("driver", "cuda_driver", "nccl", "torch") if k in facts)
        line = f"gbvalidate: SKU {t.sku} ({t.source}); baseline {baseline}"
        if self.world_rank not in (None, 0):  # the node facts and the reports are global rank 0's
            return [f"{line}; rank {self.world_rank} of a torchrun / srun world (rank 0 writes the reports)"]
        created = [
            f"gbvalidate: {source}: creating missing directory {path}" for source, path in self.settings.created_dirs
        ]
        return [f"{line}; {stack}", *created]

    # --- pytest hooks ---------------------------------------------------------------------------------------

    def pytest_report_header(self) -> list[str]:
        return self.header_lines()

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Under torchrun / srun only global rank 0 writes the JUnit XML, as it alone writes the JSON report:
        every rank would otherwise write the same path. Only when gbvalidate was asked for explicitly, so an
        unrelated test suite launched by torchrun keeps its own behaviour."""
        if self.world_rank in (None, 0) or not self.settings.explicit:
            return
        from _pytest.junitxml import xml_key

        xml = self.config.stash.get(xml_key, None)
        if xml is not None:
            del self.config.stash[xml_key]
            self.config.pluginmanager.unregister(xml)

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        if not self.settings.explicit and not any(ENGAGING_FIXTURES & set(_fixturenames(i)) for i in items):
            return
        if self.target.is_gpu:
            return
        skip = pytest.mark.skip(reason=f"needs NVIDIA GPUs; this run checks the {self.target.sku} SKU, which has none")
        for item in items:
            if item.get_closest_marker(GPU_MARKER) is not None:
                item.add_marker(skip)

    def pytest_report_collectionfinish(self) -> list[str]:
        return self.header_lines()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        records = item.stash.get(MEASUREMENTS, [])
        if records:
            # A plain attribute survives xdist's report serialisation, so the controller receives it.
            report.gb_measurements = records  # type: ignore[attr-defined]
            item.stash[MEASUREMENTS] = []
        self._gang_section()
        self._attach_report_sections(item, report)
        return report

    @pytest.hookimpl(tryfirst=True)  # before junitxml writes the testcase's properties
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not self.is_controller:
            return
        if report.when == "teardown" and not _junit_has_testcase_properties(self.config):
            report.user_properties = [(k, v) for k, v in report.user_properties if not k.startswith("gb_")]
        records: list[dict[str, Any]] = getattr(report, "gb_measurements", [])
        if records:
            _ = self.target  # a worker measured: resolve here too, for the report's header
            self.report.add_measurements(records)
        self._merge_report_sections(report)
        if report.when == "call" or report.outcome != "passed":
            message, text = (None, None) if report.passed else _failure_text(report)
            self.report.add_test(report.nodeid, report.when, report.outcome, report.duration, message, text)
        if self.engaged and (records or report.when == "teardown"):
            self.report.write()

    @pytest.hookimpl(tryfirst=True)  # before junitxml writes its file
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if not self.is_controller or not self.engaged:
            return
        t = self.target
        _add_junit_suite_properties(self.config, {"sku": t.sku, "sku_source": t.source, **self.node_facts})
        self._attach_busbw_plot()
        _add_junit_suite_properties(self.config, {name: v["value"] for name, v in self.nccl_env.items()})
        if self.settings.record is not None:
            self._record(session, exitstatus, self.settings.record)
        interrupted = exitstatus == pytest.ExitCode.INTERRUPTED
        self.report.finish(int(exitstatus), "interrupted" if interrupted else "finished")
        self.report.write()

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.is_controller or not self.engaged:
            return
        t = self.target
        measurements = self.report.measurements
        terminalreporter.section(f"gbvalidate: {t.sku} measured vs baseline")
        from pytest_gbvalidate.baselines import INFO

        gated = [m for m in measurements if m["verdict"] != INFO]
        if gated:
            for line in rp.terminal_table(gated):
                terminalreporter.write_line(line)
        else:
            terminalreporter.write_line("no measurements")
        if len(gated) < len(measurements):
            terminalreporter.write_line(
                f"(and {len(measurements) - len(gated)} measurements no baseline gates: in the tables below and "
                "the JSON report)"
            )
        tables = rp.sweep_tables(measurements)
        if tables:
            terminalreporter.section("gbvalidate: collectives, per message size (nccl-tests columns)")
            for line in tables:
                terminalreporter.write_line(line)
        for plot in self.report.data.get("plots", []):
            terminalreporter.write_line(f"busbw plot: {plot['path']}")
        if self.plot_note:
            terminalreporter.write_line(self.plot_note)
        if self.settings.report.value is not None:
            terminalreporter.write_line(f"JSON report: {self.settings.report.value}")
        if self.record_note is not None:
            terminalreporter.write_line(self.record_note)
        failed_starts = self.report.data.get("gang", {}).get("failed_starts", [])
        if failed_starts:
            terminalreporter.write_line(f"the ranks' start-up failed {len(failed_starts)} time(s) and was tried again:")
            for reason in failed_starts:
                terminalreporter.write_line(f"  {reason}")

    def _attach_busbw_plot(self) -> None:
        """A PNG of busbw against size next to the JSON report (else the JUnit XML), named in both."""
        if not rp.sweep_records(self.report.measurements):
            return
        base = self.settings.report.value or _junit_path(self.config)
        if base is None:
            self.plot_note = "busbw plot: not drawn (it is written next to --gb-report or --junitxml)"
            return
        path = base.with_name(f"{base.stem}.busbw.png")
        try:
            rp.busbw_plot(self.report.measurements, path, f"{self.target.sku}: bus bandwidth per message size")
        except ImportError:
            self.plot_note = "busbw plot: skipped, matplotlib is not installed (pip install 'pytest-gbvalidate[plots]')"
            self.report.data["plot_note"] = self.plot_note
            return
        self.report.data.setdefault("plots", []).append({"metric": "busbw_gbps", "path": str(path)})
        _add_junit_suite_properties(self.config, {"busbw_plot": str(path)})

    def _record(self, session: pytest.Session, exitstatus: int, path: Path) -> None:
        """Write the recorded baseline, but only from a run that ran every test it collected: an interrupted or
        stopped run (Ctrl-C, -x, --maxfail, an internal error) would replace a baseline with part of one."""
        complete = exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED) and not (
            session.shouldfail or session.shouldstop
        )
        if complete:
            self._write_record(path)
            self.record_note = f"recorded baseline: {path}"
        else:
            why = pytest.ExitCode(exitstatus).name.lower() if exitstatus != pytest.ExitCode.TESTS_FAILED else "stopped"
            kept = "left as it was" if path.exists() else "not written"
            self.record_note = f"nothing recorded: the run did not complete ({why}); {path} {kept}"
        self.report.data["record"] = {"path": str(path), "written": complete, "note": self.record_note}

    def _write_record(self, path: Path) -> None:
        from pytest_gbvalidate import baselines as bl

        t = self.target
        facts = self.node_facts
        stack = ", ".join(f"{k} {v}" for k, v in facts.items() if k != "hostname")
        provenance = f"measured on {facts.get('hostname', '?')} ({rp.utc_now()[:10]}; {stack}) by --gb-record"
        doc = bl.recorded_baseline(path.stem, t.baseline, self.report.measurements, provenance, t.node_gpu_count)
        rp.atomic_write_text(path, bl.dump_baseline(doc))

    # --- report sections beyond measurements: GPU inventory, NUMA map, telemetry -----------------------------
    # Probed wherever the test runs (an xdist worker, or this process) and carried to the controller on test
    # reports as plain attributes, like the measurements.

    def set_report_section(self, name: str, value: Any) -> None:
        """A section of the JSON report about the whole node (`gpus`, `numa_map`), sent with the next report."""
        self._pending_sections[name] = value

    def add_report_record(self, item: pytest.Item, section: str, record: dict[str, Any]) -> None:
        """A record of one test for a list section of the JSON report (`telemetry`)."""
        item.stash.setdefault(REPORT_RECORDS, []).append((section, record))

    def _attach_report_sections(self, item: pytest.Item, report: pytest.TestReport) -> None:
        if self._pending_sections:
            report.gb_sections = self._pending_sections  # type: ignore[attr-defined]
            self._pending_sections = {}
        records = item.stash.get(REPORT_RECORDS, [])
        if records:
            report.gb_records = records  # type: ignore[attr-defined]
            item.stash[REPORT_RECORDS] = []

    def _merge_report_sections(self, report: pytest.TestReport) -> None:
        for name, value in getattr(report, "gb_sections", {}).items():
            self.report.set_section(name, value)
        for section, record in getattr(report, "gb_records", []):
            self.report.add_record(section, record)


class Expect:
    """`gb_expect(metric, value, scope=...)`: compare a measurement with the SKU baseline inside the test that
    measured it. Fails the test below the fail limit, warns in the warn band, skips (or, with --gb-strict,
    fails) when the baseline has no reference for it. Every call is recorded in the reports, whatever the
    verdict."""

    def __init__(self, gb: GbSession, item: pytest.Item) -> None:
        self.gb = gb
        self.item = item

    def __call__(
        self,
        metric: str,
        value: float,
        scope: str = "node",
        *,
        spec: MetricSpec | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> bl.Verdict | None:
        from pytest_gbvalidate import baselines as bl

        target = self.gb.target
        ref = target.reference(metric, scope)
        value = float(value)
        spec, record = self._record(metric, value, scope, spec, ref, details)
        if ref is not None and (ref.unit, ref.direction) != (spec.unit, spec.direction):
            reason = f"{metric}: measured in {spec.unit} ({spec.direction} is better) but the baseline says "
            reason += f"{ref.unit} ({ref.direction} is better) in {target.baseline_file}"
            self._store(record | {"verdict": bl.FAIL, "message": reason})
            pytest.fail(reason, pytrace=False)
        if ref is None or not ref.has_reference:
            if self.gb.settings.record is not None:
                self._store(record | {"verdict": "recorded", "message": "recorded, no baseline to compare with"})
                return None
            reason = _no_reference_reason(target, metric, scope, ref)
            strict = self.gb.settings.strict.value
            self._store(record | {"verdict": bl.FAIL if strict else "skip", "message": reason})
            if strict:
                pytest.fail(f"{reason} (--gb-strict)", pytrace=False)
            # Reported at the test's own location, as a skip marker would be, not at this line.
            raise pytest.skip.Exception(reason, _use_item_location=True)
        verdict = bl.compare(ref, value, scope)
        self._store(record | verdict.as_dict() | {"value": rp.json_safe(value)})
        if verdict.verdict == bl.FAIL:
            pytest.fail(verdict.message, pytrace=False)
        if verdict.verdict == bl.WARN:
            # Attributed to the test itself, however deep the helper that measured it sits.
            path, line, _ = self.item.location
            warnings.warn_explicit(GbValidateWarning(verdict.message), GbValidateWarning, path, (line or 0) + 1)
        return verdict

    def record(
        self,
        metric: str,
        value: float,
        scope: str = "node",
        *,
        spec: MetricSpec | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        """Keep a measurement in the reports without comparing it with anything (verdict `info`): the sizes of
        a sweep that the baseline does not gate, so every measured size is reported."""
        from pytest_gbvalidate.baselines import INFO

        _, record = self._record(metric, float(value), scope, spec, self.gb.target.reference(metric, scope), details)
        self._store(record | {"verdict": INFO, "message": "measured; not gated at this scope"})

    def not_measured(
        self, metric: str, scope: str, reason: str, *, gated: bool, details: Mapping[str, Any] | None = None
    ) -> None:
        """Keep, in the reports, a measurement that was planned but not taken (a sweep size too large for the
        free memory): verdict `fail` where the scope is gated (the caller fails the test), else `info`."""
        from pytest_gbvalidate import baselines as bl

        ref = self.gb.target.reference(metric, scope)
        _, record = self._record(metric, None, scope, None, ref, details)
        self._store(record | {"verdict": bl.FAIL if gated else bl.INFO, "message": f"not run: {reason}"})

    def _record(
        self,
        metric: str,
        value: float | None,
        scope: str,
        spec: MetricSpec | None,
        ref: bl.Reference | None,
        details: Mapping[str, Any] | None,
    ) -> tuple[MetricSpec, dict[str, Any]]:
        """The metric's spec (built-in, given, or the baseline's) and the measurement's report record."""
        spec = spec or CATALOG.get(metric) or _spec_from(ref)
        if spec is None:
            raise TypeError(f"{metric!r} is not a built-in metric: pass spec=MetricSpec(...) to say its unit")
        record = {
            "test_id": self.item.nodeid,
            "metric": metric,
            "scope": scope,
            "scope_kind": spec.scope_kind,
            "value": None if value is None else rp.json_safe(value),
            "unit": spec.unit,
            "direction": spec.direction,
            "details": dict(details or {}),
        }
        return spec, record

    def each(self, measurements: Sequence[tuple[str, str, float, Mapping[str, Any]]]) -> None:
        """`gb_expect(metric, value, scope=..., details=...)` for every (metric, scope, value, details), all
        recorded before the test fails (every failing one in one message) or, when none failed, skips."""
        failures: list[str] = []
        skip: BaseException | None = None
        for metric, scope, value, details in measurements:
            try:
                self(metric, value, scope, details=details)
            except pytest.fail.Exception as exc:
                failures.append(str(exc.msg))
            except pytest.skip.Exception as exc:
                skip = skip or exc
        if failures:
            pytest.fail("\n".join(failures), pytrace=False)
        if skip is not None:
            raise skip

    def _store(self, record: dict[str, Any]) -> None:
        self.item.stash.setdefault(MEASUREMENTS, []).append(record)
        self.item.user_properties.extend(rp.junit_properties(record))


def _spec_from(ref: bl.Reference | None) -> MetricSpec | None:
    return None if ref is None else MetricSpec(ref.metric, ref.unit, ref.direction, ref.scope_kind, "")


def _no_reference_reason(target: Target, metric: str, scope: str, ref: bl.Reference | None) -> str:
    if target.baseline is None or metric not in target.baseline.metrics:
        return f"{target.sku} baseline has no {metric}"
    if ref is None:
        return f"{target.sku} baseline has no {metric} value for {scope}"
    return f"{target.sku} baseline for {metric} is provisional with no reference value yet ({ref.provenance})"


def _node_gpu_count() -> int:
    """The GPUs NVML sees (0 without a driver): how many ranks a SKU being recorded for the first time gets."""
    from pytest_gbvalidate.sku import nvml_gpu_names

    names = nvml_gpu_names()
    return 0 if names is None else len(names)


def _unknown_sku_message(detection: Detection, directory: Path) -> str:
    from pytest_gbvalidate import baselines as bl

    known = ", ".join(bl.known_skus(directory)) or "none"
    return (
        f"unknown SKU {detection.sku!r} ({detection.source}); known SKUs in {directory}: {known}. "
        f"To bring up a new SKU, record a baseline on a golden node: "
        f"pytest --gb-sku={detection.sku} --gb-record={bl.baseline_path(directory, detection.sku)} suites/"
    )


def _fixturenames(item: pytest.Item) -> list[str]:
    return list(getattr(item, "fixturenames", ()))


def _failure_text(report: pytest.TestReport) -> tuple[str, str]:
    """(the first line of what went wrong, as JUnit's message attribute starts; the whole text the terminal
    shows). A failed test's exception is in its crash line, never in the traceback's last line, which names only
    the file and line where it surfaced."""
    if report.skipped and isinstance(report.longrepr, tuple):
        reason = str(report.longrepr[2])
        return reason, reason
    text = report.longreprtext.strip()
    crash = getattr(report.longrepr, "reprcrash", None)
    first = str(crash.message) if crash is not None else text
    return (first.strip().splitlines() or [report.outcome])[0], text


def _junit_has_testcase_properties(config: pytest.Config) -> bool:
    """Only the xunit1 (legacy) family has properties on a testcase. xunit2, pytest's default, allows them on
    the suite only; the Jenkins xUnit plugin validates a file against that schema and skips one that fails."""
    return str(config.getini("junit_family")) in ("xunit1", "legacy")


def _junit_path(config: pytest.Config) -> Path | None:
    xmlpath = config.getoption("xmlpath", None)
    return None if not xmlpath else Path(config.invocation_params.dir) / str(xmlpath)


def _add_junit_suite_properties(config: pytest.Config, properties: Mapping[str, str]) -> None:
    from _pytest.junitxml import xml_key  # what record_testsuite_property uses; it has no public form

    xml = config.stash.get(xml_key, None)
    if xml is not None:
        for name, value in properties.items():
            xml.add_global_property(f"gb_{name}", value)
