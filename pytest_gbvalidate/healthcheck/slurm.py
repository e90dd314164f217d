"""Slurm (Prolog, Epilog, HealthCheckProgram): the exit code, the one line and the drain, after LBNL Node Health
Check (github.com/mej/nhc: the `nhc` script's die() and nhcmain_* functions, helpers/node-mark-offline): exit 0 when
healthy; a failed check's `die 1 "..."` exits 1 with one line on stdout, `ERROR:  nhc:  Health check failed:
<message>`; the watchdog's timeout exits 142; SIGHUP, SIGINT and SIGTERM exit 129, 130 and 143; a command line it
cannot parse exits 10 before any check runs. node-mark-offline drains one node with `scontrol update State=DRAIN
NodeName=$HOSTNAME Reason="NHC: <message>"`. Where we differ: NHC marks the node offline on every failure, its
timeout and signals included. We drain only with --drain, on a failed check or the deadline (a hung check is the
node's problem); never without a verdict (exit 10), which says nothing of the node, nor on a signal, which comes from
outside (slurmd's timeout, an operator). A node someone drained (or failed, or put in maintenance) is left alone,
unchecked: `scontrol update` would replace their reason. A node only DOWN is checked, and drained if it fails: Slurm
returns it to service as its slurmd starts again (ReturnToService=1), and this check is that return's only guard. We
resume only a node we drained for a job's leftovers alone (LEFTOVERS_REASON) once its checks pass; every other drain
waits for a person."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pytest_gbvalidate.fleet.drain import LEADER, REPEAT
from pytest_gbvalidate.healthcheck.verdict import FAIL, OK, TIMEOUT, Verdict, escaped
from pytest_gbvalidate.labels import printable
from pytest_gbvalidate.rules.breaker import Breaker
from pytest_gbvalidate.service import slurm_node_name

NAME = "gbvalidate"
EXIT_OK, EXIT_FAILED, EXIT_NOT_RUN, EXIT_TIMEOUT = 0, 1, 10, 142
SCONTROL_TIMEOUT_S = 5.0
LINE_MAX_CHARS = 1000
# slurmd kills HealthCheckProgram after this (src/common/run_command.c: SIGTERM to its process group, SIGKILL 10 ms
# later) up to Slurm 25.11; from 26.05 after HealthCheckTimeout, this by default.
HEALTH_CHECK_KILL_S = 60.0
# Of that limit, what is not the checks': Python's start-up (about 2 s), the interrupted run's report
# (level_run.KILL_GRACE_S, 5 s), scontrol (two calls of SCONTROL_TIMEOUT_S at most: Scontrol) and a margin of 3 s.
RESERVE_S = 20.0
# What `scontrol show config` shows for a 16-bit limit never set (Slurm's NO_VAL16 less one, INFINITE16).
NO_LIMIT = 65534
# States and flags (scontrol's State=, e.g. IDLE+DRAIN) of a node someone took out of service; not DOWN alone.
OUT_OF_SERVICE = frozenset({"DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "MAINT", "REBOOT_ISSUED"})
# A drain of ours for what a job left behind (faults.yaml's class job_leftovers): resumed once the check passes
# (Nebius's operator does the same for its `[user_problem]` drains).
LEFTOVERS_REASON = f"{LEADER}[job_leftovers]"
# What a Prolog, an Epilog, a job step and a batch script have, and HealthCheckProgram has not (SLURM_JOBID: older).
JOB_VARIABLES = ("SLURM_SCRIPT_CONTEXT", "SLURM_JOB_ID", "SLURM_JOBID")
# One part of a drain reason as fleet/drain.failed writes it: `category (repair): check,check`.
_REASON_PART = re.compile(r"(?P<category>[a-z_]+)(?: \([a-z_]+\))?: \S+")


def exit_code(verdict: Verdict) -> int:
    return {OK: EXIT_OK, FAIL: EXIT_FAILED, TIMEOUT: EXIT_TIMEOUT}.get(verdict.state, EXIT_NOT_RUN)


def signal_exit_code(signum: int) -> int:
    return 128 + signum


def line(verdict: Verdict, *notes: str) -> str:
    """NHC's one line: silent-success's log line where healthy, `ERROR:  gbvalidate:  ...` otherwise."""
    if verdict.state == OK:
        text = (
            f"{NAME}:  Node Health Check completed successfully ({verdict.duration_s:.0f}s): {verdict.level} level,"
            f" {verdict.passed} passed, {verdict.skipped} skipped"
        )
        notes = (verdict.confirmation(), *notes)
    elif verdict.state == FAIL:
        # The list of failed checks last: cut at LINE_MAX_CHARS, it must not push out the action and the drain.
        actions = [f"action: {'; '.join(verdict.actions())}"] if verdict.actions() else []
        checks = [f"checks: {'; '.join(verdict.findings())}"]
        found = [verdict.categories(), verdict.cause, *actions, verdict.confirmation(), verdict.detail, *notes, *checks]
        return one_line(f"ERROR:  {NAME}:  Health check failed:  " + "; ".join(part for part in found if part))
    elif verdict.state == TIMEOUT:
        text = f"ERROR:  {NAME}:  Health check failed:  " + "; ".join([*verdict.findings(), verdict.detail])
    else:
        text = f"ERROR:  {NAME}:  Health check could not run:  {verdict.detail}"
        notes = (verdict.confirmation(), *notes)
    return one_line("; ".join(part for part in (text, *notes) if part))


def error_line(message: str) -> str:
    return one_line(f"ERROR:  {NAME}:  {message}")


def one_line(text: str) -> str:
    """`text` on one line of printable ASCII, NHC's double spaces kept, at most LINE_MAX_CHARS."""
    text = escaped(" ".join(text.splitlines()))
    return text if len(text) <= LINE_MAX_CHARS else text[: LINE_MAX_CHARS - 3] + "..."


