"""The node's window: where its kernel log and error counters stood when each check last found it clean, so a check
judges only what happened since, each event once. No pytest here. One small JSON file (`--gb-window`, default
DEFAULT_PATH) on /run, a tmpfs a reboot empties as it empties the kernel's ring buffer and the driver's volatile
counters; a mark also carries its boot's id, so one of an earlier boot is void wherever the file lives. Writers lock
the file and replace it atomically: several pytest-xdist workers write at once."""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

DEFAULT_PATH = Path("/run/gbvalidate/window.json")
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
UPTIME = Path("/proc/uptime")
WINDOW_VERSION = 1
# A rate is taken over this long at least: a re-run seconds after a clean check must not make one error a high rate.
MIN_RATE_SPAN_S = 60.0


@dataclass(frozen=True)
class Mark:
    value: int  # a counter's reading, or the kernel log's last sequence number judged
    time_s: float  # wall clock (time.time()) when it was taken


def boot_id() -> str | None:
    """The kernel's id of this boot; None where unsaid: then no mark is kept or read (it could close another's)."""
    try:
        found = BOOT_ID.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return found or None


def uptime_s() -> float | None:
    """Seconds since boot (the kernel log's clock and what the counters count since; a suspend counts, which a node
    does not do): the window of a check with no mark this boot. None where /proc/uptime cannot be read."""
    try:
        value = float(UPTIME.read_text(encoding="ascii").split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return value if value >= 0 else None


@dataclass(frozen=True)
class Window:
    """The marks of this boot in the file at `path`; None: no window is kept (every check judges since boot)."""

    path: Path | None

    def read(self, name: str) -> Mark | None:
        """The mark `name` of this boot, or None: not taken, no window, or an unreadable file (`write` says why)."""
        boot = boot_id()
        if self.path is None or boot is None:
            return None
        mark = _load(self.path).get(boot, {}).get(name)
        # A mark from the future (a clock stepped back, a file edited by hand) says nothing of since when.
        return None if mark is None or mark.time_s > time.time() + 60 else mark

    def write(self, marks: Mapping[str, int], now_s: float | None = None) -> str | None:
        """Set these marks (name -> value) at `now_s`, dropping another boot's; a problem as one line, else None."""
        if self.path is None:
            return None
        if (boot := boot_id()) is None:
            return f"the node's window {self.path} is not kept: the kernel gives no boot id ({BOOT_ID})"
        taken = time.time() if now_s is None else now_s
        try:
            with locked(self.path):
                kept = _load(self.path).get(boot, {})
                kept.update({name: Mark(int(value), taken) for name, value in marks.items()})
                saved = {n: {"value": m.value, "time_s": m.time_s} for n, m in sorted(kept.items())}
                replace_json(self.path, {"version": WINDOW_VERSION, "boot_id": boot, "marks": saved})
        except OSError as exc:
            return f"the node's window {self.path} cannot be written: {exc.strerror or exc}"
        return None


@dataclass(frozen=True)
class Rate:
    per_s: float
    counted: str  # how: '3 in 600 s since the last clean check'


def rate(window: Window, name: str, count: int, now_s: float, min_span_s: float = MIN_RATE_SPAN_S) -> Rate | None:
    """A counter's rate since its mark of this boot, else since boot, over `min_span_s` at least; one below its mark
    (a driver reload, a GPU reset) counts as nic.change counts it. None where neither mark nor uptime can be read."""
    if (mark := window.read(name)) is not None:
        cleared = count < mark.value
        delta, span_s = (count if cleared else count - mark.value), now_s - mark.time_s
        since = "since the counter was cleared" if cleared else "since the last clean check"
    else:
        if (up := uptime_s()) is None:
            return None
        delta, span_s, since = count, up, "since boot"
    return Rate(delta / max(span_s, min_span_s), f"{delta} in {span_s:.0f} s {since}")


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """The block under `path`'s lock (a file beside it; the directory made where missing), for its writers."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f".{path.name}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def replace_json(path: Path, data: object) -> None:
    """Replace `path` atomically with `data` as JSON: a scratch file beside it, renamed over it."""
    scratch = path.with_name(f".{path.name}.{os.getpid()}")
    scratch.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    os.replace(scratch, path)


def _load(path: Path) -> dict[str, dict[str, Mark]]:
    """boot id -> name -> Mark; none from a missing, unreadable or foreign file (a window from boot judges more)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or data.get("version") != WINDOW_VERSION:
            return {}
        marks = {
            str(name): Mark(int(m["value"]), float(m["time_s"]))
            for name, m in data["marks"].items()
            if isinstance(m, dict) and math.isfinite(float(m["time_s"])) and int(m["value"]) >= 0
        }
        return {str(data["boot_id"]): marks}
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ArithmeticError):  # 1e400, NaN: not a mark
        return {}
