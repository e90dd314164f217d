"""How long a measurement waited for a CPU while it was timed: a busy neighbour slows a host-side measurement as a
degraded node would, and only this tells the two apart. The kernel keeps, per thread, the time it was ready to run
but waited for a CPU (`/proc/<pid>/task/<tid>/schedstat`, its second field: the scheduler's run delay). A parallel op
waits for its slowest thread (two threads each waiting half the time slowed a 2-core host copy up to threefold), so
what counts is the share of the timed window in which some thread waited, 1 - prod(1 - w) over the threads' shares w
(their waits independent): what a neighbour could explain of the figure (rules/noise.py counts it as noise). Only
another task is a neighbour: the measurement's own threads and a gang's ranks wait for each other as they did when
the baseline was measured (a healthy gloo all_reduce's threads waited 60-78% of the window between them). So the
share counts no more of the window than the CPU time the other tasks used in it (/proc/stat's busy time less our
processes'): a task can have held a CPU our thread waited for only while it ran. Linux only (schedstat needs
CONFIG_SCHED_INFO, as every major distribution has): None elsewhere, or where it cannot be read. No torch, no pytest."""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

TASKS = Path("/proc/self/task")
PROC = Path("/proc")
_TICK_NS = 1e9 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 1e7


@dataclass(frozen=True)
class Reading:
    """Each thread's time waiting for a CPU (nanoseconds, by thread id) at a moment (monotonic seconds)."""

    waited_ns: dict[int, int]
    at_s: float
    others_ns: float | None = None  # the CPU time every other task on the host had used by then; None: unread


def read(tasks: Path = TASKS, *, family: int | None = None, proc: Path = PROC) -> Reading | None:
    """The run delays now of the threads under `tasks` (this process's), or None where the kernel keeps none; with
    the CPU time used by the host's other tasks: not that process's, nor `family`'s and its children's (a gang's)."""
    waited = {}
    try:
        entries = list(tasks.iterdir())
    except OSError:
        return None
    for entry in entries:
        try:
            waited[int(entry.name)] = int((entry / "schedstat").read_text().split()[1])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    if not waited:
        return None
    own = tasks.parent.name
    ours = {os.getpid() if own == "self" else int(own)} if own == "self" or own.isdigit() else set()
    return Reading(waited, time.monotonic(), _others_ns(proc, ours, family))


def _others_ns(proc: Path, ours: set[int], family: int | None) -> float | None:
    """The host's busy CPU time (/proc/stat: user, nice, system, irq, softirq) less that of the processes `ours`,
    `family` and its children (/proc/<pid>/stat: utime, stime), in ns; None where /proc/stat cannot be read."""
    try:
        fields = (proc / "stat").read_text().split("\n", 1)[0].split()
        busy = sum(int(fields[i]) for i in (1, 2, 3, 6, 7))
    except (OSError, ValueError, IndexError):
        return None
    ours_ticks = 0
    for pid in ours | (_family(proc, family) if family is not None else frozenset()):
        try:
            after_name = (proc / str(pid) / "stat").read_text().rpartition(")")[2].split()  # a name may hold spaces
            ours_ticks += int(after_name[11]) + int(after_name[12])
        except (OSError, ValueError, IndexError):
            continue  # a process that ended meanwhile
    return (busy - ours_ticks) * _TICK_NS


@functools.lru_cache(maxsize=8)
def _family(proc: Path, family: int) -> frozenset[int]:
    """`family` and its children, found once (a scan of every process's stat): a gang's ranks stay as they are for
    the readings of its measurements, and a reading must cost the measurement little."""
    found = {family}
    for entry in proc.iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rpartition(")")[2].split()[1]) == family:
                found.add(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    return frozenset(found)


def waited_share(start: Reading | None, end: Reading | None) -> float | None:
    """The share (0 to 1) of the time between two readings in which some thread of the process waited for a CPU
    (`combined`), no more than the other tasks' CPU time where both readings know it; None where it cannot be told."""
    if start is None or end is None or end.at_s <= start.at_s:
        return None
    if not (both := start.waited_ns.keys() & end.waited_ns.keys()):
        return None
    window_ns = (end.at_s - start.at_s) * 1e9
    share = combined([(end.waited_ns[tid] - start.waited_ns[tid]) / window_ns for tid in both])
    if share is None or start.others_ns is None or end.others_ns is None:
        return share
    return min(share, max(0.0, end.others_ns - start.others_ns) / window_ns)  # no more than the others ran


def combined(shares: Iterable[float | None]) -> float | None:
    """The share of a window in which some of several waiters (a process's threads, a collective's ranks) waited:
    1 - prod(1 - w) over their shares w, each capped to 0..1; None where none gives a share."""
    known = [min(1.0, max(0.0, w)) for w in shares if w is not None]
    return 1.0 - math.prod(1.0 - w for w in known) if known else None


def as_pct(share: float | None) -> float | None:
    """A waited share as the percentage a report keeps (`cpu_wait_pct`: noise.from_details reads it)."""
    return None if share is None else round(share * 100.0, 1)
