"""contrib/slurm/gbvalidate-healthcheck.sh under bash with a stand-in for Python that shows what it was run with:
the settings file (read, never run; its owner and mode checked; the environment wins over it), the statuses
(a Prolog's or Epilog's "no verdict" made 0, since Slurm drains for any other), and a missing Python named. The
script under a real slurmd, with real checks: e2e/test_slurm.py."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.helpers.healthcheck import run_env
from tests.helpers.runs import REPO

pytestmark = pytest.mark.outside

SCRIPT = REPO / "contrib" / "slurm" / "gbvalidate-healthcheck.sh"

# A stand-in for Python that says, in the health check's own line, what the script ran it with, and exits as told.
FAKE_PYTHON = """#!/bin/bash
echo "some warning on the way" >&2
echo "gbvalidate:  argv=$* cuda=${CUDA_VISIBLE_DEVICES:-unset}"
exit "${FAKE_EXIT:-0}"
"""


def run_script(tmp_path: Path, conf: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    """The script with the settings file `conf` (none where None) and this environment, as slurmd gives it."""
    settings = tmp_path / "gbvalidate-healthcheck.conf"
    if conf is not None:
        settings.write_text(conf)
        settings.chmod(0o644)
    environment = run_env(tmp_path, GBVALIDATE_CONF=str(settings), **env)
    return subprocess.run(
        ["bash", str(SCRIPT)], cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def python(tmp_path: Path) -> Path:
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    return fake


def test_the_settings_file_reaches_the_command_and_its_status_comes_back(tmp_path: Path, python: Path) -> None:
    conf = f"""\