def node_name(explicit: str | None, env: Mapping[str, str], hostname: str) -> tuple[str | None, str]:
    """This node's Slurm name and its source, or None and why not: --node (as it stands), else $SLURMD_NODENAME (as
    it stands), else the hostname up to its first dot (as `hostname -s`)."""
    for given, source in ((explicit, "--node"), (env.get("SLURMD_NODENAME"), "SLURMD_NODENAME")):
        if given is not None:
            if slurm_node_name(given) != given:
                return None, f"{source} {given!a} is not a single Slurm node name"
            return given, source
    if (name := slurm_node_name(hostname)) is None:
        return None, f"the hostname {hostname!a} is not a single Slurm node name"
    return name, "the hostname"


def is_prolog_or_epilog(env: Mapping[str, str]) -> bool:
    return env.get("SLURM_SCRIPT_CONTEXT") in ("prolog_slurmd", "epilog_slurmd")


def is_health_check_program(env: Mapping[str, str]) -> bool:
    """Whether slurmd runs this as its HealthCheckProgram: SLURMD_NODENAME and no job's variables (slurmd.c,
    run_script_health_check, gives it an environment of SLURMD_NODENAME alone; 26.11 adds SLURM_NODE_IS_HEALTHY)."""
    return "SLURMD_NODENAME" in env and not any(name in env for name in JOB_VARIABLES)


