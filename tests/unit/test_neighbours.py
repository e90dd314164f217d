"""A busy neighbour, told apart from a degraded node: the share of its timed window a measurement waited for a CPU
(node/neighbours.py, on a fake /proc and on this machine's), and what a figure's noise counts for it."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_gbvalidate.node import neighbours
from pytest_gbvalidate.rules import noise
from pytest_gbvalidate.rules import resolution as rs


def tasks(root: Path, waited_ns: dict[int, int]) -> Path:
    """A /proc/self/task whose threads (by id) waited this long for a CPU."""
    for tid, waited in waited_ns.items():
        (root / str(tid)).mkdir(parents=True, exist_ok=True)
        (root / str(tid) / "schedstat").write_text(f"123456 {waited} 7\n")
    return root


def test_the_share_is_the_window_in_which_some_thread_waited(tmp_path: Path) -> None:
    start = neighbours.read(tasks(tmp_path / "t", {1: 0, 2: 1_000_000}))
    assert start is not None and start.waited_ns == {1: 0, 2: 1_000_000}
    later = neighbours.Reading({1: 100_000_000, 2: 301_000_000, 3: 5}, start.at_s + 1.0)  # thread 3 started since
    assert neighbours.waited_share(start, later) == pytest.approx(1 - 0.9 * 0.7)  # thread 3: in one reading only
    most = neighbours.Reading({1: 900_000_000, 2: 1_901_000_000}, start.at_s + 1.0)
    assert neighbours.waited_share(start, most) == 1.0  # a thread that waited the whole window
    assert neighbours.waited_share(start, None) is None
    assert neighbours.waited_share(start, start) is None  # no time passed
    assert neighbours.waited_share(start, neighbours.Reading({9: 0}, start.at_s + 1)) is None  # no thread in both
    assert neighbours.read(tmp_path / "absent") is None
    (tmp_path / "t" / "2" / "schedstat").write_text("garbage\n")
    again = neighbours.read(tmp_path / "t")  # a thread whose line cannot be read is left out
    assert again is not None and again.waited_ns == {1: 0}


def test_on_this_machine_a_thread_that_ran_alone_waited_less_than_its_window() -> None:
    if neighbours.read() is None:
        pytest.skip("this kernel keeps no scheduler run delays (/proc/self/task/*/schedstat)")
    start = neighbours.read()
    end_at = time.monotonic() + 0.3
    while time.monotonic() < end_at:  # busy: runnable the whole window, waiting only where another task ran
        pass
    share = neighbours.waited_share(start, neighbours.read())
    assert share is not None and 0.0 <= share < 1.0


def test_a_neighbour_holding_the_cpus_makes_a_measurement_wait() -> None:
    """Spinners of another process on every core: a busy thread of ours waits for its turn."""
    if neighbours.read() is None:
        pytest.skip("this kernel keeps no scheduler run delays (/proc/self/task/*/schedstat)")
    spin = "import time\nend = time.time() + 2\nwhile time.time() < end: pass\n"
    spinners = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2 * (os.cpu_count() or 1))]
    try:
        time.sleep(0.2)
        start = neighbours.read()
        end_at = time.monotonic() + 0.5
        while time.monotonic() < end_at:
            pass
        share = neighbours.waited_share(start, neighbours.read())
    finally:
        for s in spinners:
            s.kill()
            s.wait()
    assert share is not None and share > 0.2  # twice as many spinners as cores: we run a third of the time at most


def test_a_figure_s_waits_explain_a_fall_and_widen_nothing() -> None:
    """Waits for a CPU can only have made a figure worse than the node is: they explain a fall (one-sided), they
    do not widen its spread -- a figure above its floor passes however long it waited -- and a reference recorded
    from it is unsure by that much."""
    details = {"samples_gbps": [9.9, 10.0, 10.1], "cpu_wait_pct": 50.0}
    found = noise.from_details(details)
    alone = noise.from_details({"samples_gbps": [9.9, 10.0, 10.1]})
    assert found is not None and alone is not None and alone.cpu_wait_pct is None
    assert found.cpu_wait_pct == 50.0 and found.spread_pct == alone.spread_pct
    assert noise.explained_pct(found) == pytest.approx(100 * math.log(2))  # waiting half the time: a halving
    assert noise.explained_pct(alone) == 0.0
    assert found.error_with_waits_pct() == pytest.approx(math.hypot(alone.error_of(), 100 * math.log(2) / 2))
    error = round(noise.median_error_pct(found.spread_pct, 3), 3)
    assert noise.from_record(found.as_record()) == noise.Noise("median", 3, round(found.spread_pct, 3), (), 50.0, error)
    assert "50% of its time waiting for a CPU" in found.describe()
    # a share that is no percentage is ignored; a whole window of waiting is bounded
    assert noise.from_details({**details, "cpu_wait_pct": 250.0}) == alone
    assert math.isfinite(noise.neighbours_pct(100.0))
    resolution = rs.of_spreads(samples=found.spread_pct, explained_pct=noise.explained_pct(found))
    assert resolution is not None and resolution.pct == pytest.approx(2 * alone.spread_pct)


def test_several_waiters_combine_into_the_share_in_which_some_of_them_waited() -> None:
    """A collective waits for its slowest rank, as a parallel op for its slowest thread: two ranks each waiting half
    the time left it waiting three quarters of it, if their waits were independent."""
    assert neighbours.combined([0.5, 0.5]) == 0.75
    assert neighbours.combined([0.2, None]) == pytest.approx(0.2)
    assert neighbours.combined([None, None]) is None and neighbours.combined([]) is None
    assert neighbours.combined([1.5, -0.5]) == 1.0  # each capped to 0..1


def fake_proc(root: Path, busy_ticks: int, processes: dict[int, tuple[int, int]]) -> Path:
    """A /proc whose host has been busy `busy_ticks` (user), each process (pid -> (ppid, its utime ticks))."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "stat").write_text(f"cpu  {busy_ticks} 0 0 999999 0 0 0 0 0 0\ncpu0 1 2 3 4\n")
    for pid, (ppid, utime) in processes.items():
        (root / str(pid)).mkdir(exist_ok=True)
        fields = ["S", str(ppid)] + ["0"] * 9 + [str(utime), "0"] + ["0"] * 20
        (root / str(pid) / "stat").write_text(f"{pid} (a name) with) {' '.join(fields)}\n")
    return root


