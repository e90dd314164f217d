"""Slurm (Prolog, Epilog, HealthCheckProgram): the exit code, the one line, and the drain, following LBNL Node
Health Check's conventions (github.com/mej/nhc, the `nhc` script's die() and nhcmain_* functions and
helpers/node-mark-offline):

- exit 0 when healthy; on a failed check the check's `die 1 "..."` exits 1 with one line on stdout,
  `ERROR:  nhc:  Health check failed:  <message>`; the watchdog's timeout exits 142 (`die 142 "Script timed out
  ..."`); SIGHUP, SIGINT and SIGTERM exit 129, 130 and 143 (`die 143 "Terminated by signal SIGTERM."`); a command
  line it cannot parse exits 10 before any check runs.
- node-mark-offline drains with `scontrol update State=DRAIN NodeName=$HOSTNAME Reason="NHC: <message>"`: one
  node, a reason that starts with whose drain it is.

Where we differ, and why: NHC's die() marks the node offline for every failure, its watchdog's timeout and a
signal included. We drain only with --drain, and only on a failed check or the deadline (a hung check is the
node's problem, as NHC's watchdog holds); never when no verdict could be made (exit 10: no report, a broken one,
pytest's usage or internal error, every check skipped), since that says nothing of the node, and never on a signal,
which comes from outside (slurmd's own timeout, an operator). NHC leaves alone a node that is already down or that
someone else drained. We leave alone, unchecked, a node someone drained (or failed, or put in maintenance): its
reason is theirs, and `scontrol update state=drain reason=...` would replace it. But a node that is only DOWN --
Slurm's own mark for a node that stopped responding -- is checked, and drained if it fails: Slurm returns it to
service as its slurmd starts again (ReturnToService=1), and the check at slurmd's start is the only guard of that
return. NHC's node-mark-online resumes nodes it drained once they pass; we resume only a node we drained for what
a job left behind alone (`[job_leftovers]`, the reason's class: LEFTOVERS_REASON), once its checks pass: every
other drain waits for a person.

Slurm's limits: slurmd kills HealthCheckProgram after 60 s (src/common/run_command.c: SIGTERM to its process group,
SIGKILL 10 ms later), up to Slurm 25.11; from 26.05 after HealthCheckTimeout (slurm.conf, default 60). As
HealthCheckProgram (is_health_check_program) the deadline must leave room for start-up, the interrupted run's
report and the two scontrol calls within that limit: RESERVE_S.

A signal ends the command with NHC's 128+N and a line that says no verdict was made: the checks were stopped from
outside, before they could say anything of the node."""

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
# slurmd's kill of HealthCheckProgram before HealthCheckTimeout existed (Slurm 26.05), and its default since.
HEALTH_CHECK_KILL_S = 60.0
# Of that limit, what is not the checks': Python's start-up (about 2 s), the interrupted run's report
# (level_run.KILL_GRACE_S, 5 s), scontrol (two calls of SCONTROL_TIMEOUT_S at most: Scontrol) and a margin of 3 s.
RESERVE_S = 20.0
# Node states and flags of a node someone took out of service (scontrol's State=, e.g. IDLE+DRAIN, DOWN+DRAIN):
# left alone, its reason kept. DOWN alone is not one of them: Slurm sets it itself for a node that stopped
# responding (DOWN+NOT_RESPONDING), and returns such a node to service when its slurmd starts again
# (ReturnToService=1, the default): the check at slurmd's start is the guard of exactly that return.
OUT_OF_SERVICE = frozenset({"DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "MAINT", "REBOOT_ISSUED"})
# A drain of ours for what a job left behind (faults.yaml's class job_leftovers): the health check checks such a node
# and resumes it once the check passes (Nebius's operator does the same for its `[user_problem]` drains).
LEFTOVERS_REASON = f"{LEADER}[job_leftovers]"


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
        # What an operator acts on first, the list of failed checks last: the line is cut at LINE_MAX_CHARS, and
        # with many failures the list alone would fill it, leaving out the action and whether the node drained.
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
    """A line for what stopped the command itself (a usage error, a signal)."""
    return one_line(f"ERROR:  {NAME}:  {message}")


def one_line(text: str) -> str:
    """`text` on one line of printable ASCII, NHC's double spaces kept, at most LINE_MAX_CHARS."""
    text = escaped(" ".join(text.splitlines()))
    return text if len(text) <= LINE_MAX_CHARS else text[: LINE_MAX_CHARS - 3] + "..."


def node_name(explicit: str | None, env: Mapping[str, str], hostname: str) -> tuple[str | None, str]:
    """This node's Slurm name and where it came from, or None and why not: --node, else $SLURMD_NODENAME (which
    slurmd sets for Prolog, Epilog and HealthCheckProgram), else the hostname up to its first dot. A given name
    must be one node's name as it stands; a hostname is shortened as `hostname -s` does."""
    for given, source in ((explicit, "--node"), (env.get("SLURMD_NODENAME"), "SLURMD_NODENAME")):
        if given is not None:
            if slurm_node_name(given) != given:
                return None, f"{source} {given!a} is not a single Slurm node name"
            return given, source
    name = slurm_node_name(hostname)
    if name is None:
        return None, f"the hostname {hostname!a} is not a single Slurm node name"
    return name, "the hostname"


# What every program slurmd runs for a job has, and HealthCheckProgram has not: a Prolog's or Epilog's script
# context, a job step's or batch script's job id (SLURM_JOBID is the older name, still set beside SLURM_JOB_ID).
JOB_VARIABLES = ("SLURM_SCRIPT_CONTEXT", "SLURM_JOB_ID", "SLURM_JOBID")


def is_prolog_or_epilog(env: Mapping[str, str]) -> bool:
    """Whether slurmd runs this as a Prolog or Epilog (its script context says so)."""
    return env.get("SLURM_SCRIPT_CONTEXT") in ("prolog_slurmd", "epilog_slurmd")


def is_health_check_program(env: Mapping[str, str]) -> bool:
    """Whether slurmd runs this as its HealthCheckProgram: outside any job, with an environment of SLURMD_NODENAME
    alone (src/slurmd/slurmd/slurmd.c, run_script_health_check: a new, empty environment array and that one
    variable; 26.11 adds SLURM_NODE_IS_HEALTHY). A job step (srun) and a batch script (sbatch) have SLURMD_NODENAME
    too, and a job id; a Prolog and an Epilog have the job id and SLURM_SCRIPT_CONTEXT."""
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
        """Whether the reason it is out for is one of ours (`gbvalidate: ...`)."""
        return (self.reason or "").startswith(LEADER)

    @property
    def ours_to_act_on(self) -> bool:
        """One of ours, but a repeat offender's (`gbvalidate: [repeat] ...`, healthcheck/drains.py): that one is a
        person's, as anyone's is."""
        return self.ours and not (self.reason or "").startswith(f"{LEADER}[{REPEAT}]")

    @property
    def for_leftovers(self) -> bool:
        """Whether we drained it for what a job left behind alone, the reason whole as we wrote it
        (leftovers_alone)."""
        return self.out_of_service and leftovers_alone(self.reason)

    @property
    def idle(self) -> bool:
        """Whether no job runs on it: its base state is IDLE (`IDLE`, `IDLE+DRAIN`, `IDLE+COMPLETING` in the last
        job's Epilog)."""
        return self.state.upper().split("+", 1)[0] == "IDLE"

    def shown(self) -> str:
        reason = "" if self.reason is None else f", reason {self.reason!a}"
        return f"state {printable(self.state)}{reason}"


# One part of a drain reason as fleet/drain.failed writes it: `category (repair): check,check`.
_REASON_PART = re.compile(r"(?P<category>[a-z_]+)(?: \([a-z_]+\))?: \S+")


def leftovers_alone(reason: str | None) -> bool:
    """Whether `reason` is, whole, one of ours for what a job left behind and nothing else: LEFTOVERS_REASON, then
    parts of faults.yaml's job_leftovers categories only, as fleet/drain.failed writes them. A reason someone
    extended (`...; admin: RMA, keep out`), one cut short (`+2 more`, `...`), or one with a part of another category
    waits for a person: a node goes back into service only on our own word, read whole."""
    if reason is None or not reason.startswith(f"{LEFTOVERS_REASON} "):
        return False
    from pytest_gbvalidate import faults

    ours = {c.name for c in faults.load().categories.values() if c.reason_class == "job_leftovers"}
    parts = reason.removeprefix(f"{LEFTOVERS_REASON} ").split("; ")
    found = [_REASON_PART.fullmatch(part) for part in parts]
    return all(m is not None and m["category"] in ours and not m[0].endswith("...") for m in found)


def parse_node_state(text: str) -> NodeState | None:
    """`scontrol show node -o NAME`'s line: State= and Reason= (free text, then ` [user@time]`), or None."""
    state = re.search(r"(?:^|\s)State=(\S+)", text)
    if state is None:
        return None
    reason = re.search(r"(?:^|\s)Reason=(.*?)(?:\s+\[[^\]]*@[^\]]*\])?\s*$", text.strip())
    return NodeState(state[1], reason[1] if reason else None)


@dataclass(frozen=True)
class ClusterNode:
    """A node of the cluster as `scontrol show node -o` gives it: for the breaker's count."""

    name: str
    state: NodeState
    has_gpu: bool  # a GPU among its generic resources (Gres=gpu:...)


def parse_cluster(text: str) -> list[ClusterNode]:
    """`scontrol show node -o`'s lines, one node each; a line without a name or a state is left out."""
    found = []
    for line in text.splitlines():
        name = re.search(r"(?:^|\s)NodeName=(\S+)", line)
        state = parse_node_state(line)
        if name is not None and state is not None:
            found.append(ClusterNode(name[1], state, re.search(r"(?:^|\s)Gres=\S*gpu", line) is not None))
    return found


def held_by_breaker(node: str, cluster: list[ClusterNode], breaker: Breaker) -> str | None:
    """Why `node` is not drained, where the nodes drained by us with it would be more than `breaker` allows of the
    cluster's GPU nodes (every node, where none has a GPU); else None."""
    counted = [n for n in cluster if n.has_gpu] or cluster
    ours = {n.name for n in counted if n.state.out_of_service and n.state.ours}
    return breaker.tripped(len(ours | {node}), max(len(counted), 1), held=f"{node} not drained")


def drain_argv(node: str, reason: str) -> list[str]:
    return ["scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}"]


class Scontrol:
    """scontrol from PATH, for one health check. Each call waits SCONTROL_TIMEOUT_S at most; once slurmctld has
    left a question unanswered that long, no further question is asked (each would wait as long), so the command
    spends two timeouts at most in scontrol (a question, then the drain), within RESERVE_S."""

    def __init__(self, shadow: bool = False) -> None:
        self.unanswered = False
        # Shadow mode (--shadow): every question asked, no node changed; a drain or resume says what it would do.
        self.shadow = shadow

    def health_check_limit_s(self) -> float:
        """Seconds slurmd lets HealthCheckProgram run: HealthCheckTimeout where `scontrol show config` has one
        (Slurm 26.05 and later), else 60."""
        found = _config_seconds(self._ask("show", "config"), "HealthCheckTimeout")
        return HEALTH_CHECK_KILL_S if found is None else found

    def prolog_epilog_limit_s(self) -> float | None:
        """Seconds slurmd lets a Prolog or Epilog run: PrologEpilogTimeout, where `scontrol show config` gives a
        limit (its unset value, 65534, is none: slurmd waits); None where there is none or no answer."""
        found = _config_seconds(self._ask("show", "config"), "PrologEpilogTimeout")
        return found if found is not None and found < NO_LIMIT else None

    def node_state(self, node: str) -> NodeState | None:
        """The node's state, as scontrol says it. None where it does not (no scontrol, no answer): the check goes
        on. (slurmd 26.11's SLURM_NODE_IS_HEALTHY=no says a node is down, drained or failing without which: a
        node down for not responding is the one to check.)"""
        said = self._ask("show", "node", "-o", node)
        return None if said is None else parse_node_state(said)

    def drain(self, node: str, reason: str) -> str:
        """Drain `node`, unless someone else took it out of service already (their reason is kept: scontrol would
        replace it; a reason of ours is replaced by the newer one); what happened, in a few words. A node only DOWN
        drains: the drain outlives its return."""
        state = self.node_state(node)
        if state is not None and state.out_of_service and not state.ours_to_act_on:
            return f"not drained: {node} is out of service already ({state.shown()}), kept as it is"
        if self.shadow:
            return f"would drain {node} (shadow mode): reason={reason}"
        return self._update(node, "drained", drain_argv(node, reason)[1:])

    def resume(self, node: str, what: str, ours: Callable[[str | None], bool]) -> str:
        """Resume `node` where it is out of service for a reason that is, whole, one of ours (`ours(reason)`: the
        gate's own, a job's leftovers alone); else leave it for a person. What happened, in a few words."""
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
        """Every node of the cluster, or None where scontrol does not say."""
        said = self._ask("show", "node", "-o")
        return None if said is None else parse_cluster(said)

    def exclusive(self, job_id: str) -> bool | None:
        """Whether job `job_id` holds its nodes alone (`scontrol show job`: OverSubscribe=NO, as `sbatch --exclusive`
        gives it); None where scontrol does not say."""
        said = self._ask("show", "job", "-o", job_id)
        found = re.search(r"(?:^|\s)OverSubscribe=(\S+)", said or "")
        return None if found is None else found[1] == "NO"

    def _ask(self, *args: str) -> str | None:
        """scontrol's answer to a question, or None where it gave none."""
        if self.unanswered:
            return None
        done = self._run(*args)
        return None if isinstance(done, str) or done.returncode != 0 else done.stdout

    def _run(self, *args: str) -> subprocess.CompletedProcess[str] | str:
        """What scontrol did, or why it did not run or finish."""
        scontrol = shutil.which("scontrol")
        if scontrol is None:
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


# What `scontrol show config` shows for a 16-bit limit never set (Slurm's NO_VAL16 less one, INFINITE16).
NO_LIMIT = 65534


def _config_seconds(config: str | None, key: str) -> float | None:
    found = re.search(rf"^{key}\s*=\s*(\d+)", config or "", re.MULTILINE)
    return float(found[1]) if found else None


def not_checked_line(node: str, state: NodeState) -> str:
    """The line of a node already out of service: not checked, nothing changed."""
    return one_line(f"{NAME}:  Node Health Check skipped:  {node} is out of service already ({state.shown()})")


def stopped_by(signum: int) -> str:
    """The line of a command stopped by a signal. Not NHC's `Health check failed:` (its die() for a signal): the
    checks were cut short from outside and said nothing of the node, which is not drained."""
    name = signal.Signals(signum).name
    return error_line(f"Health check could not finish:  Terminated by signal {name}; no verdict, nothing drained.")
