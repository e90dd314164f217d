"""Unit tests of the node's window (pytest_gbvalidate/node/window.py): marks of this boot, written atomically under a
lock from several processes, a bad file read as no marks, rates since a mark or since boot."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from pytest_gbvalidate.node import window
from pytest_gbvalidate.node.window import Mark, Window


@pytest.fixture
def boot(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    boot_id = tmp_path / "boot_id"
    boot_id.write_text("6c1f3a52-0000-4000-8000-000000000001\n")
    monkeypatch.setattr(window, "BOOT_ID", boot_id)
    uptime = tmp_path / "uptime"
    uptime.write_text("3600.00 7000.00\n")
    monkeypatch.setattr(window, "UPTIME", uptime)
    return boot_id


def test_a_mark_is_kept_for_this_boot_only(boot: Path, tmp_path: Path) -> None:
    kept = Window(tmp_path / "run" / "window.json")
    assert kept.read("xid/GPU-1") is None
    assert kept.write({"xid/GPU-1": 41, "pcie_replays/GPU-1": 3}, now_s=1000.0) is None
    assert kept.read("xid/GPU-1") == Mark(41, 1000.0)
    assert kept.write({"xid/GPU-1": 42}, now_s=1001.0) is None  # the others stay
    assert (kept.read("xid/GPU-1"), kept.read("pcie_replays/GPU-1")) == (Mark(42, 1001.0), Mark(3, 1000.0))
    boot.write_text("6c1f3a52-0000-4000-8000-000000000002\n")  # rebooted: every earlier mark is void
    assert kept.read("xid/GPU-1") is None
    assert kept.write({"xid/GPU-2": 7}, now_s=1002.0) is None
    assert json.loads((tmp_path / "run" / "window.json").read_text())["marks"] == {
        "xid/GPU-2": {"value": 7, "time_s": 1002.0}
    }
    assert Window(None).read("xid/GPU-1") is None and Window(None).write({"x": 1}) is None  # --gb-window=none


@pytest.mark.parametrize("text", ["", "{", "[]", '{"version": 9, "boot_id": "x", "marks": {}}', '{"version": 1}'])
def test_a_file_that_does_not_read_holds_no_marks_and_is_replaced(boot: Path, tmp_path: Path, text: str) -> None:
    path = tmp_path / "window.json"
    path.write_text(text)
    assert Window(path).read("xid/GPU-1") is None  # the window opens at boot: judges more, never less
    assert Window(path).write({"xid/GPU-1": 5}, now_s=1.0) is None
    assert Window(path).read("xid/GPU-1") == Mark(5, 1.0)


def test_a_window_that_cannot_be_written_says_so_in_one_line(boot: Path, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    problem = Window(tmp_path / "file" / "window.json").write({"x": 1})
    assert problem is not None and problem.startswith(f"the node's window {tmp_path}/file/window.json cannot be")
    assert "\n" not in problem


def _write_marks(path: str, worker: int) -> None:
    for i in range(20):
        assert Window(Path(path)).write({f"w{worker}/{i}": i}) is None


def test_writers_in_several_processes_lose_no_mark(boot: Path, tmp_path: Path) -> None:
    path = tmp_path / "window.json"
    context = multiprocessing.get_context("fork")  # the fixtures' patched boot id, as xdist's workers share one
    workers = [context.Process(target=_write_marks, args=(str(path), w)) for w in range(3)]
    for p in workers:
        p.start()
    for p in workers:
        p.join(30)
        assert p.exitcode == 0
    kept = Window(path)
    values = {f"w{w}/{i}": getattr(kept.read(f"w{w}/{i}"), "value", None) for w in range(3) for i in range(20)}
    assert values == {f"w{w}/{i}": i for w in range(3) for i in range(20)}


def test_a_rate_since_the_mark_else_since_boot(boot: Path, tmp_path: Path) -> None:
    kept = Window(tmp_path / "window.json")
    since_boot = window.rate(kept, "replays", 7200, now_s=5000.0, min_span_s=60)
    assert since_boot == window.Rate(2.0, "7200 in 3600 s since boot")
    kept.write({"replays": 7200}, now_s=4000.0)
    assert window.rate(kept, "replays", 7300, now_s=5000.0, min_span_s=60) == window.Rate(
        0.1, "100 in 1000 s since the last clean check"
    )
    assert window.rate(kept, "replays", 7300, now_s=4001.0, min_span_s=60).per_s == pytest.approx(100 / 60)  # type: ignore[union-attr]
    cleared = window.rate(kept, "replays", 10, now_s=5000.0, min_span_s=60)  # below the mark: a driver reload
    assert cleared == window.Rate(0.01, "10 in 1000 s since the counter was cleared")
    window.UPTIME.unlink()
    assert window.uptime_s() is None and window.rate(Window(None), "replays", 1, 5000.0, 60) is None


@pytest.mark.parametrize(
    "mark", ['{"value": 1e400, "time_s": 1.0}', '{"value": 3, "time_s": NaN}', '{"value": -1, "time_s": 1.0}']
)
def test_a_mark_that_is_no_count_at_a_time_is_no_mark(boot: Path, tmp_path: Path, mark: str) -> None:
    path = tmp_path / "window.json"
    boot_id = boot.read_text().strip()
    path.write_text(f'{{"version": 1, "boot_id": "{boot_id}", "marks": {{"x": {mark}}}}}')
    assert Window(path).read("x") is None  # judged since boot: more, never less
    assert Window(path).write({"y": 1}, now_s=5.0) is None and Window(path).read("y") == Mark(1, 5.0)


def test_a_mark_from_the_future_or_without_a_boot_id_is_not_trusted(boot: Path, tmp_path: Path) -> None:
    kept = Window(tmp_path / "window.json")
    assert kept.write({"xid/GPU-1": 9}, now_s=4e9) is None  # the year 2096: a clock stepped back since
    assert kept.read("xid/GPU-1") is None
    boot.write_text("")
    assert kept.read("xid/GPU-1") is None
    problem = kept.write({"xid/GPU-1": 10})
    assert problem is not None and "the kernel gives no boot id" in problem
