"""pytest_gbvalidate/healthcheck/cli.py: what stops the command before any check runs is one line on stdout and
the mode's "no verdict" exit status (Slurm 10, NPD 2); nothing runs and nothing is drained."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pytest_gbvalidate.healthcheck import cli, drains
from pytest_gbvalidate.healthcheck.level_run import CannotRun
from tests.helpers.healthcheck import scontrol_calls, stub_scontrol


@pytest.fixture
def nothing_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    def run_checks(*_args: object) -> None:
        raise AssertionError("the checks ran")

    monkeypatch.setattr(cli, "run_checks", run_checks)


@pytest.mark.parametrize(
    ("argv", "line", "code"),
    [
        (["slurm", "--deadline-s", "0"], "ERROR:  gbvalidate:  usage:  argument --deadline-s: '0' is not a", 10),
        # A deadline no run could meet: our start-up would pass for the node's hang.
        (
            ["slurm", "--deadline-s", "0.5"],
            "ERROR:  gbvalidate:  usage:  argument --deadline-s: '0.5' is not a number of seconds from 20 (the "
            "checks' start-up) to 86400",
            10,
        ),
        (["npd", "--deadline-s", "19.9"], "unknown: usage: argument --deadline-s: '19.9' is not a number", 2),
        (["slurm", "--deadline-s", "nan"], "ERROR:  gbvalidate:  usage:  argument --deadline-s: 'nan'", 10),
        (["slurm", "--dran"], "ERROR:  gbvalidate:  usage:  unrecognized arguments: --dran", 10),
        (["npd", "--max-output-length", "5"], "unknown: usage: argument --max-output-length: '5' is not a", 2),
        (["npd", "--max-output-length", "9" * 5000], "unknown: usage: argument --max-output-length: '999", 2),
        (["npd", "--drain"], "unknown: usage: unrecognized arguments: --drain", 2),
        (["nhc"], "unknown: usage: argument MODE: invalid choice: 'nhc'", 2),
        ([], "unknown: usage: the following arguments are required: MODE", 2),
        (["npd", "--deadline-s", "n\u00f6"], "unknown: usage: argument --deadline-s: 'n\\xf6' is not a number", 2),
        (["slurm", "--keep-report", ""], "ERROR:  gbvalidate:  usage:  argument --keep-report: is empty: name the", 10),
        # The report is the health check's own: after `--`, pytest would write it elsewhere and leave none to read.
        (["slurm", "--", "--gb-report=/tmp/elsewhere.json"], "ERROR:  gbvalidate:  usage:  --gb-report after --: ", 10),
        (["npd", "--", "-k", "gpu", "--gb-report", "r.json"], "unknown: usage: --gb-report after --: the health", 2),
        (["slurm", "--", "--gb-report"], "ERROR:  gbvalidate:  usage:  --gb-report after --: ", 10),
    ],
)
@pytest.mark.usefixtures("nothing_runs")
def test_a_usage_error_is_one_line(argv: list[str], line: str, code: int, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv, env={}, hostname="gpu-017") == code
    out = capsys.readouterr().out
    assert out.startswith(line) and out.count("\n") == 1, out
    assert code == 10 or len(out) <= 81  # NPD's default max_output_length, and the newline


@pytest.mark.usefixtures("nothing_runs")
def test_a_report_path_that_is_no_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "target.json").write_text("{}")
    (tmp_path / "link.json").symlink_to(tmp_path / "target.json")
    assert cli.main(["slurm", "--keep-report", str(tmp_path / "link.json")], env={}, hostname="h") == 10
    out = capsys.readouterr().out
    assert out == (
        f"ERROR:  gbvalidate:  usage:  --keep-report {tmp_path / 'link.json'}: is a symbolic link (to "
        f"{tmp_path / 'target.json'}): name the file itself\n"
    )
    assert cli.main(["npd", "--keep-report", str(tmp_path)], env={}, hostname="h") == 2
    assert capsys.readouterr().out.startswith("unknown: usage: --keep-report ")
    assert (tmp_path / "target.json").read_text() == "{}"


@pytest.mark.parametrize(
    ("argv", "env", "hostname", "why"),
    [
        (["--node", "gpu[01-04]"], {}, "h", "--node 'gpu[01-04]' is not a single Slurm node name"),
        ([], {"SLURMD_NODENAME": "ALL"}, "h", "SLURMD_NODENAME 'ALL' is not a single Slurm node name"),
        ([], {}, "n1,n2", "the hostname 'n1,n2' is not a single Slurm node name"),
        # An IPv6 scope id is any text to ipaddress: this one would drain 128 other nodes.
        (
            [],
            {"SLURMD_NODENAME": "fe80::1%n1,gpu[001-128]", "SLURM_SCRIPT_CONTEXT": "prolog_slurmd"},
            "h",
            "SLURMD_NODENAME 'fe80::1%n1,gpu[001-128]' is not a single Slurm node name",
        ),
        (["--node", "n\u00f6de1"], {}, "h", "--node 'n\\xf6de1' is not a single Slurm node name"),
    ],
)
@pytest.mark.usefixtures("nothing_runs")
def test_drain_refuses_a_name_that_is_not_one_node_before_any_check_runs(
    argv: list[str],
    env: dict[str, str],
    hostname: str,
    why: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    calls = stub_scontrol(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert cli.main(["slurm", "--drain", *argv], env=env, hostname=hostname) == 10
    assert capsys.readouterr().out == f"ERROR:  gbvalidate:  refusing to drain:  {why}\n"
    assert scontrol_calls(calls) == []


def test_pytest_arguments_follow_the_double_dash() -> None:
    args = cli.build_parser().parse_args(["slurm", "--drain", "--", "--gb-sku=cpu", "-k", "copy or gemm"])
    assert (args.drain, args.deadline_s, args.pytest_args) == (True, None, ["--gb-sku=cpu", "-k", "copy or gemm"])


# --- Slurm's limits: HealthCheckProgram's kill, a node out of service already ------------------------------------


def captured_run(monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, list[str]]]:
    """The deadline and pytest arguments each run of the checks got; every run finds a failed check."""
    from pytest_gbvalidate.healthcheck.verdict import Run
    from tests.helpers.healthcheck import FAULT, record, report_with

    runs: list[tuple[float, list[str]]] = []

    def run_checks(
        level: str, deadline_s: float, pytest_args: list[str], keep: object, rerun: object = None
    ) -> tuple[Run, None]:
        if rerun is None:  # the level's run; its failed checks' second run (confirm.py) finds them failed again
            runs.append((deadline_s, pytest_args))
        report = report_with([record("s.py::test_gpu_count", "failed", fault=FAULT)], exit_status=1)
        return Run(level, 1, False, deadline_s, 3.0, report), None

    monkeypatch.setattr(cli, "run_checks", run_checks)
    return runs


HEALTH_CHECK_PROGRAM = {"SLURMD_NODENAME": "gpu-017"}  # slurmd's whole environment for it (no script context)
PROLOG = {"SLURMD_NODENAME": "gpu-017", "SLURM_SCRIPT_CONTEXT": "prolog_slurmd", "SLURM_JOB_ID": "42"}
# What srun gives a job step's task and sbatch a batch script: SLURMD_NODENAME too, and the job's id.
JOB_STEP = {"SLURMD_NODENAME": "gpu-017", "SLURM_JOB_ID": "42", "SLURM_JOBID": "42", "SLURM_STEP_ID": "0"}
BATCH_SCRIPT = {"SLURMD_NODENAME": "gpu-017", "SLURM_JOB_ID": "42", "SLURM_JOBID": "42"}


@pytest.mark.parametrize(
    ("env", "argv", "config", "deadline_s"),
    [
        (HEALTH_CHECK_PROGRAM, [], "", 40.0),  # Slurm before 26.05: killed at 60 s
        (HEALTH_CHECK_PROGRAM, [], "HealthCheckTimeout      = 300 sec", 45.0),  # 26.05: its own limit
        (HEALTH_CHECK_PROGRAM, ["--level", "quick"], "HealthCheckTimeout      = 300 sec", 90.0),
        (HEALTH_CHECK_PROGRAM, [], "HealthCheckTimeout      = 50 sec", 30.0),
        (HEALTH_CHECK_PROGRAM, ["--deadline-s", "35"], "", 35.0),
        (PROLOG, [], "", 45.0),  # no PrologEpilogTimeout: slurmd waits
        (PROLOG, ["--deadline-s", "600"], "", 600.0),
        (JOB_STEP, [], "", 45.0),  # `srun -N16 ... slurm --drain`: no slurmd kill either
        (JOB_STEP, ["--deadline-s", "600"], "", 600.0),
        (BATCH_SCRIPT, ["--deadline-s", "600"], "", 600.0),
    ],
)
def test_the_deadline_fits_slurmd_s_limit_for_its_health_check_program(
    env: dict[str, str],
    argv: list[str],
    config: str,
    deadline_s: float,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    stub_scontrol(tmp_path, config=config)
    monkeypatch.setenv("PATH", str(tmp_path))
    runs = captured_run(monkeypatch)
    assert cli.main(["slurm", *argv, "--", "--gb-sku=cpu"], env=env, hostname="h") == 1
    assert runs == [(deadline_s, ["--gb-sku=cpu", "--gb-world=none"])]  # a health check is this node's own
    assert capsys.readouterr().out.startswith("ERROR:  gbvalidate:  Health check failed:  gpu_hardware (1 check); ")


@pytest.mark.usefixtures("nothing_runs")
def test_a_deadline_past_slurmd_s_kill_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = stub_scontrol(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert cli.main(["slurm", "--drain", "--deadline-s", "90"], env=HEALTH_CHECK_PROGRAM, hostname="h") == 10
    assert capsys.readouterr().out == (
        "ERROR:  gbvalidate:  usage:  --deadline-s 90: as HealthCheckProgram slurmd kills the check after 60 s "
        "(HealthCheckTimeout, 60 before Slurm 26.05), so the checks get 40 s at most (20 s are start-up, the report "
        "and scontrol) and at least 20: raise HealthCheckTimeout\n"
    )
    assert scontrol_calls(calls) == []


@pytest.mark.parametrize("state", ["IDLE+DRAIN", "DOWN+DRAIN", "MIXED+DRAIN", "IDLE+COMPLETING+DRAIN"])
@pytest.mark.usefixtures("nothing_runs")
def test_a_node_out_of_service_already_is_not_checked_and_keeps_its_reason(
    state: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = stub_scontrol(tmp_path, state=state, reason="admin: fan replaced, burn-in pending")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert cli.main(["slurm", "--drain"], env=PROLOG, hostname="h") == 0
    assert capsys.readouterr().out == (
        f"gbvalidate:  Node Health Check skipped:  gpu-017 is out of service already (state {state}, reason "
        "'admin: fan replaced, burn-in pending')\n"
    )
    assert scontrol_calls(calls) == []


@pytest.mark.parametrize("env", [HEALTH_CHECK_PROGRAM, HEALTH_CHECK_PROGRAM | {"SLURM_NODE_IS_HEALTHY": "no"}])
def test_a_node_down_for_not_responding_is_checked_and_drains_for_a_failed_check(
    env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Slurm returns such a node to service as its slurmd starts (ReturnToService=1): skipped as out of service,
    a failing node went back to IDLE and ran a job. slurmd 26.11's SLURM_NODE_IS_HEALTHY=no does not say which."""
    runs = captured_run(monkeypatch)
    calls = stub_scontrol(tmp_path, state="DOWN+NOT_RESPONDING", reason="Not responding")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert cli.main(["slurm", "--drain", "--deadline-s", "30"], env=env, hostname="h") == 1
    assert len(runs) == 1 and "; drained gpu-017; " in capsys.readouterr().out
    assert scontrol_calls(calls)[-1] == [
        "update",
        "nodename=gpu-017",
        "state=drain",
        "reason=gbvalidate: [hardware] gpu_hardware: test_gpu_count",
    ]


