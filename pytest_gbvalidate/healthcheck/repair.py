"""The node's way back into service: a repair said (`healthcheck repaired`), or a resume of a node we drained found
by the next check, closes the node's window (its Xid events and InfiniBand error counts so far), so the same old
event does not drain it again (fixed means fixed). No pytest."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Mapping
from pathlib import Path

from pytest_gbvalidate.healthcheck import drains
from pytest_gbvalidate.node import nic, topology, window, xid
from pytest_gbvalidate.setting_values import SettingError, parse_window
from pytest_gbvalidate.settings import env_name


def close_window(given: str | None, env: Mapping[str, str]) -> tuple[str, str | None]:
    """Close the node's window (`given`, else GBVALIDATE_WINDOW, else window.DEFAULT_PATH) at the kernel log's last
    record and the InfiniBand error counts now: what was done, or why it could not be."""
    given, where = (given, "--window") if given else (env.get(env_name("window")), env_name("window"))
    try:
        path = window.DEFAULT_PATH if not given else parse_window(given, Path.cwd())
    except SettingError as exc:
        return "", f"{where}: {given!a}: {exc}"
    if path is None:
        return "", f"{where}: none: no window is kept, nothing to close"
    try:
        last = xid.last_seq(xid.read_kernel_log(xid.KERNEL_LOG))
    except OSError as exc:
        return "", f"cannot read the kernel log {xid.KERNEL_LOG}: {exc.strerror or exc}"
    if last is None:
        return "", f"the kernel log {xid.KERNEL_LOG} has no numbered record to close at"
    counters = nic.counter_marks(topology.SYSFS_ROOT)
    if (problem := window.Window(path).write({xid.REPAIRED_MARK: last, **counters})) is not None:
        return "", problem
    ports = f", {len(counters)} InfiniBand error counters count from now" if counters else ""
    return f"gbvalidate: repair noted: Xid events up to kernel log record {last} are closed{ports} ({path})", None


def back_in_service(log: Path | None, env: Mapping[str, str]) -> str | None:
    """Close the window of a node we drained, found in service again, once, before its checks run (as `repaired`
    does by hand): what was done, or why not; None where there is nothing to do."""
    if log is None:
        return None
    try:
        if (last := drains.unseen_back(drains.read(log))) is None:
            return None
        done, problem = close_window(None, env)
        if problem is None:
            drains.seen_back(log, time.time())
    except drains.DrainLogError as exc:
        return str(exc)
    since = f"back in service since its drain of {_utc(last.time_s)}"
    return f"{since}: {done.removeprefix('gbvalidate: ')}" if problem is None else f"{since}: not closed: {problem}"


def _utc(time_s: float) -> str:
    return dt.datetime.fromtimestamp(time_s, dt.timezone.utc).isoformat(timespec="seconds")
