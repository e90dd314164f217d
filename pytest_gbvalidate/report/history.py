"""A node's own history of run reports (`--gb-history DIR`): every run's JSON report kept as
`DIR/<hostname>/<UTC start time>.json`, e.g. `DIR/node7/20261124T101500Z.json`. No pytest here.

The layout follows pytest-benchmark's autosave (`.benchmarks/<machine id>/<counter>_<commit>_<UTC date>_<UTC
time>.json`, the latest compared with), except: the machine is the node's hostname (pytest-benchmark's
`Linux-CPython-3.11-64bit` is the same on every node of a fleet), checked to be one safe path component; and no
counter, which two runs saving at once both take: the name is the run's start time, ISO 8601 basic format (sortable
as text), a second run within the same second taking `_2`, `_3`, ..., claimed atomically (files.atomic_create_bytes)
so that no run replaces another's file. Files of the directory not named so (a note, a temporary file) are not the
history's.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from dataclasses import dataclass
from pathlib import Path

from pytest_gbvalidate.files import OutputError, atomic_create_bytes, atomic_write_bytes
from pytest_gbvalidate.labels import printable
from pytest_gbvalidate.report.records import RunReportRecord
from pytest_gbvalidate.report.writer import as_json

MAX_HOSTNAME = 253  # RFC 1035's longest name; a file name may be 255 bytes
_HOSTNAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_STAMP_FORMAT = "%Y%m%dT%H%M%SZ"
_NAME = re.compile(r"(?P<stamp>\d{8}T\d{6}Z)(?:_(?P<seq>[1-9]\d{0,5}))?\.json")
# More runs of one node starting within one second than this is no real history: something loops.
MAX_SAME_SECOND = 1000
# Clocks of a fleet's nodes differ a little (NTP keeps them within milliseconds). A report dated later than now by
# more than this cannot count: the latest is the one compared with, and one dated 2099 would stand for every later run.
CLOCK_SKEW = dt.timedelta(minutes=5)


class HistoryError(Exception):
    """The history cannot be used: an unsafe hostname, a directory that is not one. One line."""


@dataclass(frozen=True, order=True)
class Entry:
    """One run's report in a node's history, ordered by when the run started."""

    start: dt.datetime
    seq: int  # 1 for the first run starting in that second, then 2, 3, ...
    path: Path


def node_directory(root: Path, hostname: str) -> Path:
    """`root/<hostname>`: where this node's reports are kept. HistoryError where the hostname is not a safe name for
    one directory, or that path is something other than a directory."""
    if not (len(hostname) <= MAX_HOSTNAME and hostname.isascii() and _HOSTNAME.fullmatch(hostname)):
        raise HistoryError(
            f"this node's hostname '{printable(hostname)}' cannot name its history directory: a hostname there is "
            f"letters, digits, '.', '_' and '-', not starting with '.' or '-', at most {MAX_HOSTNAME} characters"
        )
    directory = root / hostname
    # Checked as a named path is, before the run rather than after it (then a report would be lost at the end).
    if directory.is_symlink() and not directory.exists():
        raise HistoryError(f"{directory} is a symbolic link to {os.readlink(directory)}, which does not exist")
    if directory.exists() and not directory.is_dir():
        raise HistoryError(f"{directory} is not a directory")
    if directory.is_dir() and not os.access(directory, os.W_OK | os.X_OK):  # found now, not after the run
        raise HistoryError(f"cannot create files in {directory} (no write permission)")
    if not directory.exists() and root.is_dir() and not os.access(root, os.W_OK | os.X_OK):
        raise HistoryError(f"cannot create {directory} (no write permission in {root})")
    return directory


def file_name(start: dt.datetime, seq: int = 1) -> str:
    stamp = start.astimezone(dt.timezone.utc).strftime(_STAMP_FORMAT)
    return f"{stamp}.json" if seq == 1 else f"{stamp}_{seq}.json"


def entry(path: Path) -> Entry | None:
    """The history entry `path` names, or None where its name is not one."""
    match = _NAME.fullmatch(path.name)
    if match is None:
        return None
    try:
        start = dt.datetime.strptime(match["stamp"], _STAMP_FORMAT).replace(tzinfo=dt.timezone.utc)
    except ValueError:  # 20261345T...: digits, but no date
        return None
    return Entry(start, int(match["seq"] or 1), path)


def entries(directory: Path) -> list[Entry]:
    """The reports of a node's history directory, oldest first (none where the directory does not exist yet)."""
    try:
        names = list(directory.iterdir())
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise HistoryError(f"{directory}: cannot list it: {exc.strerror or exc}") from None
    return sorted(e for e in map(entry, names) if e is not None)


def in_future(start: dt.datetime, now: dt.datetime | None = None) -> bool:
    """Whether a run dated `start` lies beyond `now` (default: the clock) by more than CLOCK_SKEW."""
    return start > (now or dt.datetime.now(dt.timezone.utc)) + CLOCK_SKEW


def start_time(report: RunReportRecord) -> dt.datetime:
    """The run's start time as the report says it (the writer's utc_now(): ISO 8601 with its offset)."""
    start = dt.datetime.fromisoformat(report["start_time"])
    return start if start.tzinfo is not None else start.replace(tzinfo=dt.timezone.utc)


def replace(path: Path, report: RunReportRecord) -> Path:
    """Write `report` over the one this run kept at `path` as it started; the path. Raises OutputError naming it."""
    atomic_write_bytes(path, as_json(report).encode("utf-8"))
    return path


def keep(directory: Path, report: RunReportRecord) -> Path:
    """Write `report` into `directory` as a new file named by its start time; the path. Raises OutputError."""
    data = as_json(report).encode("utf-8")
    start = start_time(report)
    for seq in range(1, MAX_SAME_SECOND + 1):
        path = directory / file_name(start, seq)
        try:
            atomic_create_bytes(path, data)
        except FileExistsError:
            continue
        return path
    raise OutputError(f"cannot write into {directory}: {MAX_SAME_SECOND} reports there already start at {start}")
