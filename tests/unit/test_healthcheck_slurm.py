"""pytest_gbvalidate/healthcheck/slurm.py: LBNL NHC's exit codes and line, this node's name, and the drain through a
stub `scontrol` on PATH."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_gbvalidate.fleet import drain
from pytest_gbvalidate.healthcheck import slurm
from pytest_gbvalidate.healthcheck.verdict import Run, Verdict, judge
from tests.helpers.healthcheck import FAULT, NODE_LINE, record, report_with, scontrol_calls, stub_scontrol


def verdict_of(tests: list[dict[str, object]] | None, returncode: int = 0, timed_out: bool = False) -> Verdict:
    report = None if tests is None else report_with(tests, exit_status=returncode)
    return judge(Run("quick", returncode, timed_out, 90.0, 11.6, report, "pytest wrote no report (exit status 4)"))


PASSED = verdict_of([record("s/t.py::test_gpu_count", "passed"), record("s/t.py::test_gemm", "skipped", "setup")])
FAILED = verdict_of([record("s/t.py::test_gpu_count", "failed", fault=FAULT)], returncode=1)
TIMED_OUT = verdict_of(None, returncode=-15, timed_out=True)
NO_VERDICT = verdict_of(None, returncode=4)


def test_exit_codes_are_nhcs() -> None:
    assert [slurm.exit_code(v) for v in (PASSED, FAILED, TIMED_OUT, NO_VERDICT)] == [0, 1, 142, 10]
    assert [slurm.signal_exit_code(n) for n in (1, 2, 15)] == [129, 130, 143]


def test_lines_are_nhcs() -> None:
    assert slurm.line(PASSED) == (
        "gbvalidate:  Node Health Check completed successfully (12s): quick level, 1 passed, 1 skipped"
    )
    assert slurm.line(FAILED, "drained gpu-017") == (
        "ERROR:  gbvalidate:  Health check failed:  gpu_hardware (1 check); "
        f"action: gpu_hardware: {FAULT['action']}; drained gpu-017; checks: gpu_hardware: test_gpu_count"
    )
    assert slurm.line(TIMED_OUT) == (
        "ERROR:  gbvalidate:  Health check failed:  timeout: the quick checks did not finish within 90 s; "
        "killed at the 90 s deadline"
    )
    assert slurm.line(NO_VERDICT, "") == (
        "ERROR:  gbvalidate:  Health check could not run:  pytest wrote no report (exit status 4)"
    )
    # A signal is no verdict (NHC's 143 is kept; nothing is drained): the line must not read as a failed check.
    assert slurm.stopped_by(15) == (
        "ERROR:  gbvalidate:  Health check could not finish:  Terminated by signal SIGTERM; no verdict, nothing "
        "drained."
    )
    assert slurm.one_line("a\nb\x1b" + "x" * 2000).startswith("a b\\x1b") and len(slurm.one_line("x" * 2000)) == 1000


def test_a_line_at_its_length_limit_keeps_the_verdict_the_action_and_the_drain() -> None:
    """Many failed checks: the list is what the 1000-character line cuts, not the action or the drain's result."""
    link = FAULT | {"category": "link", "action": "check the cable or port", "disposition": "ISOLATE"}
    tests = [record(f"s/t.py::test_ib_port_{i:03d}_{'x' * 30}", "failed", fault=link) for i in range(60)]
    many = verdict_of([*tests, record("s/t.py::test_gpu_count", "failed", fault=FAULT)], returncode=1)
    text = slurm.line(many, "drained gpu-017")
    assert len(text) == slurm.LINE_MAX_CHARS and text.endswith("...")
    assert text.startswith(
        "ERROR:  gbvalidate:  Health check failed:  link (60 checks), gpu_hardware (1 check); action: link: check "
        f"the cable or port; gpu_hardware: {FAULT['action']}; drained gpu-017; checks: link: test_ib_port_000_"
    )


def test_only_a_failure_or_a_timeout_has_a_drain_reason() -> None:
    assert FAILED.drain_reason() == "gbvalidate: [hardware] gpu_hardware: test_gpu_count"
    timeout = "gbvalidate: [hardware] timeout: the quick checks did not finish within 90 s"
    assert TIMED_OUT.drain_reason() == timeout
    assert PASSED.drain_reason() is None and NO_VERDICT.drain_reason() is None
    quoted = verdict_of([record('s/t.py::test_it\'s["a"]', "failed", fault=FAULT)], returncode=1)
    assert quoted.drain_reason() == "gbvalidate: [hardware] gpu_hardware: test_its[a]"
    many = verdict_of([record(f"s/t.py::test_{i:03d}_{'x' * 40}", "failed") for i in range(9)], returncode=1)
    reason = many.drain_reason()
    assert reason is not None and len(reason) == drain.REASON_MAX_CHARS
    assert reason.startswith("gbvalidate: [hardware] unclassified: test_000_") and reason.endswith("...")


