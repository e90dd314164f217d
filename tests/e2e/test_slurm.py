"""Against a real Slurm (tests/helpers/slurm.py: munged, slurmctld and a slurmd per node on this machine), exactly
what an operator runs: contrib/slurm/'s files as written (the slurm.conf lines of its README, the health check script
and its settings file as Prolog, Epilog and HealthCheckProgram, the sbatch recipes), srun and sbatch worlds, and the
fleet summary's scontrol lines run as printed; drains read back with sinfo. What a real Slurm here cannot show (a
scontrol that hangs or fails) stays with the stub in test_contrib_slurm.py and the unit tests."""

from __future__ import annotations

import csv
import json
import re
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.fleet_reports import write
from tests.helpers.healthcheck import FAULT, record, report_with
from tests.helpers.slurm import (
    CONTRIB,
    HEALTHY,
    SKIP_REASON,
    SlurmCluster,
    free_ports,
    install_recipe,
    logged,
    recipe_lines,
    slurm_cluster,
)

pytestmark = [pytest.mark.outside, pytest.mark.skipif(bool(SKIP_REASON), reason=SKIP_REASON)]

# A site's own check at the passive level (it reads the node), failing.
SITE_CHECK = (
    "import pytest\n\n\n@pytest.mark.gb_level('passive')\ndef test_site_fan():\n    assert False, 'fan 3 stopped'\n"
)