@dataclass(frozen=True)
class NodeState:
    """What slurmctld says of a node: its state (`IDLE+DRAIN`) and the reason it was taken out, if any."""

    state: str
    reason: str | None

    @property
    def out_of_service(self) -> bool:
        return bool(OUT_OF_SERVICE & set(self.state.upper().split("+")))

    @property
    def ours(self) -> bool:
        return (self.reason or "").startswith(LEADER)

    @property
    def ours_to_act_on(self) -> bool:
        """Ours, but not a repeat offender's (`gbvalidate: [repeat] ...`: a person's, as anyone's is)."""
        return self.ours and not (self.reason or "").startswith(f"{LEADER}[{REPEAT}]")

    @property
    def for_leftovers(self) -> bool:
        return self.out_of_service and leftovers_alone(self.reason)

    @property
    def idle(self) -> bool:
        """Whether its base state is IDLE (`IDLE+DRAIN`, `IDLE+COMPLETING` in the last job's Epilog)."""
        return self.state.upper().split("+", 1)[0] == "IDLE"

    def shown(self) -> str:
        reason = "" if self.reason is None else f", reason {self.reason!a}"
        return f"state {printable(self.state)}{reason}"


def leftovers_alone(reason: str | None) -> bool:
    """Whether `reason` is, whole, LEFTOVERS_REASON then parts of faults.yaml's job_leftovers categories only. A
    reason someone extended, one cut short (`+2 more`, `...`) or with another category's part waits for a person."""
    if reason is None or not reason.startswith(f"{LEFTOVERS_REASON} "):
        return False
    from pytest_gbvalidate import faults

    ours = {c.name for c in faults.load().categories.values() if c.reason_class == "job_leftovers"}
    parts = reason.removeprefix(f"{LEFTOVERS_REASON} ").split("; ")
    found = [_REASON_PART.fullmatch(part) for part in parts]
    return all(m is not None and m["category"] in ours and not m[0].endswith("...") for m in found)


def parse_node_state(text: str) -> NodeState | None:
    """`scontrol show node -o NAME`'s line: State= and Reason= (free text, then ` [user@time]`), or None."""
    if (state := re.search(r"(?:^|\s)State=(\S+)", text)) is None:
        return None
    reason = re.search(r"(?:^|\s)Reason=(.*?)(?:\s+\[[^\]]*@[^\]]*\])?\s*$", text.strip())
    return NodeState(state[1], reason[1] if reason else None)


@dataclass(frozen=True)
class ClusterNode:
    name: str
    state: NodeState
    has_gpu: bool  # a GPU among its generic resources (Gres=gpu:...)


def parse_cluster(text: str) -> list[ClusterNode]:
    """`scontrol show node -o`'s lines, one node each; a line without a name or a state is left out."""
    found = []
    for line in text.splitlines():
        name, state = re.search(r"(?:^|\s)NodeName=(\S+)", line), parse_node_state(line)
        if name is not None and state is not None:
            found.append(ClusterNode(name[1], state, re.search(r"(?:^|\s)Gres=\S*gpu", line) is not None))
    return found


def held_by_breaker(node: str, cluster: list[ClusterNode], breaker: Breaker) -> str | None:
    """Why `node` is not drained where `breaker` trips on our drains of GPU nodes (all, if none has one), or None."""
    counted = [n for n in cluster if n.has_gpu] or cluster
    ours = {n.name for n in counted if n.state.out_of_service and n.state.ours}
    return breaker.tripped(len(ours | {node}), max(len(counted), 1), held=f"{node} not drained")


def drain_argv(node: str, reason: str) -> list[str]:
    return ["scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}"]


