"""Running a level of the shipped suites in a subprocess, within a deadline, and reading the report it wrote.

pytest runs (pytest_command) in a private temporary directory (mode 0700) that holds the report, its output and whatever
else the run writes, removed afterwards: no conftest.py, ini file or package of the caller's current directory
(slurmd's, NPD's) joins the run, and no earlier run's report can be read as this one's. The directory is locked while
the run lives; one left by a killed run (slurmd and NPD kill with SIGKILL) is removed by the next run. The run is its
own process group (the gang's ranks with it): at the deadline it gets SIGTERM, which the plugin turns into an
interrupted run that still writes its report (signals.py), then SIGKILL after KILL_GRACE_S. pytest gets SIGKILL should
this process die first (PR_SET_PDEATHSIG, Linux); the ranks leave once pytest is gone (ranks/gang.py).

The run gets neither PYTEST_ADDOPTS nor PYTEST_PLUGINS, and an empty pytest.ini of its own: a caller's shell options
(`-k numa`), plugins that deselect or an `addopts` in a directory above (/tmp/pytest.ini) would narrow the level's
checks, and a healthy verdict on a few would pass for one on all; the operator's pytest options go after `--`."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import cast

from pytest_gbvalidate.files import InputError, atomic_write_bytes, read_input, read_json
from pytest_gbvalidate.fleet.text import shorten
from pytest_gbvalidate.healthcheck.verdict import Run, escaped, exit_meaning
from pytest_gbvalidate.labels import printable
from pytest_gbvalidate.report import schema
from pytest_gbvalidate.report.records import RunReportRecord

SUITES_PACKAGE = "pytest_gbvalidate.suites"
DIRECTORY_PREFIX = "gbvalidate-healthcheck-"
HELD = ".held"  # the lock file that says a run's directory is in use
UNLOCKED_GRACE_S = 600.0
KILL_GRACE_S = 5.0  # after SIGTERM, for the interrupted run to write its report
OUTPUT_TAIL_BYTES = 64 * 1024  # of pytest's output, read for its last line
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
DROPPED_ENV = ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")  # what the run does not get of this process's environment


class CannotRun(Exception):
    """The checks could not start, for a cause of ours the one-line message names (no interpreter): no verdict."""


class Stopped(Exception):
    """This process got a termination signal while the checks ran; the run was killed."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def pytest_command(report: Path, level: str, pytest_args: Sequence[str], rerun: Path | None = None) -> list[str]:
    """The level's run; with `rerun`, an earlier run's report, only the checks that failed in it (run/rerun.py)."""
    command = [sys.executable, "-m", "pytest", "--pyargs", SUITES_PACKAGE, f"--gb-level={level}"]
    again = [] if rerun is None else [f"--gb-rerun-failed={rerun}"]
    return [*command, f"--gb-report={report}", *again, "-p", "no:cacheprovider", "-q", *pytest_args]


def run_checks(
    level: str,
    deadline_s: float,
    pytest_args: Sequence[str],
    keep_report: Path | None,
    rerun: RunReportRecord | None = None,
) -> tuple[Run, str | None]:
    """The run (with `rerun`, an earlier report: only the checks that failed in it), and why its report could not be
    kept at `keep_report`. Raises Stopped (after killing the run) on SIGTERM, SIGINT or SIGHUP, and CannotRun."""
    if not sys.executable:  # Python sets it empty where it cannot tell its own path
        raise CannotRun("this Python cannot tell its own path (sys.executable is empty): no interpreter for the checks")
    try:
        parent = Path(tempfile.gettempdir())
        remove_abandoned(parent)
        directory = Path(tempfile.mkdtemp(prefix=DIRECTORY_PREFIX))
    except OSError as exc:  # no usable temporary directory, or a full one
        raise CannotRun(f"cannot make the run's directory: {_why(exc)}") from None
    held = None
    try:
        try:
            held = _hold(directory)
            (directory / "pytest.ini").touch()
        except OSError as exc:
            raise CannotRun(f"cannot lock the run's directory: {_why(exc)}") from None
        report_path, output_path = directory / "report.json", directory / "output.log"
        earlier = None if rerun is None else directory / "earlier.json"
        if earlier is not None:
            try:
                atomic_write_bytes(earlier, json.dumps(rerun).encode())
            except OSError as exc:
                raise CannotRun(f"cannot write the earlier report for the second run: {_why(exc)}") from None
        command = pytest_command(report_path, level, pytest_args, earlier)
        start = time.monotonic()
        returncode, timed_out = _run(command, directory, output_path, deadline_s)
        duration_s = time.monotonic() - start
        not_kept = None
        if keep_report is not None:
            not_kept = _keep(report_path, keep_report) if report_path.exists() else "no report to keep"
        report, problem = read_report(report_path)
        if report is None and not report_path.exists():
            problem = (
                f"pytest wrote no report where the health check expected it ({exit_meaning(returncode)}): "
                f"{last_line(output_path)}"
            )
        elif problem is not None:  # name the file that stays, not the one about to go
            kept = keep_report is not None and not_kept is None
            problem = problem.replace(str(report_path), str(keep_report) if kept else "the run's report")
        elif report is not None and report["status"] != "finished" and returncode >= 0 and not timed_out:
            # pytest ended by itself with its report still running: the last write failed (a full disk)
            ended = f"pytest ended ({exit_meaning(returncode)}) with its report left {report['status']}"
            problem = f"{ended}: {last_line(output_path)}"
        return Run(level, returncode, timed_out, deadline_s, duration_s, report, problem), not_kept
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        if held is not None:
            os.close(held)