def test_a_node_someone_drains_while_the_check_runs_keeps_their_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = captured_run(monkeypatch)
    monkeypatch.setenv("PATH", str(tmp_path))
    stub_scontrol(tmp_path)  # in service when the check starts ...

    run_failing_checks = vars(cli)["run_checks"]  # the stand-in captured_run put there

    def run_then_drain(*args: object) -> object:
        found = run_failing_checks(*args)
        stub_scontrol(tmp_path, state="MIXED+DRAIN", reason="maintenance window")  # ... drained by an operator
        return found

    monkeypatch.setattr(cli, "run_checks", run_then_drain)
    assert cli.main(["slurm", "--drain"], env=PROLOG, hostname="h") == 1
    out = capsys.readouterr().out
    assert out.endswith(
        "; not drained: gpu-017 is out of service already (state MIXED+DRAIN, reason 'maintenance window'), kept as "
        "it is; checks: gpu_hardware: test_gpu_count\n"
    )
    assert len(runs) == 1 and scontrol_calls(tmp_path / "scontrol.calls") == []


# --- no verdict: the command's own failures, an inherited PYTEST_ADDOPTS, a --keep-report that is an input ------


def test_checks_that_cannot_start_are_no_verdict_and_drain_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """level_run.CannotRun (an interpreter that cannot start, a full TMPDIR: test_level_run.py): Slurm's 10
    and NPD's Unknown, one line."""
    calls = stub_scontrol(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))

    def run_checks(*_args: object) -> None:
        raise CannotRun("cannot lock the run's directory: /tmp/x/.held: No space left on device")

    monkeypatch.setattr(cli, "run_checks", run_checks)
    assert cli.main(["slurm", "--drain"], env=PROLOG, hostname="h") == 10
    assert capsys.readouterr().out == (
        "ERROR:  gbvalidate:  Health check could not run:  cannot lock the run's directory: /tmp/x/.held: No space "
        "left on device\n"
    )
    assert cli.main(["npd"], env={}, hostname="h") == 2
    assert (
        capsys.readouterr().out == "unknown: cannot lock the run's directory: /tmp/x/.held: No space left on device\n"
    )
    assert scontrol_calls(calls) == []


