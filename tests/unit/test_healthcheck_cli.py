"""pytest_gbvalidate/healthcheck/cli.py: what stops the command before any check runs is one line on stdout and
the mode's "no verdict" exit status (Slurm 10, NPD 2); nothing runs and nothing is drained."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gbvalidate.healthcheck import cli
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

    def run_checks(level: str, deadline_s: float, pytest_args: list[str], keep: object) -> tuple[Run, None]:
        runs.append((deadline_s, pytest_args))
        report = report_with([record("s.py::test_gpu_count", "failed", fault=FAULT)], exit_status=1)
        return Run(level, 1, False, deadline_s, 3.0, report), None

    monkeypatch.setattr(cli, "run_checks", run_checks)
    return runs


HEALTH_CHECK_PROGRAM = {"SLURMD_NODENAME": "gpu-017"}  # slurmd's whole environment for it (no script context)
PROLOG = {"SLURMD_NODENAME": "gpu-017", "SLURM_SCRIPT_CONTEXT": "prolog_slurmd"}


@pytest.mark.parametrize(
    ("env", "argv", "config", "deadline_s"),
    [
        (HEALTH_CHECK_PROGRAM, [], "", 40.0),  # Slurm before 26.05: killed at 60 s
        (HEALTH_CHECK_PROGRAM, [], "HealthCheckTimeout      = 300 sec", 90.0),  # 26.05: its own limit
        (HEALTH_CHECK_PROGRAM, [], "HealthCheckTimeout      = 50 sec", 30.0),
        (HEALTH_CHECK_PROGRAM, ["--deadline-s", "35"], "", 35.0),
        (PROLOG, [], "", 90.0),  # no such limit for a Prolog
        (PROLOG, ["--deadline-s", "600"], "", 600.0),
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


@pytest.mark.parametrize("state", ["IDLE+DRAIN", "DOWN+NOT_RESPONDING", "MIXED+DRAIN", "IDLE+COMPLETING+DRAIN"])
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


@pytest.mark.usefixtures("nothing_runs")
def test_slurmd_s_word_that_the_node_is_unhealthy_needs_no_question(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Slurm 26.11 tells HealthCheckProgram what slurmctld thinks of the node (SLURM_NODE_IS_HEALTHY)."""
    calls = stub_scontrol(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    env = HEALTH_CHECK_PROGRAM | {"SLURM_NODE_IS_HEALTHY": "no"}
    assert cli.main(["slurm", "--drain", "--deadline-s", "30"], env=env, hostname="h") == 0
    assert "is out of service already (state SLURM_NODE_IS_HEALTHY=no)" in capsys.readouterr().out
    assert scontrol_calls(calls) == []


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
