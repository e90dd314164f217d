"""`python -m pytest_gbvalidate.healthcheck` end to end: real quick runs of the shipped suites on the cpu SKU, with
a stub `scontrol` first on PATH. A healthy node (Slurm mode, --drain): exit 0, one line, nothing drained, the
report kept; a run past its deadline (NPD and Slurm modes, and a real slurmd's Prolog where a real Slurm runs here):
killed with its process group, Unknown for NPD, exit 142 and drained for Slurm; a SIGTERM to the command: NHC's
143, the run killed, nothing drained. (A failing node, through contrib/slurm's script: e2e/test_contrib_slurm.py;
verdicts on reports made here: unit/test_healthcheck_*.)"""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import pytest

from pytest_gbvalidate.healthcheck.level_run import remove_abandoned
from tests.helpers.healthcheck import run_env, scontrol_calls, stub_scontrol
from tests.helpers.slurm import SKIP_REASON, hung_prolog


def healthcheck(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "pytest_gbvalidate.healthcheck", *args]
    return subprocess.run(
        command, cwd=tmp_path, env=run_env(tmp_path, **env), capture_output=True, text=True, timeout=300
    )


def processes_with(mark: str) -> list[psutil.Process]:
    """The processes still running with MARK in their environment: what a run left behind."""
    left = []
    for process in psutil.process_iter():
        try:
            if process.environ().get("GBVALIDATE_TEST_MARK") == mark:
                left.append(process)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return left


def test_a_healthy_node_passes_in_one_line_and_is_not_drained(tmp_path: Path) -> None:
    calls = stub_scontrol(tmp_path)
    kept = tmp_path / "kept.json"
    args = ("slurm", "--level", "quick", "--drain", "--keep-report", str(kept), "--", "--gb-sku=cpu")
    done = healthcheck(tmp_path, *args, SLURMD_NODENAME="gpu-017")
    assert done.returncode == 0, done.stdout + done.stderr
    (line,) = done.stdout.splitlines()
    match = re.fullmatch(
        r"gbvalidate:  Node Health Check completed successfully \(\d+s\): quick level, (\d+) passed, (\d+) skipped",
        line,
    )
    assert match is not None, line
    assert scontrol_calls(calls) == []

    report = json.loads(kept.read_text())  # the run's own report, kept: the schema check holds it to the records
    assert (report["status"], report["exit_status"], report["level"], report["sku"]["name"]) == (
        "finished",
        0,
        "quick",
        "cpu",
    )
    assert {t["level"] for t in report["tests"]} == {"passive", "quick"}  # a level runs those below it too
    passed = {t["test_id"] for t in report["tests"] if t["outcome"] == "passed" and t["when"] == "call"}
    skipped = {t["test_id"] for t in report["tests"] if t["outcome"] == "skipped"}
    assert (int(match[1]), int(match[2])) == (len(passed), len(skipped))
    assert {"test_host_copy_bandwidth", "test_all_reduce_one_size"} <= {p.rsplit("::", 1)[-1] for p in passed}
    assert list((tmp_path / "tmp").iterdir()) == []  # the run's private directory is gone


# A pytest plugin that hangs the run as soon as pytest is configured, after starting a process of its own that
# ignores SIGTERM (as a rank stuck in a collective may): only the SIGKILL to the whole process group ends that one.
HANG = """
import os, signal, subprocess, sys, time

IGNORE = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(600)"

def pytest_configure(config):
    child = subprocess.Popen([sys.executable, "-c", IGNORE], stdout=subprocess.PIPE, text=True)
    child.stdout.readline()
    with open(os.environ["HUNG_FILE"], "w") as f:
        f.write(str(child.pid))
    time.sleep(600)
"""


HUNG_RUN = ("--gb-sku=cpu", "-p", "hang_plugin")


