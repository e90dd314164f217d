"""How long a measurement waited for a CPU while it was timed. A busy neighbour slows a host-side measurement as a
degraded node would, in every sample; only this tells the two apart. The kernel keeps, per thread, the time it was
ready to run but waited for a CPU another task held (`/proc/<pid>/task/<tid>/schedstat`, its second field: the
scheduler's run delay). A parallel op waits for its slowest thread, so a wait of any one of the measuring process's
threads delays it all (two threads each waiting half the time slowed a 2-core host copy up to threefold, more than
either thread's own wait explains): the share of the timed window in which some thread waited, taken as 1 - prod(1 -
w) over the threads' shares w (their waits independent), is what counts. That share is what a neighbour -- another
job, the hypervisor's tasks -- could explain of the figure (rules/noise.py counts it in the figure's noise); a
neighbour that left the measurement its CPUs explains nothing and counts nothing.

Only another task is a neighbour: the measurement's own threads, and a gang's ranks (a CPU collective's two ranks on
two cores), wait for each other as they did when the baseline was measured, and that is the measurement, not noise
(a healthy gloo all_reduce's threads waited 60-78% of the window between them). So the share counts no more of the
window than the CPU time the other tasks used in it (the host's busy time in /proc/stat less our processes'): a
task can have held a CPU our thread waited for only while it ran.

Linux only (schedstat needs the kernel's CONFIG_SCHED_INFO, as every major distribution's has): None elsewhere,
or where it cannot be read. No torch, no pytest.
"""

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
    """The run delays now of the threads under `tasks` (this process's), or None where the kernel does not keep
    them; with the CPU time the host's other tasks have used: all but that process and, where `family` names a
    process, it and its children (a rank's launcher and its sibling ranks)."""
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
    """The share (0 to 1) of the time between two readings in which some thread of the process waited for a CPU:
    1 - prod(1 - w) over each thread's share w of the window (each capped at the whole of it), and no more than the
    CPU time the other tasks used in it, where both readings know it; None where either reading is missing, no
    thread is in both, or no time passed."""
    if start is None or end is None or end.at_s <= start.at_s:
        return None
    both = start.waited_ns.keys() & end.waited_ns.keys()
    if not both:
        return None
    window_ns = (end.at_s - start.at_s) * 1e9
    share = combined([(end.waited_ns[tid] - start.waited_ns[tid]) / window_ns for tid in both])
    if share is None or start.others_ns is None or end.others_ns is None:
        return share
    return min(share, max(0.0, end.others_ns - start.others_ns) / window_ns)  # no more than the others ran


def combined(shares: Iterable[float | None]) -> float | None:
    """The share of a window in which some of several waiters waited, each of its own share (capped to 0..1):
    1 - prod(1 - w) -- the threads of one process, or the ranks of one collective, which waits for its slowest.
    None where none gives a share."""
    known = [min(1.0, max(0.0, w)) for w in shares if w is not None]
    return 1.0 - math.prod(1.0 - w for w in known) if known else None


def as_pct(share: float | None) -> float | None:
    """A waited share as the percentage a report keeps (`cpu_wait_pct`: noise.from_details reads it)."""
    return None if share is None else round(share * 100.0, 1)
