"""The command line: `python -m pytest_gbvalidate.healthcheck slurm [--drain]`, `... npd` and `... repaired`."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NoReturn

from pytest_gbvalidate.files import clashes, unwritable
from pytest_gbvalidate.healthcheck import drains, evidence, gate, npd, repair, slurm
from pytest_gbvalidate.healthcheck.confirm import confirm
from pytest_gbvalidate.healthcheck.level_run import KILL_GRACE_S, CannotRun, Stopped, dropped_note, run_checks
from pytest_gbvalidate.healthcheck.verdict import OK, Verdict, judge
from pytest_gbvalidate.levels import BUDGET_S, LEVELS, Level
from pytest_gbvalidate.node import window
from pytest_gbvalidate.rules import breaker
from pytest_gbvalidate.setting_values import bundled_baselines
from pytest_gbvalidate.settings import cli_flag, env_name

PROG = "python -m pytest_gbvalidate.healthcheck"
# The levels a health check runs; by default, in slurmd's hooks (which may run beside a job) those that measure
# nothing, as a node-problem-detector plugin one short measurement of each path too.
HEALTH_LEVELS: tuple[Level, ...] = ("passive", "quick")
DEFAULT_LEVEL: dict[str, Level] = {"slurm": "passive", "npd": "quick"}
DEADLINE_FACTOR = 1.5  # times the level's budget: half again, for a node slower to answer than the SKU's
# Below this no run reaches its checks (Python, torch and pytest start, the suites are collected and the GPUs opened:
# about 4 s on a 2-vCPU VM, more where CUDA starts): a shorter deadline would judge our start-up as the node.
MIN_DEADLINE_S = 20.0
MAX_DEADLINE_S = 24 * 3600.0
# Passed to pytest last: a health check is this node's own (srun -N2 ... healthcheck is two checks, not a world of 2).
NODE_ONLY = f"{cli_flag('world')}=none"
NODE_IDLE = cli_flag("node_idle")
REPORT_OPTION = cli_flag("report")  # the run's own (level_run.py): not to be given after `--`
INPUT_SETTINGS = ("baselines", "compare", "history")  # the run's settings that name files it reads

DESCRIPTION = f"""\
Run a level of the shipped suites (pytest --pyargs pytest_gbvalidate.suites --gb-level=LEVEL: `passive`, the
checks that measure nothing, or `quick`, one short measurement of each path too) in a subprocess within a
deadline, read its JSON report and print one line. Arguments after `--` go to pytest (e.g.
-- --gb-sku=ND_GB200_v6). `slurm`: LBNL NHC's exit codes and line, for Prolog, Epilog and HealthCheckProgram;
with --drain, a failed node drains itself through scontrol. `npd`: a Kubernetes node-problem-detector custom
plugin (exit {npd.EXIT_OK} OK, {npd.EXIT_NONOK} NonOK, {npd.EXIT_UNKNOWN} Unknown)."""

SLURM_EPILOG = f"""\
Exit status: {slurm.EXIT_OK} healthy; {slurm.EXIT_FAILED} a check failed; {slurm.EXIT_TIMEOUT} the checks ran past \
the deadline (killed); {slurm.EXIT_NOT_RUN} no verdict (no report,
a broken one, a usage or internal error, every check skipped) or a usage error; 128+N stopped by signal N.
--drain runs `scontrol update nodename=NODE state=drain reason="gbvalidate: [CLASS] CATEGORY: CHECK"` on exit \
{slurm.EXIT_FAILED}
and {slurm.EXIT_TIMEOUT} only (failed checks run once more first: only what fails again counts), and resumes a node \
it drained for
[job_leftovers] alone once its checks pass. NODE: --node, else $SLURMD_NODENAME, else the hostname up to its first
dot; one node's name or nothing runs (exit {slurm.EXIT_NOT_RUN})."""

NPD_EPILOG = f"""\
Exit status: {npd.EXIT_OK} OK; {npd.EXIT_NONOK} NonOK (a check failed); {npd.EXIT_UNKNOWN} Unknown (the checks ran \
past the deadline, no verdict, a usage
error, a signal). One line on stdout, at most --max-output-length characters (NPD's default is
{npd.DEFAULT_MAX_OUTPUT_LENGTH}). Set the rule's timeout above the deadline plus 10 s."""