def test_an_inherited_pytest_addopts_is_not_passed_on_and_the_line_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The environment the run gets is level_run.checks_environment's (test_level_run.py); the line says
    what was left out."""
    stub_scontrol(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    runs = captured_run(monkeypatch)
    assert cli.main(["slurm", "--", "--gb-sku=cpu"], env=PROLOG | {"PYTEST_ADDOPTS": "-k numa"}, hostname="h") == 1
    assert runs == [(45.0, ["--gb-sku=cpu", "--gb-world=none"])]  # the passive level's default
    out = capsys.readouterr().out
    assert "; PYTEST_ADDOPTS='-k numa' not passed on: the level's checks run as given (pytest options go after --)" in (
        out
    )
    assert cli.main(["slurm"], env=PROLOG | {"PYTEST_ADDOPTS": " "}, hostname="h") == 1
    assert "PYTEST_ADDOPTS" not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("env", "pytest_args", "kept", "source"),
    [
        ({"GBVALIDATE_BASELINES": "{b}", "GBVALIDATE_SKU": "cpu"}, [], "{b}/cpu.yaml", "GBVALIDATE_BASELINES in the"),
        ({}, ["--gb-baselines", "{b}"], "{b}/other.yaml", "--gb-baselines after --"),  # any SKU's: `auto` reads all
        ({"GBVALIDATE_BASELINES": "/nowhere"}, ["--gb-baselines={b}"], "{b}/cpu.yaml", "--gb-baselines after --"),
        ({"GBVALIDATE_COMPARE": "{t}/earlier.json"}, [], "{t}/earlier.json", "GBVALIDATE_COMPARE in the environment"),
        ({}, ["--gb-history={t}/history"], "{t}/history/gpu-017/2026-11-27T02-54-03Z.json", "--gb-history after --"),
    ],
)
@pytest.mark.usefixtures("nothing_runs")
def test_a_kept_report_is_none_of_the_run_s_inputs(
    env: dict[str, str],
    pytest_args: list[str],
    kept: str,
    source: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--keep-report replaces its file after the run: never the baseline the run read, the earlier report it
    compared with or a report kept in its history (as the run guards its own outputs: run/paths.py)."""
    baselines = tmp_path / "baselines"
    baselines.mkdir()
    for name in ("cpu.yaml", "other.yaml"):
        (baselines / name).write_text("sku: x\n")
    (tmp_path / "earlier.json").write_text("{}")
    (tmp_path / "history" / "gpu-017").mkdir(parents=True)
    (tmp_path / "history" / "gpu-017" / "2026-11-27T02-54-03Z.json").write_text("{}")

    def given(text: str) -> str:
        return text.format(b=baselines, t=tmp_path)

    keep = given(kept)
    env = {k: given(v) for k, v in env.items()}
    args = ["slurm", "--keep-report", keep, "--", *map(given, pytest_args)]
    assert cli.main(args, env=env, hostname="h") == 10
    out = capsys.readouterr().out
    assert out.startswith(f"ERROR:  gbvalidate:  usage:  --keep-report: {keep} is also ") and source in out, out
    assert out.endswith(": an output must be a file of its own\n") and out.count("\n") == 1
    assert Path(keep).read_text() in ("{}", "sku: x\n")  # as it was