def test_this_nodes_name_comes_from_node_then_slurmd_then_the_short_hostname() -> None:
    env = {"SLURMD_NODENAME": "gpu-017"}
    assert slurm.node_name("gpu-001", env, "h.example") == ("gpu-001", "--node")
    assert slurm.node_name(None, env, "h.example") == ("gpu-017", "SLURMD_NODENAME")
    assert slurm.node_name(None, {}, "gpu-018.cluster.local") == ("gpu-018", "the hostname")


@pytest.mark.parametrize(
    ("explicit", "env", "hostname", "why"),
    [
        ("n[1-2]", {}, "h", "--node 'n[1-2]' is not a single Slurm node name"),
        ("ALL", {}, "h", "--node 'ALL' is not a single Slurm node name"),
        (None, {"SLURMD_NODENAME": "n1,n2"}, "h", "SLURMD_NODENAME 'n1,n2' is not a single Slurm node name"),
        (None, {"SLURMD_NODENAME": "n1.x"}, "h", "SLURMD_NODENAME 'n1.x' is not a single Slurm node name"),
        (None, {}, "evil\n\x1b[2J", "the hostname 'evil\\n\\x1b[2J' is not a single Slurm node name"),
        ("n\u00f6de1", {}, "h", "--node 'n\\xf6de1' is not a single Slurm node name"),  # escaped once
        (None, {"SLURMD_NODENAME": "fe80::1%n1,gpu[001-128]"}, "h", "SLURMD_NODENAME 'fe80::1%n1,gpu[001-128]' is"),
    ],
)
def test_a_name_that_is_not_one_node_is_refused(
    explicit: str | None, env: dict[str, str], hostname: str, why: str
) -> None:
    name, said = slurm.node_name(explicit, env, hostname)
    assert name is None and said.startswith(why), said
    assert slurm.error_line(said).endswith(said)  # the line escapes nothing twice


@pytest.mark.parametrize(
    ("env", "health_check_program"),
    [
        ({"SLURMD_NODENAME": "n1"}, True),  # slurmd's run_script_health_check: that variable alone
        ({"SLURMD_NODENAME": "n1", "SLURM_NODE_IS_HEALTHY": "no"}, True),  # Slurm 26.11
        ({"SLURMD_NODENAME": "n1", "SLURM_SCRIPT_CONTEXT": "prolog_slurmd", "SLURM_JOB_ID": "42"}, False),
        ({"SLURMD_NODENAME": "n1", "SLURM_JOB_ID": "42", "SLURM_JOBID": "42", "SLURM_STEP_ID": "0"}, False),  # srun
        ({"SLURMD_NODENAME": "n1", "SLURM_JOB_ID": "42", "SLURM_JOBID": "42"}, False),  # an sbatch script
        ({"SLURMD_NODENAME": "n1", "SLURM_JOBID": "42"}, False),
        ({}, False),
    ],
)
def test_only_slurmd_s_own_health_check_program_has_its_limit(env: dict[str, str], health_check_program: bool) -> None:
    assert slurm.is_health_check_program(env) is health_check_program


