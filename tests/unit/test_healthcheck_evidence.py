"""Unit tests of the evidence the health check keeps before a drain (pytest_gbvalidate/healthcheck/evidence.py), with
stand-ins for nvidia-bug-report.sh (NVIDIA's driver installs it; this machine has no driver): one that writes its
gzip as the real one does, one that hangs, one that writes too much, one that fails."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pytest_gbvalidate.healthcheck import evidence

# The real tool writes FILE.gz for `--output-file FILE` (it compresses its log as it goes).
WRITES = '#!/bin/sh\nwhile [ "$1" != --output-file ]; do shift; done\necho "nvidia-smi -q ..." | gzip > "$2.gz"\n'
HANGS = "#!/bin/sh\nsleep 600\n"
FAILS = "#!/bin/sh\necho 'nvidia-bug-report.sh: must be run as root' >&2\nexit 1\n"


@pytest.fixture
def tool(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return bin_dir / evidence.TOOL


def install(tool: Path, script: str) -> None:
    tool.write_text(script)
    tool.chmod(0o755)


def test_the_bug_report_is_kept_beside_the_kept_report(tool: Path, tmp_path: Path) -> None:
    install(tool, WRITES)
    note = evidence.keep(tmp_path / "hc.json", left_s=30)
    assert note == f"evidence: {tmp_path / 'hc.nvidia-bug-report.log.gz'}"
    assert (tmp_path / "hc.nvidia-bug-report.log.gz").stat().st_size > 0


def test_no_place_no_tool_no_time_each_said_in_one_note(tool: Path, tmp_path: Path) -> None:
    assert evidence.keep(None, left_s=30) == ""  # no report kept: no place named for evidence
    assert (
        evidence.keep(tmp_path / "hc.json", 30)
        == "evidence: nvidia-bug-report.sh not installed; the kept report is the evidence"
    )
    install(tool, WRITES)
    assert evidence.keep(tmp_path / "hc.json", left_s=2) == "evidence: not collected, 2 s left of the deadline"
    install(tool, FAILS)
    assert evidence.keep(tmp_path / "hc.json", left_s=30) == "evidence: nvidia-bug-report.sh exited 1 and wrote nothing"


def test_a_tool_that_hangs_is_killed_at_the_deadline_and_leaves_nothing(
    tool: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install(tool, HANGS)
    monkeypatch.setattr(evidence, "MIN_S", 0.5)  # a second is bound enough to see the kill
    started = time.monotonic()
    said = evidence.keep(tmp_path / "hc.json", left_s=1.0)
    assert said == "evidence: nvidia-bug-report.sh killed after 1 s, nothing kept"
    assert time.monotonic() - started < 10
    assert not list(tmp_path.glob("hc.nvidia-bug-report*"))


def test_a_bundle_over_the_size_bound_is_removed(tool: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install(tool, WRITES)
    monkeypatch.setattr(evidence, "MAX_BYTES", 10)
    assert evidence.keep(tmp_path / "hc.json", left_s=30).endswith("MiB, over 0 MiB: removed")
    assert not list(tmp_path.glob("hc.nvidia-bug-report*"))