def test_only_another_task_is_a_neighbour(tmp_path: Path) -> None:
    """Threads that waited for each other -- the measurement's own, or a gang's ranks' -- are no neighbour: the share
    counts no more of the window than the CPU time the host's other tasks used in it."""
    me, launcher, sibling, stranger = os.getpid(), 1000, 1001, 1002
    tick_ns = neighbours._TICK_NS
    window_ticks = int(1e9 / tick_ns)  # a window of one second
    task_dir = tasks(tmp_path / "self" / "task", {1: 0})
    proc = tmp_path / "proc"

    def reading(
        busy: int, mine: int, theirs: int, at_s: float, waited_ns: int, family: int | None
    ) -> neighbours.Reading:
        processes = {me: (launcher, mine), launcher: (1, 0), sibling: (launcher, theirs), stranger: (1, 0)}
        tasks(task_dir, {1: waited_ns})
        found = neighbours.read(task_dir, family=family, proc=fake_proc(proc, busy, processes))
        assert found is not None
        return neighbours.Reading(found.waited_ns, at_s, found.others_ns)

    # Our thread waited 70% of the window while only we and a sibling rank ran (the host's busy time is ours).
    start = reading(0, 0, 0, 0.0, 0, launcher)
    end = reading(2 * window_ticks, window_ticks, window_ticks, 1.0, 700_000_000, launcher)
    assert neighbours.waited_share(start, end) == pytest.approx(0.0, abs=1e-9)
    # The same sibling read without its family: another task, which ran the whole window, explains it all.
    start = reading(0, 0, 0, 0.0, 0, None)
    end = reading(2 * window_ticks, window_ticks, window_ticks, 1.0, 700_000_000, None)
    assert neighbours.waited_share(start, end) == pytest.approx(0.7)
    # A stranger that ran a fifth of the window explains no more than that of the wait.
    start = reading(0, 0, 0, 0.0, 0, launcher)
    end = reading(2 * window_ticks + window_ticks // 5, window_ticks, window_ticks, 1.0, 700_000_000, launcher)
    assert neighbours.waited_share(start, end) == pytest.approx(0.2)
    # Where /proc/stat cannot be read the waits count whole, as before.
    (proc / "stat").unlink()
    unread = neighbours.read(task_dir, family=launcher, proc=proc)
    assert unread is not None and unread.others_ns is None
