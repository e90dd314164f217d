"""The per-run state of pytest-gbvalidate and the hooks that use it (plugin.py registers one GbSession).

The SKU and its baseline are resolved once, lazily: at start-up when the user asked for gbvalidate in any way
(a `--gb-*` option, its environment variable or ini key), else when the first collected test uses one of our
fixtures. An unrelated test run in the same environment never detects anything nor imports torch or NVML.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import pytest

from pytest_gbvalidate.levels import Level
from pytest_gbvalidate.ranks.world import (
    WorldError,
    number_gpus_by_pci_bus,
    rendezvous_problem,
    world_from_environment,
)
from pytest_gbvalidate.run import junit_hooks, markers
from pytest_gbvalidate.run.payload import PAYLOAD, payload
from pytest_gbvalidate.settings import Setting, Settings

if TYPE_CHECKING:
    from pytest_gbvalidate.compare import EarlierReport, SameNode
    from pytest_gbvalidate.node.preconditions import Unmet
    from pytest_gbvalidate.ranks.gang import Gang
    from pytest_gbvalidate.report.records import (
        FaultRecord,
        LevelTimeRecord,
        MeasurementRecord,
        NcclVariableRecord,
        Phase,
        RunStatus,
        TestRecord,
    )
    from pytest_gbvalidate.report.writer import ListSection, NodeSection, RunReport
    from pytest_gbvalidate.run.signals import Stopper
    from pytest_gbvalidate.target import ReferenceTools, Target

# Loaded in every pytest run of the environment: the target and its baselines (PyYAML), detection (urllib,
# NVML), node facts and the report code are imported where they are first used, once gbvalidate is engaged.

ENGAGING_FIXTURES = frozenset({"gb_expect", "gb_target", "gb_gang", "gb_gpu_pair"})
# A test's phases and outcomes as the report's records have them (TestRecord). pytest-xdist reports a worker that
# died under a test with the phase "???"; pytest-rerunfailures an attempt it runs again with the outcome "rerun".
PHASES, OUTCOMES = ("setup", "call", "teardown"), ("passed", "failed", "skipped")
# A phase as a record keeps it (pytest before 9 types a report's `when` as any text).
RECORDED_PHASES: dict[str, Phase] = {"setup": "setup", "call": "call", "teardown": "teardown"}
# How long one call on the ranks may take (--gb-timeout overrides): a GPU sweep to 16 GiB, or NCCL setting up
# its communicators on many nodes, takes minutes at worst; the CPU smoke run finishes in seconds.
DEFAULT_TIMEOUT_S = {"gpu": 300.0, "cpu": 30.0}


class GbSession:
    def __init__(self, config: pytest.Config, settings: Settings) -> None:
        self.config = config
        self.settings = settings
        # The launcher's world this process is a rank of, or None; why that is unknown, where it is (a usage error
        # once gbvalidate is asked for: an unrelated run in the same environment is not ours to stop).
        self.world, self.world_problem = _world(settings)
        if self.world_problem is not None and settings.explicit:
            raise pytest.UsageError(self.world_problem)
        # The xdist controller, or the only process; under torchrun / srun, global rank 0 (every rank runs the
        # same tests and reaches the same verdicts; one writes the reports).
        self.world_rank = None if self.world is None else self.world[0]
        self.is_controller = not hasattr(config, "workerinput") and self.world_rank in (None, 0)
        self._report: RunReport | None = None
        self._unreported_tests: list[TestRecord] = []
        self._target: Target | None = None
        self._header_shown = False
        self.node_facts: dict[str, str] = {}
        self._pending_sections: dict[NodeSection, Any] = {}
        self.nccl_env: dict[str, NcclVariableRecord] = {}  # variable -> value and source, as the ranks get it
        self.plot_note: str | None = None
        self._gang: Gang | None = None
        self._pytest_session: pytest.Session | None = None
        self._gang_reported = -1  # failed start-ups already in the report's gang section
        self.record_error: str | None = None  # why the recorded baseline could not be written
        self._stopper: Stopper | None = None  # SIGTERM, SIGHUP and SIGINT while the session runs (signals.py)
        self._comparison: tuple[EarlierReport, SameNode] | None = None  # --gb-compare, checked with the target
        # The measurements of the run's second pass, taken where its pace would have regressed (_measure_again)
        self._measured_again: list[MeasurementRecord] | None = None
        self._unusable: tuple[Unmet | None] | None = None  # the node's GPU preconditions, once probed
        self._level_times: dict[Level, LevelTimeRecord] = {}  # what each level's checks took, on the controller
        self.suite_error = False  # a usage error found where the checks were collected (markers.USAGE_ERROR)
        self.compare_note: str | None = None  # --gb-compare=last with no earlier report in the history yet
        self.history_dir: Path | None = None  # --gb-history: this node's directory in it (the controller's)
        self._kept_started: Path | None = None  # this run's record in it, kept `running` as the checks started
        self._writers_lost: dict[str, str] = {}  # pytest's JUnit XML and pytest-html's page not written, by path
        self._pytest_writers_kept = False
        self.output_notes: list[str] = []  # where they went, or why not: for the terminal summary

    def check_outputs(self) -> None:
        """Before anything runs, when gbvalidate was asked for: the run's files (paths.py)."""
        if self.settings.explicit:
            from pytest_gbvalidate.run import paths

            self.history_dir = paths.check_outputs(self.config, self.settings, keeps_history=self.is_controller)

    @property
    def report(self) -> RunReport:
        """The JSON report, made when first needed (an unrelated run never needs it)."""
        if self._report is None:
            from pytest_gbvalidate.report.writer import RunReport

            self._report = RunReport(self.settings.report.value if self.is_controller else None)
        return self._report

    # --- the target ---------------------------------------------------------------------------------------

    @property
    def engaged(self) -> bool:
        return self._target is not None

    def engage(self) -> Target:
        """Engage gbvalidate for this run, once (the first call; later ones return the same target): resolve the
        SKU and its baseline and the earlier report --gb-compare names, take the NCCL environment, end the run as
        Ctrl-C does on SIGTERM and SIGHUP, and describe the run in the report. Called where a run first needs it:
        at start-up when gbvalidate was asked for, else at collection or by the first fixture of ours."""
        if self._target is None:
            from pytest_gbvalidate import baselines as bl
            from pytest_gbvalidate.run import paths, sections, signals
            from pytest_gbvalidate.target import resolve_target

            if self.world_problem is not None:
                raise pytest.UsageError(self.world_problem)
            # Engaged: GPUs numbered as NVML numbers them, before the node facts or a test first touch CUDA here
            # (its driver reads the order once); the ranks we start inherit it.
            number_gpus_by_pci_bus()
            target = resolve_target(self.config, self.settings)
            paths.check_record(self.settings, target)
            self._comparison, self.compare_note = paths.earlier_report(self.settings, target, self.world)
            self._target = target
            self._stopper = signals.Stopper()
            self._stopper.install()
            try:
                self.nccl_env = sections.nccl_environment(target, os.environ)
            except bl.BaselineError as exc:
                raise pytest.UsageError(f"bad baseline: {exc}") from None
            if self.is_controller:
                self._describe_run(target)
        return self._target

    @property
    def target(self) -> Target:
        """The engaged run's target: the SKU it checks and its baseline."""
        if self._target is None:
            raise RuntimeError("gbvalidate is not engaged yet: GbSession.engage() first")
        return self._target

    @property
    def comparison(self) -> tuple[EarlierReport, SameNode] | None:
        """--gb-compare: the node's earlier report, checked to be this node's, and what changed since."""
        self.engage()
        return self._comparison

    def _describe_run(self, target: Target) -> None:
        from pytest_gbvalidate.node.facts import software_facts
        from pytest_gbvalidate.run import paths
        from pytest_gbvalidate.run.sections import describe_run

        self.node_facts = software_facts(gpu=target.is_gpu)
        world_size = None if self.world is None else self.world[1]
        node: Any = self.node_facts  # NodeRecord: the facts' names are the record's fields
        describe_run(
            self.report, target, self.settings, self.timeout, node, self.nccl_env, self._comparison, world_size
        )
        self.report.data["narrowed_by"] = markers.narrowed_by(self.config)
        writable = paths.writable_inputs(target, None if self._comparison is None else self._comparison[0])
        if writable:
            self.report.data["writable_inputs"] = writable
        self.report.write()

    # --- ranks: timeout, reference tools, the gang -----------------------------------------------------------

    @property
    def timeout(self) -> Setting[float]:
        """Seconds one call on the ranks may take: --gb-timeout and friends, else the SKU's default."""
        chosen = self.settings.timeout
        if chosen.value is not None:
            return Setting(chosen.value, chosen.source)
        kind = "gpu" if self.target.is_gpu else "cpu"
        return Setting(DEFAULT_TIMEOUT_S[kind], f"default for a {'GPU' if kind == 'gpu' else 'CPU-only'} SKU")

    def reference_tools(self) -> ReferenceTools:
        from pytest_gbvalidate.target import reference_tools

        env = {name: v["value"] for name, v in self.nccl_env.items()}
        return reference_tools(self.settings.reference_tools.value, self.world_rank, env, self.timeout.value)

    def make_gang(self) -> Gang:
        """The session's ranks: this process's torchrun / srun world when it is in one, else local ranks (one per
        GPU, or CPU_RANKS on the CPU) started on first use, with the SKU's NCCL environment and the timeout."""
        from pytest_gbvalidate.ranks.gang import GangError, LocalGang
        from pytest_gbvalidate.ranks.world_gang import WorldGang

        t = self.target
        timeout_s = self.timeout.value
        env = {name: v["value"] for name, v in self.nccl_env.items() if name not in os.environ}
        gang: Gang
        if self.world is not None:
            try:
                gang = WorldGang(*self.world, device_type=t.device_type, timeout_s=timeout_s, env=env)
            except GangError as exc:
                if exc.cause != "cannot join its world":
                    raise
                # The launcher's rendezvous, not the node: no verdict, as the problems found before any test.
                pytest.exit(f"{exc} (the launcher's failure: no verdict on this node)", pytest.ExitCode.USAGE_ERROR)
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
        if gang is None or self._gang_reported == len(gang.failed_starts):
            return
        from pytest_gbvalidate.run.sections import gang_section

        section = gang_section(gang, self.world is not None, self.target.device_type)
        self._gang_reported = len(section["failed_starts"])
        self.set_report_section("gang", section)

    def header_lines(self) -> list[str]:
        if not self.engaged or self._header_shown:
            return []
        self._header_shown = True
        t = self.target
        baseline = str(t.baseline_file) if t.baseline else "none yet (recording)"
        facts = self.node_facts
        stack = ", ".join(f"{k} {facts[k]}" for k in ("driver", "cuda_driver", "nccl", "torch") if k in facts)
        level = self.settings.level
        line = f"gbvalidate: SKU {t.sku} ({t.source}); level {level.value}"
        line += "" if level.is_default else f" ({level.source})"
        chosen = self.settings.baselines
        line += f"; baseline {baseline} ({'bundled with the plugin' if chosen.is_default else chosen.source})"
        if self.world_rank not in (None, 0):  # the node facts and the reports are global rank 0's
            return [f"{line}; rank {self.world_rank} of a torchrun / srun world (rank 0 writes the reports)"]
        created = [
            f"gbvalidate: {source}: creating missing directory {path}" for source, path in self.settings.created_dirs
        ]
        lines = [f"{line}; {stack}", *created]
        if self._comparison is not None:
            earlier, same = self._comparison
            source = self.settings.compare.source
            lines.append(f"gbvalidate: comparing with {earlier.path} ({source}): {'; '.join(same.notes)}")
        if self.compare_note is not None:
            lines.append(f"gbvalidate: {self.settings.compare.source}: {self.compare_note}")
        for found in self.report.data.get("writable_inputs", []):
            lines.append(
                f"gbvalidate: {found['input']} {found['path']} decides verdicts, and others could have written it: "
                f"{found['problem']}"
            )
        return lines

    # --- pytest hooks ---------------------------------------------------------------------------------------

    def pytest_report_header(self) -> list[str]:
        return self.header_lines()

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Under torchrun / srun only global rank 0 writes the JUnit XML, as it alone writes the JSON report:
        every rank would otherwise write the same path. Only when gbvalidate was asked for explicitly, so an
        unrelated test suite launched by torchrun keeps its own behaviour."""
        self._pytest_session = session  # its exit status, for a rank that ends at once (pytest_unconfigure)
        if self.world_rank not in (None, 0) and self.settings.explicit:
            junit_hooks.stop_writing(self.config)
        if self.settings.explicit:
            self._keep_pytest_writers()

    def _keep_pytest_writers(self) -> None:
        """pytest's JUnit XML and pytest-html's page, written as the plugin writes its own files: a write that
        fails leaves the last good file, and the report says so. Once all plugins are configured, on the process that
        writes them, where gbvalidate was asked for or its checks collected: an unrelated run keeps pytest's ways."""
        if not self.is_controller or self._pytest_writers_kept:
            return
        self._pytest_writers_kept = True
        junit_hooks.keep_last_good(self.config, self._writers_lost)
        if self.config.getoption("htmlpath", None) and self.config.pluginmanager.hasplugin("html"):
            from pytest_gbvalidate.run import html_page

            html_page.keep_last_good(self.config, self._writers_lost)

    @pytest.hookimpl(wrapper=True)
    def pytest_make_collect_report(
        self, collector: pytest.Collector
    ) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
        report = yield
        if not report.passed:
            return report
        problem = markers.level_problems(report.result)
        items = [node for node in report.result if isinstance(node, pytest.Item)]
        problem = problem or self._gangs_at_once(items)
        if problem is None and any(ENGAGING_FIXTURES & set(_fixturenames(i)) for i in items):
            try:  # where the checks are collected (in pytest-xdist's workers too): a bad setting or SKU
                self.engage()
            except pytest.UsageError as exc:
                problem = str(exc)
        if problem is not None:  # a collection error: shown the same with and without pytest-xdist
            report.outcome, report.longrepr, report.result = "failed", f"{markers.USAGE_ERROR}{problem}", []
        return report

    def _gangs_at_once(self, items: list[pytest.Item]) -> str | None:
        """Why checks that start ranks cannot run here, or None: under pytest-xdist with more than one worker each
        worker would start a gang of its own, at once, on the same GPUs (two 2-rank gangs on a 2-rank SKU halved
        its figures and passed, or their ranks joined one world and failed). A gang needs the whole node."""
        workers = int(getattr(self.config, "workerinput", {}).get("workercount", 1))
        if workers <= 1:
            return None
        from pytest_gbvalidate.node.preconditions import RANK_FIXTURES

        ranked = [i.nodeid for i in items if RANK_FIXTURES & set(_fixturenames(i))]
        if not ranked:
            return None
        return (
            f"{ranked[0]}{f' and {len(ranked) - 1} more' if len(ranked) > 1 else ''} start ranks on the node's GPUs, "
            f"and pytest-xdist runs {workers} workers, each of which would start a gang of its own at once: run "
            "them without -n (or with -n 0)"
        )

    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        if not self.settings.explicit and not any(ENGAGING_FIXTURES & set(_fixturenames(i)) for i in items):
            return
        target = self.engage()
        self._keep_pytest_writers()
        unusable = self.unusable_gpus()
        if self.settings.rerun_failed.value is not None:
            from pytest_gbvalidate.run import rerun

            failed = rerun.failed_checks(self.settings.rerun_failed.value)
            if failed is not None:
                rerun.select(config, items, failed)
        markers.select(config, items, self.settings.level.value, None if target.is_gpu else target.sku, unusable)

    def unusable_gpus(self) -> Unmet | None:
        """The precondition the node's GPUs do not meet (node/preconditions.py), probed once; None where they are
        usable, and on a SKU that promises no number of GPUs (none, or a site's baseline without `detect`)."""
        if self.target.device_type != "cuda" or not self.target.gpu_count:
            return None
        if self._unusable is None:
            from pytest_gbvalidate.node import preconditions

            detect = None if self.target.baseline is None else self.target.baseline.detect
            promised = preconditions.Promised(
                self.target.sku, self.target.gpu_count, None if detect is None else detect.gpu_name_contains
            )
            self._unusable = (preconditions.probe(promised),)
        return self._unusable[0]

    def pytest_report_collectionfinish(self) -> list[str]:
        return self.header_lines()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if self.engaged:
            report.gb_level = markers.check_level(item)  # type: ignore[attr-defined]
        self._gang_section()
        data = payload(item)
        del item.stash[PAYLOAD]  # the next phase's report carries what comes after this one
        if report.failed and self.engaged:
            data.fault = self._fault(item, report, data.measurements)
        data.sections.update(self._pending_sections)
        self._pending_sections = {}
        if any(data.as_dict().values()):
            report.gb_payload = data.as_dict()  # type: ignore[attr-defined]
        return report

    @pytest.hookimpl(tryfirst=True)  # before junitxml writes the testcase's properties
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not self.is_controller:
            return
        if report.when == "teardown" and not junit_hooks.has_testcase_properties(self.config):
            report.user_properties = [(k, v) for k, v in report.user_properties if not k.startswith("gb_")]
        data: dict[str, Any] = getattr(report, "gb_payload", {})
        level: Level | None = getattr(report, "gb_level", None)
        if data or level is not None:
            self.engage()  # a worker measured: resolve here too, for the report's header
        replaced = report.outcome not in OUTCOMES and report.when in PHASES  # pytest-rerunfailures' "rerun"
        if (report.when == "call" or report.outcome != "passed") and not replaced:
            self._unreported_tests.append(self._test_record(report, data.get("fault"), level))
        if not self.engaged:  # kept, for a run that engages later (under xdist, when a worker first measures)
            return
        if level is not None:
            times = self._level_times.setdefault(level, {"tests": 0, "duration_s": 0.0})
            if report.when == "setup":
                times["tests"] += 1
            times["duration_s"] = round(times["duration_s"] + report.duration, 6)
            self.report.data["level_times"] = self._level_times
        for test in self._unreported_tests:
            self.report.add_test(test)
        self._unreported_tests.clear()
        records: list[MeasurementRecord] = data.get("measurements", [])
        self.report.add_measurements(records)
        for name, value in data.get("sections", {}).items():
            self.report.set_section(name, value)
        for section, record in data.get("records", []):
            self.report.add_record(section, record)
        if report.when == "teardown":
            measured = [m for m in self.report.data["measurements"] if m["test_id"] == report.nodeid]
            junit_hooks.add_testcase_output(self.config, report, measured)
        if records or report.when == "teardown":
            self.report.write()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Generator[None, object, object]:
        if self.engaged and self.is_controller and self.history_dir is not None and not self.config.option.collectonly:
            from pytest_gbvalidate.run import sections

            self._kept_started = sections.keep_started(self.report, self.history_dir)
        result = yield
        self._measured_again = self._measure_again(session)
        return result

    def _measure_again(self, session: pytest.Session) -> list[MeasurementRecord] | None:
        """Where the run's pace against the node's history would regress (compare.run_pace), every test that
        measured runs once more, silently (its reports, failures and warnings left out: the first pass's stand),
        and the measurements of that second pass are returned for the pace to take each figure's better pass: a
        neighbour that held the machine for one pass slows that pass (a healthy 2-vCPU VM ran one whole run
        17-39% slower in every check, and the runs before and after it ran at pace), a node that lost pace is
        slow in both. pytest-rerunfailures runs a test again the same way (`runtestprotocol`, not logged). None
        where nothing is measured again: no comparison with a history, a run stopped early, or pytest-xdist's
        controller (its workers ran the tests)."""
        if (
            self._comparison is None
            or not self.engaged
            or not self.is_controller
            or session.shouldstop
            or session.shouldfail
            or self.config.pluginmanager.has_plugin("dsession")
        ):
            return None
        import warnings

        from _pytest.runner import runtestprotocol

        from pytest_gbvalidate import compare as cmp

        measurements = self.report.data["measurements"]
        allowed = self.settings.compare_fail.value or cmp.AllowedRegression()
        pace = cmp.run_pace(self._comparison[0], measurements, allowed)
        if pace is None or pace["verdict"] != cmp.REGRESSED:
            return None
        measured = {m["test_id"] for m in measurements}
        items = [item for item in session.items if item.nodeid in measured]
        again: list[MeasurementRecord] = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a WARN of the second pass is not the run's
            for n, item in enumerate(items):
                properties = list(item.user_properties)
                reports = runtestprotocol(item, nextitem=items[n + 1] if n + 1 < len(items) else None, log=False)
                item.user_properties[:] = properties
                for report in reports:
                    again += getattr(report, "gb_payload", {}).get("measurements", [])
        return again

    def _test_record(self, report: pytest.TestReport, fault: FaultRecord | None, level: Level | None) -> TestRecord:
        message, text = (None, None) if report.passed else junit_hooks.failure_text(report)
        outcome = report.outcome
        when = RECORDED_PHASES.get(report.when or "")
        if when is None:
            # pytest-xdist's report of a worker that died under a test (the OOM killer, a driver's segfault, a
            # signal) says when "???": the test failed by crashing, which the node's record must say in its terms.
            when, outcome = "call", "failed"
            said = [line for line in report.longreprtext.splitlines() if "crashed" in line]  # xdist's own line
            message = f"crashed: {said[-1].strip() if said else 'the process running the test ended without a report'}"
            text = text or message
            fault = fault or self._crash_fault(report.nodeid, message)
        test: TestRecord = {
            "test_id": report.nodeid,
            "when": when,
            "outcome": outcome,
            "duration_s": round(report.duration, 6) if math.isfinite(report.duration) else 0.0,
            "message": message,
            "text": text,
        }
        if level is not None:
            test["level"] = level
        if fault is not None:
            summary = f"{fault['category']} ({fault['disposition']}): {fault['action']}"
            junit_hooks.add_suite_properties(self.config, {f"fault[{report.nodeid}]": summary})
            test["fault"] = fault
        return test

    def _crash_fault(self, test_id: str, message: str) -> FaultRecord:
        from pytest_gbvalidate import faults

        return faults.load().classify(test_id, message, set()).as_dict()

    def _fault(self, item: pytest.Item, report: pytest.TestReport, records: list[MeasurementRecord]) -> FaultRecord:
        """The failed test's fault category and the operator's action, from the fault table: for the JSON report
        and the testcase's JUnit properties (xunit1; the controller adds them to the suite's for xunit2)."""
        from pytest_gbvalidate import faults

        message, _ = junit_hooks.failure_text(report)
        verdicts = {r["verdict"] for r in records} | {r["compare"]["verdict"] for r in records if "compare" in r}
        fault = faults.load().classify(report.nodeid, message, {v for v in verdicts if v}).as_dict()
        item.user_properties += [("gb_fault_category", fault["category"]), ("gb_fault_action", fault["action"])]
        return fault

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        """On the controller, a worker's collection errors too: a bad marker or setting is no verdict on the node."""
        if report.failed and str(report.longrepr).startswith(markers.USAGE_ERROR):
            self.suite_error = True

    @pytest.hookimpl(tryfirst=True)  # before junitxml writes its file
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self._stopper is not None:
            self._stopper.finishing()
            if self._stopper.cut_short:  # a second signal kept pytest from saying so: part of the checks ran
                session.exitstatus = exitstatus = pytest.ExitCode.INTERRUPTED
        if self.suite_error:  # no verdict about the node: a usage error, as pytest's own for a bad -m or option
            session.exitstatus = exitstatus = pytest.ExitCode.USAGE_ERROR
        if not self.is_controller or not self.engaged:
            return
        from pytest_gbvalidate.run import paths, sections

        t = self.target
        suite = {"sku": t.sku, "sku_source": t.source, "level": self.settings.level.value, **self.node_facts}
        junit_hooks.add_suite_properties(self.config, suite)
        base = self.settings.report.value or junit_hooks.junit_path(self.config)
        self.plot_note = sections.attach_busbw_plot(self.report, base, t.sku)
        for plot in self.report.data.get("plots", []):
            junit_hooks.add_suite_properties(self.config, {"busbw_plot": plot["path"]})
        junit_hooks.add_suite_properties(self.config, {name: v["value"] for name, v in self.nccl_env.items()})
        exitstatus = self._judge_preconditions(session, exitstatus)
        if self.settings.record.value is not None:
            why_not = _incomplete(session, exitstatus)
            path = self.settings.record.value
            try:
                runs = paths.kept_runs(self.settings, t.sku) if why_not is None else ()
            except pytest.UsageError:  # the history went since the run began: the recording is this run's alone
                runs = ()
            self.record_error = sections.record_baseline(self.report, t, path, self.node_facts, why_not, runs)
        exitstatus = self._judge_pace(session, exitstatus)
        exitstatus = self._judge_nothing_checked(session, exitstatus)
        status: RunStatus = "interrupted" if exitstatus == pytest.ExitCode.INTERRUPTED else "finished"
        self.report.finish(int(exitstatus), status)  # written, kept and exported once pytest's writers are done

    @pytest.hookimpl(specname="pytest_sessionfinish", wrapper=True, trylast=True)
    def pytest_sessionfinish_after_writers(self, session: pytest.Session) -> Generator[None]:
        """The innermost wrapper: after pytest's own writers (junitxml's, pytest-html's), the run's own files, so
        that the report says which of theirs were lost."""
        try:
            return (yield)
        finally:
            if self.is_controller and self.engaged:
                self._write_outputs(session)

    def _write_outputs(self, session: pytest.Session) -> None:
        """The report, with the files lost so far (`outputs_lost`: a lost file fails the run), kept in the node's
        history, written as a Prometheus file, and written."""
        from pytest_gbvalidate.run import sections

        for line in self._writers_lost.values():
            sections.output_lost(self.report, line)
        exitstatus = self._fail_on_lost_outputs(session, session.exitstatus)
        self.report.data["exit_status"] = int(exitstatus)
        if not self.config.option.collectonly:  # a run that measured nothing replaces no node's figures
            prometheus = self.settings.prometheus.value
            self.output_notes += sections.keep_report(self.report, self.history_dir, prometheus, self._kept_started)
            exitstatus = self._fail_on_lost_outputs(session, exitstatus)
            self.report.data["exit_status"] = int(exitstatus)  # a file lost fails the run, and the report says so
        self.report.write()
        self._fail_on_lost_outputs(session, exitstatus)  # the last write may be the one that failed
        if self._stopper is not None and self._stopper.signal_name is not None and not self._stopper.cut_short:
            self.output_notes.append(
                f"{self._stopper.signal_name} came once every check had run: the outputs were written first"
            )

    def _judge_pace(self, session: pytest.Session, exitstatus: int) -> int:
        """With --gb-compare and the node's history: the run as a whole against the node's kept runs
        (compare.run_pace), in the report's `compare.pace`. A run slower across the board than its history allows
        fails the test PACE_TEST_ID, reported as the checks' tests are (the terminal, JUnit, the JSON report and
        the page), with its fault category. Only for a run that passed or failed its checks: one interrupted, or
        ended by a usage or internal error, has no verdict to add to. The exit status the run ends with."""
        if (
            self._comparison is None
            or self.config.option.collectonly
            or exitstatus not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED)
        ):
            return exitstatus
        from pytest_gbvalidate import compare as cmp
        from pytest_gbvalidate import faults

        allowed = self.settings.compare_fail.value or cmp.AllowedRegression()
        pace = cmp.run_pace(self._comparison[0], self.report.data["measurements"], allowed, self._measured_again)
        if pace is None:
            return exitstatus
        self.report.data["compare"]["pace"] = pace
        if pace["verdict"] != cmp.REGRESSED:
            return exitstatus
        location = (PACE_TEST_ID.split("::")[0], None, PACE_TEST_ID.split("::")[1])
        failed = pytest.TestReport(PACE_TEST_ID, location, {}, "failed", pace["message"], "call")
        fault = faults.load().classify(PACE_TEST_ID, pace["message"], {cmp.REGRESSED})
        failed.gb_payload = {"fault": fault.as_dict()}  # type: ignore[attr-defined]
        self.config.hook.pytest_runtest_logreport(report=failed)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        return session.exitstatus

    def _judge_preconditions(self, session: pytest.Session, exitstatus: int) -> int:
        """A node whose GPUs cannot be used fails the test PRECONDITIONS_TEST_ID once, with the cause and its fault
        category, reported as the checks' tests are; the checks that depend on it were skipped naming it
        (markers.select). Only for a run that ran its checks. The exit status the run ends with."""
        unusable = self.unusable_gpus()
        if (
            unusable is None
            or self.config.option.collectonly
            or exitstatus not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED)
        ):
            return exitstatus
        from pytest_gbvalidate import faults
        from pytest_gbvalidate.node.preconditions import PRECONDITIONS_TEST_ID

        message = f"the node's GPUs cannot be used: {unusable.why}"
        location = (PRECONDITIONS_TEST_ID.split("::")[0], None, PRECONDITIONS_TEST_ID.split("::")[1])
        failed = pytest.TestReport(PRECONDITIONS_TEST_ID, location, {}, "failed", message, "call")
        fault = faults.load().classify(PRECONDITIONS_TEST_ID, message, set())
        failed.gb_payload = {"fault": fault.as_dict()}  # type: ignore[attr-defined]
        self.config.hook.pytest_runtest_logreport(report=failed)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        return session.exitstatus

    def _judge_nothing_checked(self, session: pytest.Session, exitstatus: int) -> int:
        """A run that would pass having checked nothing -- every check skipped and no figure judged: a baseline that
        gates nothing, a -k that matched only checks this node cannot run -- no verdict (pytest's
        NO_TESTS_COLLECTED, as a run that selected nothing), never a pass. Not under torchrun / srun, whose launcher
        reads any other status of a rank as its failure and ends the world: the report says no verdict all the same
        (report/node_verdict.py), which the fleet summary reads. The exit status the run ends with."""
        from pytest_gbvalidate.report.node_verdict import checked

        data: Any = self.report.data  # a RunReportRecord by now: the run described, its tests and measurements
        quiet = self.world is not None or self.config.option.collectonly
        if exitstatus != pytest.ExitCode.OK or quiet or checked(data):
            return exitstatus
        self.output_notes.append(
            "no check ran: every selected check was skipped (see why above), so nothing was measured or judged: no "
            f"verdict (exit {int(pytest.ExitCode.NO_TESTS_COLLECTED)}), never a pass"
        )
        session.exitstatus = pytest.ExitCode.NO_TESTS_COLLECTED
        return session.exitstatus

    def _fail_on_lost_outputs(self, session: pytest.Session, exitstatus: int) -> int:
        """A run whose report, recorded baseline, kept report or Prometheus file could not be written does not pass:
        a gate's evidence is missing. The exit status it ends with."""
        lost = self.report.write_error or self.record_error or self.report.data.get("outputs_lost")
        if exitstatus == pytest.ExitCode.OK and lost:
            session.exitstatus = exitstatus = pytest.ExitCode.TESTS_FAILED
        elif exitstatus == pytest.ExitCode.OK and self.report.misfit:  # our own failure: no verdict on the node
            session.exitstatus = exitstatus = pytest.ExitCode.INTERNAL_ERROR
        return exitstatus

    @pytest.hookimpl(trylast=True)  # after every other plugin's
    def pytest_unconfigure(self) -> None:
        if self._stopper is not None:  # set once engaged: an unrelated run never loads the module
            self._stopper.put_back()
        if self._gang is not None and self._gang.broken:
            self._end_now()

    def _end_now(self) -> NoReturn:
        """A rank whose process group failed ends here, its reports written, with the run's exit status. Left to
        the interpreter's exit, torch's NCCL watchdog held it (every collective still queued timed out in turn, a
        minute apart: 4 ranks on an H200 were still there 3 minutes after a peer died) or crashed it (SIGABRT,
        "Broken promise"), and the launcher would wait on it or call a node whose run had ended a crashed one."""
        capture = self.config.pluginmanager.get_plugin("capturemanager")
        if capture is not None:  # what pytest still holds of the output, to the terminal
            capture.stop_global_capturing()
        status = int(self._pytest_session.exitstatus) if self._pytest_session is not None else 1
        print(f"gbvalidate: this rank's process group failed; it exits now ({status}), not waiting on torch's threads")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)

    @pytest.hookimpl(wrapper=True, tryfirst=True)  # around pytest's own summary: the verdict after all of it
    def pytest_terminal_summary(self, terminalreporter: Any) -> Generator[None]:
        """Details before pytest's failures and short test summary; the run, measured vs baseline and the failures
        by fault category after them, the last lines before pytest's closing line."""
        if not self.is_controller or not self.engaged:
            return (yield)
        from pytest_gbvalidate.report import terminal

        _write_sections(terminalreporter, terminal.detail_sections(self.report.data, terminalreporter.verbosity > 0))
        result = yield
        recorded = self.report.data.get("record")
        written = self.report.write_error is None and self.settings.report.value is not None
        notes = (
            []
            if self.report.write_error is None
            else [f"JSON report NOT written: {self.report.write_error}; the run fails"]
        )
        if self.report.misfit is not None:
            notes.append(
                f"the JSON report does not fit its own schema ({self.report.misfit}): a bug of pytest-gbvalidate, "
                "please report it; its readers will refuse the report (exit 3 where the checks passed: no verdict)"
            )
        notes += [note for note in (self.plot_note, None if recorded is None else recorded["note"]) if note]
        notes += self.output_notes
        notes += [f"{line}; the run fails" for line in self.report.data.get("outputs_lost", [])]
        given = terminal.SummaryInput(
            verbose=terminalreporter.verbosity > 0,
            json_report=str(self.settings.report.value) if written else None,
            notes=notes,
        )
        _write_sections(terminalreporter, terminal.verdict_sections(self.target.sku, self.report.data, given))
        return result

    # --- report sections beyond measurements: GPU inventory, NUMA map, telemetry -----------------------------
    # Probed wherever the test runs (an xdist worker, or this process) and carried to the controller in the
    # test's payload, with its measurements.

    def set_report_section(self, name: NodeSection, value: Any) -> None:
        """A section of the JSON report about the whole node (`gpus`, `numa_map`), sent with the next report."""
        self._pending_sections[name] = value

    def add_report_record(self, item: pytest.Item, section: ListSection, record: Any) -> None:
        """A record of one test for a list section of the JSON report (`telemetry`, `suspects`)."""
        payload(item).records.append((section, record))

    def add_measurement(self, item: pytest.Item, record: MeasurementRecord) -> None:
        """One measurement of a test (gb_expect's), for the JSON report's `measurements`."""
        payload(item).measurements.append(record)


