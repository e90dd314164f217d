"""How long a measurement waited for a CPU while it was timed. A busy neighbour slows a host-side measurement as a
degraded node would, in every sample; only this tells the two apart. The kernel keeps, per thread, the time it was
ready to run but waited for a CPU another task held (`/proc/<pid>/task/<tid>/schedstat`, its second field: the
scheduler's run delay). A parallel op waits for its slowest thread, so a wait of any one of the measuring process's
threads delays it all (two threads each waiting half the time slowed a 2-core host copy up to threefold, more than
either thread's own wait explains): the share of the timed window in which some thread waited, taken as 1 - prod(1 -
w) over the threads' shares w (their waits independent), is what counts. That share is what a neighbour -- another
job, another rank, the hypervisor -- could explain of the figure (rules/noise.py counts it in the figure's noise); a
neighbour that left the measurement its CPUs explains nothing and counts nothing.

Linux only (schedstat needs the kernel's CONFIG_SCHED_INFO, as every major distribution's has): None elsewhere,
or where it cannot be read. No torch, no pytest.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

TASKS = Path("/proc/self/task")


@dataclass(frozen=True)
class Reading:
    """Each thread's time waiting for a CPU (nanoseconds, by thread id) at a moment (monotonic seconds)."""

    waited_ns: dict[int, int]
    at_s: float


def read(tasks: Path = TASKS) -> Reading | None:
    """This process's threads' run delays now, or None where the kernel does not keep them."""
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
    return Reading(waited, time.monotonic()) if waited else None


def waited_share(start: Reading | None, end: Reading | None) -> float | None:
    """The share (0 to 1) of the time between two readings in which some thread of the process waited for a CPU:
    1 - prod(1 - w) over each thread's share w of the window (each capped at the whole of it); None where either
    reading is missing, no thread is in both, or no time passed."""
    if start is None or end is None or end.at_s <= start.at_s:
        return None
    both = start.waited_ns.keys() & end.waited_ns.keys()
    if not both:
        return None
    window_ns = (end.at_s - start.at_s) * 1e9
    return combined([(end.waited_ns[tid] - start.waited_ns[tid]) / window_ns for tid in both])


def combined(shares: Iterable[float | None]) -> float | None:
    """The share of a window in which some of several waiters waited, each of its own share (capped to 0..1):
    1 - prod(1 - w) -- the threads of one process, or the ranks of one collective, which waits for its slowest.
    None where none gives a share."""
    known = [min(1.0, max(0.0, w)) for w in shares if w is not None]
    return 1.0 - math.prod(1.0 - w for w in known) if known else None


def as_pct(share: float | None) -> float | None:
    """A waited share as the percentage a report keeps (`cpu_wait_pct`: noise.from_details reads it)."""
    return None if share is None else round(share * 100.0, 1)