def _why(exc: OSError) -> str:
    """An OSError as one line: the file it names, if any, and the operating system's words."""
    said = exc.strerror or str(exc)
    return printable(f"{exc.filename}: {said}" if exc.filename is not None else said)


def checks_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The run's environment: `env` less DROPPED_ENV."""
    return {name: value for name, value in env.items() if name not in DROPPED_ENV}


def dropped_note(env: Mapping[str, str]) -> str | None:
    """What the line says of a DROPPED_ENV variable `env` sets (not empty), or None."""
    if not (dropped := [f"{name}={env[name]!a}" for name in DROPPED_ENV if env.get(name, "").strip()]):
        return None
    return f"{', '.join(dropped)} not passed on: the level's checks run as given (pytest options go after --)"


def _hold(directory: Path) -> int:
    """Lock the run's directory while this process lives (the kernel drops the lock however it dies); the fd."""
    fd = os.open(directory / HELD, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def remove_abandoned(parent: Path) -> list[Path]:
    """Remove the run directories in `parent` a killed check left (this user's, unlocked; with no lock file, past
    UNLOCKED_GRACE_S: made, not yet locked) and end the processes working in them; the ones removed."""
    removed = [directory for directory in parent.glob(f"{DIRECTORY_PREFIX}*") if _abandoned(directory)]
    if removed:
        _kill_working_in(removed)
    for directory in removed:
        shutil.rmtree(directory, ignore_errors=True)
    return removed


def _kill_working_in(directories: list[Path]) -> None:
    """SIGKILL the processes working in these directories: a killed run's ranks, whatever outlived its pytest."""
    import psutil

    roots = [str(d.resolve()) for d in directories]
    for process in psutil.process_iter():
        try:
            cwd = process.cwd()
            if any(cwd == root or cwd.startswith(root + os.sep) for root in roots):
                process.kill()
        except (psutil.Error, OSError):
            continue


def _abandoned(directory: Path) -> bool:
    try:
        info = directory.lstat()
    except OSError:
        return False
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        return False
    try:
        fd = os.open(directory / HELD, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return time.time() - info.st_mtime > UNLOCKED_GRACE_S
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # refused while the run that made it lives
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def read_report(path: Path) -> tuple[RunReportRecord | None, str | None]:
    """The report at `path` checked against the report's records, or None and why not (the file and the field)."""
    try:
        data = read_json(path)
    except InputError as exc:  # files.py's words and our own path: the values in them escaped already
        return None, escaped(str(exc))
    if (problem := schema.problem(data)) is not None:
        return None, f"{path}: {escaped(problem)}"
    return cast(RunReportRecord, data), None


def last_line(path: Path) -> str:
    """The line of pytest's output (our own file) that says what went wrong, as it may be shown."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - OUTPUT_TAIL_BYTES))
            data = f.read(OUTPUT_TAIL_BYTES)
    except OSError as exc:
        return printable(f"{path}: {exc.strerror or exc}")
    lines = [line.strip() for line in data.decode("utf-8", "replace").splitlines() if line.strip()]
    # Not the last line (a usage error ends with its rootdir, a collection error with a summary): the run's own line
    # for an output it could not write, else the last `error:` line, or the last `E   ` line of a traceback.
    errors = [line for line in lines if "NOT written" in line]
    errors = errors or [s for s in lines if "error:" in s.lower() or s.startswith(("E ", "INTERNALERROR>"))]
    said = errors or lines
    return shorten(printable(said[-1]), 200) if said else "no output"


def _keep(report: Path, keep: Path) -> str | None:
    """Copy the report to `keep` (files.py's rules); why not, or None."""
    try:
        atomic_write_bytes(keep, read_input(report))
    except (OSError, InputError) as exc:
        return f"report not kept: {printable(str(exc))}"
    return None


def _run(command: list[str], cwd: Path, output: Path, deadline_s: float) -> tuple[int, bool]:
    """pytest's exit code (negative: the signal that ended it) and whether the deadline killed it."""
    try:
        out = output.open("wb")
    except OSError as exc:
        raise CannotRun(f"cannot write pytest's output: {_why(exc)}") from None
    with out:
        try:
            process = subprocess.Popen(
                command,
                cwd=cwd,
                env=checks_environment(os.environ),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,  # this command line runs one thread
            )
        except OSError as exc:  # gone, a directory, not executable
            why = printable(exc.strerror or str(exc))
            raise CannotRun(f"cannot start the checks' interpreter {command[0]!a}: {why}") from None
    stops = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    previous = {s: signal.signal(s, _raise_stopped) for s in stops}
    try:
        try:
            return process.wait(timeout=deadline_s), False
        except subprocess.TimeoutExpired:
            _stop(process)
            return process.returncode, True
    except Stopped:
        for s in stops:  # a second signal must not cut the teardown short
            signal.signal(s, signal.SIG_IGN)
        _stop(process)
        raise
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _raise_stopped(signum: int, _frame: object) -> None:
    raise Stopped(signum)


def _stop(process: subprocess.Popen[bytes]) -> None:
    _signal_group(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=KILL_GRACE_S)
    _signal_group(process.pid, signal.SIGKILL)  # the ranks too, should pytest have left them behind
    process.wait()


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is gone
        os.killpg(pgid, signum)


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
