"""How long a measurement waited for a CPU while it was timed. A busy neighbour slows a host-side measurement as a
degraded node would, in every sample; only this tells the two apart. The kernel keeps, per thread, the time it was
ready to run but waited for a CPU another task held (`/proc/<pid>/task/<tid>/schedstat`, its second field: the
scheduler's run delay). The share of the timed window the most-delayed thread of the measuring process spent so is
the share of the figure a neighbour -- another job, another rank, the hypervisor -- could explain (noise.py counts
it in the figure's noise); a neighbour that left the measurement its CPUs explains nothing and counts nothing.

Linux only (schedstat needs the kernel's CONFIG_SCHED_INFO, as every major distribution's has): None elsewhere,
or where it cannot be read. No torch, no pytest.
"""

from __future__ import annotations

import time
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
    """The share (0 to 1) of the time between two readings that the process's most-delayed thread spent waiting
    for a CPU; None where either reading is missing, no thread is in both, or no time passed."""
    if start is None or end is None or end.at_s <= start.at_s:
        return None
    both = start.waited_ns.keys() & end.waited_ns.keys()
    if not both:
        return None
    most = max(end.waited_ns[tid] - start.waited_ns[tid] for tid in both)
    return min(1.0, max(0.0, most / 1e9 / (end.at_s - start.at_s)))