def test_the_drain_runs_scontrol_from_path_with_one_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = stub_scontrol(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert slurm.Scontrol().drain("gpu-017", "gbvalidate: [hardware] gpu_hardware: test_gpu_count") == "drained gpu-017"
    assert scontrol_calls(calls) == [
        ["update", "nodename=gpu-017", "state=drain", "reason=gbvalidate: [hardware] gpu_hardware: test_gpu_count"]
    ]
    assert slurm.drain_argv("n1", "r")[0] == "scontrol"


def test_a_drain_that_fails_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert slurm.Scontrol().drain("gpu-017", "r") == "not drained: scontrol is not on PATH"
    stub_scontrol(tmp_path, status=1, say="slurm_update error: Invalid node name specified\n")
    said = slurm.Scontrol().drain("gpu-017", "r")
    assert said == "not drained: scontrol exit status 1: slurm_update error: Invalid node name specified"


@pytest.mark.parametrize(
    ("line", "state", "reason"),
    [
        (NODE_LINE.format(node="n1", state="IDLE", reason=""), "IDLE", None),
        (
            NODE_LINE.format(node="n1", state="IDLE+DRAIN", reason=" Reason=admin: fan, [x] pending [root@2026-11-27]"),
            "IDLE+DRAIN",
            "admin: fan, [x] pending",
        ),
        (
            "NodeName=n1 State=DOWN+NOT_RESPONDING Reason=Not responding [slurm@2026-11-27T02:54:03]",
            "DOWN+NOT_RESPONDING",
            "Not responding",
        ),
    ],
)
def test_scontrol_s_node_line_gives_its_state_and_reason(line: str, state: str, reason: str | None) -> None:
    assert slurm.parse_node_state(line) == slurm.NodeState(state, reason)


def test_out_of_service_is_a_drain_fail_or_maintenance_flag_and_down_alone_is_not() -> None:
    """DOWN alone is Slurm's own mark for a node that stopped responding, which it returns to service as its slurmd
    starts again: such a node is checked."""
    out = ["IDLE+DRAIN", "MIXED+DRAIN", "DOWN+DRAIN", "IDLE+FAIL", "ALLOCATED+MAINT", "idle+drain"]
    assert all(slurm.NodeState(state, None).out_of_service for state in out)
    checked = ["IDLE", "MIXED", "ALLOCATED+COMPLETING", "DOWN", "DOWN+NOT_RESPONDING", "IDLE+NOT_RESPONDING"]
    assert not any(slurm.NodeState(s, None).out_of_service for s in checked)


def test_an_unreadable_node_state_is_none_and_the_check_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert slurm.Scontrol().node_state("gpu-017") is None  # no scontrol
    assert slurm.Scontrol().health_check_limit_s() == slurm.HEALTH_CHECK_KILL_S


HANGING_SCONTROL = """#!{python}
import sys, time
with open({asked!r}, "a") as f:
    f.write(" ".join(sys.argv[1:]) + "\\n")
time.sleep(30)
"""


def test_a_controller_that_does_not_answer_costs_two_timeouts_at_most(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """slurmctld down: its first question waits SCONTROL_TIMEOUT_S; no other question is asked, and the drain is
    still tried (the node failed its check), so the command stays within slurmd's limit (RESERVE_S)."""
    (tmp_path / "scontrol").write_text(HANGING_SCONTROL.format(python=sys.executable, asked=str(tmp_path / "asked")))
    (tmp_path / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(slurm, "SCONTROL_TIMEOUT_S", 0.5)
    scontrol = slurm.Scontrol()
    assert scontrol.health_check_limit_s() == slurm.HEALTH_CHECK_KILL_S
    assert scontrol.node_state("gpu-017") is None
    assert scontrol.drain("gpu-017", "r") == "not drained: scontrol did not finish within 0.5 s"
    assert (tmp_path / "asked").read_text().splitlines() == [
        "show config",
        "update nodename=gpu-017 state=drain reason=r",
    ]


def _fault(category: str) -> dict[str, object]:
    """A report's fault record of a check of this category, as faults.yaml says it."""
    from pytest_gbvalidate import faults

    found = faults.load().categories[category]
    said = {"title": found.title, "action": found.action, "disposition": found.disposition}
    return {"category": category, **said, "reason_class": found.reason_class, "repair": found.repair}


def _reason(*categories: str) -> str:
    tests = [record(f"s/t.py::test_{c}", "failed", fault=_fault(c)) for c in categories]
    reason = verdict_of(tests, returncode=1).drain_reason()
    assert reason is not None
    return reason


def test_a_node_is_resumed_only_on_our_whole_word_for_a_job_s_leftovers_alone() -> None:
    ours = _reason("job_leftovers")
    assert ours == "gbvalidate: [job_leftovers] job_leftovers (fix_job): test_job_leftovers"
    assert slurm.leftovers_alone(ours) and slurm.NodeState("IDLE+DRAIN", ours).for_leftovers
    assert not slurm.NodeState("IDLE", ours).for_leftovers  # in service: nothing to resume
    # another class beside it, whatever comes first; cut short; someone's words after ours
    assert not slurm.leftovers_alone(_reason("job_leftovers", "gpu_hardware"))
    assert not slurm.leftovers_alone(_reason("job_leftovers", "configuration"))
    assert not slurm.leftovers_alone(f"{ours}; +2 more")
    assert not slurm.leftovers_alone(f"{ours[:-5]}...")
    assert not slurm.leftovers_alone(f"{ours}; admin: RMA, keep out")
    assert not slurm.leftovers_alone(f"{ours} (admin: keep out)")
    assert not slurm.leftovers_alone("admin: " + ours) and not slurm.leftovers_alone(None)


@given(word=st.from_regex(r"[a-z_]{1,20}", fullmatch=True), said=st.text(max_size=40))
def test_nothing_anyone_adds_to_our_leftovers_reason_resumes_the_node(word: str, said: str) -> None:
    """A part of another category (an admin's `admin: ...`, a class of ours), or words after ours without the
    separator, are someone's word: the node waits for a person, whatever they say."""
    ours = _reason("job_leftovers")
    if word != "job_leftovers":
        assert not slurm.leftovers_alone(f"{ours}; {word}: {said}")
        assert not slurm.leftovers_alone(f"{ours}; {word} ({word}): {said}")
    assert not slurm.leftovers_alone(f"{ours} {said}")
