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