class Scontrol:
    """scontrol from PATH, for one check: none asked after one unanswered in SCONTROL_TIMEOUT_S (RESERVE_S has two)."""

    def __init__(self, shadow: bool = False) -> None:
        self.unanswered = False
        self.shadow = shadow  # --shadow: every question asked, no node changed; a drain or resume says what it would do

    def health_check_limit_s(self) -> float:
        """Seconds slurmd lets HealthCheckProgram run: HealthCheckTimeout where `scontrol show config` has one."""
        found = _config_seconds(self._ask("show", "config"), "HealthCheckTimeout")
        return HEALTH_CHECK_KILL_S if found is None else found

    def prolog_epilog_limit_s(self) -> float | None:
        """Seconds slurmd lets a Prolog or Epilog run (PrologEpilogTimeout); None where unset (NO_LIMIT) or unsaid."""
        found = _config_seconds(self._ask("show", "config"), "PrologEpilogTimeout")
        return found if found is not None and found < NO_LIMIT else None

    def node_state(self, node: str) -> NodeState | None:
        """The node's state, or None where scontrol does not say (SLURM_NODE_IS_HEALTHY=no does not say which)."""
        said = self._ask("show", "node", "-o", node)
        return None if said is None else parse_node_state(said)

    def drain(self, node: str, reason: str) -> str:
        """Drain `node` unless someone else took it out of service (scontrol would replace their reason; ours is
        replaced by the newer one); what happened, in a few words."""
        state = self.node_state(node)
        if state is not None and state.out_of_service and not state.ours_to_act_on:
            return f"not drained: {node} is out of service already ({state.shown()}), kept as it is"
        if self.shadow:
            return f"would drain {node} (shadow mode): reason={reason}"
        return self._update(node, "drained", drain_argv(node, reason)[1:])

    def resume(self, node: str, what: str, ours: Callable[[str | None], bool]) -> str:
        """Resume `node` where it is out of service for a reason that is, whole, one of ours (`ours(reason)`); else
        leave it for a person. What happened, in a few words."""
        state = self.node_state(node)
        if state is None or not state.out_of_service or not ours(state.reason):
            shown = "no answer" if state is None else state.shown()
            return f"not resumed: {node} is not drained for {what} alone ({shown})"
        if self.shadow:
            return f"would resume {node} (shadow mode)"
        return self._update(node, "resumed", ["update", f"nodename={node}", "state=resume"])

    def _update(self, node: str, done_word: str, args: list[str]) -> str:
        done = self._run(*args)
        if isinstance(done, str):
            return f"not {done_word}: {done}"
        if done.returncode != 0:
            said = [text.strip() for text in (done.stderr + done.stdout).splitlines() if text.strip()]
            return f"not {done_word}: scontrol exit status {done.returncode}: {said[-1] if said else 'no output'}"
        return f"{done_word} {node}"

    def cluster(self) -> list[ClusterNode] | None:
        said = self._ask("show", "node", "-o")
        return None if said is None else parse_cluster(said)

    def exclusive(self, job_id: str) -> bool | None:
        """Whether job `job_id` holds its nodes alone (OverSubscribe=NO: `sbatch --exclusive`); None where unsaid."""
        said = self._ask("show", "job", "-o", job_id)
        found = re.search(r"(?:^|\s)OverSubscribe=(\S+)", said or "")
        return None if found is None else found[1] == "NO"

    def _ask(self, *args: str) -> str | None:
        if self.unanswered:
            return None
        done = self._run(*args)
        return None if isinstance(done, str) or done.returncode != 0 else done.stdout

    def _run(self, *args: str) -> subprocess.CompletedProcess[str] | str:
        """What scontrol did, or why it did not run or finish."""
        if (scontrol := shutil.which("scontrol")) is None:
            return "scontrol is not on PATH"
        try:
            return subprocess.run(
                [scontrol, *args], capture_output=True, text=True, errors="replace", timeout=SCONTROL_TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            self.unanswered = True
            return f"scontrol did not finish within {SCONTROL_TIMEOUT_S:g} s"
        except OSError as exc:
            return f"scontrol: {exc.strerror or exc}"


def _config_seconds(config: str | None, key: str) -> float | None:
    found = re.search(rf"^{key}\s*=\s*(\d+)", config or "", re.MULTILINE)
    return float(found[1]) if found else None


def not_checked_line(node: str, state: NodeState) -> str:
    return one_line(f"{NAME}:  Node Health Check skipped:  {node} is out of service already ({state.shown()})")


def stopped_by(signum: int) -> str:
    """The line of a command stopped by a signal; not NHC's `Health check failed:`, as the checks said nothing."""
    name = signal.Signals(signum).name
    return error_line(f"Health check could not finish:  Terminated by signal {name}; no verdict, nothing drained.")
