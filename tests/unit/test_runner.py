"""reference_tools/runner.py: how a reference tool is run, and what it is asked what it can do with."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gbvalidate.reference_tools import runner


def test_a_tool_runs_with_the_run_s_environment_on_top_of_this_process_s(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GBVALIDATE_TEST_KEPT", "kept")
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    printed = runner.run(
        ["sh", "-c", 'echo "$GBVALIDATE_TEST_KEPT $NCCL_DEBUG"'], env={"NCCL_DEBUG": "WARN"}, timeout_s=10
    )
    assert printed == "kept WARN\n"


def test_asking_a_tool_takes_both_outputs_whatever_its_exit_code(tmp_path: Path) -> None:
    """A usage (`-h`) may go to either output and end with a nonzero code; a tool that cannot run answers nothing."""
    both = runner.printed(["sh", "-c", "echo usage; echo --json >&2; exit 1"], env={}, timeout_s=10)
    assert both == "usage\n--json\n"
    assert runner.printed([str(tmp_path / "missing"), "-h"], env={}, timeout_s=10) == ""
    assert runner.printed(["sleep", "5"], env={}, timeout_s=0.2) == ""
