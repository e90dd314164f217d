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
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

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