@pytest.mark.outside  # a real Slurm, where one can run here
def test_a_run_past_its_deadline_is_killed_with_its_process_group(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """NPD: Unknown (as NPD's own timeout); Slurm: exit 142 and drained, as NHC's watchdog. Nothing stays behind.
    The shortest deadline there is (a shorter one is a usage error), both modes at once; and in the same 20 s, where
    a real Slurm can run here, a real slurmd's Prolog whose check hangs: PrologEpilogTimeout=40 leaves the check 20 s
    after its start-up, report and scontrol (it once kept its own 90 s deadline, and slurmd killed it at 40 s
    without a line), and the job does not run."""
    (tmp_path / "hang_plugin.py").write_text(HANG)
    calls, mark = stub_scontrol(tmp_path), uuid.uuid4().hex
    hung = {mode: tmp_path / f"hung-{mode}" for mode in ("npd", "slurm")}
    runs = {
        mode: subprocess.Popen(
            [sys.executable, "-m", "pytest_gbvalidate.healthcheck", *args, "--deadline-s", "20", "--", *HUNG_RUN],
            cwd=tmp_path,
            env=run_env(tmp_path, GBVALIDATE_TEST_MARK=mark, PYTHONPATH=str(tmp_path), HUNG_FILE=str(hung[mode]))
            | ({"SLURMD_NODENAME": "gpu-017"} if mode == "slurm" else {}),
            stdout=subprocess.PIPE,
            text=True,
        )
        for mode, args in (
            ("npd", ["npd", "--deadline-s", "20"]),
            ("slurm", ["slurm", "--drain", "--deadline-s", "20"]),
        )
    }
    prolog = None if SKIP_REASON else hung_prolog(tmp_path_factory.mktemp("slurm-prolog"))
    out = {mode: run.communicate(timeout=120)[0] for mode, run in runs.items()}
    assert (runs["npd"].returncode, out["npd"]) == (
        2,
        "unknown: timeout: the quick checks did not finish within 20 s\n",
    )
    assert runs["slurm"].returncode == 142, out["slurm"]
    assert out["slurm"] == (  # slurmd's hooks run the passive level by default
        "ERROR:  gbvalidate:  Health check failed:  timeout: the passive checks did not finish within 20 s; "
        "killed at the 20 s deadline; drained gpu-017\n"
    )
    reason = "reason=gbvalidate: [hardware] timeout: the passive checks did not finish within 20 s"
    assert scontrol_calls(calls) == [["update", "nodename=gpu-017", "state=drain", reason]]
    for path in hung.values():
        assert path.exists(), "the run was killed before it hung: nothing shows the SIGKILL reached its process group"
        pid = int(path.read_text())
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
    assert processes_with(mark) == [] and list((tmp_path / "tmp").iterdir()) == []
    if prolog is not None:
        line, job_output = prolog
        assert line.startswith(out["slurm"].split(";")[0]), line
        assert "the job ran" not in job_output


def test_a_stop_from_outside_kills_the_run_and_drains_nothing(tmp_path: Path) -> None:
    """SIGTERM to the command (an operator, slurmd): NHC's exit 143, a line that says there is no verdict; the
    run's process group is killed."""
    (tmp_path / "hang_plugin.py").write_text(HANG)
    calls, hung, mark = stub_scontrol(tmp_path), tmp_path / "hung", uuid.uuid4().hex
    command = [sys.executable, "-m", "pytest_gbvalidate.healthcheck", "slurm", "--drain", "--deadline-s", "60"]
    env = run_env(tmp_path, GBVALIDATE_TEST_MARK=mark, PYTHONPATH=str(tmp_path), HUNG_FILE=str(hung))
    env |= {"SLURMD_NODENAME": "gpu-017", "SLURM_SCRIPT_CONTEXT": "prolog_slurmd"}  # a Prolog: no 60 s kill
    with subprocess.Popen(
        [*command, "--", "--gb-sku=cpu", "-p", "hang_plugin"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True
    ) as process:
        for _ in range(600):  # until the run hangs: at most 60 s
            if hung.exists() and hung.read_text():
                break
            time.sleep(0.1)
        assert hung.exists(), "the run did not hang within 60 s"
        process.terminate()
        out, _ = process.communicate(timeout=60)
    assert process.returncode == 143
    assert out == (
        "ERROR:  gbvalidate:  Health check could not finish:  Terminated by signal SIGTERM; no verdict, nothing "
        "drained.\n"
    )
    assert scontrol_calls(calls) == [] and processes_with(mark) == []
    assert list((tmp_path / "tmp").iterdir()) == []


def test_a_kill_by_slurmd_leaves_a_directory_the_next_run_removes(tmp_path: Path) -> None:
    """slurmd ends an overrunning HealthCheckProgram as its run_command() does: SIGTERM to the process group, SIGKILL
    10 ms later. No clean-up runs; the run's pytest dies with it (parent-death signal); its directory stays until
    the next run removes it, and a run in progress keeps its own."""
    (tmp_path / "hang_plugin.py").write_text(HANG)
    hung, mark = tmp_path / "hung", uuid.uuid4().hex
    env = run_env(tmp_path, GBVALIDATE_TEST_MARK=mark, PYTHONPATH=str(tmp_path), HUNG_FILE=str(hung))
    command = [sys.executable, "-m", "pytest_gbvalidate.healthcheck", "slurm", "--", *HUNG_RUN]
    with subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, start_new_session=True) as run:
        for _ in range(600):
            if hung.exists() and hung.read_text():
                break
            time.sleep(0.1)
        assert hung.exists(), "the run did not hang within 60 s"
        os.killpg(run.pid, signal.SIGTERM)
        time.sleep(0.01)
        os.killpg(run.pid, signal.SIGKILL)
    (left,) = (tmp_path / "tmp").iterdir()
    assert left.name.startswith("gbvalidate-healthcheck-")
    assert processes_with(mark) != []  # the hung check's own process, which ignores SIGTERM, outlived pytest

    in_progress = Path(tempfile.mkdtemp(prefix="gbvalidate-healthcheck-", dir=tmp_path / "tmp"))
    held = os.open(in_progress / ".held", os.O_CREAT | os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        assert remove_abandoned(tmp_path / "tmp") == [left]
    finally:
        os.close(held)
    assert list((tmp_path / "tmp").iterdir()) == [in_progress]
    deadline = time.monotonic() + 10
    while processes_with(mark) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_with(mark) == []


def test_an_inherited_pytest_addopts_does_not_narrow_the_checks(tmp_path: Path) -> None:
    """PYTEST_ADDOPTS from the caller's shell: `--collect-only` there would run no check at all. The run does not
    get it, and the line says so; nor an ini file's `addopts` in a directory above the run's (pytest looks upward
    from it: a /tmp/pytest.ini), nor PYTEST_PLUGINS."""
    (tmp_path / "tmp").mkdir()
    (tmp_path / "tmp" / "pytest.ini").write_text("[pytest]\naddopts = --collect-only\n")
    done = healthcheck(
        tmp_path,
        "npd",
        "--max-output-length",
        "400",
        "--",
        "--gb-sku=cpu",
        "-k",
        "numa",
        PYTEST_ADDOPTS="--collect-only",
        PYTEST_PLUGINS="no_such_plugin_module",
    )
    assert (done.returncode, done.stdout) == (
        0,
        "quick GPU node checks pass; PYTEST_ADDOPTS='--collect-only', PYTEST_PLUGINS='no_such_plugin_module' not "
        "passed on: the level's checks run as given (pytest options go after --)\n",
    ), done.stderr


def test_a_run_that_writes_no_report_says_where_it_was_expected(tmp_path: Path) -> None:
    """`-- --version`: pytest exits 0 without running anything. Not "tests passed": no verdict."""
    done = healthcheck(tmp_path, "slurm", "--", "--version")
    assert done.returncode == 10, done.stdout + done.stderr
    assert done.stdout.startswith(
        "ERROR:  gbvalidate:  Health check could not run:  pytest wrote no report where the health check expected it "
        "(exit status 0): pytest "
    )
    assert list((tmp_path / "tmp").iterdir()) == []


def test_an_interpreter_that_cannot_import_the_command_is_no_verdict(tmp_path: Path) -> None:
    """A dependency missing (typing_extensions, which the command's imports need): one line and the mode's no
    verdict status (Slurm 10, NPD 2), not a traceback and exit 1, which NPD reads as NonOK."""
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "typing_extensions.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'typing_extensions'\", name='typing_extensions')\n"
    )
    said = "cannot import the health check: ModuleNotFoundError: No module named"
    for mode, code, line in (
        ("slurm", 10, f"ERROR:  gbvalidate:  Health check could not run:  {said} 'typing_extensions'\n"),
        ("npd", 2, f"unknown: {said}...\n"),
    ):
        done = healthcheck(tmp_path, mode, PYTHONPATH=str(broken))
        assert (done.returncode, done.stdout, done.stderr) == (code, line, "")
