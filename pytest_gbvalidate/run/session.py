"""The per-run state of pytest-gbvalidate and the hooks that use it (plugin.py registers one GbSession).

The SKU and its baseline are resolved once, lazily: at start-up when the user asked for gbvalidate in any way
(a `--gb-*` option, its environment variable or ini key), else when the first collected test uses one of our
fixtures. An unrelated test run in the same environment never detects anything nor imports torch or NVML.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_gbvalidate.levels import Level
from pytest_gbvalidate.ranks.world import launcher_world, number_gpus_by_pci_bus
from pytest_gbvalidate.run import junit_hooks, markers, outcomes
from pytest_gbvalidate.run.payload import PAYLOAD, Payload, payload
from pytest_gbvalidate.settings import Setting, Settings

if TYPE_CHECKING:
    from pytest_gbvalidate.node.preconditions import Unmet
    from pytest_gbvalidate.ranks.gang import Gang
    from pytest_gbvalidate.report.earlier import EarlierReport, SameNode
    from pytest_gbvalidate.report.records import (
        LevelTimeRecord,
        MeasurementRecord,
        NcclVariableRecord,
        RunStatus,
        TestRecord,
    )
    from pytest_gbvalidate.report.writer import ListSection, NodeSection, RunReport
    from pytest_gbvalidate.run.ending import RunEnd
    from pytest_gbvalidate.run.signals import Stopper
    from pytest_gbvalidate.target import ReferenceTools, Target

# Loaded in every pytest run of the environment: the rest is imported where first used, once gbvalidate is engaged.
ENGAGING_FIXTURES = frozenset({"gb_expect", "gb_target", "gb_gang", "gb_gpu_pair"})


class GbSession:
    def __init__(self, config: pytest.Config, settings: Settings) -> None:
        self.config = config
        self.settings = settings
        # The launcher's world this process is a rank of, or None; why it is unknown, where it is (a usage error once
        # gbvalidate is asked for: an unrelated run in the same environment is not ours to stop).
        none = f"{settings.world.source}: --gb-world=none runs this process as one node's own run"
        self.world, self.world_problem = (None, None) if settings.world.value == "none" else launcher_world(none)
        if self.world_problem is not None and settings.explicit:
            raise pytest.UsageError(self.world_problem)
        # The xdist controller, or the only process; under torchrun / srun, global rank 0 (every rank runs the
        # same tests and reaches the same verdicts; one writes the reports).
        self.world_rank = None if self.world is None else self.world.rank
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
        self._stopper: Stopper | None = None  # SIGTERM, SIGHUP and SIGINT while the session runs (signals.py)
        self._comparison: tuple[EarlierReport, SameNode] | None = None  # --gb-compare, checked with the target
        self._end: RunEnd | None = None  # what the run's end reads (ending.py), made as the checks end
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

    @property
    def engaged(self) -> bool:
        return self._target is not None

    def engage(self) -> Target:
        """The run's target, resolved once where the run first needs it (with the earlier report --gb-compare names,
        the NCCL environment, the signal handlers, and the run described in the report)."""
        if self._target is None:
            from pytest_gbvalidate import baselines as bl
            from pytest_gbvalidate.run import paths, sections, signals
            from pytest_gbvalidate.target import resolve_target

            if self.world_problem is not None:
                raise pytest.UsageError(self.world_problem)
            # GPUs numbered as NVML numbers them, before anything here touches CUDA (its driver reads the order once).
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
        from pytest_gbvalidate.run.paths import writable_inputs
        from pytest_gbvalidate.run.sections import describe_run

        self.node_facts = software_facts(gpu=target.is_gpu)
        node: Any = self.node_facts  # NodeRecord: the facts' names are the record's fields
        world_size = None if self.world is None else self.world.size
        writable = writable_inputs(target, None if self._comparison is None else self._comparison[0])
        given = (self.settings, self.timeout, node, self.nccl_env, self._comparison, world_size)
        describe_run(self.report, target, *given, markers.narrowed_by(self.config), writable)
        self.report.write()

    @property
    def timeout(self) -> Setting[float]:
        """Seconds one call on the ranks may take: --gb-timeout and friends, else the SKU's default."""
        from pytest_gbvalidate.run import gangs

        return gangs.call_timeout(self.settings.timeout, self.target)

    def reference_tools(self) -> ReferenceTools:
        from pytest_gbvalidate.target import reference_tools

        env = {name: v["value"] for name, v in self.nccl_env.items()}
        return reference_tools(self.settings.reference_tools.value, self.world_rank, env, self.timeout.value)

    def make_gang(self) -> Gang:
        """The session's ranks (gangs.py), started on first use."""
        from pytest_gbvalidate.run import gangs

        env = {name: v["value"] for name, v in self.nccl_env.items() if name not in os.environ}
        self._gang = gangs.start(self.target, self.world, self.timeout.value, env)
        self._gang_section()
        return self._gang

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
        """The terminal header's lines, once (the first of the hooks that show it)."""
        if not self.engaged or self._header_shown:
            return []
        self._header_shown = True
        from pytest_gbvalidate.run.sections import header_lines

        return header_lines(
            *(self.report, self.target, self.settings, self.node_facts),
            *(self.world_rank, self._comparison, self.compare_note),
        )

    def pytest_report_header(self) -> list[str]:
        return self.header_lines()

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Under torchrun / srun only global rank 0 writes the JUnit XML (else every rank writes the same path);
        only when gbvalidate was asked for, so an unrelated suite launched by torchrun keeps its own behaviour."""
        self._pytest_session = session  # its exit status, for a rank that ends at once (pytest_unconfigure)
        if self.world_rank not in (None, 0) and self.settings.explicit:
            junit_hooks.stop_writing(self.config)
        if self.settings.explicit:
            self._keep_pytest_writers()

    def _keep_pytest_writers(self) -> None:
        """pytest's JUnit XML and pytest-html's page written as the plugin writes its own files (junit_hooks.py,
        html_page.py), once, where gbvalidate was asked for or its checks collected: an unrelated run keeps pytest's."""
        if not self.is_controller or self._pytest_writers_kept:
            return
        self._pytest_writers_kept = True
        junit_hooks.keep_last_good(self.config, self._writers_lost)
        if self.config.getoption("htmlpath", None) and self.config.pluginmanager.hasplugin("html"):
            from pytest_gbvalidate.run import html_page

            html_page.keep_last_good(self.config, self._writers_lost)

    def pytest_ignore_collect(self, collection_path: Path) -> bool | None:
        """A module of the shipped suites with no check at the run's level is not imported at all."""
        if not collection_path.name.startswith("test_") or collection_path.parent != markers.shipped_suites():
            return None
        return markers.holds_no_check_at(collection_path, self.settings.level.value) or None

    @pytest.hookimpl(wrapper=True)
    def pytest_make_collect_report(
        self, collector: pytest.Collector
    ) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
        report = yield
        if not report.passed:
            return report
        problem = markers.level_problems(report.result)
        items = [node for node in report.result if isinstance(node, pytest.Item)]
        problem = problem or markers.gangs_at_once(self.config, items)
        if problem is None and any(ENGAGING_FIXTURES & set(_fixturenames(i)) for i in items):
            try:  # where the checks are collected (in pytest-xdist's workers too): a bad setting or SKU
                self.engage()
            except pytest.UsageError as exc:
                problem = str(exc)
        if problem is not None:  # a collection error: shown the same with and without pytest-xdist
            report.outcome, report.longrepr, report.result = "failed", f"{markers.USAGE_ERROR}{problem}", []
        return report

    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        if not self.settings.explicit and not any(ENGAGING_FIXTURES & set(_fixturenames(i)) for i in items):
            return
        target = self.engage()
        self._keep_pytest_writers()
        unusable = self.unusable_gpus()
        if self.settings.rerun_failed.value is not None:
            from pytest_gbvalidate.run import rerun

            rerun.select(config, items, rerun.failed_checks(self.settings.rerun_failed.value))
        markers.select(config, items, self.settings.level.value, None if target.is_gpu else target.sku, unusable)

    def unusable_gpus(self) -> Unmet | None:
        """The precondition the node's GPUs do not meet (node/preconditions.py), probed once; None where they are
        usable, and on a SKU that promises no number of GPUs (none, or a site's baseline without `detect`)."""
        if self.target.device_type != "cuda" or not self.target.gpu_count:
            return None
        if self._unusable is None:
            from pytest_gbvalidate.node import preconditions

            detect = None if self.target.baseline is None else self.target.baseline.detect
            named = None if detect is None else detect.gpu_name_contains
            promised = preconditions.Promised(self.target.sku, self.target.gpu_count, named)
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
            data.fault = outcomes.fault_of(item, report, data.measurements)
        data.sections.update(self._pending_sections)
        self._pending_sections = {}
        data.attach(report)
        return report

    @pytest.hookimpl(tryfirst=True)  # before junitxml writes the testcase's properties
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not self.is_controller:
            return
        if report.when == "teardown" and not junit_hooks.has_testcase_properties(self.config):
            report.user_properties = [(k, v) for k, v in report.user_properties if not k.startswith("gb_")]
        data = Payload.carried(report)
        level: Level | None = getattr(report, "gb_level", None)
        if data != Payload() or level is not None:
            self.engage()  # a worker measured: resolve here too, for the report's header
        if outcomes.recorded(report):
            self._unreported_tests.append(outcomes.test_record(self.config, report, data.fault, level))
        if not self.engaged:  # kept, for a run that engages later (under xdist, when a worker first measures)
            return
        if level is not None:
            outcomes.count_level_time(self._level_times, level, report)
            self.report.set("level_times", self._level_times)
        for test in self._unreported_tests:
            self.report.add_test(test)
        self._unreported_tests.clear()
        self.report.add_measurements(data.measurements)
        for name, value in data.sections.items():
            self.report.set_section(name, value)
        for section, record in data.records:
            self.report.add_record(section, record)
        if report.when == "teardown":
            measured = [m for m in self.report.data["measurements"] if m["test_id"] == report.nodeid]
            junit_hooks.add_testcase_output(self.config, report, measured)
            from pytest_gbvalidate.report import node_verdict

            failed = [
                t for t in self.report.data["tests"] if t["test_id"] == report.nodeid and t["outcome"] == "failed"
            ]
            if failed and all(node_verdict.is_unresolved(t) for t in failed):
                junit_hooks.unresolved_as_error(self.config, report)
        if data.measurements or report.when == "teardown":
            self.report.write()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Generator[None, object, object]:
        if self.engaged and self.is_controller and self.history_dir is not None and not self.config.option.collectonly:
            from pytest_gbvalidate.run import sections

            self._kept_started = sections.keep_started(self.report, self.history_dir)
        result = yield
        if self.engaged:
            from pytest_gbvalidate.run import ending

            ending.measure_again(self.ending(), session)
        return result

    def ending(self) -> RunEnd:
        """What the run's end reads of the session (ending.py), made once."""
        if self._end is None:
            from pytest_gbvalidate.run.ending import RunEnd

            self._end = RunEnd(
                *(self.config, self.settings, self.report, self._comparison, self.world is not None),
                *(self.is_controller, self.unusable_gpus(), self.history_dir, self.output_notes),
            )
        return self._end

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
        from pytest_gbvalidate.run import ending, paths, sections

        t = self.target
        suite = {"sku": t.sku, "sku_source": t.source, "level": self.settings.level.value, **self.node_facts}
        junit_hooks.add_suite_properties(self.config, suite)
        base = self.settings.report.value or junit_hooks.junit_path(self.config)
        self.plot_note = sections.attach_busbw_plot(self.report, base, t.sku)
        for plot in self.report.data.get("plots", []):
            junit_hooks.add_suite_properties(self.config, {"busbw_plot": plot["path"]})
        junit_hooks.add_suite_properties(self.config, {name: v["value"] for name, v in self.nccl_env.items()})
        end = self.ending()
        exitstatus = ending.judge_preconditions(end, session, exitstatus)
        if self.settings.record.value is not None:
            why_not = ending.incomplete(session, exitstatus)
            path = self.settings.record.value
            try:
                runs = paths.kept_runs(self.settings, t.sku) if why_not is None else ()
            except pytest.UsageError:  # the history went since the run began: the recording is this run's alone
                runs = ()
            end.record_error = sections.record_baseline(self.report, t, path, self.node_facts, why_not, runs)
        exitstatus = ending.judge_pace(end, session, exitstatus)
        exitstatus = ending.judge_nothing_checked(end, session, exitstatus)
        exitstatus = ending.judge_unresolved(end, session, exitstatus)
        status: RunStatus = "interrupted" if exitstatus == pytest.ExitCode.INTERRUPTED else "finished"
        self.report.finish(int(exitstatus), status)  # written, kept and exported once pytest's writers are done

    @pytest.hookimpl(specname="pytest_sessionfinish", wrapper=True, trylast=True)
    def pytest_sessionfinish_after_writers(self, session: pytest.Session) -> Generator[None]:
        """The innermost wrapper: after pytest's own writers, the run's own files, saying which of theirs were lost."""
        try:
            return (yield)
        finally:
            if self.is_controller and self.engaged:
                from pytest_gbvalidate.run import ending

                ending.write_outputs(self.ending(), session, self._writers_lost, self._kept_started, self._stopper)

    @pytest.hookimpl(trylast=True)  # after every other plugin's
    def pytest_unconfigure(self) -> None:
        if self._stopper is not None:  # set once engaged: an unrelated run never loads the module
            self._stopper.put_back()
        if self._gang is not None and self._gang.broken:
            from pytest_gbvalidate.run import signals

            signals.end_now(self.config, self._pytest_session)

    @pytest.hookimpl(wrapper=True, tryfirst=True)  # around pytest's own summary: the verdict after all of it
    def pytest_terminal_summary(self, terminalreporter: Any) -> Generator[None]:
        """Details before pytest's failures and short test summary; the verdict's sections after them (terminal.py)."""
        if not self.is_controller or not self.engaged:
            return (yield)
        from pytest_gbvalidate.report import terminal
        from pytest_gbvalidate.run import ending

        _write_sections(terminalreporter, terminal.detail_sections(self.report.data, terminalreporter.verbosity > 0))
        result = yield
        written = self.report.write_error is None and self.settings.report.value is not None
        given = terminal.SummaryInput(
            verbose=terminalreporter.verbosity > 0,
            json_report=str(self.settings.report.value) if written else None,
            notes=ending.output_notes(self.report, [self.plot_note, *self.output_notes]),
        )
        _write_sections(terminalreporter, terminal.verdict_sections(self.target.sku, self.report.data, given))
        return result

    # --- report sections, probed wherever the test runs and carried to the controller in its payload (payload.py)

    def set_report_section(self, name: NodeSection, value: Any) -> None:
        """A section of the JSON report about the whole node (`gpus`, `numa_map`), sent with the next report."""
        self._pending_sections[name] = value

    def add_report_record(self, item: pytest.Item, section: ListSection, record: Any) -> None:
        """A record of one test for a list section of the JSON report (`telemetry`, `suspects`)."""
        payload(item).records.append((section, record))

    def add_measurement(self, item: pytest.Item, record: MeasurementRecord) -> None:
        """One measurement of a test (gb_expect's), for the JSON report's `measurements`."""
        payload(item).measurements.append(record)


def _write_sections(terminalreporter: Any, sections: list[tuple[str, list[str]]]) -> None:
    for title, lines in sections:
        terminalreporter.section(title)
        for line in lines:
            terminalreporter.write_line(line)


def _fixturenames(item: pytest.Item) -> list[str]:
    return list(getattr(item, "fixturenames", ()))
