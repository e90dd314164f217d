"""The measuring gate as an exclusive Slurm job (`python -m pytest_gbvalidate.healthcheck slurm --gate`, from
contrib/slurm/gbvalidate-gate.sbatch): the standard or full level on a node no other job shares. The levels that
measure take minutes and load every GPU and link: they run as the field runs them (AMD's Slurm operator, Nebius,
Azure's runbook), as a job of their own holding the node alone (`sbatch --exclusive`), else refused. As it starts the
node is drained (`gbvalidate: gate running (job N)`) so no job lands there; then a pass resumes it (only where that
reason of ours still stands), a failure or the deadline drains it with the failed checks, and no verdict (our own
failure, a signal) resumes it. A node someone else took out of service is left alone, unchecked."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from pytest_gbvalidate.healthcheck import slurm
from pytest_gbvalidate.healthcheck.level_run import CannotRun, Stopped
from pytest_gbvalidate.healthcheck.verdict import Verdict

GATE_REASON = "gbvalidate: gate running"


def refusal(env: Mapping[str, str], scontrol: slurm.Scontrol) -> str | None:
    """Why the gate cannot run here, or None: only in a job of its own that holds the node alone."""
    if slurm.is_health_check_program(env) or slurm.is_prolog_or_epilog(env):
        return "--gate measures for minutes: not in slurmd's hooks, but as a job (contrib/slurm/gbvalidate-gate.sbatch)"
    if not (job := env.get("SLURM_JOB_ID")):
        return "--gate runs in a Slurm job that holds the node alone: sbatch --exclusive -w NODE gbvalidate-gate.sbatch"
    if scontrol.exclusive(job) is not True:
        return f"job {job} does not hold its node alone (sbatch --exclusive): the gate would measure beside a job"
    return None


def run_gate(
    node: str,
    env: Mapping[str, str],
    scontrol: slurm.Scontrol,
    run: Callable[[], tuple[Verdict, str | None]],
    notes: Callable[[str | None], list[str]],
    drain_failed: Callable[[str], str],
) -> tuple[str, int]:
    """The gate on `node`: its line and exit status. `run` runs and judges the checks; `notes` gives the line's notes
    from what `run` says of the kept report; `drain_failed` drains the node for a failure's reason."""
    state = scontrol.node_state(node)
    if state is not None and state.out_of_service and not state.ours_to_act_on:
        return slurm.not_checked_line(node, state), slurm.EXIT_OK
    reason = f"{GATE_REASON} (job {env.get('SLURM_JOB_ID', '?')})"

    def ours(said: str | None) -> bool:  # the gate's own drain, as it wrote it: anyone's change waits for a person
        return said == reason

    took = scontrol.drain(node, reason)
    if not took.startswith("drained") and not scontrol.shadow:  # another job could land beside its minutes
        return slurm.error_line(f"Gate could not run:  {took}"), slurm.EXIT_NOT_RUN
    try:
        verdict, not_kept = run()
    except Stopped as stop:
        resumed = scontrol.resume(node, "the gate", ours)
        return f"{slurm.stopped_by(stop.signum)} {resumed}", slurm.signal_exit_code(stop.signum)
    except CannotRun as exc:
        line = slurm.error_line(f"Gate could not run:  {exc}; {scontrol.resume(node, 'the gate', ours)}")
        return line, slurm.EXIT_NOT_RUN
    failed = verdict.drain_reason()  # a failure or the deadline; else a pass, or no verdict
    done = drain_failed(failed) if failed is not None else scontrol.resume(node, "the gate", ours)
    return slurm.line(verdict, *notes(not_kept), done), slurm.exit_code(verdict)
