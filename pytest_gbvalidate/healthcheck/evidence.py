"""The evidence a vendor ticket asks for, kept before the health check drains its node (reset or rebooted next, what
the driver knew goes with it): NVIDIA's `nvidia-bug-report.sh` log beside the kept report, bounded in time and size,
as NVSentinel collects beside its drains (a minimal collection in about 17 s). No pytest here."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

TOOL = "nvidia-bug-report.sh"
MAX_S = 60.0  # at most this long, and never past the health check's deadline
MIN_S = 5.0  # with less of the deadline left, no collection is started: it could not finish
MAX_BYTES = 256 * 2**20


def keep(beside: Path | None, left_s: float) -> str:
    """Run the tool into `beside`'s directory (the kept report's; none: no note) within `left_s` seconds; the line's
    note: where the evidence is, or why none was kept."""
    if beside is None:
        return ""
    if (tool := shutil.which(TOOL)) is None:
        return f"evidence: {TOOL} not installed; the kept report is the evidence"
    bound_s = min(MAX_S, left_s)
    if bound_s < MIN_S:
        return f"evidence: not collected, {left_s:.0f} s left of the deadline"
    stem = beside.with_name(f"{beside.stem}.nvidia-bug-report.log")
    made = stem.with_name(stem.name + ".gz")  # the tool compresses what it writes
    command, quiet = [tool, "--safe-mode", "--output-file", str(stem)], subprocess.DEVNULL
    try:
        tool_run = subprocess.Popen(command, stdin=quiet, stdout=quiet, stderr=quiet, start_new_session=True)
    except OSError as exc:
        return f"evidence: {TOOL} did not start: {exc.strerror or exc}"
    try:
        code = tool_run.wait(bound_s)
    except subprocess.TimeoutExpired:
        os.killpg(tool_run.pid, signal.SIGKILL)  # its children too (nvidia-smi, dmesg, lspci)
        tool_run.wait()
        made.unlink(missing_ok=True)
        stem.unlink(missing_ok=True)
        return f"evidence: {TOOL} killed after {bound_s:.0f} s, nothing kept"
    if (found := next((p for p in (made, stem) if p.is_file()), None)) is None:
        return f"evidence: {TOOL} exited {code} and wrote nothing"
    size = found.stat().st_size
    if size > MAX_BYTES:
        found.unlink()
        return f"evidence: {TOOL} wrote {size / 2**20:.0f} MiB, over {MAX_BYTES // 2**20} MiB: removed"
    return f"evidence: {found}"