@pytest.mark.usefixtures("nothing_runs")
def test_a_relative_setting_names_none_of_the_caller_s_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The run starts in a directory of its own: GBVALIDATE_BASELINES=baselines there is not ./baselines here."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "baselines").mkdir()
    (tmp_path / "baselines" / "cpu.yaml").write_text("sku: x\n")
    assert cli.run_inputs([], {"GBVALIDATE_BASELINES": "baselines"}) == {}
    assert cli.run_inputs(["--gb-compare=last"], {}) == {
        k: v for k, v in cli.run_inputs([], {}).items() if k.startswith("the baseline ")
    }


def test_the_command_s_own_import_failing_is_no_verdict() -> None:
    """__main__.py: a broken interpreter (a dependency missing) is one line and the mode's "no verdict" status,
    written out there since slurm.py and npd.py may be what failed to import."""
    from pytest_gbvalidate.healthcheck import __main__ as entry
    from pytest_gbvalidate.healthcheck import npd, slurm

    assert (entry.SLURM_EXIT_NOT_RUN, entry.SLURM_LINE_MAX_CHARS) == (slurm.EXIT_NOT_RUN, slurm.LINE_MAX_CHARS)
    assert (entry.NPD_EXIT_UNKNOWN, entry.NPD_MAX_OUTPUT_LENGTH) == (npd.EXIT_UNKNOWN, npd.DEFAULT_MAX_OUTPUT_LENGTH)
    missing = ModuleNotFoundError("No module named 'typing_extensions'")
    assert entry.cannot_import(missing, ["slurm", "--drain"]) == (
        "ERROR:  gbvalidate:  Health check could not run:  cannot import the health check: ModuleNotFoundError: No "
        "module named 'typing_extensions'",
        10,
    )
    assert entry.cannot_import(missing, ["npd"]) == (
        "unknown: cannot import the health check: ModuleNotFoundError: No module named...",
        2,
    )
    line, _ = entry.cannot_import(ImportError("n\u00f6\n\x1b[2J"), ["slurm"])
    assert line.endswith("ImportError: n\\xf6 \\x1b[2J") and line.isascii() and line.isprintable()