REPAIRED_HELP = (
    "say a repair was made (a GPU reset, a part replaced): the Xid events the kernel log holds now are closed, and "
    "the next checks judge only what comes after them (a reboot closes them by itself), as NVSentinel's reset "
    f"acknowledgement does. Exit {slurm.EXIT_OK} done, {slurm.EXIT_NOT_RUN} not done (the line says why)."
)


def default_deadline_s(level: Level) -> float:
    """DEADLINE_FACTOR times the level's budget on the SKU it is made for (a 4-GPU node: levels.BUDGET_S)."""
    return DEADLINE_FACTOR * BUDGET_S[level]


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    modes = parser.add_subparsers(dest="mode", required=True, metavar="MODE", parser_class=_Parser)
    for mode, epilog, summary in (
        ("slurm", SLURM_EPILOG, "Prolog, Epilog, HealthCheckProgram (LBNL NHC's conventions)"),
        ("npd", NPD_EPILOG, "a Kubernetes node-problem-detector custom plugin"),
    ):
        sub = modes.add_parser(
            mode, help=summary, description=DESCRIPTION, epilog=epilog, formatter_class=argparse.RawTextHelpFormatter
        )
        _add_mode_options(sub, mode)
    repaired = modes.add_parser("repaired", help=REPAIRED_HELP, description=REPAIRED_HELP)
    where = f"the node's window file (default: {env_name('window')}, else {window.DEFAULT_PATH})"
    repaired.add_argument("--window", metavar="PATH", help=where)
    return parser


def _add_mode_options(sub: argparse.ArgumentParser, mode: str) -> None:
    budgets = ", ".join(f"{level} {default_deadline_s(level):g}" for level in HEALTH_LEVELS)
    within = f"; within slurmd's limit (HealthCheckTimeout, PrologEpilogTimeout) less {slurm.RESERVE_S:g}"
    default = f"{DEADLINE_FACTOR:g} times the level's budget: {budgets}" + (within if mode == "slurm" else "")
    sub.add_argument(
        "--level",
        choices=LEVELS if mode == "slurm" else HEALTH_LEVELS,
        default=DEFAULT_LEVEL[mode],
        help=f"the checks to run (default {DEFAULT_LEVEL[mode]})"
        + ("; standard and full only with --gate" if mode == "slurm" else ""),
    )
    sub.add_argument(
        "--deadline-s",
        type=_deadline,
        metavar="SECONDS",
        help=f"kill the checks after SECONDS, {MIN_DEADLINE_S:g} to {MAX_DEADLINE_S:g} (SIGTERM, then SIGKILL "
        f"{KILL_GRACE_S:g} s later; default {default})",
    )
    sub.add_argument(
        "--keep-report",
        type=_keep_path,
        metavar="PATH",
        help="also keep the run's JSON report at PATH (replaced; none of the run's inputs)",
    )
    sub.add_argument(
        "--confirm",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the failed checks once more within the deadline and count only what fails again; a check "
        "that then passes is flapping, said and not a failure (default: on)",
    )
    sub.add_argument(
        "--shadow",
        action="store_true",
        help="shadow mode, to trial the check: everything run, judged, kept and logged, no node drained, resumed or "
        "reported; the line says what would have been done, and the exit status is OK's",
    )
    sub.add_argument("pytest_args", nargs="*", metavar="-- PYTEST_ARG", help="passed on to pytest")
    if mode == "slurm":
        _add_slurm_options(sub)
    else:
        sub.add_argument(
            "--max-output-length",
            type=_output_length,
            default=npd.DEFAULT_MAX_OUTPUT_LENGTH,
            metavar="N",
            help=f"the plugin config's max_output_length, {npd.MIN_OUTPUT_LENGTH} or more",
        )


