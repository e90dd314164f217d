"""pytest_gbvalidate/healthcheck/confirm.py: a health check's failed checks run once more within its deadline; only
what fails again is a failure (and a drain), what passes is flapping, and what the second run cannot say is no
verdict. The rule as a property over every outcome of the two runs, and the command end to end with a stub run and
a stub scontrol."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_gbvalidate.healthcheck import cli
from pytest_gbvalidate.healthcheck.confirm import combined, confirm
from pytest_gbvalidate.healthcheck.level_run import CannotRun
from pytest_gbvalidate.healthcheck.verdict import FAIL, OK, UNKNOWN, Run, judge
from tests.helpers.healthcheck import FAULT, record, report_with, scontrol_calls, stub_scontrol

CHECKS = [f"test_health.py::test_{name}" for name in ("ecc_errors[gpu0]", "pcie_link[gpu1]", "nvlinks[gpu2]")]
SECOND = ("failed", "passed", "skipped", "absent")  # what the second run says of one check


def _run(outcomes: dict[str, str], deadline_s: float = 45.0, duration_s: float = 5.0) -> Run:
    tests = [
        record(test_id, outcome, fault=FAULT if outcome == "failed" else None)
        for test_id, outcome in outcomes.items()
        if outcome != "absent"
    ]
    failed = any(o == "failed" for o in outcomes.values())
    return Run("passive", int(failed), False, deadline_s, duration_s, report_with(tests, exit_status=int(failed)))


@given(
    first=st.lists(st.booleans(), min_size=len(CHECKS), max_size=len(CHECKS)),
    second=st.lists(st.sampled_from(SECOND), min_size=len(CHECKS), max_size=len(CHECKS)),
)
def test_only_what_fails_twice_is_a_failure_and_flapping_is_never_one(first: list[bool], second: list[str]) -> None:
    before = judge(_run({c: "failed" if f else "passed" for c, f in zip(CHECKS, first, strict=True)}))
    failed_first = {c for c, f in zip(CHECKS, first, strict=True) if f}
    again = _run({c: o for c, o, f in zip(CHECKS, second, first, strict=True) if f})
    after = combined(before, judge(again)) if failed_first else before
    twice = {c for c, o, f in zip(CHECKS, second, first, strict=True) if f and o == "failed"}
    flapped = {c.rsplit("::", 1)[-1] for c, o, f in zip(CHECKS, second, first, strict=True) if f and o == "passed"}
    assert {f.test_id for f in after.failures} == twice  # a check that failed once only is never a failure
    names = {c.rsplit("::", 1)[-1] for c in failed_first}
    expected = FAIL if twice else OK if names == flapped else UNKNOWN  # no failure at all: flapped == names == {}
    assert after.state == expected
    assert set(after.flapping) == flapped
    assert after.confirmed == bool(twice)
    if after.state != FAIL:
        assert after.drain_reason() is None  # nothing drains on a single failure


def test_no_time_left_within_the_deadline_is_no_verdict() -> None:
    first = _run({CHECKS[0]: "failed"}, deadline_s=45.0, duration_s=30.0)

    def rerun(_report: object, _left_s: float) -> Run:
        raise AssertionError("ran with no time left")

    verdict = confirm(first, rerun, min_s=20.0)
    assert verdict.state == UNKNOWN and verdict.drain_reason() is None
    assert verdict.detail == (
        "failed once, not confirmed (test_ecc_errors[gpu0]): 15 s of the 45 s deadline left, 20 needed; run it again"
    )


def test_the_second_run_gets_the_first_report_and_what_is_left_of_the_deadline() -> None:
    asked: list[tuple[object, float]] = []
    first = _run({CHECKS[0]: "failed", CHECKS[1]: "passed"})

    def rerun(report: object, left_s: float) -> Run:
        asked.append((report, left_s))
        raise CannotRun("cannot start the checks' interpreter")

    verdict = confirm(first, rerun, min_s=20.0)
    assert asked == [(first.report, 40.0)]
    assert verdict.state == UNKNOWN and "cannot start the checks' interpreter" in verdict.detail


# --- the command: the line, the exit status, the drain ------------------------------------------------------


def _stub_runs(monkeypatch: pytest.MonkeyPatch, second: str) -> list[Any]:
    """Every run of the checks: the level's finds test_pcie_link[gpu1] failed; its second run says `second`."""
    runs: list[Any] = []

    def run_checks(level: str, deadline_s: float, args: list[str], keep: object, rerun: object = None) -> Any:
        runs.append((list(args), rerun is not None))
        return _run({CHECKS[1]: second if rerun else "failed", CHECKS[0]: "passed"}), None

    monkeypatch.setattr(cli, "run_checks", run_checks)
    return runs


@pytest.mark.parametrize(
    ("second", "code", "said", "drained"),
    [
        ("failed", 1, "; confirmed: failed again on a second run; drained gpu-017; checks: gpu_hardware: ", True),
        ("passed", 0, "; flapping (failed, then passed; not drained): test_pcie_link[gpu1]", False),
        ("skipped", 10, "Health check could not run:  failed once, not confirmed (test_pcie_link[gpu1]): ", False),
    ],
)
def test_the_slurm_health_check_drains_only_a_confirmed_failure(
    second: str,
    code: int,
    said: str,
    drained: bool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    runs = _stub_runs(monkeypatch, second)
    calls = stub_scontrol(tmp_path, state="MIXED")
    monkeypatch.setenv("PATH", str(tmp_path))
    env = {"SLURMD_NODENAME": "gpu-017"}
    assert cli.main(["slurm", "--drain", "--", "--gb-sku=cpu"], env=env, hostname="h") == code
    out = capsys.readouterr().out
    assert said in out, out
    assert [again for _, again in runs] == [False, True] and runs[0][0] == runs[1][0]  # the same arguments
    assert bool(scontrol_calls(calls)) == drained


def test_no_confirm_drains_on_the_first_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = _stub_runs(monkeypatch, "passed")
    calls = stub_scontrol(tmp_path, state="MIXED")
    monkeypatch.setenv("PATH", str(tmp_path))
    env = {"SLURMD_NODENAME": "gpu-017"}
    assert cli.main(["slurm", "--drain", "--no-confirm"], env=env, hostname="h") == 1
    assert "confirmed" not in capsys.readouterr().out and len(runs) == 1 and scontrol_calls(calls)


def test_npd_says_flapping_and_reports_ok(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _stub_runs(monkeypatch, "passed")
    assert cli.main(["npd", "--max-output-length", "200"], env={}) == 0
    assert capsys.readouterr().out == (
        "passive GPU node checks pass; flapping (failed, then passed; not drained): test_pcie_link[gpu1]\n"
    )
