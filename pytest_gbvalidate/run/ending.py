"""The run's end: what the run as a whole says beyond its checks, and the exit status it ends with -- the node's GPU
preconditions, the pace against the node's history (measured again where a neighbour may have slowed it), a run
that checked nothing, and outputs that could not be written. Each takes the session and the exit status so far."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_gbvalidate.run import outcomes
from pytest_gbvalidate.run.payload import Payload

if TYPE_CHECKING:
    from pytest_gbvalidate.report.records import MeasurementRecord
    from pytest_gbvalidate.report.writer import RunReport
    from pytest_gbvalidate.run.session import GbSession
    from pytest_gbvalidate.run.signals import Stopper

# The test a run slower across the board than the node's history fails (compare.run_pace): no check of a suite,
# the run as a whole.
PACE_TEST_ID = "gbvalidate::node_pace"
JUDGED = (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED)  # a run that passed or failed its checks


def judge_preconditions(gb: GbSession, session: pytest.Session, exitstatus: int) -> int:
    """A node whose GPUs cannot be used fails the test PRECONDITIONS_TEST_ID once, with the cause and its fault
    category; the checks that depend on it were skipped naming it (markers.select). Only for a run that ran its
    checks."""
    unusable = gb.unusable_gpus()
    if unusable is None or gb.config.option.collectonly or exitstatus not in JUDGED:
        return exitstatus
    from pytest_gbvalidate.node.preconditions import PRECONDITIONS_TEST_ID

    message = f"the node's GPUs cannot be used: {unusable.why}"
    return outcomes.fail_run_check(gb.config, session, PRECONDITIONS_TEST_ID, message, set())


def measure_again(gb: GbSession, session: pytest.Session) -> list[MeasurementRecord] | None:
    """Where the run's pace against the node's history would regress (compare.run_pace), every test that measured
    runs once more, silently (its reports, failures and warnings left out: the first pass's stand), and the
    measurements of that second pass are returned for the pace to take each figure's better pass: a neighbour that
    held the machine for one pass slows that pass, a node that lost pace is slow in both (docs/noise.md).
    pytest-rerunfailures runs a test again the same way (`runtestprotocol`, not logged). None where nothing is
    measured again: no comparison with a history, a run stopped early, or pytest-xdist's controller (its workers
    ran the tests)."""
    comparison = gb.comparison_if_engaged
    if (
        comparison is None
        or not gb.is_controller
        or session.shouldstop
        or session.shouldfail
        or gb.config.pluginmanager.has_plugin("dsession")
    ):
        return None
    from _pytest.runner import runtestprotocol

    from pytest_gbvalidate import compare as cmp

    measurements = gb.report.data["measurements"]
    allowed = gb.settings.compare_fail.value or cmp.AllowedRegression()
    pace = cmp.run_pace(comparison[0], measurements, allowed)
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
                again += Payload.carried(report).measurements
    return again


def judge_pace(gb: GbSession, session: pytest.Session, exitstatus: int, again: list[MeasurementRecord] | None) -> int:
    """With --gb-compare and the node's history: the run as a whole against the node's kept runs (compare.run_pace),
    in the report's `compare.pace`, each figure the better of its passes (`again`). A run slower across the board
    than its history allows fails PACE_TEST_ID. Only for a run that passed or failed its checks."""
    comparison = gb.comparison_if_engaged
    if comparison is None or gb.config.option.collectonly or exitstatus not in JUDGED:
        return exitstatus
    from pytest_gbvalidate import compare as cmp

    allowed = gb.settings.compare_fail.value or cmp.AllowedRegression()
    pace = cmp.run_pace(comparison[0], gb.report.data["measurements"], allowed, again)
    if pace is None:
        return exitstatus
    gb.report.set_pace(pace)
    if pace["verdict"] != cmp.REGRESSED:
        return exitstatus
    return outcomes.fail_run_check(gb.config, session, PACE_TEST_ID, pace["message"], {cmp.REGRESSED})


def judge_nothing_checked(gb: GbSession, session: pytest.Session, exitstatus: int) -> int:
    """A run that would pass having checked nothing -- every check skipped and no figure judged: a baseline that
    gates nothing, a -k that matched only checks this node cannot run -- no verdict (pytest's NO_TESTS_COLLECTED,
    as a run that selected nothing), never a pass. Not under torchrun / srun, whose launcher reads any other status
    of a rank as its failure and ends the world: the report says no verdict all the same (report/node_verdict.py),
    which the fleet summary reads."""
    from pytest_gbvalidate.report.node_verdict import checked

    data: Any = gb.report.data  # a RunReportRecord by now: the run described, its tests and measurements
    quiet = gb.world is not None or gb.config.option.collectonly
    if exitstatus != pytest.ExitCode.OK or quiet or checked(data):
        return exitstatus
    gb.output_notes.append(
        "no check ran: every selected check was skipped (see why above), so nothing was measured or judged: no "
        f"verdict (exit {int(pytest.ExitCode.NO_TESTS_COLLECTED)}), never a pass"
    )
    session.exitstatus = pytest.ExitCode.NO_TESTS_COLLECTED
    return session.exitstatus


def judge_unresolved(gb: GbSession, session: pytest.Session, exitstatus: int) -> int:
    """A run whose every failed test failed only for figures too noisy to judge exits
    node_verdict.EXIT_UNRESOLVED, not 1: "this run could not tell" is no "this node failed" (the terminal's last
    line, the JUnit XML's error type and the page say the same)."""
    from pytest_gbvalidate.report import node_verdict

    if hasattr(gb.config, "workerinput"):  # pytest-xdist's controller decides the run's status
        return exitstatus
    if exitstatus != pytest.ExitCode.TESTS_FAILED or not node_verdict.only_unresolved(gb.report.data["tests"]):
        return exitstatus
    session.exitstatus = node_verdict.EXIT_UNRESOLVED
    return session.exitstatus


def fail_on_lost_outputs(gb: GbSession, session: pytest.Session, exitstatus: int) -> int:
    """A run whose report, recorded baseline, kept report or Prometheus file could not be written does not pass: a
    gate's evidence is missing; one whose report does not fit its own records is no verdict (our own failure)."""
    lost = gb.report.write_error or gb.record_error or gb.report.data.get("outputs_lost")
    if exitstatus == pytest.ExitCode.OK and lost:
        session.exitstatus = exitstatus = pytest.ExitCode.TESTS_FAILED
    elif exitstatus == pytest.ExitCode.OK and gb.report.misfit:
        session.exitstatus = exitstatus = pytest.ExitCode.INTERNAL_ERROR
    return exitstatus


def write_outputs(
    gb: GbSession,
    session: pytest.Session,
    writers_lost: Mapping[str, str],
    started: Path | None,
    stopper: Stopper | None,
) -> None:
    """After pytest's writers: the report, with the files lost so far (`outputs_lost`: pytest's JUnit XML or page in
    `writers_lost`; a lost file fails the run), kept in the node's history (over the record kept as it `started`),
    written as a Prometheus file, and written."""
    from pytest_gbvalidate.run import sections

    for line in writers_lost.values():
        sections.output_lost(gb.report, line)
    exitstatus = fail_on_lost_outputs(gb, session, session.exitstatus)
    gb.report.set("exit_status", int(exitstatus))
    if not gb.config.option.collectonly:  # a run that measured nothing replaces no node's figures
        prometheus = gb.settings.prometheus.value
        gb.output_notes += sections.keep_report(gb.report, gb.history_dir, prometheus, started)
        exitstatus = fail_on_lost_outputs(gb, session, exitstatus)
        gb.report.set("exit_status", int(exitstatus))  # a file lost fails the run, and the report says so
    gb.report.write()
    fail_on_lost_outputs(gb, session, exitstatus)  # the last write may be the one that failed
    if stopper is not None and stopper.signal_name is not None and not stopper.cut_short:
        gb.output_notes.append(f"{stopper.signal_name} came once every check had run: the outputs were written first")


def output_notes(report: RunReport, notes: Sequence[str | None]) -> list[str]:
    """The terminal summary's last lines: the report's own failures, then `notes` (the plot's, where the files went)
    and the recorded baseline's, then each file lost."""
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