def _add_slurm_options(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--drain", action="store_true", help="drain this node through scontrol on a failure")
    sub.add_argument(
        "--gate",
        action="store_true",
        help="the measuring gate, in an exclusive job: drain the node as it starts, resume it on a pass, "
        "drain it with the failed checks on a failure (healthcheck/gate.py)",
    )
    sub.add_argument("--node", metavar="NAME", help="this node's Slurm name (default: see below)")
    sub.add_argument(
        "--drain-metrics",
        type=Path,
        metavar="PATH",
        help="after each check, write the drain log's counts as a Prometheus text file here, beside the run's own "
        f"in node_exporter's textfile directory (default: {env_name('drain_metrics')}, else none)",
    )
    sub.add_argument(
        "--drain-log",
        type=Path,
        metavar="PATH",
        help="keep each drain of this node in this file (healthcheck/drains.py): a node drained more than "
        f"{drains.REPEAT_AFTER} time(s) within {drains.REPEAT_DAYS:g} days drains as a repeat offender "
        f"(`[repeat]`), for a person to resume (default: {env_name('drain_log')}, else none kept)",
    )
    breaker.add_options(sub, "do not drain")


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None, hostname: str | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    env = os.environ if env is None else env
    slurm_mode = bool(argv) and argv[0] == "slurm"
    try:
        args = build_parser().parse_args(argv)
        if args.mode == "repaired":
            done, problem = repair.close_window(args.window, env)
            return _say(f"gbvalidate: not done: {problem}", slurm.EXIT_NOT_RUN) if problem else _say(done, 0)
        if any(arg == REPORT_OPTION or arg.startswith(REPORT_OPTION + "=") for arg in args.pytest_args):
            raise UsageError(
                f"{REPORT_OPTION} after --: the health check names the run's report itself (keep a copy with "
                "--keep-report PATH)"
            )
        if args.keep_report is not None:
            if (why := unwritable(args.keep_report)) is not None:
                raise UsageError(f"--keep-report {args.keep_report}: {why}")
            if found := clashes({"--keep-report": args.keep_report}, run_inputs(args.pytest_args, env)):
                raise UsageError(found[0])
    except UsageError as exc:
        if slurm_mode:
            return _say(slurm.error_line(f"usage:  {exc}"), slurm.EXIT_NOT_RUN)
        return _say(npd.one_line(f"unknown: usage: {exc}", npd.DEFAULT_MAX_OUTPUT_LENGTH), npd.EXIT_UNKNOWN)
    if args.mode == "slurm":
        return _slurm(args, env, socket.gethostname() if hostname is None else hostname)
    return _npd(args, env)


def _slurm(args: argparse.Namespace, env: Mapping[str, str], hostname: str) -> int:
    if args.level not in HEALTH_LEVELS and not args.gate:
        why = f"--level {args.level} measures for minutes: run it as the gate (--gate) in an exclusive job"
        return _say(slurm.error_line(f"usage:  {why} (contrib/slurm/gbvalidate-gate.sbatch)"), slurm.EXIT_NOT_RUN)
    node = None
    if args.drain or args.gate:  # before any check runs: a drain line names exactly one node, or nothing runs
        node, why = slurm.node_name(args.node, env, hostname)
        if node is None:
            return _say(slurm.error_line(f"refusing to drain:  {why}"), slurm.EXIT_NOT_RUN)
    scontrol = slurm.Scontrol(shadow=args.shadow)
    for name in ("drain_log", "drain_metrics"):  # the command line's, else the environment's
        if getattr(args, name) is None and env.get(env_name(name)):
            setattr(args, name, Path(env[env_name(name)]))
    deadline_s, unmeetable = _slurm_deadline(args.deadline_s, args.level, env, scontrol)
    if unmeetable is not None:
        return _say(slurm.error_line(f"usage:  {unmeetable}"), slurm.EXIT_NOT_RUN)
    if args.gate:
        assert node is not None
        if (refused := gate.refusal(env, scontrol)) is not None:
            return _say(slurm.error_line(f"usage:  {refused}"), slurm.EXIT_NOT_RUN)
        line, code = gate.run_gate(
            node,
            env,
            scontrol,
            lambda: checked(args, deadline_s, [NODE_IDLE]),  # the gate's job holds the node alone
            lambda not_kept: [not_kept or "", dropped_note(env) or ""],
            lambda reason: drains.counted(scontrol, node, reason, args.drain_log),
        )
        metrics_problem = drains.write_metrics(args.drain_log, args.drain_metrics, node)
        return _say(line + (f"; {metrics_problem}" if metrics_problem else ""), _shadowed(args, code, slurm.EXIT_OK))
    state = None if node is None else scontrol.node_state(node)
    # Someone's drain is their word; ours for a job's leftovers alone is checked, to be resumed once they are gone.
    if node is not None and state is not None and state.out_of_service and not state.for_leftovers:
        return _say(slurm.not_checked_line(node, state), slurm.EXIT_OK)
    back = None if state is None or state.out_of_service or args.shadow else repair.back_in_service(args.drain_log, env)
    started = time.monotonic()
    try:
        verdict, not_kept = checked(args, deadline_s, idle_node(state))
    except Stopped as stop:
        return _say(slurm.stopped_by(stop.signum), slurm.signal_exit_code(stop.signum))
    except CannotRun as exc:
        return _say(slurm.error_line(f"Health check could not run:  {exc}"), slurm.EXIT_NOT_RUN)
    notes = [back or "", not_kept or "", dropped_note(env) or ""]
    reason = verdict.drain_reason()  # FAIL and TIMEOUT only
    if reason is not None:  # before the node is touched: what the driver knows now goes with a reset or a reboot
        notes.append(evidence.keep(args.keep_report, deadline_s - (time.monotonic() - started)))
    if node is not None and reason is not None:
        cluster = scontrol.cluster()  # where it cannot be counted, the node's own evidence stands
        held = None if not cluster else slurm.held_by_breaker(node, cluster, breaker.from_options(args))
        notes.append(held or drains.counted(scontrol, node, reason, args.drain_log))
    elif node is not None and state is not None and state.for_leftovers and verdict.state == OK:
        notes.append(resumed := scontrol.resume(node, "a job's leftovers", slurm.leftovers_alone))
        if resumed.startswith("resumed") and args.drain_log is not None:  # back in service on our word
            with contextlib.suppress(drains.DrainLogError):  # said by the next check, where the log is broken
                drains.seen_back(args.drain_log, time.time())
    notes.append(drains.write_metrics(args.drain_log, args.drain_metrics, node) or "")
    return _say(slurm.line(verdict, *notes), _shadowed(args, slurm.exit_code(verdict), slurm.EXIT_OK))


def _slurm_deadline(
    given: float | None, level: Level, env: Mapping[str, str], scontrol: slurm.Scontrol
) -> tuple[float, str | None]:
    """The checks' deadline, and why it cannot be kept where the command must end before slurmd's kill (no line)."""
    if slurm.is_health_check_program(env):
        limit_s: float | None = scontrol.health_check_limit_s()
        named = "as HealthCheckProgram", "HealthCheckTimeout, 60 before Slurm 26.05", "HealthCheckTimeout"
    elif slurm.is_prolog_or_epilog(env):
        limit_s = scontrol.prolog_epilog_limit_s()
        named = f"as {env['SLURM_SCRIPT_CONTEXT'].split('_')[0].title()}", "PrologEpilogTimeout", "PrologEpilogTimeout"
    else:
        limit_s = None
    if limit_s is None:
        return (default_deadline_s(level) if given is None else given), None
    room_s = limit_s - slurm.RESERVE_S
    if given is None:
        given = min(default_deadline_s(level), room_s)
    if given > room_s or given < MIN_DEADLINE_S:
        where, limit_name, raise_it = named
        return given, (
            f"--deadline-s {given:g}: {where} slurmd kills the check after {limit_s:g} s ({limit_name}), so the "
            f"checks get {room_s:g} s at most ({slurm.RESERVE_S:g} s are start-up, the report and scontrol) and at "
            f"least {MIN_DEADLINE_S:g}: raise {raise_it}"
        )
    return given, None


def _npd(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    deadline_s = default_deadline_s(args.level) if args.deadline_s is None else args.deadline_s
    try:
        verdict, not_kept = checked(args, deadline_s)
    except Stopped as stop:
        return _say(npd.one_line(f"unknown: stopped by {stop}", args.max_output_length), npd.EXIT_UNKNOWN)
    except CannotRun as exc:
        return _say(npd.one_line(f"unknown: {exc}", args.max_output_length), npd.EXIT_UNKNOWN)
    notes = (not_kept or "", dropped_note(env) or "")
    line, code = npd.line(verdict, args.max_output_length, *notes), npd.exit_code(verdict)
    if args.shadow and code != npd.EXIT_OK:  # the condition stays OK: its message says what it would have been
        line = npd.one_line(f"shadow mode, would report {npd.STATUS_WORDS[code]}: {line}", args.max_output_length)
    return _say(line, _shadowed(args, code, npd.EXIT_OK))


def _shadowed(args: argparse.Namespace, code: int, ok: int) -> int:
    """`ok` in shadow mode (slurmd drains a node whose Prolog or Epilog fails, NPD sets a condition on NonOK)."""
    return ok if args.shadow else code


def idle_node(state: slurm.NodeState | None) -> list[str]:
    """pytest's option that says no job runs on the node (a process on its GPUs is a leftover), where Slurm says so."""
    return [NODE_IDLE] if state is not None and state.idle else []


def checked(args: argparse.Namespace, deadline_s: float, extra: Sequence[str] = ()) -> tuple[Verdict, str | None]:
    """The level's verdict (failures confirmed by a second run unless --no-confirm), and why its report was not kept."""
    pytest_args = [*args.pytest_args, *extra, NODE_ONLY]
    run, not_kept = run_checks(args.level, deadline_s, pytest_args, args.keep_report)
    if not args.confirm:
        return judge(run), not_kept
    rerun = lambda report, left_s: run_checks(args.level, left_s, pytest_args, None, report)[0]  # noqa: E731
    return confirm(run, rerun, MIN_DEADLINE_S), not_kept


def _say(line: str, code: int) -> int:
    sys.stdout.write(line + "\n")  # one write: the lines of checks sharing a log never interleave
    sys.stdout.flush()
    return code


def _deadline(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not MIN_DEADLINE_S <= value <= MAX_DEADLINE_S:  # NaN too
        raise argparse.ArgumentTypeError(
            f"{text!a} is not a number of seconds from {MIN_DEADLINE_S:g} (the checks' start-up) to {MAX_DEADLINE_S:g}"
        )
    return value


def _output_length(text: str) -> int:
    if not (text.isdecimal() and len(text) <= 9) or int(text) < npd.MIN_OUTPUT_LENGTH:  # int() refuses 4300+ digits
        raise argparse.ArgumentTypeError(
            f"{text[:40]!a} is not a whole number from {npd.MIN_OUTPUT_LENGTH} to 999999999"
        )
    return int(text)


def _keep_path(text: str) -> Path:
    if not text.strip():  # Path("") is the current directory
        raise argparse.ArgumentTypeError("is empty: name the file to keep the report in")
    return Path(text)


def _given(pytest_args: Sequence[str], option: str) -> str | None:
    """The value pytest takes for `option` from `pytest_args` (`--opt VALUE` or `--opt=VALUE`, the last), or None."""
    value = None
    for i, arg in enumerate(pytest_args):
        if arg == option and i + 1 < len(pytest_args):
            value = pytest_args[i + 1]
        elif arg.startswith(option + "="):
            value = arg.removeprefix(option + "=")
    return value


def run_inputs(pytest_args: Sequence[str], env: Mapping[str, str]) -> dict[str, Path]:
    """The files the run reads that --keep-report must not replace (files.clashes' inputs): every baseline of its
    directory (`auto` may read any), the --gb-compare report, the --gb-history reports; each setting after `--`, else
    from the environment. Absolute paths only: the run starts in a directory where a relative one names none of ours."""

    def given(name: str) -> tuple[str, str] | None:
        if (raw := _given(pytest_args, cli_flag(name))) is not None:
            return f"{cli_flag(name)} after --", raw
        return None if (raw := env.get(env_name(name))) is None else (f"{env_name(name)} in the environment", raw)

    def path(name: str) -> tuple[str, Path] | None:
        found = given(name)
        return None if found is None or not os.path.isabs(found[1]) else (found[0], Path(found[1]))

    inputs: dict[str, Path] = {}
    baselines = path("baselines") if given("baselines") is not None else ("the default", bundled_baselines())
    if baselines is not None:
        inputs |= {f"the baseline {p} ({baselines[0]})": p for p in sorted(baselines[1].glob("*.yaml"))}
    if (compare := path("compare")) is not None:
        inputs[f"the earlier report {compare[1]} ({compare[0]})"] = compare[1]
    if (history := path("history")) is not None:
        inputs |= {f"the history's {p} ({history[0]})": p for p in sorted(history[1].glob("*/*.json"))}
    return inputs