@pytest.fixture(scope="module")
def recipe(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """One node whose slurm.conf ends with the recipe's lines as written, the recipe installed, a healthy node's
    settings: slurmd ran the check once when it started (HealthCheckProgram)."""
    root = tmp_path_factory.mktemp("slurm-recipe")
    cluster = SlurmCluster(root, ("gpu-017",), recipe_lines())
    (root / "etc").mkdir()
    install_recipe(cluster, GBVALIDATE_PYTEST_ARGS=HEALTHY)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def test_the_recipe_s_lines_load_and_a_healthy_node_passes_when_slurmd_starts(recipe: SlurmCluster) -> None:
    """The slurm.conf lines as written parse on Slurm 22.05 (no HealthCheckTimeout there); the settings file
    reaches the script, which slurmd runs with no environment of its own; the node is checked and stays in."""
    log = recipe.root / "healthcheck.log"
    recipe.wait_until(lambda: logged(log), "health check line", timeout=60)
    (line,) = logged(log)
    assert line.startswith("gbvalidate:  Node Health Check completed successfully ("), line
    assert line.endswith("passive level, 1 passed, 0 skipped")
    assert recipe.state("gpu-017") == "IDLE" and recipe.reasons() == {}


@pytest.fixture
def prolog_node(recipe: SlurmCluster) -> Iterator[SlurmCluster]:
    """The recipe's node back in service, its log empty, after the test."""
    yield recipe
    recipe.run("scancel", "--full", "--user=root")
    if recipe.state("gpu-017") != "IDLE":
        recipe.scontrol("update", "nodename=gpu-017", "state=resume")
    install_recipe(recipe, GBVALIDATE_PYTEST_ARGS=HEALTHY)


def run_job(cluster: SlurmCluster) -> tuple[str, int]:
    """A one-line job on the node, submitted and waited for: what it printed and its exit status."""
    out = cluster.root / "job.out"
    out.unlink(missing_ok=True)
    done = cluster.batch("-N1", f"--output={out}", "--wrap", "echo the job ran", timeout=120)
    return (out.read_text() if out.exists() else ""), done.returncode


def test_prolog_and_epilog_check_a_healthy_node_around_a_job(prolog_node: SlurmCluster) -> None:
    log = prolog_node.root / "healthcheck.log"
    before = len(logged(log))
    printed, status = run_job(prolog_node)
    assert (printed, status) == ("the job ran\n", 0)
    prolog_node.wait_until(lambda: len(logged(log)) == before + 2, "Prolog and Epilog lines", timeout=60)
    assert all(line.startswith("gbvalidate:  Node Health Check completed successfully") for line in logged(log)[-2:])
    assert prolog_node.reasons() == {}


def test_the_hooks_run_the_passive_checks_beside_a_job_and_start_no_ranks(prolog_node: SlurmCluster) -> None:
    """slurmd's hooks may run beside a job: the checks that measured (a copy, a GEMM, an all_reduce) measured the
    job too, down about 60% here. By default the recipe runs the passive level: every check reads the node."""
    kept = prolog_node.root / "prolog.json"
    log = install_recipe(prolog_node, GBVALIDATE_PYTEST_ARGS="--gb-sku=cpu", GBVALIDATE_KEEP_REPORT=str(kept))
    before = len(logged(log))
    printed, status = run_job(prolog_node)
    assert (printed, status) == ("the job ran\n", 0)
    prolog_node.wait_until(lambda: len(logged(log)) >= before + 2, "Prolog and Epilog lines", timeout=60)
    assert all(" passive level, " in line for line in logged(log)[before:]), logged(log)[before:]
    report = json.loads(kept.read_text())
    assert report["level"] == "passive" and {t["level"] for t in report["tests"]} == {"passive"}
    assert "gang" not in report  # no ranks started, no device or link loaded


def test_a_failing_node_drains_itself_in_the_prolog_and_resumes_as_documented(prolog_node: SlurmCluster) -> None:
    """The Prolog's check fails: the node drains with the failed check as the reason, the job does not run there;
    the Epilog that follows finds the node out of service and leaves its reason alone."""
    site = prolog_node.root / "site" / "test_site.py"
    site.parent.mkdir(exist_ok=True)
    site.write_text(SITE_CHECK)
    log = install_recipe(prolog_node, GBVALIDATE_PYTEST_ARGS=f"--gb-sku=cpu {site} -k test_site")
    before = len(logged(log))
    out = prolog_node.root / "failing.out"
    submitted = prolog_node.run("sbatch", "-N1", f"--output={out}", "--wrap", "echo the job ran")
    assert submitted.returncode == 0, submitted.stderr
    prolog_node.wait_until(lambda: len(logged(log)) >= before + 2, "Prolog and Epilog lines", timeout=90)
    prolog, epilog = logged(log)[before:]
    assert prolog.startswith("ERROR:  gbvalidate:  Health check failed:  unclassified (1 check); action: ")
    assert prolog.endswith("; drained gpu-017; checks: unclassified: test_site_fan")
    assert epilog.startswith("gbvalidate:  Node Health Check skipped:  gpu-017 is out of service already (state ")
    assert prolog_node.reasons() == {"gpu-017": "gbvalidate: [hardware] unclassified: test_site_fan"}
    assert "DRAIN" in prolog_node.state("gpu-017")
    assert not out.exists()  # the job did not run on the failed node (Slurm requeues and holds it)

    # The documented resume brings it back.
    prolog_node.run("scancel", "--full", "--user=root")
    prolog_node.scontrol("update", "nodename=gpu-017", "state=resume")
    prolog_node.wait_until(lambda: prolog_node.state("gpu-017") == "IDLE", "resume")


def test_a_failing_node_in_shadow_mode_stays_in_service_and_logs_what_would_have_drained_it(
    prolog_node: SlurmCluster,
) -> None:
    """GBVALIDATE_SHADOW=1, the same failing check: the Prolog and the Epilog judge it and log `would drain` with
    the reason, exit 0 (a failed Prolog would make slurmd drain the node itself), and the job runs."""
    site = prolog_node.root / "site" / "test_site.py"
    site.parent.mkdir(exist_ok=True)
    site.write_text(SITE_CHECK)
    args = f"--gb-sku=cpu {site} -k test_site"
    log = install_recipe(prolog_node, GBVALIDATE_PYTEST_ARGS=args, GBVALIDATE_SHADOW="1", GBVALIDATE_CONFIRM="0")
    before = len(logged(log))
    assert run_job(prolog_node) == ("the job ran\n", 0)
    prolog_node.wait_until(lambda: len(logged(log)) >= before + 2, "Prolog and Epilog lines", timeout=90)
    reason = "gbvalidate: [hardware] unclassified: test_site_fan"
    for line in logged(log)[before:]:
        assert line.startswith("ERROR:  gbvalidate:  Health check failed:  unclassified (1 check); action: "), line
        assert f"; would drain gpu-017 (shadow mode): reason={reason}; checks: " in line, line
    assert prolog_node.reasons() == {}
    prolog_node.wait_until(lambda: prolog_node.state("gpu-017") == "IDLE", "the job's end")  # COMPLETING first


# A site's passive check of the node's own word: an event of the real kernel log (/dev/kmsg), judged over the node's
# window as the Xid check judges its events (since the last clean check, or the last repair).
KERNEL_EVENT_CHECK = """\
import pytest

from pytest_gbvalidate.node import xid


@pytest.mark.gb_level("passive")
def test_site_event(gb_window):
    since = gb_window.read(xid.REPAIRED_MARK)
    seen = [
        r.seq for r in xid.read_kernel_log(xid.KERNEL_LOG)
        if {mark!r} in r.message and (since is None or r.seq is None or r.seq > since.value)
    ]
    assert not seen, "kernel log record(s) %s: {mark}" % seen
"""


def test_a_node_an_admin_resumed_is_not_drained_again_for_the_same_kernel_log_event(prolog_node: SlurmCluster) -> None:
    """A real kernel log event fails the Prolog's check: drained. An admin resumes the node (the repair made); the
    next Prolog finds the node we drained back in service, closes its window before the checks (fixed means fixed),
    and the same event in the log drains it no more: the job runs."""
    mark = f"gbvalidate-e2e-event-{uuid.uuid4().hex}"
    try:
        Path("/dev/kmsg").write_text(f"{mark}\n")
    except OSError as exc:
        pytest.skip(f"cannot write to the kernel log here (/dev/kmsg: {exc.strerror}): root on Linux only")
    site = prolog_node.root / "site" / "test_site.py"
    site.parent.mkdir(exist_ok=True)
    site.write_text(KERNEL_EVENT_CHECK.format(mark=mark))
    args = f"--gb-sku=cpu {site} -k test_site_event"
    log = install_recipe(prolog_node, GBVALIDATE_PYTEST_ARGS=args, GBVALIDATE_CONFIRM="0")
    before = len(logged(log))
    submitted = prolog_node.run("sbatch", "-N1", "--output=/dev/null", "--wrap", "echo the job ran")
    assert submitted.returncode == 0, submitted.stderr

    def failed() -> list[str]:
        return [line for line in logged(log)[before:] if line.startswith("ERROR:")]

    prolog_node.wait_until(lambda: failed() and "DRAIN" in prolog_node.state("gpu-017"), "the drain", timeout=90)
    prolog = failed()[0]
    assert "; drained gpu-017; checks: unclassified: test_site_event" in prolog, prolog

    prolog_node.run("scancel", "--full", "--user=root")  # the admin: the repair is made, the node goes back
    prolog_node.scontrol("update", "nodename=gpu-017", "state=resume")
    prolog_node.wait_until(lambda: "DRAIN" not in prolog_node.state("gpu-017"), "resume")
    drained_at = logged(log).index(prolog) + 1
    assert run_job(prolog_node) == ("the job ran\n", 0)
    prolog_node.wait_until(lambda: len(logged(log)) >= drained_at + 2, "Prolog and Epilog lines", timeout=60)
    since = logged(log)[drained_at:]  # the first check after the resume (slurmd's, or the Prolog) closes it
    assert all(line.startswith("gbvalidate:  Node Health Check completed successfully") for line in since), since
    closed = [line for line in since if "; back in service since its drain of " in line]
    assert len(closed) == 1 and ": repair noted: Xid events up to kernel log record " in closed[0], since
    assert prolog_node.reasons() == {}
    prolog_node.wait_until(lambda: prolog_node.state("gpu-017") == "IDLE", "the job's end")  # COMPLETING first


@pytest.mark.parametrize(
    ("settings", "cause"),
    [
        pytest.param(
            {"GBVALIDATE_PYTHON": "/usr/bin/python3-missing"},
            "/usr/bin/python3-missing -m pytest_gbvalidate.healthcheck exited 127: ",
            id="no-interpreter",
        ),
        pytest.param(
            {"GBVALIDATE_PYTHON": sys.executable, "GBVALIDATE_DEADLINE_S": "0.5"},
            "usage:  argument --deadline-s: '0.5' is not a number of seconds from 20",
            id="impossible-deadline",
        ),
        pytest.param({"GBVALIDATE_DRAIN": "yes"}, "GBVALIDATE_DRAIN=yes: expected 1 or 0", id="bad-setting"),
    ],
)
def test_our_own_failure_in_the_prolog_drains_nothing_and_the_job_runs(
    prolog_node: SlurmCluster, settings: dict[str, str], cause: str
) -> None:
    log = install_recipe(prolog_node, GBVALIDATE_PYTEST_ARGS=HEALTHY, **settings)
    before = len(logged(log))
    printed, status = run_job(prolog_node)
    assert (printed, status) == ("the job ran\n", 0)
    # The wait returns when the job ends, maybe before the Epilog has written its line: wait for both.
    prolog_node.wait_until(lambda: len(logged(log)) >= before + 2, "Prolog and Epilog lines", timeout=60)
    # and slurmctld may not have seen the Epilog end yet (IDLE+COMPLETING): a drain would stay, COMPLETING goes
    prolog_node.wait_until(lambda: "COMPLETING" not in prolog_node.state("gpu-017"), "the job's end", timeout=60)
    assert prolog_node.reasons() == {}
    prolog_node.wait_until(lambda: prolog_node.state("gpu-017") == "IDLE", "the job's end")  # COMPLETING first
    for line in logged(log)[before:]:
        assert line.startswith("ERROR:  gbvalidate:  ") and cause in line, line


def check_as_slurmd_starts(cluster: SlurmCluster, log: Path) -> str:
    """slurmd restarted on gpu-017, which runs HealthCheckProgram as it starts: the line that check logged."""
    before = len(logged(log))
    cluster.stop_slurmd("gpu-017")
    cluster.start_slurmd("gpu-017")
    cluster.wait_until(lambda: len(logged(log)) > before, "health check line", timeout=60)
    return logged(log)[-1]


def test_a_node_someone_else_drained_is_not_checked_and_keeps_its_reason(prolog_node: SlurmCluster) -> None:
    """HealthCheckProgram runs on drained nodes too (here: when slurmd restarts); a check that would fail must not
    replace the operator's reason."""
    site = prolog_node.root / "site" / "test_site.py"
    site.parent.mkdir(exist_ok=True)
    site.write_text(SITE_CHECK)
    log = install_recipe(prolog_node, GBVALIDATE_PYTEST_ARGS=f"--gb-sku=cpu {site} -k test_site")
    reason = "admin: fan replaced, burn-in pending"
    prolog_node.scontrol("update", "nodename=gpu-017", "state=drain", f"reason={reason}")
    line = check_as_slurmd_starts(prolog_node, log)
    assert line.startswith(
        "gbvalidate:  Node Health Check skipped:  gpu-017 is out of service already (state IDLE+DRAIN"
    )
    assert prolog_node.reasons() == {"gpu-017": reason}


def test_a_node_down_for_not_responding_is_checked_as_slurmd_starts_and_stays_out_if_it_fails(
    prolog_node: SlurmCluster,
) -> None:
    """slurmd died: Slurm marks the node DOWN, `Not responding`, and returns it to service as its slurmd starts again
    (ReturnToService=1, the default). The start-up check skipped it as out of service already, and a failing node
    went back to IDLE and ran a job."""
    site = prolog_node.root / "site" / "test_site.py"
    site.parent.mkdir(exist_ok=True)
    site.write_text(SITE_CHECK)
    log = install_recipe(prolog_node, GBVALIDATE_PYTEST_ARGS=f"--gb-sku=cpu {site} -k test_site")
    prolog_node.stop_slurmd("gpu-017")
    # What slurmctld sets once SlurmdTimeout passes without an answer (here at once, not 30 s later).
    prolog_node.scontrol("update", "nodename=gpu-017", "state=down", "reason=Not responding")
    before = len(logged(log))
    prolog_node.start_slurmd("gpu-017")
    prolog_node.wait_until(lambda: len(logged(log)) > before, "health check line", timeout=60)
    assert logged(log)[-1].startswith("ERROR:  gbvalidate:  Health check failed:  "), logged(log)[-1]
    assert prolog_node.reasons() == {"gpu-017": "gbvalidate: [hardware] unclassified: test_site_fan"}
    assert "DRAIN" in prolog_node.state("gpu-017")


def test_a_node_drained_for_a_job_s_leftovers_resumes_once_they_are_gone(prolog_node: SlurmCluster) -> None:
    """A process a job left on a GPU (here a file the site's stand-in for the check reads): the node drains with
    the class of its failure first, `[job_leftovers]`, confirmed by a second run; once the leftover is gone, the
    next health check (at slurmd's start) passes and resumes it. A reason of any other class stays for a person, and
    so does a repeat offender's: the same drain again within the week is `[repeat]`."""
    leftover = prolog_node.root / "leftover-pid"
    site = prolog_node.root / "site" / "test_site.py"
    site.parent.mkdir(exist_ok=True)
    site.write_text(
        "import pathlib\n\nimport pytest\n\n\n@pytest.mark.gb_level('passive')\n"
        "def test_no_leftover_gpu_processes():\n"
        f"    assert not pathlib.Path({str(leftover)!r}).exists(), 'gpu0: pid 4242 left on a node no job runs on'\n"
    )
    log = install_recipe(prolog_node, GBVALIDATE_PYTEST_ARGS=f"--gb-sku=cpu {site} -k leftover")
    leftover.write_text("4242\n")
    line = check_as_slurmd_starts(prolog_node, log)
    assert "; confirmed: failed again on a second run; drained gpu-017; " in line, line
    reason = "gbvalidate: [job_leftovers] job_leftovers (fix_job): test_no_leftover_gpu_processes"
    assert prolog_node.reasons() == {"gpu-017": reason}

    leftover.unlink()
    line = check_as_slurmd_starts(prolog_node, log)
    assert line.endswith("; resumed gpu-017"), line
    prolog_node.wait_until(lambda: prolog_node.state("gpu-017") == "IDLE", "resumed")
    assert prolog_node.reasons() == {}

    # The same again within the week (healthcheck/drains.py): a repeat offender, which no passing check resumes.
    leftover.write_text("4242\n")
    line = check_as_slurmd_starts(prolog_node, log)
    assert "drained gpu-017 as a repeat offender (2 drains in 7 days: a person resumes it)" in line, line
    repeat = "gbvalidate: [repeat] job_leftovers (fix_job): test_no_leftover_gpu_processes"
    assert prolog_node.reasons() == {"gpu-017": repeat}
    leftover.unlink()
    line = check_as_slurmd_starts(prolog_node, log)
    assert line.startswith("gbvalidate:  Node Health Check skipped:  gpu-017 is out of service already"), line
    assert prolog_node.reasons() == {"gpu-017": repeat} and "DRAIN" in prolog_node.state("gpu-017")


# --- worlds: what srun's tasks are, and what a batch script is not ----------------------------------------------


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    with slurm_cluster(tmp_path_factory.mktemp("slurm-two"), ("node1", "node2")) as cluster:
        yield cluster


GANG_CHECK = """\
def test_ranks(gb_gang, gb_expect):
    assert gb_gang.world_size >= 1
"""


def test_a_batch_script_is_no_world_and_drains_nothing(two_nodes: SlurmCluster, tmp_path: Path) -> None:
    """sbatch -n2: the batch script has SLURM_PROCID=0 and SLURM_NTASKS=2 but is no task of a step. pytest there
    is one node's run (it waited for a rank that never came), and the health check there drains nothing. It has
    SLURMD_NODENAME, as slurmd's HealthCheckProgram has, and is none: a deadline past that one's 60 s kill is
    taken."""
    (tmp_path / "test_gang.py").write_text(GANG_CHECK)
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        f"{sys.executable} -m pytest -p no:cacheprovider -q test_gang.py --gb-sku=cpu --gb-report=batch.json\n"
        f"echo pytest=$?\n{sys.executable} -m pytest_gbvalidate.healthcheck slurm --drain --deadline-s 90 "
        f"-- {HEALTHY}\n"
        "echo healthcheck=$?\n"
    )
    done = two_nodes.batch("-n2", "-N1", "--output=job.out", "--time=3", str(script), cwd=tmp_path, timeout=200)
    printed = (tmp_path / "job.out").read_text()
    assert done.returncode == 0, printed
    assert "pytest=0" in printed and "healthcheck=0" in printed, printed
    report = json.loads((tmp_path / "batch.json").read_text())
    assert report["gang"]["kind"] == "local" and "world" not in report
    assert two_nodes.reasons() == {}


