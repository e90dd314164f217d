"""The run's end: what the run as a whole says beyond its checks, and the exit status it ends with -- the node's GPU
preconditions, the pace against the node's history, a run that checked nothing, and outputs that could not be
written. Each reads a RunEnd (what the session knows by then) and the exit status so far. The run's own checks reach
pytest's writers as a test's report (outcomes.fail_run_check): they read results from no other place."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_gbvalidate.run import outcomes
from pytest_gbvalidate.run.payload import Payload

if TYPE_CHECKING:
    from pytest_gbvalidate.node.preconditions import Unmet
    from pytest_gbvalidate.report.earlier import EarlierReport, SameNode
    from pytest_gbvalidate.report.records import MeasurementRecord, RunPaceRecord
    from pytest_gbvalidate.report.writer import RunReport
    from pytest_gbvalidate.run.signals import Stopper
    from pytest_gbvalidate.settings import Settings

# The test a run slower across the board than the node's history fails (compare.run_pace).
PACE_TEST_ID = "gbvalidate::node_pace"
JUDGED = (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED)  # a run that passed or failed its checks


@dataclass
class RunEnd:
    """What the run's end reads of the session (run/session.py makes it as the checks end)."""

    config: pytest.Config
    settings: Settings
    report: RunReport
    comparison: tuple[EarlierReport, SameNode] | None  # --gb-compare's earlier report, where the run engaged it
    under_launcher: bool  # a rank of a torchrun / srun world: its launcher reads any other status as a failure
    is_controller: bool
    unusable: Unmet | None  # the node's GPU precondition not met, where one is not
    history_dir: Path | None
    notes: list[str]  # the terminal summary's last lines (the session's own list)
    record_error: str | None = None  # why the recorded baseline could not be written
    # The pace against the node's history (measure_again), and the measurements of a second pass where it regressed.
    pace: RunPaceRecord | None = None
    again: list[MeasurementRecord] | None = None


def judge_preconditions(end: RunEnd, session: pytest.Session, exitstatus: int) -> int:
    """A node whose GPUs cannot be used fails PRECONDITIONS_TEST_ID once, with the cause (judged runs only)."""
    if end.unusable is None or end.config.option.collectonly or exitstatus not in JUDGED:
        return exitstatus
    from pytest_gbvalidate.node.preconditions import PRECONDITIONS_TEST_ID

    message = f"the node's GPUs cannot be used: {end.unusable.why}"
    return outcomes.fail_run_check(end.config, session, PRECONDITIONS_TEST_ID, message, set())


def measure_again(end: RunEnd, session: pytest.Session) -> None:
    """The run's pace against the node's history (compare.run_pace), once, into `end.pace`; where it would
    regress, every test that measured runs once more, silently (the first pass's reports stand), its measurements
    into `end.again` for the pace to take each figure's better pass: a neighbour that held the machine slows one
    pass, a node that lost pace is slow in both (docs/noise.md). Not in a run stopped early, nor on pytest-xdist's
    controller (its workers ran the tests)."""
    if end.comparison is None or not end.is_controller or end.config.option.collectonly:
        return
    from pytest_gbvalidate import compare as cmp

    measurements = end.report.data["measurements"]
    allowed = end.settings.compare_fail.value or cmp.AllowedRegression()
    end.pace = cmp.run_pace(end.comparison[0], measurements, allowed)
    stopped = session.shouldstop or session.shouldfail or end.config.pluginmanager.has_plugin("dsession")
    if end.pace is None or end.pace["verdict"] != cmp.REGRESSED or stopped:
        return
    from _pytest.runner import runtestprotocol

    measured = {m["test_id"] for m in measurements}
    items = [item for item in session.items if item.nodeid in measured]
    end.again = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a WARN of the second pass is not the run's
        for n, item in enumerate(items):
            properties = list(item.user_properties)
            reports = runtestprotocol(item, nextitem=items[n + 1] if n + 1 < len(items) else None, log=False)
            item.user_properties[:] = properties
            for report in reports:
                end.again += Payload.carried(report).measurements
    end.pace = cmp.run_pace(end.comparison[0], measurements, allowed, end.again)  # each figure's better pass


def judge_pace(end: RunEnd, session: pytest.Session, exitstatus: int) -> int:
    """The run's pace into the report; a run slower than its history allows fails PACE_TEST_ID (judged runs only)."""
    if end.pace is None or exitstatus not in JUDGED:
        return exitstatus
    from pytest_gbvalidate import compare as cmp

    end.report.set_pace(end.pace)
    if end.pace["verdict"] != cmp.REGRESSED:
        return exitstatus
    return outcomes.fail_run_check(end.config, session, PACE_TEST_ID, end.pace["message"], {cmp.REGRESSED})


