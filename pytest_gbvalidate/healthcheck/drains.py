"""The node's own drains, kept on the node (`--drain-log`: one JSON file, replaced atomically under its lock, not on
/run: a reboot, the commonest repair, must not clear it): when the health check drained it and why. A node drained
more than REPEAT_AFTER times within REPEAT_DAYS (fleet/drain.py's rule, after NVSentinel's) drains as a repeat
offender, `gbvalidate: [repeat] ...`, which no check of ours resumes: field data have a few nodes causing most
exclusions, each coming back after every automatic resume. No pytest."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pytest_gbvalidate.files import atomic_write_text
from pytest_gbvalidate.fleet import drain
from pytest_gbvalidate.fleet.drain import REPEAT_AFTER as REPEAT_AFTER  # where the health check takes them
from pytest_gbvalidate.fleet.drain import REPEAT_DAYS as REPEAT_DAYS
from pytest_gbvalidate.healthcheck import slurm
from pytest_gbvalidate.node.window import locked, replace_json

DEFAULT_PATH = Path("/var/lib/gbvalidate/drains.json")
LOG_VERSION = 1
DAY_S = 86400.0
REPEAT_WINDOW_S = REPEAT_DAYS * DAY_S
# How long a drain is kept: the span of NVSentinel's time-between-incidents histogram (15 minutes to 30 days).
KEEP_S = 30 * DAY_S


class DrainLogError(Exception):
    """The drain log cannot be read or written: the message names the file and what is wrong."""


@dataclass(frozen=True)
class Drain:
    time_s: float  # wall clock (time.time())
    reason: str
    back_s: float | None = None  # when a check found the node back in service after it (its evidence then closed)


def read(path: Path) -> list[Drain]:
    """The drains the log at `path` keeps, oldest first; none where there is no file yet. Raises DrainLogError."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as exc:
        raise DrainLogError(f"the drain log {path} cannot be read: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        data = json.loads(text)
    except ValueError:
        raise DrainLogError(f"the drain log {path} is not JSON") from None
    if not isinstance(data, dict) or data.get("version") != LOG_VERSION or not isinstance(data.get("drains"), list):
        raise DrainLogError(f"the drain log {path}: `version` {LOG_VERSION} and a list `drains` expected")
    found = []
    for n, entry in enumerate(data["drains"]):
        time_s = entry.get("time_s") if isinstance(entry, dict) else None
        reason = entry.get("reason") if isinstance(entry, dict) else None
        if isinstance(time_s, bool) or not isinstance(time_s, (int, float)) or not math.isfinite(time_s):
            raise DrainLogError(f"the drain log {path}: drains[{n}].time_s is not a time")
        if not isinstance(reason, str):
            raise DrainLogError(f"the drain log {path}: drains[{n}].reason is not text")
        back_s = entry.get("back_s")
        if back_s is not None and (isinstance(back_s, bool) or not isinstance(back_s, (int, float))):
            raise DrainLogError(f"the drain log {path}: drains[{n}].back_s is not a time")
        found.append(Drain(float(time_s), reason, None if back_s is None else float(back_s)))
    return sorted(found, key=lambda d: d.time_s)


def recent(drains: Sequence[Drain], now_s: float, window_s: float = REPEAT_WINDOW_S) -> list[Drain]:
    """The drains within `window_s` before `now_s` (one from the future, a clock stepped back, counts)."""
    return [d for d in drains if now_s - d.time_s <= window_s]


def repeats(drains: Sequence[Drain], now_s: float) -> bool:
    """Whether a drain now makes the node a repeat offender (fleet/drain.py's rule)."""
    return drain.repeats([d.time_s for d in drains], now_s) is not None


def record(path: Path, new: Drain) -> list[Drain]:
    """Add `new` to the log at `path` (made where missing), dropping what is older than KEEP_S; the drains it keeps.
    Raises DrainLogError where it cannot (an unreadable log is not replaced: it is someone's to look at)."""
    return _change(path, lambda kept: [*recent(kept, new.time_s, KEEP_S), new])


def unseen_back(drains: Sequence[Drain]) -> Drain | None:
    """The last drain, where no check has found the node back in service since."""
    return drains[-1] if drains and drains[-1].back_s is None else None


def seen_back(path: Path, now_s: float) -> list[Drain]:
    """Say in the log at `path` that the node was found back in service now, after its last drain."""
    return _change(path, lambda kept: [*kept[:-1], dataclasses.replace(kept[-1], back_s=now_s)] if kept else kept)


def _change(path: Path, change: Callable[[list[Drain]], list[Drain]]) -> list[Drain]:
    try:
        with locked(path):
            kept = change(read(path))
            entries = [{"time_s": d.time_s, "reason": d.reason, "back_s": d.back_s} for d in kept]
            replace_json(path, {"version": LOG_VERSION, "drains": entries})
    except OSError as exc:
        raise DrainLogError(f"the drain log {path} cannot be written: {exc.strerror or exc}") from None
    return kept


# The windows the Prometheus file counts drains over: the repeat window, and all that is kept.
METRIC_WINDOWS = (("7d", REPEAT_WINDOW_S), ("30d", KEEP_S))


def exposition(drains: Sequence[Drain], now_s: float, hostname: str) -> str:
    """The node's drains as Prometheus text: counts within METRIC_WINDOWS, and the last one's Unix time, if any."""
    node = json.dumps(hostname, ensure_ascii=False)  # a label value: its quotes and backslashes escaped
    lines = [
        "# HELP gbvalidate_node_drains The health check's drains of this node within the window (its drain log).",
        "# TYPE gbvalidate_node_drains gauge",
        *(
            f'gbvalidate_node_drains{{hostname={node},window="{name}"}} {len(recent(drains, now_s, span_s))}'
            for name, span_s in METRIC_WINDOWS
        ),
    ]
    if drains:
        lines += [
            "# HELP gbvalidate_node_last_drain_timestamp_seconds When the health check last drained this node.",
            "# TYPE gbvalidate_node_last_drain_timestamp_seconds gauge",
            f"gbvalidate_node_last_drain_timestamp_seconds{{hostname={node}}} {max(d.time_s for d in drains):.3f}",
        ]
    return "\n".join(lines) + "\n"


def write_metrics(log: Path | None, metrics: Path | None, node: str | None) -> str | None:
    """Write the log's exposition to `metrics`, where given (after each check: drains age out); why not, or None."""
    if log is None or metrics is None or node is None:
        return None
    try:
        atomic_write_text(metrics, exposition(read(log), time.time(), node))
    except DrainLogError as exc:
        return f"{exc}: no drain metrics written"
    except OSError as exc:
        return f"--drain-metrics {metrics}: cannot be written: {exc.strerror or exc}"
    return None


def counted(scontrol: slurm.Scontrol, node: str, reason: str, log: Path | None) -> str:
    """Drain `node` for `reason` (a repeat offender's where the log says so), logged where kept; what happened."""
    if log is None:
        return scontrol.drain(node, reason)
    now_s = time.time()
    try:
        kept = read(log)
    except DrainLogError as exc:  # someone's file, or a broken one: not replaced, and the drain stands
        return f"{scontrol.drain(node, reason)}; {exc}: this drain not counted"
    repeat = repeats(kept, now_s)
    done = scontrol.drain(node, drain.as_repeat(reason) if repeat else reason)
    if not done.startswith("drained"):  # not drained (or shadow mode): nothing to count
        return done
    if repeat:
        count = len(recent(kept, now_s)) + 1
        done += f" as a repeat offender ({count} drains in {REPEAT_DAYS:g} days: a person resumes it)"
    try:
        record(log, Drain(now_s, drain.as_repeat(reason) if repeat else reason))
    except DrainLogError as exc:
        done += f"; {exc}"
    return done
