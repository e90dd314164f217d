"""pytest_gbvalidate/fleet/confirm.py: `fleet summary --confirm` takes a failed node out only for the checks that
failed again in a second run of them (`--gb-rerun-failed`) among the reports; flapping is listed, never drained; a
failure with no second run is not confirmed. On node reports, through the command."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_gbvalidate.fleet.cli import main
from tests.helpers.fleet_reports import write
from tests.helpers.healthcheck import FAULT
from tests.helpers.reports import minimal_report

CHECK = "test_health.py::test_pcie_link[gpu1]"


def _report(host: str, outcome: str, start: str, rerun_of: Path | None = None) -> dict[str, Any]:
    report = minimal_report()
    report["node"]["hostname"] = host
    report["start_time"], report["end_time"] = f"2026-11-29T{start}+00:00", f"2026-11-29T{start[:-2]}59+00:00"
    test = {"test_id": CHECK, "when": "call", "outcome": outcome, "duration_s": 0.1, "text": None}
    test |= {"message": None} if outcome == "passed" else {"message": "gen 3, not 5", "fault": FAULT}
    report["tests"] = [*([] if rerun_of else report["tests"]), test]
    report["exit_status"] = 1 if outcome == "failed" else 0
    report["narrowed_by"] = ["-k 'pcie'"]  # both runs narrowed alike: the second is still the first's confirmation
    if rerun_of is not None:  # what run/rerun.py's run records
        report["narrowed_by"].append(f"--gb-rerun-failed {rerun_of}")
        report["measurements"] = []
    return report


@pytest.fixture
def fleet(tmp_path: Path) -> list[str]:
    """Four nodes: gb-01 fails twice, gb-02 fails then passes, gb-03 fails with no second run, gb-04 passes."""
    paths = []
    for host, first, second in [
        ("gb-01", "failed", "failed"),
        ("gb-02", "failed", "passed"),
        ("gb-03", "failed", None),
    ]:
        path = write(tmp_path, f"{host}.json", _report(host, first, "10:00:00"))
        paths.append(path)
        if second is not None:
            paths.append(write(tmp_path, f"{host}-again.json", _report(host, second, "10:05:00", path)))
    paths.append(write(tmp_path, "gb-04.json", _report("gb-04", "passed", "10:00:00")))
    return [str(p) for p in paths]


def _drain_lines(out: str) -> list[str]:
    return [line.strip() for line in out.splitlines() if line.strip().startswith("scontrol update")]


def test_with_confirm_only_a_failure_seen_twice_drains(
    fleet: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["summary", *fleet, "--out", str(tmp_path / "out"), "--confirm", "--max-drain-pct", "100"])
    out = capsys.readouterr().out
    assert code == 1
    assert _drain_lines(out) == [
        "scontrol update nodename=gb-01 state=drain reason='gbvalidate: [hardware] gpu_hardware: test_pcie_link[gpu1]'"
    ]
    assert "gb-02: flapping (failed, then passed on a second run; not drained): test_pcie_link[gpu1]" in out
    assert (
        "gb-03: failed once, not confirmed: no second run of its failed checks here "
        "(pytest --gb-rerun-failed=ITS_REPORT)"
    ) in out
    assert "4 nodes (1 pass, 1 fail, 1 flapping, 1 unconfirmed)" in out
    assert "1 node(s) failed once, not confirmed (no verdict: run their failed checks again)" in out
    page = (tmp_path / "out" / "summary.md").read_text()
    assert "gb-02: flapping" in page and "gb-03: failed once, not confirmed" in page


def test_without_confirm_the_second_runs_are_listed_and_every_failure_drains(
    fleet: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["summary", *fleet, "--out", str(tmp_path / "out"), "--max-drain-pct", "100"])
    out = capsys.readouterr().out
    assert code == 1
    assert [line.split()[2] for line in _drain_lines(out)] == [f"nodename=gb-0{i}" for i in (1, 2, 3)]
    assert out.count("runs the failed checks of gb-0") == 2  # listed among the reports not merged


def test_a_second_run_still_running_neither_clears_nor_confirms_a_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A second run killed outright (`running`, its passes written test by test) speaks in no direction: the node
    failed once, not confirmed -- never flapping, never drained."""
    first = write(tmp_path, "gb-02.json", _report("gb-02", "failed", "10:00:00"))
    killed = _report("gb-02", "passed", "10:05:00", first) | {"status": "running", "exit_status": None}
    killed["end_time"] = None
    again = write(tmp_path, "gb-02-again.json", killed)
    code = main(["summary", str(first), str(again), "--out", str(tmp_path / "out"), "--confirm"])
    out = capsys.readouterr().out
    assert code == 1 and "flapping" not in out and not _drain_lines(out)
    assert "gb-02: failed once, not confirmed: no second run of its failed checks here" in out
    assert f"still running: {first}, a finished run of gb-02, speaks for it" in out
