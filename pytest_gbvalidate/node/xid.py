"""GPU Xid events (`NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.`) from
/dev/kmsg, the kernel's ring buffer, each with its record's sequence number and time, so a check can judge the events
since its last clean run (node/window.py) by NVIDIA's Xid catalog (rules/xids.py). No pytest here."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pytest_gbvalidate.rules.xids import XidEvent

KERNEL_LOG = Path("/dev/kmsg")
REPAIRED_MARK = "xid/repaired"  # in the node's window: the last record before a repair was said (clean_mark: per GPU)


def clean_mark(gpu_uuid: str) -> str:
    return f"xid/{gpu_uuid}"


_XID = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)[^)]*\): (\d+),\s*(.*)")


@dataclass(frozen=True)
class KernelRecord:
    message: str
    seq: int | None = None  # /dev/kmsg's sequence number; None for a plain text line
    time_s: float | None = None  # seconds after boot (the kernel's clock, as dmesg shows it)


def read_kernel_log(path: Path) -> list[KernelRecord]:
    """The records of the kernel log: /dev/kmsg (non-blocking) gives one per read and raises when none is left, a
    plain file (the tests') ends at EOF. Raises OSError where it cannot be read (kernel.dmesg_restrict=1, not root)."""
    messages: list[KernelRecord] = []
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        pending = b""
        while True:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                break
            except BrokenPipeError:  # the ring buffer overwrote a record while we read: skip it
                continue
            if not chunk:
                break
            pending += chunk
            *records, pending = pending.split(b"\n")
            messages.extend(_message(r.decode("utf-8", "replace")) for r in records if r and not r.startswith(b" "))
        if pending.strip():
            messages.append(_message(pending.decode("utf-8", "replace")))
    finally:
        os.close(fd)
    return messages


def _message(record: str) -> KernelRecord:
    """A /dev/kmsg record is 'priority,sequence,microseconds,flags;message'; plain lines pass through."""
    header, sep, message = record.partition(";")
    fields = re.fullmatch(r"\d+,(\d+),(\d+),[^;]*", header) if sep else None
    if fields is None:
        return KernelRecord(record)
    return KernelRecord(message, int(fields[1]), int(fields[2]) / 1e6)


def xid_events(records: Iterable[KernelRecord | str]) -> list[XidEvent]:
    events = []
    for record in records:
        r = KernelRecord(record) if isinstance(record, str) else record
        if "Xid" not in r.message:  # most lines: skip the expression
            continue
        if match := _XID.search(r.message):
            domain, bus, device, xid, _ = match.groups()
            pci = (int(domain, 16), int(bus, 16), int(device, 16))
            events.append(XidEvent(pci, int(xid), r.message.strip(), r.seq, r.time_s))
    return events


def last_seq(records: Iterable[KernelRecord]) -> int | None:
    """The sequence number of the log's last record; None where the records carry none."""
    return max((r.seq for r in records if r.seq is not None), default=None)


def pci_of(bus_id: str) -> tuple[int, int, int]:
    """(domain, bus, device) of an NVML bus id such as '00000000:3B:00.0'."""
    domain, bus, device_function = bus_id.strip().split(":")
    return int(domain, 16), int(bus, 16), int(device_function.split(".")[0], 16)
