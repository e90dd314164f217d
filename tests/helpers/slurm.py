"""A real Slurm for the tests: munged, slurmctld and one slurmd per node (Slurm's multiple-slurmd mode, which
Debian's slurm-wlm is built with), all in a directory of the test's own, on ports of their own.

Each slurmd runs in namespaces of its own (`unshare`): a UTS namespace, so the node's hostname is its NodeName as
on a real cluster; a mount namespace, where the cluster's `etc/` is /etc/slurm (slurm.conf, the health check
script and its settings file at the paths the recipes name) and its own /etc/hosts, in which its own name and no
other node's resolves (a NodeName need not resolve elsewhere); and a PID namespace with
slurmd as its first process, so stopping slurmd by its PID ends everything it started (job steps, Prolog, Epilog,
HealthCheckProgram). slurmd gives those programs no environment of its own beyond a few variables, as on a real
node. The test process is the cluster's login node: its client commands read SLURM_CONF from `env`.

Needs root (namespaces, munged, slurmd) and the Debian packages munge, slurmctld, slurmd and slurm-client; where
they are missing the tests skip, saying how to get them."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers.runs import REPO

CONTRIB = REPO / "contrib" / "slurm"
HEALTHY = "--gb-sku=cpu -k test_numa_nodes_hold_every_cpu"  # one quick check that passes on any machine
PROGRAMS = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "scontrol", "sinfo", "unshare")
MISSING = [name for name in PROGRAMS if shutil.which(name) is None]
SKIP_REASON = (
    f"a real Slurm needs {', '.join(MISSING)} and root (apt-get install -y --no-install-recommends munge slurmctld "
    "slurmd slurm-client)"
    if MISSING or os.geteuid() != 0
    else ""
)
START_TIMEOUT_S = 30.0

BASE_CONF = """\
ClusterName=gbtest
SlurmctldHost={controller}(127.0.0.1)
SlurmctldPort={controller_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={root}/munge/munge.socket
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=5
KillWait=2
Waittime=0
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@dataclass
class SlurmCluster:
    root: Path
    nodes: tuple[str, ...]
    extra_conf: str = ""
    _daemons: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def etc(self) -> Path:
        """/etc/slurm on every node."""
        return self.root / "etc"

    @property
    def conf(self) -> Path:
        return self.etc / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """The login node's environment: the client commands find this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def start(self) -> None:
        for name in ("munge", "state", "spool", "log", "etc"):
            (self.root / name).mkdir(parents=True, exist_ok=True)
        controller_port, *node_ports = free_ports(1 + len(self.nodes))
        nodes = "\n".join(
            f"NodeName={node} NodeAddr=127.0.0.1 Port={port} CPUs={os.cpu_count() or 1} State=UNKNOWN"
            for node, port in zip(self.nodes, node_ports, strict=True)
        )
        controller = socket.gethostname().split(".")[0]
        self.base_conf = BASE_CONF.format(
            root=self.root, controller=controller, controller_port=controller_port, nodes=nodes
        )
        self.write_conf(self.extra_conf)
        for node in self.nodes:
            (self.root / f"hosts-{node}").write_text(f"{Path('/etc/hosts').read_text()}127.0.0.1 {node}\n")
        self._start_munge()
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        for node in self.nodes:
            self.start_slurmd(node)
        self.wait_until(lambda: all(self.state(n).startswith("IDLE") for n in self.nodes), "every node idle")

    def write_conf(self, extra: str) -> None:
        self.conf.write_text(self.base_conf + extra)

    def _start_munge(self) -> None:
        munge = self.root / "munge"
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        munge.chmod(0o711)  # munged wants its socket's directory searchable by all
        argv = ["munged", "-F", "--force", f"--socket={munge}/munge.socket", f"--key-file={key}"]
        argv += [f"--log-file={munge}/munged.log", f"--pid-file={munge}/munged.pid", f"--seed-file={munge}/seed"]
        self._spawn("munged", argv)
        self.wait_until(lambda: (munge / "munge.socket").exists(), "munged's socket")

    def start_slurmd(self, node: str) -> None:
        """slurmd for `node` in its namespaces; with HealthCheckProgram set, it runs the check before it registers."""
        inside = (
            'mount --make-rprivate / && mount --bind "$1" /etc/slurm && mount --bind "$2" /etc/hosts && '
            'hostname "$3" && exec slurmd -D -N "$3" -f /etc/slurm/slurm.conf'
        )
        argv = ["unshare", "--uts", "--mount", "--pid", "--fork", "--mount-proc", "--kill-child=SIGKILL"]
        argv += ["bash", "-c", inside, "slurmd", str(self.etc), str(self.root / f"hosts-{node}"), node]
        self._spawn(f"slurmd-{node}", argv)

    def _spawn(self, name: str, argv: list[str]) -> None:
        """A daemon in the foreground, in a session of its own, its output in log/NAME.out."""
        with (self.root / "log" / f"{name}.out").open("wb") as log:
            self._daemons[name] = subprocess.Popen(argv, stdout=log, stderr=log, start_new_session=True)

    def stop_slurmd(self, node: str) -> None:
        """SIGKILL to its `unshare`, which SIGKILLs slurmd (--kill-child), the first process of its PID namespace:
        the kernel then ends every process in it. (unshare itself waits on through a SIGTERM.)"""
        daemon = self._daemons.pop(f"slurmd-{node}")
        daemon.kill()
        daemon.wait()

    def stop(self) -> None:
        for node in [n.removeprefix("slurmd-") for n in self._daemons if n.startswith("slurmd-")]:
            self.stop_slurmd(node)
        for name in ("slurmctld", "munged"):
            if name in self._daemons:
                _stop(self._daemons.pop(name))

    # --- the login node's commands ---------------------------------------------------------------------------

    def run(
        self, *argv: str, timeout: float = 120, env: Mapping[str, str] | None = None, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv),
            env={**self.env, **(env or {})},
            cwd=cwd or self.root,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def batch(
        self, *sbatch_args: str, timeout: float = 120, env: Mapping[str, str] | None = None, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        """`sbatch --wait` without its 2 s polls: the job submitted, its state read every 0.1 s until it ended and
        its nodes are free again (its Epilog done); the job's exit status (128 + the signal, where one ended it)
        and `scontrol show job`'s line."""
        submitted = self.run("sbatch", "--parsable", *sbatch_args, env=env, cwd=cwd)
        assert submitted.returncode == 0, submitted.stderr
        job = submitted.stdout.strip().split(";")[0]
        shown = ""

        def ended() -> bool:
            nonlocal shown
            shown = self.run("scontrol", "show", "job", "-o", job, timeout=30).stdout
            return (
                re.search(r"\bJobState=(PENDING|CONFIGURING|RUNNING|SUSPENDED|REQUEUED|RESIZING|COMPLETING)\b", shown)
                is None
            )

        self.wait_until(ended, f"end of job {job}", timeout=timeout)
        found = re.search(r"\bExitCode=(\d+):(\d+)", shown)
        assert found is not None, shown
        status, signal_number = int(found[1]), int(found[2])
        return subprocess.CompletedProcess(
            ["sbatch", *sbatch_args], status or (128 + signal_number if signal_number else 0), shown, ""
        )

    def scontrol(self, *args: str) -> str:
        done = self.run("scontrol", *args, timeout=30)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def state(self, node: str) -> str:
        """The node's State= as scontrol shows it (`IDLE`, `IDLE+DRAIN`, ...), or "" where it cannot say."""
        done = self.run("scontrol", "show", "node", "-o", node, timeout=30)
        found = re.search(r"\bState=(\S+)", done.stdout)
        return found[1] if found else ""

    def reasons(self) -> dict[str, str]:
        """`sinfo -R`: each drained or down node's reason, as an operator reads it."""
        done = self.run("sinfo", "-R", "-h", "-N", "-o", "%N|%E", timeout=30)
        assert done.returncode == 0, done.stderr
        return dict(line.split("|", 1) for line in done.stdout.splitlines() if "|" in line)

    def wait_until(self, done: object, what: str, timeout: float = START_TIMEOUT_S) -> None:
        assert callable(done)
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                raise AssertionError(f"the cluster: no {what} within {timeout:g} s\n{self.logs()}")
            for name, daemon in self._daemons.items():
                if daemon.poll() is not None:
                    raise AssertionError(f"the cluster: {name} exited {daemon.returncode}\n{self.logs()}")
            time.sleep(0.1)

    def logs(self) -> str:
        return "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in (self.root / "log").iterdir())


def _stop(daemon: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the daemon, by its PID, then SIGKILL should it linger."""
    with contextlib.suppress(ProcessLookupError):
        daemon.send_signal(signal.SIGTERM)
    try:
        daemon.wait(timeout=10)
    except subprocess.TimeoutExpired:
        daemon.kill()
        daemon.wait()


@contextlib.contextmanager
def slurm_cluster(root: Path, nodes: tuple[str, ...], extra_conf: str = "") -> Iterator[SlurmCluster]:
    cluster = SlurmCluster(root, nodes, extra_conf)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def recipe_lines() -> str:
    """The slurm.conf lines of contrib/slurm/README.md, as an operator copies them."""
    readme = (CONTRIB / "README.md").read_text()
    section = readme.split("## slurm.conf", 1)[1]
    return section.split("```", 2)[1].lstrip("\n")


def install_recipe(cluster: SlurmCluster, **settings: str) -> Path:
    """contrib/slurm/ installed as its README says, at /etc/slurm on every node, the settings file edited as an
    operator edits it; the log file its lines go to."""
    script = cluster.etc / "gbvalidate-healthcheck.sh"
    script.write_bytes((CONTRIB / "gbvalidate-healthcheck.sh").read_bytes())
    script.chmod(0o755)
    log = cluster.root / "healthcheck.log"
    chosen = {"GBVALIDATE_PYTHON": sys.executable, "GBVALIDATE_LOG_FILE": str(log), "GBVALIDATE_SYSLOG": "0"}
    # A drain log of the test's own: a drain another test made is no drain of this one's node.
    chosen["GBVALIDATE_DRAIN_LOG"] = str(cluster.root / f"drains-{uuid.uuid4().hex}.json")
    chosen |= settings
    conf = cluster.etc / "gbvalidate-healthcheck.conf"
    conf.write_text(
        (CONTRIB / "gbvalidate-healthcheck.conf").read_text() + "".join(f"{k}={v}\n" for k, v in chosen.items())
    )
    conf.chmod(0o644)
    return log


def logged(log: Path) -> list[str]:
    """The health check's lines, without the date and the node's name."""
    return [line.split(" ", 2)[2] for line in log.read_text().splitlines()] if log.exists() else []


HANGING_CHECK = (
    "import time\n\nimport pytest\n\n\n@pytest.mark.gb_level('passive')\ndef test_site_hang():\n    time.sleep(300)\n"
)


def hung_prolog(root: Path) -> tuple[str, str]:
    """One node with the recipe and PrologEpilogTimeout=40, its Prolog's check hanging: the health check's line for
    the Prolog of a job submitted there, and what the job wrote (nothing where it never ran)."""
    cluster = SlurmCluster(root, ("gpu-018",), recipe_lines() + "PrologEpilogTimeout=40\n")
    (root / "etc").mkdir()
    log = install_recipe(cluster, GBVALIDATE_PYTEST_ARGS=HEALTHY)  # slurmd's start-up check passes
    site = root / "site" / "test_site.py"
    site.parent.mkdir()
    site.write_text(HANGING_CHECK)
    try:
        cluster.start()
        cluster.wait_until(lambda: logged(log), "the start-up check's line", timeout=60)
        install_recipe(cluster, GBVALIDATE_PYTEST_ARGS=f"--gb-sku=cpu {site} -k test_site_hang")
        before = len(logged(log))
        job = root / "job.out"
        cluster.run("sbatch", "-N1", f"--output={job}", "--wrap", "echo the job ran")
        cluster.wait_until(lambda: len(logged(log)) > before, "the Prolog's line", timeout=90)
        return logged(log)[-1], job.read_text() if job.exists() else ""
    finally:
        cluster.run("scancel", "--full", "--user=root")
        cluster.stop()
