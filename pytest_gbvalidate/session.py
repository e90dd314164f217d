"""The per-run state of pytest-gbvalidate and the hooks that use it (plugin.py registers one GbSession).

The SKU and its baseline are resolved once, lazily: at start-up when the user asked for gbvalidate in any way
(a `--gb-*` option, its environment variable or ini key), else when the first collected test uses one of our
fixtures. An unrelated test run in the same environment never detects anything nor imports torch or NVML.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from collections.abc import Generator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_gbvalidate.ranks.world import number_gpus_by_pci_bus, world_from_environment, world_rank
from pytest_gbvalidate.settings import Setting, Settings

if TYPE_CHECKING:
    from pytest_gbvalidate import report as rp
    from pytest_gbvalidate.compare import EarlierReport, GpuIdentity, SameNode
    from pytest_gbvalidate.ranks.gang import Gang
    from pytest_gbvalidate.target import ReferenceTools, Target

# Loaded in every pytest run of the environment: the target and its baselines (PyYAML), detection (urllib,
# NVML), node facts and the report code are imported where they are first used, once gbvalidate is engaged.

ENGAGING_FIXTURES = frozenset({"gb_expect", "gb_target", "gb_gang", "gb_gpu_pair"})
GPU_MARKER = "gb_gpu"
# How long one call on the ranks may take (--gb-timeout overrides): a GPU sweep to 16 GiB, or NCCL setting up
# its communicators on many nodes, takes minutes at worst; the CPU smoke run finishes in seconds.
DEFAULT_TIMEOUT_S = {"gpu": 300.0, "cpu": 30.0}
# What one test hands the JSON report: its measurements and its records of list sections (`telemetry`), plus the
# node sections (`gpus`, `numa_map`, `gang`) set since the last test. Made wherever the test runs and carried to
# the controller as one plain attribute of the test's report, which survives xdist's report serialisation.
PAYLOAD = pytest.StashKey[dict[str, Any]]()


def payload(item: pytest.Item) -> dict[str, Any]:
    return item.stash.setdefault(PAYLOAD, {"measurements": [], "records": [], "sections": {}})


class GbSession:
    def __init__(self, config: pytest.Config, settings: Settings) -> None:
        self.config = config
        self.settings = settings
        # The xdist controller, or the only process; under torchrun / srun, global rank 0 (every rank runs the
        # same tests and reaches the same verdicts; one writes the reports).
        self.world_rank = world_rank(os.environ)
        self.is_controller = not hasattr(config, "workerinput") and self.world_rank in (None, 0)
        self._report: rp.RunReport | None = None
        self._unreported_tests: list[tuple[str, str, str, float, str | None, str | None, dict[str, Any] | None]] = []
        self._target: Target | None = None
        self._header_shown = False
        self.node_facts: dict[str, str] = {}
        self._pending_sections: dict[str, Any] = {}
        self.nccl_env: dict[str, dict[str, str]] = {}  # variable -> {value, source}, as the ranks get it
        self.plot_note: str | None = None
        self._gang: Gang | None = None
        self._gang_reported = -1  # failed start-ups already in the report's gang section
        self.record_note: str | None = None  # what became of --gb-record
        self.record_error: str | None = None  # why it could not be written
        self._signal_handlers: dict[int, Any] = {}  # replaced while the session runs (SIGTERM, SIGHUP)
        self._comparison: tuple[EarlierReport, SameNode] | None = None  # --gb-compare, checked with the target

    def check_outputs(self) -> None:
        """Before anything runs: no output of the run is one of its inputs or another of its outputs (files.py).
        --gb-record may replace the baseline the run reads (re-recording a SKU); nothing else may."""
        s, config = self.settings, self.config
        if not s.explicit:
            return
        from pytest_gbvalidate.files import clashes

        junit = _junit_path(config)
        written = {s.report.source: s.report.value, "--junitxml on the command line": junit}
        outputs = {k: v for k, v in written.items() if v is not None}
        recorded = {"--gb-record on the command line": s.record} if s.record is not None else {}
        cwd = Path(config.invocation_params.dir)
        read = {f"the test path {arg}": cwd / arg.split("::")[0] for arg in config.args}
        read |= {f"the ini file {config.inipath}": config.inipath} if config.inipath is not None else {}
        read |= {s.compare.source: s.compare.value} if s.compare.value is not None else {}
        baselines = {f"the baseline {p}": p for p in sorted(s.baselines.value.glob("*.yaml"))}
        found = clashes({**outputs, **recorded}, read) + clashes(outputs, baselines)
        if found:
            raise pytest.UsageError("\n".join(dict.fromkeys(found)))

    @property
    def report(self) -> rp.RunReport:
        """The JSON report, made when first needed (an unrelated run never needs it)."""
        if self._report is None:
            from pytest_gbvalidate.report import RunReport

            self._report = RunReport(self.settings.report.value if self.is_controller else None)
        return self._report

    # --- the target ---------------------------------------------------------------------------------------

    @property
    def engaged(self) -> bool:
        return self._target is not None

    @property
    def target(self) -> Target:
        if self._target is None:
            from pytest_gbvalidate.target import resolve_target

            # Engaged: GPUs numbered as NVML numbers them, before the node facts or a test first touch CUDA here
            # (its driver reads the order once); the ranks we start inherit it.
            number_gpus_by_pci_bus()
            target = resolve_target(self.config, self.settings)
            self._comparison = self._earlier_report(target)
            self._target = target
            self._signal_handlers = _stop_on_termination_signals()
            self.nccl_env = self._nccl_environment(self._target)
            if self.is_controller:
                self._describe_run(self._target)
        return self._target

    @property
    def comparison(self) -> tuple[EarlierReport, SameNode] | None:
        """--gb-compare: the node's earlier report, checked to be this node's, and what changed since."""
        _ = self.target
        return self._comparison

    def _earlier_report(self, target: Target) -> tuple[EarlierReport, SameNode] | None:
        setting = self.settings.compare
        if setting.value is None:
            return None
        from pytest_gbvalidate import compare as cmp

        if world_from_environment(os.environ) is not None:
            raise pytest.UsageError(
                f"{setting.source}: compares a node with its own earlier single-node run; under torchrun / srun "
                "each node is compared in its own run, or the fleet summary compares the nodes"
            )
        try:
            earlier = cmp.load_earlier(setting.value)
            same = cmp.check_same_node(earlier, target.sku, socket.gethostname(), _gpu_identities(target))
        except cmp.CompareError as exc:
            raise pytest.UsageError(f"{setting.source}: {exc}") from None
        return earlier, same

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
                "engine_python": {
                    "value": None if s.engine_python.value is None else list(s.engine_python.value),
                    "source": s.engine_python.source,
                },
            },
            nccl_env=self.nccl_env,
        )
        if self._comparison is not None:
            earlier, same = self._comparison
            allowed = s.compare_fail.value
            self.report.data["compare"] = {
                "path": str(earlier.path),
                "source": s.compare.source,
                "earlier_date": earlier.date,
                "earlier_status": earlier.status,
                "allowed": None if allowed is None else {"default_pct": allowed.default_pct, **allowed.by_metric},
                "allowed_source": s.compare_fail.source,
                **same.as_dict(),
            }
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
        from pytest_gbvalidate.target import ReferenceTools

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
        from pytest_gbvalidate.ranks.gang import LocalGang
        from pytest_gbvalidate.ranks.world_gang import WorldGang

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
        section |= {"nodes": len(gang.hosts), "hosts": [f"node{n} ({host})" for n, host in gang.hosts.items()]}
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
        lines = [f"{line}; {stack}", *created]
        if self._comparison is not None:
            earlier, same = self._comparison
            source = self.settings.compare.source
            lines.append(f"gbvalidate: comparing with {earlier.path} ({source}): {'; '.join(same.notes)}")
        return lines

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
        self._gang_section()
        data = payload(item)
        del item.stash[PAYLOAD]  # the next phase's report carries what comes after this one
        if report.failed and self.engaged:
            data["fault"] = self._fault(item, report, data["measurements"])
        data["sections"].update(self._pending_sections)
        self._pending_sections = {}
        if any(data.values()):
            report.gb_payload = data  # type: ignore[attr-defined]
        return report

    @pytest.hookimpl(tryfirst=True)  # before junitxml writes the testcase's properties
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not self.is_controller:
            return
        if report.when == "teardown" and not _junit_has_testcase_properties(self.config):
            report.user_properties = [(k, v) for k, v in report.user_properties if not k.startswith("gb_")]
        data = getattr(report, "gb_payload", {})
        if data:
            _ = self.target  # a worker measured: resolve here too, for the report's header
        if report.when == "call" or report.outcome != "passed":
            message, text = (None, None) if report.passed else _failure_text(report)
            fault = data.get("fault")
            if fault is not None:
                summary = f"{fault['category']} ({fault['disposition']}): {fault['action']}"
                _add_junit_suite_properties(self.config, {f"fault[{report.nodeid}]": summary})
            self._unreported_tests.append(
                (report.nodeid, report.when, report.outcome, report.duration, message, text, fault)
            )
        if not self.engaged:  # kept, for a run that engages later (under xdist, when a worker first measures)
            return
        for test in self._unreported_tests:
            self.report.add_test(*test)
        self._unreported_tests.clear()
        records: list[dict[str, Any]] = data.get("measurements", [])
        self.report.add_measurements(records)
        for name, value in data.get("sections", {}).items():
            self.report.set_section(name, value)
        for section, record in data.get("records", []):
            self.report.add_record(section, record)
        if records or report.when == "teardown":
            self.report.write()

    def _fault(self, item: pytest.Item, report: pytest.TestReport, records: list[dict[str, Any]]) -> dict[str, Any]:
        """The failed test's fault category and the operator's action, from the fault table: for the JSON report
        and the testcase's JUnit properties (xunit1; the controller adds them to the suite's for xunit2)."""
        from pytest_gbvalidate import faults

        message, _ = _failure_text(report)
        verdicts = {r.get("verdict") for r in records} | {(r.get("compare") or {}).get("verdict") for r in records}
        fault = faults.load().classify(report.nodeid, message, {v for v in verdicts if v}).as_dict()
        item.user_properties += [("gb_fault_category", fault["category"]), ("gb_fault_action", fault["action"])]
        return fault

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
        exitstatus = self._fail_on_lost_outputs(session, exitstatus)
        interrupted = exitstatus == pytest.ExitCode.INTERRUPTED
        self.report.finish(int(exitstatus), "interrupted" if interrupted else "finished")
        self.report.write()
        self._fail_on_lost_outputs(session, exitstatus)  # the last write may be the one that failed

    def _fail_on_lost_outputs(self, session: pytest.Session, exitstatus: int) -> int:
        """A run whose report or recorded baseline could not be written does not pass: a gate's evidence is
        missing. The exit status it ends with."""
        if exitstatus == pytest.ExitCode.OK and (self.report.write_error or self.record_error):
            session.exitstatus = exitstatus = pytest.ExitCode.TESTS_FAILED
        return exitstatus

    def pytest_unconfigure(self) -> None:
        for number, handler in self._signal_handlers.items():
            signal.signal(number, handler)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.is_controller or not self.engaged:
            return
        from pytest_gbvalidate import report as rp

        notes = [self.plot_note, self.record_note]
        if self.report.write_error is not None:
            notes.insert(1, f"JSON report NOT written: {self.report.write_error}; the run fails")
        elif self.settings.report.value is not None:
            notes.insert(1, f"JSON report: {self.settings.report.value}")
        for title, lines in rp.terminal_summary(self.target.sku, self.report, [n for n in notes if n]):
            terminalreporter.section(title)
            for line in lines:
                terminalreporter.write_line(line)

    def _attach_busbw_plot(self) -> None:
        """A PNG of busbw against size next to the JSON report (else the JUnit XML), named in both."""
        from pytest_gbvalidate import report as rp

        if not rp.sweep_records(self.report.measurements):
            return
        base = self.settings.report.value or _junit_path(self.config)
        if base is None:
            self.plot_note = "busbw plot: not drawn (it is written next to --gb-report or --junitxml)"
            return
        path = base.with_name(f"{base.stem}.busbw.png")
        try:
            rp.busbw_plot(self.report.measurements, path, f"{self.target.sku}: bus bandwidth per message size")
        except OSError as exc:  # OutputError: the plot is a picture of the report, not evidence: noted
            self.plot_note = f"busbw plot: not written: {exc}"
            self.report.data["plot_note"] = self.plot_note
            return
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
            from pytest_gbvalidate.baselines.recording import write_recorded_baseline
            from pytest_gbvalidate.files import OutputError

            t = self.target
            try:
                skipped = write_recorded_baseline(
                    path, t.baseline, self.report.measurements, self.node_facts, t.node_gpu_count
                )
                self.record_note = f"recorded baseline: {path}"
                if skipped:  # failed or broken measurements: no expected value of 0 or "nan"
                    self.record_note += f"; left out, not measured validly: {'; '.join(skipped)}"
            except OutputError as exc:
                complete = False
                self.record_error = str(exc)
                self.record_note = f"baseline NOT recorded: {exc}; the run fails"
        else:
            why = pytest.ExitCode(exitstatus).name.lower() if exitstatus != pytest.ExitCode.TESTS_FAILED else "stopped"
            kept = "left as it was" if path.exists() else "not written"
            self.record_note = f"nothing recorded: the run did not complete ({why}); {path} {kept}"
        self.report.data["record"] = {"path": str(path), "written": complete, "note": self.record_note}

    # --- report sections beyond measurements: GPU inventory, NUMA map, telemetry -----------------------------
    # Probed wherever the test runs (an xdist worker, or this process) and carried to the controller in the
    # test's payload, with its measurements.

    def set_report_section(self, name: str, value: Any) -> None:
        """A section of the JSON report about the whole node (`gpus`, `numa_map`), sent with the next report."""
        self._pending_sections[name] = value

    def add_report_record(self, item: pytest.Item, section: str, record: dict[str, Any]) -> None:
        """A record of one test for a list section of the JSON report (`telemetry`)."""
        payload(item)["records"].append((section, record))


def _stop_on_termination_signals() -> dict[int, Any]:
    """SIGTERM (Slurm's scancel and time limit, Kubernetes deleting a pod) and SIGHUP (a closed terminal) end the
    run as Ctrl-C does: pytest's interrupted path tears the ranks down, writes the report `"interrupted"`, records
    nothing and exits 2. Python's default for them ends the process at once, leaving the report "running". Only
    once gbvalidate is engaged, and only where a handler can be set (the main thread). The handlers replaced,
    to put back when the session ends."""
    replaced: dict[int, Any] = {}
    if threading.current_thread() is not threading.main_thread():
        return replaced
    for number in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(number) in (signal.SIG_DFL, None):  # leave a handler someone else set alone
            replaced[number] = signal.signal(number, _interrupt)
    return replaced


def _interrupt(number: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"stopped by {signal.Signals(number).name}")


def _gpu_identities(target: Target) -> tuple[GpuIdentity, ...] | str | None:
    """This node's GPUs by PCI bus id (None on a SKU without GPUs; NVML's error when it cannot say)."""
    if not target.is_gpu:
        return None
    from pytest_gbvalidate.compare import GpuIdentity
    from pytest_gbvalidate.node import nvml

    try:
        nvml.init()
        try:
            inventory = nvml.read_inventory()
        finally:
            nvml.shutdown()
    except nvml.NvmlError as exc:
        return f"NVML: {exc}"
    return tuple(GpuIdentity(g.index, g.pci_bus_id, g.uuid, g.serial) for g in inventory.gpus.values())


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