def test_the_settings_named_are_settings_py_s() -> None:
    from pytest_gbvalidate.settings import TABLE

    names = {spec.name for spec in TABLE}
    assert {*cli.INPUT_SETTINGS, "report", "world", "node_idle"} <= names


@pytest.mark.parametrize(
    ("config", "deadline_s"),
    [("PrologEpilogTimeout     = 60", 40.0), ("PrologEpilogTimeout     = 65534", 45.0), ("", 45.0)],
    ids=["limit", "unset", "no-answer"],
)
def test_a_prolog_s_deadline_leaves_room_within_prolog_epilog_timeout(
    config: str, deadline_s: float, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """slurmd kills a Prolog or Epilog at PrologEpilogTimeout: the check's own 90 s outlived a 60 s limit, and the
    kill left no line and the run's directory behind. 65534 is Slurm's word for no limit."""
    runs = captured_run(monkeypatch)
    stub_scontrol(tmp_path, config=config)
    monkeypatch.setenv("PATH", str(tmp_path))
    cli.main(["slurm", "--drain"], env=PROLOG, hostname="h")
    assert [deadline for deadline, _ in runs] == [deadline_s]


@pytest.mark.usefixtures("nothing_runs")
def test_an_epilog_deadline_past_prolog_epilog_timeout_is_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stub_scontrol(tmp_path, config="PrologEpilogTimeout = 60")
    monkeypatch.setenv("PATH", str(tmp_path))
    env = PROLOG | {"SLURM_SCRIPT_CONTEXT": "epilog_slurmd"}
    assert cli.main(["slurm", "--deadline-s", "90"], env=env, hostname="h") == 10
    assert capsys.readouterr().out == (
        "ERROR:  gbvalidate:  usage:  --deadline-s 90: as Epilog slurmd kills the check after 60 s "
        "(PrologEpilogTimeout), so the checks get 40 s at most (20 s are start-up, the report and scontrol) and at "
        "least 20: raise PrologEpilogTimeout\n"
    )


@pytest.mark.parametrize(
    ("argv", "env", "said"),
    [
        (["--level", "standard"], BATCH_SCRIPT, "--level standard measures for minutes: run it as the gate (--gate)"),
        (["--gate", "--level", "standard"], HEALTH_CHECK_PROGRAM, "--gate measures for minutes: not in slurmd's hooks"),
        (["--gate"], PROLOG, "--gate measures for minutes: not in slurmd's hooks"),
        (["--gate"], {"SLURMD_NODENAME": "gpu-017"} | {"SLURM_JOB_ID": ""}, "--gate runs in a Slurm job that holds"),
        (["--gate", "--level", "full"], BATCH_SCRIPT, "job 42 does not hold its node alone (sbatch --exclusive)"),
    ],
    ids=["level-without-gate", "health-check-program", "prolog", "no-job", "not-exclusive"],
)
@pytest.mark.usefixtures("nothing_runs")
def test_the_measuring_gate_runs_only_in_a_job_that_holds_the_node_alone(
    argv: list[str],
    env: dict[str, str],
    said: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The standard and full levels measure for minutes with every GPU and link: beside a job they measured the job
    too. Nothing runs, and nothing is drained, where the gate cannot hold the node alone."""
    calls = stub_scontrol(tmp_path)  # `show job` says nothing of OverSubscribe: not known to be exclusive
    monkeypatch.setenv("PATH", str(tmp_path))
    assert cli.main(["slurm", *argv], env=env, hostname="gpu-017") == 10
    assert capsys.readouterr().out.startswith(f"ERROR:  gbvalidate:  usage:  {said}")
    assert scontrol_calls(calls) == []


CLUSTER_SCONTROL = """#!{python}
import json, sys
with open({calls!r}, "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
nodes = {nodes!r}
if sys.argv[1:3] == ["show", "node"]:
    asked = [n for n in nodes if n.split()[0] == "NodeName=" + sys.argv[-1]] or nodes
    print("\\n".join(asked))
"""


def test_the_breaker_holds_a_drain_past_half_the_cluster_s_gpu_nodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A wrong image or baseline fails every node's check alike: each drained itself, and the cluster went out."""
    gpu = "Gres=gpu:4 State={state} Partitions=debug{reason}"
    ours = gpu.format(state="IDLE+DRAIN", reason=" Reason=gbvalidate: [hardware] link: x")
    nodes = [f"NodeName=gpu-0{i} {ours}" for i in (1, 2)]
    nodes += [f"NodeName=gpu-017 {gpu.format(state='IDLE', reason='')}"]
    nodes += [f"NodeName=gpu-018 {gpu.format(state='IDLE', reason='')}", "NodeName=login State=IDLE Gres=(null)"]
    calls = tmp_path / "scontrol.calls"
    (tmp_path / "scontrol").write_text(CLUSTER_SCONTROL.format(python=sys.executable, calls=str(calls), nodes=nodes))
    (tmp_path / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    captured_run(monkeypatch)
    assert cli.main(["slurm", "--drain"], env=PROLOG, hostname="h") == 1
    out = capsys.readouterr().out
    # Of the four GPU nodes (the login node has none), two are out already: a third would be more than half.
    assert "; breaker tripped: 3 of 4 nodes to take out, more than the 2 allowed at once" in out
    assert "gpu-017 not drained, look at what they share first" in out
    assert scontrol_calls(calls) == []
    assert cli.main(["slurm", "--drain", "--max-drain-pct", "75"], env=PROLOG, hostname="h") == 1
    assert "; drained gpu-017; " in capsys.readouterr().out


# --- a job's leftovers: checked on an idle node, the node resumed once they are gone ------------------------------

LEFTOVERS = "gbvalidate: [job_leftovers] job_leftovers: test_no_leftover_gpu_processes[gpu0]"


def passing_run(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The pytest arguments of each run of the checks; every run passes."""
    from pytest_gbvalidate.healthcheck.verdict import Run
    from tests.helpers.healthcheck import record, report_with

    runs: list[list[str]] = []

    def run_checks(level: str, deadline_s: float, args: list[str], keep: object, rerun: object = None) -> Any:
        runs.append(args)
        return Run(level, 0, False, deadline_s, 3.0, report_with([record("s.py::test_x", "passed")])), None

    monkeypatch.setattr(cli, "run_checks", run_checks)
    return runs


@pytest.mark.parametrize(
    ("state", "idle"), [("IDLE", True), ("IDLE+COMPLETING", True), ("MIXED", False), ("ALLOCATED", False)]
)
def test_a_node_slurm_says_is_idle_is_checked_for_a_job_s_leftovers(
    state: str, idle: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = passing_run(monkeypatch)
    stub_scontrol(tmp_path, state=state)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert cli.main(["slurm", "--drain"], env=PROLOG, hostname="h") == 0
    assert ("--gb-node-idle" in runs[0]) == idle


def test_a_node_drained_for_a_job_s_leftovers_alone_resumes_once_its_checks_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = passing_run(monkeypatch)
    calls = stub_scontrol(tmp_path, state="IDLE+DRAIN", reason=LEFTOVERS)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert cli.main(["slurm", "--drain"], env=HEALTH_CHECK_PROGRAM, hostname="h") == 0
    assert "--gb-node-idle" in runs[0]
    assert capsys.readouterr().out.endswith("; resumed gpu-017\n")
    assert scontrol_calls(calls) == [["update", "nodename=gpu-017", "state=resume"]]


@pytest.mark.parametrize(
    "reason",
    [
        "gbvalidate: [hardware] gpu_hardware: test_gpu_count; job_leftovers: test_no_leftover_gpu_processes[gpu0]",
        "gbvalidate: [configuration] configuration: test_persistence_mode[gpu0]",
        "admin: [job_leftovers] cleaning up",  # someone else's words, however they read
    ],
)
@pytest.mark.usefixtures("nothing_runs")
def test_a_node_drained_for_more_than_leftovers_is_left_alone(
    reason: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = stub_scontrol(tmp_path, state="IDLE+DRAIN", reason=reason)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert cli.main(["slurm", "--drain"], env=HEALTH_CHECK_PROGRAM, hostname="h") == 0
    assert "Node Health Check skipped:  gpu-017 is out of service already" in capsys.readouterr().out
    assert scontrol_calls(calls) == []


def test_repaired_closes_the_kernel_log_s_events_in_the_window_the_checks_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pytest_gbvalidate.node import window, xid

    log = tmp_path / "kmsg"
    log.write_text("6,41,1000,-;NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus\n6,42,2000,-;usb 1-1\n")
    monkeypatch.setattr(xid, "KERNEL_LOG", log)
    assert cli.main(["repaired"], env={"GBVALIDATE_WINDOW": str(tmp_path / "w.json")}) == 0
    assert "Xid events up to kernel log record 42 are closed" in capsys.readouterr().out
    assert window.Window(tmp_path / "w.json").read(xid.REPAIRED_MARK) is not None
    assert cli.main(["repaired"], env={"GBVALIDATE_WINDOW": "none"}) == 10
    assert (
        capsys.readouterr().out
        == "gbvalidate: not done: GBVALIDATE_WINDOW: none: no window is kept, nothing to close\n"
    )
    assert cli.main(["repaired", "--window", str(tmp_path)], env={}) == 10  # a directory: one line naming it
    assert capsys.readouterr().out.startswith(f"gbvalidate: not done: --window: '{tmp_path}': is a directory")
    monkeypatch.setattr(xid, "KERNEL_LOG", tmp_path / "missing")
    assert cli.main(["repaired", "--window", str(tmp_path / "w.json")], env={}) == 10
    assert "cannot read the kernel log" in capsys.readouterr().out


# --- shadow mode: everything judged and said, no node changed ---------------------------------------------------


def test_shadow_mode_drains_nothing_exits_ok_and_says_what_it_would_have_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Prolog that fails would make slurmd drain the node itself, and NPD sets its condition on NonOK: shadow mode
    exits OK's status, and the line names the drain or the status it would have made."""
    runs = captured_run(monkeypatch)
    calls = stub_scontrol(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert cli.main(["slurm", "--drain", "--shadow"], env=PROLOG, hostname="h") == 0
    out = capsys.readouterr().out
    reason = "gbvalidate: [hardware] gpu_hardware: test_gpu_count"
    assert out.startswith("ERROR:  gbvalidate:  Health check failed:  gpu_hardware (1 check); ")
    assert f"; would drain gpu-017 (shadow mode): reason={reason}; " in out
    assert len(runs) == 1 and scontrol_calls(calls) == []  # asked about the node, changed nothing
    assert cli.main(["npd", "--shadow"], env={}, hostname="h") == 0
    assert capsys.readouterr().out.startswith("shadow mode, would report NonOK: gpu_hardware (1 check)")
    assert cli.main(["npd"], env={}, hostname="h") == 1  # without it, as always


def test_shadow_mode_resumes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    passing_run(monkeypatch)
    calls = stub_scontrol(tmp_path, state="IDLE+DRAIN", reason=LEFTOVERS)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert cli.main(["slurm", "--drain", "--shadow"], env=HEALTH_CHECK_PROGRAM, hostname="h") == 0
    assert capsys.readouterr().out.endswith("; would resume gpu-017 (shadow mode)\n")
    assert scontrol_calls(calls) == []


def test_the_health_check_drains_a_second_failure_within_the_week_as_a_repeat_offender(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    captured_run(monkeypatch)  # every run finds test_gpu_count failed
    calls = stub_scontrol(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    log, metrics = tmp_path / "drains.json", tmp_path / "textfile" / "gbvalidate-drains.prom"
    metrics.parent.mkdir()
    env = HEALTH_CHECK_PROGRAM | {"GBVALIDATE_DRAIN_LOG": str(log), "GBVALIDATE_DRAIN_METRICS": str(metrics)}
    assert cli.main(["slurm", "--drain", "--shadow"], env=env, hostname="h") == 0
    assert not log.exists()  # shadow mode drains nothing, and counts nothing
    assert cli.main(["slurm", "--drain"], env=env, hostname="h") == 1
    assert "; drained gpu-017; " in capsys.readouterr().out
    assert cli.main(["slurm", "--drain"], env=env, hostname="h") == 1
    said = "drained gpu-017 as a repeat offender (2 drains in 7 days: a person resumes it)"
    assert said in capsys.readouterr().out
    reasons = [call[-1] for call in scontrol_calls(calls)]
    assert reasons == [
        "reason=gbvalidate: [hardware] gpu_hardware: test_gpu_count",
        "reason=gbvalidate: [repeat] gpu_hardware: test_gpu_count",
    ]
    assert [d.reason for d in drains.read(log)] == [r.removeprefix("reason=") for r in reasons]
    # the drain metrics, as node_exporter's textfile collector reads them
    families = {f.name: f for f in text_string_to_metric_families(metrics.read_text())}
    counted = {s.labels["window"]: s.value for s in families["gbvalidate_node_drains"].samples}
    assert counted == {"7d": 2, "30d": 2}
    assert {s.labels["hostname"] for s in families["gbvalidate_node_drains"].samples} == {"gpu-017"}
    (last,) = families["gbvalidate_node_last_drain_timestamp_seconds"].samples
    assert last.value == pytest.approx(max(d.time_s for d in drains.read(log)), abs=1e-3)
    log.write_text("not a log")  # someone's file: the drain stands, uncounted, the file named
    assert cli.main(["slurm", "--drain"], env=env, hostname="h") == 1
    assert f"; the drain log {log} is not JSON: this drain not counted" in capsys.readouterr().out
    assert log.read_text() == "not a log"


def test_a_node_we_drained_found_back_in_service_is_fixed_and_its_old_events_are_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An admin resumed the node after our drain: before its checks, the kernel log's events so far are closed (as
    `repaired` closes them), once, so the same old Xid does not drain it again."""
    from pytest_gbvalidate.node import window, xid

    passing_run(monkeypatch)
    stub_scontrol(tmp_path)  # in service: IDLE, no reason
    monkeypatch.setenv("PATH", str(tmp_path))
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("4,7,1000,-;NVRM: Xid (PCI:0000:1b:00): 79, pid=1, GPU has fallen off the bus.\n")
    monkeypatch.setattr(xid, "KERNEL_LOG", kmsg)
    log, kept_window = tmp_path / "drains.json", tmp_path / "window.json"
    drains.record(log, drains.Drain(1_790_000_000.0, "gbvalidate: [hardware] gpu_hardware (reboot): test_xid[gpu0]"))
    env = HEALTH_CHECK_PROGRAM | {"GBVALIDATE_DRAIN_LOG": str(log), "GBVALIDATE_WINDOW": str(kept_window)}
    assert cli.main(["slurm", "--drain"], env=env, hostname="h") == 0
    out = capsys.readouterr().out
    assert "; back in service since its drain of 2026-09-21T" in out, out
    assert ": repair noted: Xid events up to kernel log record 7 are closed" in out
    closed = window.Window(kept_window).read(xid.REPAIRED_MARK)
    assert closed is not None and closed.value == 7
    assert drains.read(log)[-1].back_s is not None
    assert cli.main(["slurm", "--drain"], env=env, hostname="h") == 0  # once: the drain is seen back now
    assert "back in service" not in capsys.readouterr().out