def test_health_checks_started_by_one_srun_are_one_check_per_node(two_nodes: SlurmCluster, tmp_path: Path) -> None:
    """A job step's tasks have SLURMD_NODENAME, as slurmd's HealthCheckProgram has, and are none: a deadline past
    that one's 60 s kill is taken."""
    done = two_nodes.run(
        *("srun", "-N2", "--ntasks-per-node=1", "--time=3", "--label", sys.executable, "-m"),
        *("pytest_gbvalidate.healthcheck", "slurm", "--drain", "--deadline-s", "90", "--", *HEALTHY.split()),
        cwd=tmp_path,
        timeout=200,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = sorted(done.stdout.splitlines())
    assert len(lines) == 2 and all("Node Health Check completed successfully" in line for line in lines), lines
    assert two_nodes.reasons() == {}


def run_world(cluster: SlurmCluster, tmp_path: Path, *pytest_args: str) -> tuple[int, str, dict[str, Any]]:
    """contrib/slurm/gbvalidate-world.sbatch over both nodes, submitted and waited for: its exit status, its output
    and the report rank 0 wrote."""
    env = {"GBVALIDATE_PYTHON": sys.executable, "GBVALIDATE_OUT": str(tmp_path / "out")}
    env["MASTER_PORT"] = str(free_ports(1)[0])  # clusters of other test workers run jobs with the same ids
    done = cluster.batch(
        *("-N2", "--ntasks-per-node=1", "--time=3", "--output=world.out"),
        *(str(CONTRIB / "gbvalidate-world.sbatch"), "--gb-sku=cpu", *pytest_args),
        env=env,
        cwd=tmp_path,
        timeout=200,
    )
    printed = (tmp_path / "world.out").read_text()
    reports = list((tmp_path / "out").glob("gbvalidate-world-*.json"))
    assert len(reports) == 1, printed
    return done.returncode, printed, json.loads(reports[0].read_text())


def test_the_world_recipe_runs_one_world_across_the_nodes(two_nodes: SlurmCluster, tmp_path: Path) -> None:
    """contrib/slurm/gbvalidate-world.sbatch: MASTER_ADDR is the first node's NodeAddr (its NodeName resolves on
    no other node here, as on clusters whose NodeNames are not host names)."""
    status, printed, report = run_world(two_nodes, tmp_path, "-k", "test_all_reduce_one_size")
    assert status == 0, printed
    assert report["world"] == {"world_size": 2} and report["gang"]["kind"] == "world"
    assert [h["hostname"] for h in report["gang"]["hosts"]] == ["node1", "node2"]
    assert [t["outcome"] for t in report["tests"] if t["when"] == "call"] == ["passed"]


WORLD_FAIL = """\
def test_world_site_fan(gb_gang):
    assert gb_gang.world_size == 2
    assert False, "fan 3 stopped"
"""


def test_the_world_recipe_s_job_fails_with_its_checks_not_cancelled(two_nodes: SlurmCluster, tmp_path: Path) -> None:
    """With `srun --kill-on-bad-exit=1`, the first rank to exit 1 had srun kill the others: the step CANCELLED, the
    job's exit status 143, and the job no longer said the node had failed its check."""
    (tmp_path / "test_world_site.py").write_text(WORLD_FAIL)
    status, printed, report = run_world(two_nodes, tmp_path, str(tmp_path / "test_world_site.py"), "-k", "site_fan")
    assert status == 1, printed
    assert "CANCELLED" not in printed and "Terminated" not in printed, printed
    assert report["exit_status"] == 1 and [t["outcome"] for t in report["tests"] if t["when"] == "call"] == ["failed"]


def run_per_node(cluster: SlurmCluster, tmp_path: Path, *pytest_args: str) -> tuple[int, str]:
    """contrib/slurm/gbvalidate-per-node.sbatch over both nodes, submitted and waited for: its exit status and its
    output; the reports in tmp_path/out."""
    env = {"GBVALIDATE_PYTHON": sys.executable, "GBVALIDATE_OUT": str(tmp_path / "out")}
    done = cluster.batch(
        *("-N2", "--time=3", "--output=per-node.out"),
        *(str(CONTRIB / "gbvalidate-per-node.sbatch"), *pytest_args),
        env=env,
        cwd=tmp_path,
        timeout=200,
    )
    return done.returncode, (tmp_path / "per-node.out").read_text()


def test_the_per_node_recipe_writes_one_report_per_node(two_nodes: SlurmCluster, tmp_path: Path) -> None:
    status, printed = run_per_node(two_nodes, tmp_path, *HEALTHY.split())
    reports = sorted(p.name for p in (tmp_path / "out").glob("*.json"))
    assert reports == ["node1.json", "node2.json"], printed
    for name in reports:
        report = json.loads((tmp_path / "out" / name).read_text())
        assert report["node"]["hostname"] == name.removesuffix(".json") and report["exit_status"] == 0
        assert report["gang"]["kind"] == "local" if "gang" in report else "world" not in report
    (summary,) = (tmp_path / "out").glob("summary-*/summary.md")
    assert "node1" in summary.read_text() and "node2" in summary.read_text(), printed
    assert status in (0, 1), printed  # the summary's verdict: two nodes are too few for outliers


FLAPPING_CHECK = """\
import pathlib
import socket


def test_site_link():
    host = socket.gethostname()
    seen = pathlib.Path(__file__).with_name(f"seen-{host}")
    first = not seen.exists()
    seen.touch()
    assert not first and host != "node2", "link retrained"
"""


def test_the_per_node_recipe_confirms_a_failure_before_the_summary_takes_a_node_out(
    two_nodes: SlurmCluster, tmp_path: Path
) -> None:
    """node1's check fails, then passes on its second run (flapping: listed, no drain line); node2's fails twice
    (confirmed: its drain line)."""
    site = tmp_path / "site" / "test_site.py"
    site.parent.mkdir()
    site.write_text(FLAPPING_CHECK)
    status, printed = run_per_node(two_nodes, tmp_path, "--gb-sku=cpu", str(site), "-k", "test_site")
    assert status == 1, printed
    reports = sorted(p.name for p in (tmp_path / "out").glob("*.json"))
    assert reports == ["node1-again.json", "node1.json", "node2-again.json", "node2.json"], printed
    assert "node1: flapping (failed, then passed on a second run; not drained): test_site_link" in printed
    drains = [line.strip() for line in printed.splitlines() if line.strip().startswith("scontrol update")]
    assert drains == [
        "scontrol update nodename=node2 state=drain reason='gbvalidate: [hardware] unclassified: test_site_link'"
    ], printed


def test_a_job_array_s_jobs_summarise_their_own_nodes_and_a_dependent_job_all(
    two_nodes: SlurmCluster, tmp_path: Path
) -> None:
    """The per-node recipe as a job array writing into one directory: the first job to end summarised the others'
    reports while they were still `running`, and printed drain lines for healthy nodes. Each job now summarises
    the reports its own step wrote; the summary over all of them is a job that waits for the whole array."""
    out = tmp_path / "out"
    env = {"GBVALIDATE_PYTHON": sys.executable, "GBVALIDATE_OUT": str(out)}
    submitted = two_nodes.run(
        *("sbatch", "--parsable", "--array=0-1", "-N1", "--exclusive", "--time=3", "--output=array-%a.out"),
        *(str(CONTRIB / "gbvalidate-per-node.sbatch"), *HEALTHY.split()),
        env=env,
        cwd=tmp_path,
    )
    assert submitted.returncode == 0, submitted.stderr
    array = submitted.stdout.strip().split(";")[0]
    summary = f"{sys.executable} -m pytest_gbvalidate.fleet summary --out {out}/summary {out}/*.json"
    done = two_nodes.batch(
        *(f"--dependency=afterany:{array}", "--time=3", "--output=summary.out"),
        *("--wrap", summary),
        cwd=tmp_path,
        timeout=200,
    )
    printed = "".join(p.read_text() for p in sorted(tmp_path.glob("*.out")))
    assert sorted(p.name for p in out.glob("*.json")) == ["node1.json", "node2.json"], printed
    assert "scontrol update" not in printed, printed
    per_job = [read_nodes(path) for path in sorted(out.glob("summary-*/nodes.csv"))]
    assert sorted(len(rows) for rows in per_job) == [1, 1], per_job  # each job its own node
    assert done.returncode in (0, 1), printed  # two nodes are too few for outliers
    assert sorted((r["hostname"], r["verdict"]) for r in read_nodes(out / "summary" / "nodes.csv")) == [
        ("node1", "pass"),
        ("node2", "pass"),
    ]


def read_nodes(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(path.read_text().splitlines()))


def test_the_fleet_summary_s_scontrol_lines_drain_as_printed(two_nodes: SlurmCluster, tmp_path: Path) -> None:
    reports = []
    for host in ("node1", "node2", "node3", "node4"):
        outcome = "failed" if host == "node2" else "passed"
        tests = [record("t.py::test_gpu_count", outcome, fault=FAULT if outcome == "failed" else None)]
        report = report_with(tests, node={"hostname": host, "torch": "2.13.0"}, exit_status=int(host == "node2"))
        reports.append(str(write(tmp_path, f"{host}.json", report)))
    done = two_nodes.run(
        sys.executable, "-m", "pytest_gbvalidate.fleet", "summary", "--out", str(tmp_path / "summary"), *reports
    )
    lines = [line.strip() for line in done.stdout.splitlines() if line.strip().startswith("scontrol ")]
    assert lines == [line for line in lines if "nodename=node2 " in line] and lines, done.stdout
    for line in lines:
        ran = two_nodes.run("bash", "-c", line)
        assert ran.returncode == 0, ran.stderr
    reason = two_nodes.reasons()["node2"]
    assert reason == "gbvalidate: [hardware] gpu_hardware: test_gpu_count"
    two_nodes.scontrol("update", "nodename=node2", "state=resume")


# --- the measuring gate as an exclusive job ---------------------------------------------------------------------


def submit_gate(cluster: SlurmCluster, tmp_path: Path, hosts: str, *pytest_args: str) -> dict[str, str]:
    """contrib/slurm/gbvalidate-gate-submit.sh over `hosts`, as an operator runs it; once the jobs it submitted have
    ended, what it said of each node."""
    env = {"GBVALIDATE_PYTHON": sys.executable, "GBVALIDATE_OUT": str(tmp_path / "out")}
    done = cluster.run(str(CONTRIB / "gbvalidate-gate-submit.sh"), hosts, *pytest_args, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    said = dict(line.split(": ", 1) for line in done.stdout.splitlines())
    jobs = [text.removeprefix("submitted job ") for text in said.values() if text.startswith("submitted job ")]
    cluster.wait_until(
        lambda: not any(cluster.run("squeue", "-h", "-j", job).stdout.strip() for job in jobs),
        "the gate's jobs to end",
        timeout=120,
    )
    return said


def test_the_gate_resumes_a_node_that_passes_and_drains_one_that_fails(two_nodes: SlurmCluster, tmp_path: Path) -> None:
    """The standard level as an exclusive job per node: drained while it measures (no job lands beside it), resumed
    on a pass, drained with the failed check as the reason on a failure."""
    site = tmp_path / "test_site.py"  # the fan of node2 only: it fails there
    site.write_text("import socket\n" + SITE_CHECK.replace("assert False", "assert socket.gethostname() == 'node1'"))
    try:
        said = submit_gate(two_nodes, tmp_path, "node[1-2]", "--gb-sku=cpu", str(site), "-k", "test_site_fan")
        assert [text.split(" ", 2)[:2] for text in said.values()] == [["submitted", "job"]] * 2, said
        assert two_nodes.reasons() == {"node2": "gbvalidate: [hardware] unclassified: test_site_fan"}
        assert two_nodes.state("node1") == "IDLE"
        lines = sorted(p.read_text().splitlines()[-1] for p in tmp_path.glob("gbvalidate-gate-*.out"))
        assert lines[0].startswith("ERROR:  gbvalidate:  Health check failed:  unclassified (1 check); ")
        assert "; drained node2; checks: unclassified: test_site_fan" in lines[0]
        assert re.fullmatch(
            r"gbvalidate:  Node Health Check completed successfully \(\d+s\): standard level, 1 passed, 0 skipped; "
            r"resumed node1",
            lines[1],
        ), lines
        reports = {p.stem: json.loads(p.read_text()) for p in (tmp_path / "out").glob("*.json")}
        assert {host: r["level"] for host, r in reports.items()} == {"node1": "standard", "node2": "standard"}
    finally:
        two_nodes.scontrol("update", "nodename=node2", "state=resume")


def test_the_gate_leaves_a_node_with_a_running_job_untouched(two_nodes: SlurmCluster, tmp_path: Path) -> None:
    busy = two_nodes.run("sbatch", "--parsable", "-w", "node2", "--time=3", "--wrap", "sleep 120", cwd=tmp_path)
    job = busy.stdout.strip()
    try:
        two_nodes.wait_until(lambda: two_nodes.state("node2").startswith(("ALLOCATED", "MIXED")), "node2 to run it")
        said = submit_gate(two_nodes, tmp_path, "node2", "--gb-sku=cpu", "-k", "test_numa_nodes_hold_every_cpu")
        assert said == {"node2": f"left alone ({two_nodes.state('node2')}: a job runs there)"}, said
        assert two_nodes.reasons() == {} and list(tmp_path.glob("gbvalidate-gate-*.out")) == []
    finally:
        two_nodes.run("scancel", job)


def test_the_health_check_s_breaker_holds_a_drain_past_half_the_cluster(
    two_nodes: SlurmCluster, tmp_path: Path
) -> None:
    """node1 is out for one of our reasons already: node2 failing too would take the whole cluster out, which a wrong
    image or baseline does; the check says so and leaves node2 in."""
    site = tmp_path / "test_site.py"
    site.write_text(SITE_CHECK)
    two_nodes.scontrol("update", "nodename=node1", "state=drain", "reason=gbvalidate: [hardware] link: test_pcie_link")
    try:
        done = two_nodes.run(
            *("srun", "-w", "node2", "-N1", "--time=3", sys.executable, "-m", "pytest_gbvalidate.healthcheck"),
            *("slurm", "--drain", "--deadline-s", "90", "--", "--gb-sku=cpu", str(site), "-k", "test_site_fan"),
            cwd=tmp_path,
            timeout=200,
        )
        assert done.returncode == 1, done.stdout + done.stderr
        assert "breaker tripped: 2 of 2 nodes to take out, more than the 1 allowed at once" in done.stdout
        assert "node2 not drained" in done.stdout
        assert two_nodes.reasons() == {"node1": "gbvalidate: [hardware] link: test_pcie_link"}
    finally:
        two_nodes.scontrol("update", "nodename=node1", "state=resume")