def judge_nothing_checked(end: RunEnd, session: pytest.Session, exitstatus: int) -> int:
    """A run that would pass having checked nothing (node_verdict.checked) exits NO_TESTS_COLLECTED, as a run that
    selected nothing: never a pass. Not under torchrun / srun, whose launcher reads any other status of a rank as
    its failure: the report says no verdict all the same (report/node_verdict.py)."""
    from pytest_gbvalidate.report.node_verdict import checked

    data: Any = end.report.data  # a RunReportRecord by now: the run described, its tests and measurements
    quiet = end.under_launcher or end.config.option.collectonly
    if exitstatus != pytest.ExitCode.OK or quiet or checked(data):
        return exitstatus
    end.notes.append(
        "no check ran: every selected check was skipped (see why above), so nothing was measured or judged: no "
        f"verdict (exit {int(pytest.ExitCode.NO_TESTS_COLLECTED)}), never a pass"
    )
    session.exitstatus = pytest.ExitCode.NO_TESTS_COLLECTED
    return session.exitstatus


def judge_unresolved(end: RunEnd, session: pytest.Session, exitstatus: int) -> int:
    """Exit node_verdict.EXIT_UNRESOLVED, not 1, where every failed test was only too noisy to judge."""
    from pytest_gbvalidate.report import node_verdict

    if hasattr(end.config, "workerinput"):  # pytest-xdist's controller decides the run's status
        return exitstatus
    judged = node_verdict.judge(end.report.data)  # the run's checks so far: its status is set after this
    if exitstatus != pytest.ExitCode.TESTS_FAILED or not judged.unresolved or judged.faults:
        return exitstatus
    session.exitstatus = node_verdict.EXIT_UNRESOLVED
    return session.exitstatus


def fail_on_lost_outputs(end: RunEnd, session: pytest.Session, exitstatus: int) -> int:
    """A run whose report, recorded baseline, kept report or Prometheus file could not be written does not pass: a
    gate's evidence is missing; one whose report does not fit its own records is no verdict (our own failure)."""
    lost = end.report.write_error or end.record_error or end.report.data.get("outputs_lost")
    if exitstatus == pytest.ExitCode.OK and lost:
        session.exitstatus = exitstatus = pytest.ExitCode.TESTS_FAILED
    elif exitstatus == pytest.ExitCode.OK and end.report.misfit:
        session.exitstatus = exitstatus = pytest.ExitCode.INTERNAL_ERROR
    return exitstatus


def write_outputs(
    end: RunEnd, session: pytest.Session, writers_lost: Mapping[str, str], started: Path | None, stopper: Stopper | None
) -> None:
    """After pytest's writers: the report, with the files lost so far (`writers_lost` too), kept in the node's
    history (over the record kept as it `started`), written as a Prometheus file, and written."""
    from pytest_gbvalidate.run import sections

    for line in writers_lost.values():
        sections.output_lost(end.report, line)
    exitstatus = fail_on_lost_outputs(end, session, session.exitstatus)
    end.report.set("exit_status", int(exitstatus))
    if not end.config.option.collectonly:  # a run that measured nothing replaces no node's figures
        end.notes += sections.keep_report(end.report, end.history_dir, end.settings.prometheus.value, started)
        exitstatus = fail_on_lost_outputs(end, session, exitstatus)
        end.report.set("exit_status", int(exitstatus))  # a file lost fails the run, and the report says so
    end.report.write()
    fail_on_lost_outputs(end, session, exitstatus)  # the last write may be the one that failed
    if stopper is not None and stopper.signal_name is not None and not stopper.cut_short:
        end.notes.append(f"{stopper.signal_name} came once every check had run: the outputs were written first")


def output_notes(report: RunReport, notes: Sequence[str | None]) -> list[str]:
    """The terminal summary's last lines: the report's own failures, `notes`, the recorded baseline's, files lost."""
    found = [] if report.write_error is None else [f"JSON report NOT written: {report.write_error}; the run fails"]
    if report.misfit is not None:
        found.append(
            f"the JSON report does not fit its own schema ({report.misfit}): a bug of pytest-gbvalidate, please "
            "report it; its readers will refuse the report (exit 3 where the checks passed: no verdict)"
        )
    recorded = report.data.get("record")
    found += [note for note in (notes[0], None if recorded is None else recorded["note"], *notes[1:]) if note]
    return found + [f"{line}; the run fails" for line in report.data.get("outputs_lost", [])]


def incomplete(session: pytest.Session, exitstatus: int) -> str | None:
    """Why the run did not run every test it collected (Ctrl-C, -x, --maxfail, an internal error), else None: a
    baseline is recorded only from a complete run, never replaced with part of one."""
    if exitstatus not in JUDGED:
        return pytest.ExitCode(exitstatus).name.lower()
    return "stopped" if session.shouldfail or session.shouldstop else None
