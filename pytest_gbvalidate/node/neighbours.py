"""How much of the node's CPU time processes outside this run took while a measurement ran. A busy neighbour slows a
host-side measurement as a degraded node would, in every sample, and only this tells the two apart: a figure whose
node was busy cannot tell a fall the neighbour could explain (noise.from_details counts it in its noise).

"This run" is the session of the measuring process (`os.getsid`): pytest, its ranks and its workers, a batch job's
steps. Everything else -- another job, a monitoring agent, the hypervisor's steal time -- is a neighbour. Linux's
/proc only: None elsewhere, or where it cannot be read. No torch, no pytest.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
# /proc/stat's `cpu` line: user nice system idle iowait irq softirq steal ...; all but idle and iowait are busy
# (guest time is counted in user already).
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)


@dataclass(frozen=True)
class Reading:
    """The node's busy CPU time and this session's, in clock ticks, at a moment (monotonic seconds)."""

    busy_ticks: int
    ours_ticks: int
    at_s: float
    cpus: int  # the CPUs /proc/stat's total is over


def read(proc: Path = PROC) -> Reading | None:
    """The node's busy CPU time and this session's now, or None where /proc cannot say."""
    try:
        lines = (proc / "stat").read_text().splitlines()
        fields = lines[0].split()
        busy = sum(int(fields[1 + i]) for i in _BUSY_FIELDS if 1 + i < len(fields))
    except (OSError, ValueError, IndexError):
        return None
    cpus = sum(1 for line in lines[1:] if line.startswith("cpu"))
    return Reading(busy, _session_ticks(proc, os.getsid(0)), time.monotonic(), max(cpus, 1))


def _session_ticks(proc: Path, session: int) -> int:
    """The user and system CPU time of every process of `session` (those that exited are in nobody's count)."""
    total = 0
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # After the command's closing parenthesis: state ppid pgrp session ... utime (12th) stime (13th).
            after = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(after[3]) == session:
                total += int(after[11]) + int(after[12])
        except (OSError, ValueError, IndexError):
            continue  # a process that ended meanwhile, or one we may not read
    return total


def others_share(start: Reading | None, end: Reading | None) -> float | None:
    """The share (0 to 1) of the node's CPU capacity that processes outside this session took between two
    readings; None where either is missing or no time passed."""
    if start is None or end is None:
        return None
    seconds = end.at_s - start.at_s
    capacity = seconds * os.sysconf("SC_CLK_TCK") * end.cpus
    if capacity <= 0:
        return None
    others = (end.busy_ticks - start.busy_ticks) - (end.ours_ticks - start.ours_ticks)
    return min(1.0, max(0.0, others / capacity))