# as an operator edits it
GBVALIDATE_PYTHON={python}
GBVALIDATE_DEADLINE_S=45
GBVALIDATE_KEEP_REPORT="/var/log/gb.json"
GBVALIDATE_PYTEST_ARGS='--gb-sku=cpu  -k copy'
GBVALIDATE_SYSLOG=0
"""
    epilog = run_script(tmp_path, conf, CUDA_VISIBLE_DEVICES="2", FAKE_EXIT="142", SLURM_SCRIPT_CONTEXT="epilog_slurmd")
    assert epilog.returncode == 142
    argv, cuda = epilog.stdout.strip().removeprefix("gbvalidate:  argv=").rsplit(" cuda=", 1)
    assert shlex.split(argv) == [
        *("-m", "pytest_gbvalidate.healthcheck", "slurm", "--level", "passive", "--deadline-s", "45", "--drain"),
        *("--drain-log", "/var/lib/gbvalidate/drains.json", "--keep-report", "/var/log/gb.json"),
        *("--", "--gb-sku=cpu", "-k", "copy"),
    ]
    assert cuda == "unset"  # a Prolog's or Epilog's CUDA_VISIBLE_DEVICES names the job's GPUs, not the node's

    # By hand: the environment wins over the file. HealthCheckProgram (no script context) keeps the job's GPUs.
    by_hand = run_script(
        tmp_path,
        conf,
        CUDA_VISIBLE_DEVICES="2",
        GBVALIDATE_DRAIN="0",
        GBVALIDATE_CONFIRM="0",
        GBVALIDATE_PYTEST_ARGS="",
    )
    assert by_hand.returncode == 0
    assert by_hand.stdout == (
        "gbvalidate:  argv=-m pytest_gbvalidate.healthcheck slurm --level passive --deadline-s 45 --no-confirm "
        "--keep-report /var/log/gb.json -- "
        "cuda=2\n"
    )


@pytest.mark.parametrize(
    ("context", "status"),
    [("prolog_slurmd", 0), ("epilog_slurmd", 0), ("", 10)],
)
def test_our_own_failure_is_no_verdict_and_a_prolog_does_not_drain_for_it(
    tmp_path: Path, context: str, status: int
) -> None:
    """A missing Python: the line names it and the settings file; as Prolog or Epilog the status is 0, else NHC's
    10 (HealthCheckProgram's status drains nothing: slurmd only logs it)."""
    missing = tmp_path / "no-such-python"
    log = tmp_path / "hc.log"
    conf = f"GBVALIDATE_PYTHON={missing}\nGBVALIDATE_SYSLOG=0\nGBVALIDATE_LOG_FILE={log}\n"
    env = {"SLURMD_NODENAME": "gpu-017"} | ({"SLURM_SCRIPT_CONTEXT": context} if context else {})
    done = run_script(tmp_path, conf, **env)
    assert done.returncode == status
    line = (
        f"ERROR:  gbvalidate:  Health check could not run:  {missing} -m pytest_gbvalidate.healthcheck exited 127: "
        f"{SCRIPT}: line "
    )
    assert done.stdout.startswith(line) and done.stdout.endswith(
        f"{missing}: No such file or directory (GBVALIDATE_PYTHON in {tmp_path / 'gbvalidate-healthcheck.conf'})\n"
    )
    (logged,) = log.read_text().splitlines()
    assert logged.split(" ", 2)[1:] == ["gpu-017", done.stdout.strip()]


@pytest.mark.parametrize("status", [0, 1, 142, 10, 4, 143])
def test_a_prolog_keeps_a_verdict_s_status_and_makes_no_verdict_0(tmp_path: Path, python: Path, status: int) -> None:
    conf = f"GBVALIDATE_PYTHON={python}\nGBVALIDATE_SYSLOG=0\n"
    done = run_script(tmp_path, conf, FAKE_EXIT=str(status), SLURM_SCRIPT_CONTEXT="prolog_slurmd")
    assert done.returncode == (status if status in (0, 1, 142) else 0)
    assert done.stdout.startswith("gbvalidate:  argv=")


@pytest.mark.parametrize(
    ("conf", "mode", "why"),
    [
        ("GBVALIDATE_PYTHON=python3\n", 0o666, "owned by uid {uid} with mode 666: it must be writable by root"),
        ("GBVALIDATE_PYTHON=python3\n", 0o620, "with mode 620"),
        ("GBVALIDATE_PYTON=python3\n", 0o644, "line 1: unknown setting GBVALIDATE_PYTON (known: GBVALIDATE_PYTHON "),
        ("# ok\n\n$(reboot)\n", 0o644, "line 3: not KEY=VALUE"),
        ("GBVALIDATE_DRAIN=yes\n", 0o644, "GBVALIDATE_DRAIN=yes: expected 1 or 0"),
        ("GBVALIDATE_CONFIRM=twice\n", 0o644, "GBVALIDATE_CONFIRM=twice: expected 1 or 0"),
        # a node drained after draining was switched off: the first of two values held, silently
        (
            "GBVALIDATE_DRAIN=0\n#\nGBVALIDATE_DRAIN=1\n",
            0o644,
            "line 3: GBVALIDATE_DRAIN is set again (first on line 1)",
        ),
        (
            "GBVALIDATE_DRAIN=0\r\n",
            0o644,
            "line 1: ends in a carriage return (Windows line ends: convert with dos2unix)",
        ),
    ],
    ids=[
        "everyone-writes",
        "group-writes",
        "unknown-key",
        "not-key-value",
        "bad-value",
        "bad-confirm",
        "repeated",
        "crlf",
    ],
)
def test_a_settings_file_that_cannot_be_trusted_or_read_is_no_verdict(
    tmp_path: Path, python: Path, conf: str, mode: int, why: str
) -> None:
    settings = tmp_path / "gbvalidate-healthcheck.conf"
    settings.write_text(conf + "GBVALIDATE_SYSLOG=0\n")
    settings.chmod(mode)
    environment = run_env(tmp_path, GBVALIDATE_CONF=str(settings), SLURM_SCRIPT_CONTEXT="prolog_slurmd")
    done = subprocess.run(["bash", str(SCRIPT)], env=environment, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0  # a Prolog: no verdict drains nothing
    assert done.stdout.startswith("ERROR:  gbvalidate:  Health check could not run:  ")
    assert why.format(uid=os.geteuid()) in done.stdout, done.stdout
    assert "argv=" not in done.stdout  # nothing ran


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_settings_path_that_is_no_regular_file_is_no_verdict_at_once(tmp_path: Path, kind: str) -> None:
    """A directory made the Prolog exit 1 (Slurm drained the node); a FIFO hung it until slurmd killed it."""
    settings = tmp_path / "gbvalidate-healthcheck.conf"
    if kind == "directory":
        settings.mkdir()
    else:
        os.mkfifo(settings, 0o644)
    environment = run_env(tmp_path, GBVALIDATE_CONF=str(settings), SLURM_SCRIPT_CONTEXT="prolog_slurmd")
    done = subprocess.run(["bash", str(SCRIPT)], env=environment, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0
    assert done.stdout == f"ERROR:  gbvalidate:  Health check could not run:  {settings}: not a regular file\n"


def test_the_log_file_is_never_written_through_a_link_or_in_a_directory_others_may_write(
    tmp_path: Path, python: Path
) -> None:
    """Root appended the line to whatever a link at GBVALIDATE_LOG_FILE named."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o755)
    link = logs / "hc.log"
    link.symlink_to(victim)
    conf = f"GBVALIDATE_PYTHON={python}\nGBVALIDATE_SYSLOG=0\nGBVALIDATE_LOG_FILE={link}\n"
    done = run_script(tmp_path, conf)
    assert done.returncode == 0 and done.stdout.startswith("gbvalidate:  argv=")
    assert victim.read_text() == "precious\n"
    link.unlink()
    logs.chmod(0o777)  # anyone could put a link there between the check and the write
    run_script(tmp_path, conf)
    assert not link.exists()
    logs.chmod(0o755)
    run_script(tmp_path, conf)
    (logged,) = link.read_text().splitlines()
    assert logged.endswith(
        "gbvalidate:  argv=-m pytest_gbvalidate.healthcheck slurm --level passive --drain --drain-log "
        "/var/lib/gbvalidate/drains.json -- cuda=unset"
    )


# A slurmctld that does not answer: scontrol (HANG=show) or sbatch (HANG=sbatch) waits where it would ask it
# (`show hostnames` is local); otherwise every node is idle.
SILENT_SLURM = """#!/bin/bash
if [[ "$1 $2" == "show hostnames" ]]; then echo gpu-001; echo gpu-002; exit 0; fi
if [[ "$HANG" == "$1" || "$HANG" == "$(basename "$0")" ]]; then exec sleep 60; fi
echo "NodeName=$4 State=IDLE Partitions=debug"
"""


@pytest.mark.parametrize(
    ("hang", "said"),
    [
        ("show", "left alone (no state: out of service, or no answer within 1 s)"),
        ("sbatch", "not submitted (sbatch failed or gave no answer within 1 s)"),
    ],
)
def test_the_gate_submitter_is_bounded_where_slurmctld_does_not_answer(tmp_path: Path, hang: str, said: str) -> None:
    """contrib/slurm/gbvalidate-gate-submit.sh waits GBVALIDATE_SLURM_TIMEOUT_S at most for each scontrol and sbatch
    call, and says which node it left alone for that, never hanging without a line."""
    for name in ("scontrol", "sbatch"):
        (tmp_path / name).write_text(SILENT_SLURM)
        (tmp_path / name).chmod(0o755)
    env = run_env(tmp_path, GBVALIDATE_SLURM_TIMEOUT_S="1", HANG=hang)
    script = REPO / "contrib" / "slurm" / "gbvalidate-gate-submit.sh"
    done = subprocess.run(["bash", str(script), "gpu-[001-002]"], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"gpu-00{n}: {said}" for n in (1, 2)]
