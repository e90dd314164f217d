"""A busy neighbour, told apart from a degraded node: the share of the CPUs other processes took while a figure was
measured (node/neighbours.py, on a fake /proc and on this machine's), and what a figure's noise counts for it."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_gbvalidate import noise
from pytest_gbvalidate import resolution as rs
from pytest_gbvalidate.node import neighbours


def fake_proc(root: Path, busy: int, idle: int, processes: dict[int, tuple[int, int, int]]) -> Path:
    """A /proc with two CPUs whose total is `busy` user ticks and `idle` idle ticks, and processes pid ->
    (session, utime, stime)."""
    root.mkdir(exist_ok=True)
    (root / "stat").write_text(f"cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\ncpu0 1 0 0 1\ncpu1 1 0 0 1\nintr 0\n")
    for pid, (session, utime, stime) in processes.items():
        (root / str(pid)).mkdir(exist_ok=True)
        # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime ...
        fields = f"S 1 {session} {session} 0 -1 0 0 0 0 0 {utime} {stime} 0 0 20 0 1 0"
        (root / str(pid) / "stat").write_text(f"{pid} (a (tricky) name) {fields}\n")
    (root / "self").mkdir(exist_ok=True)  # not a pid: skipped
    return root


def test_the_share_is_what_processes_outside_the_session_took(tmp_path: Path) -> None:
    ours = os.getsid(0)
    start = neighbours.read(fake_proc(tmp_path / "p", 1000, 1000, {10: (ours, 100, 0), 11: (ours + 1, 500, 0)}))
    assert start is not None and (start.busy_ticks, start.ours_ticks, start.cpus) == (1000, 100, 2)
    later = neighbours.Reading(1000 + 150, 100 + 50, start.at_s + 1.0, 2)  # 150 ticks busy, 50 of them ours
    hz = os.sysconf("SC_CLK_TCK")
    assert neighbours.others_share(start, later) == pytest.approx(min(1.0, 100 / (2 * hz)))
    assert neighbours.others_share(start, None) is None
    assert neighbours.others_share(start, start) is None  # no time passed
    assert neighbours.read(tmp_path / "absent") is None


def test_on_this_machine_a_process_of_another_session_is_no_part_of_ours() -> None:
    spin = "import time\nend = time.time() + 3\nwhile time.time() < end: pass\n"
    child = subprocess.Popen([sys.executable, "-c", spin], start_new_session=True)
    try:
        time.sleep(0.5)  # some CPU time, however busy the machine
        theirs = neighbours._session_ticks(Path("/proc"), child.pid)  # its own session: itself
        assert os.getsid(child.pid) != os.getsid(0) and theirs > 0
        reading = neighbours.read()
        assert reading is not None and reading.busy_ticks > 0 and reading.cpus >= 1
    finally:
        child.kill()
        child.wait()


def test_a_figure_s_noise_counts_what_its_neighbours_could_explain() -> None:
    details = {"samples_gbps": [9.9, 10.0, 10.1], "others_cpu_pct": 50.0}
    found = noise.from_details(details)
    assert found is not None and found.others_cpu_pct == 50.0
    alone = noise.from_details({"samples_gbps": [9.9, 10.0, 10.1]})
    assert alone is not None and alone.others_cpu_pct is None
    assert found.spread_pct == pytest.approx(math.hypot(alone.spread_pct, 100 * math.log(2) / noise.NOISE_K))
    # its resolution grows by what a neighbour holding half the CPUs could explain: a halving, 69%
    resolution = rs.of_spreads(samples=found.spread_pct)
    assert resolution is not None and resolution.pct > 100 * math.log(2)
    assert noise.from_record(found.as_record()) == noise.Noise("median", 3, round(found.spread_pct, 3), (), 50.0)
    assert "other processes took 50% of the CPUs" in found.describe()
    # nothing taken, nothing counted; a share that is no percentage is ignored; a whole machine taken is bounded
    assert noise.from_details({**details, "others_cpu_pct": 0.0}) == noise.Noise("median", 3, alone.spread_pct, (), 0.0)
    assert noise.from_details({**details, "others_cpu_pct": 250.0}) == alone
    assert math.isfinite(noise.neighbours_pct(100.0))