# The test a run slower across the board than the node's history fails (compare.run_pace): no check of a suite,
# the run as a whole.
PACE_TEST_ID = "gbvalidate::node_pace"


def _incomplete(session: pytest.Session, exitstatus: int) -> str | None:
    """Why the run did not run every test it collected (Ctrl-C, -x, --maxfail, an internal error), else None: a
    baseline is recorded only from a complete run, never replaced with part of one."""
    if exitstatus not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
        return pytest.ExitCode(exitstatus).name.lower()
    return "stopped" if session.shouldfail or session.shouldstop else None


def _write_sections(terminalreporter: Any, sections: list[tuple[str, list[str]]]) -> None:
    for title, lines in sections:
        terminalreporter.section(title)
        for line in lines:
            terminalreporter.write_line(line)


def _fixturenames(item: pytest.Item) -> list[str]:
    return list(getattr(item, "fixturenames", ()))


def _world(settings: Settings) -> tuple[tuple[int, int, int] | None, str | None]:
    """(rank, world size, local rank) of the launcher's world this process is a rank of, else None; and why that
    cannot be told, where it cannot (ranks/world.py)."""
    if settings.world.value == "none":
        return None, None
    none = f"{settings.world.source}: --gb-world=none runs this process as one node's own run"
    try:
        world = world_from_environment(os.environ)
    except WorldError as exc:
        return None, f"{exc} ({none})"
    # Its rendezvous too, before any test: a test that cannot join its world is the launcher's failure, not the node's.
    problem = None if world is None else rendezvous_problem(os.environ)
    return world, None if problem is None else f"{problem} ({none})"
