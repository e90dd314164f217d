"""GPU Xid events from the kernel log, where the NVIDIA driver reports GPU faults:

    NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.

Public health checks grep the kernel log for the Xids that mean a broken GPU; so does this module, reading
/dev/kmsg (the kernel's ring buffer, what `dmesg` prints) since boot. No pytest here.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

KERNEL_LOG = Path("/dev/kmsg")
_XID = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)[^)]*\): (\d+),\s*(.*)")


@dataclass(frozen=True)
class XidEvent:
    pci: tuple[int, int, int]  # PCI (domain, bus, device) of the GPU, as the driver names it
    xid: int
    text: str  # the whole log line, for the failure message


def read_kernel_log(path: Path) -> list[str]:
    """The messages in the kernel log. /dev/kmsg returns one record per read and raises when none is left
    (it is opened non-blocking); a plain file (the tests' fake log) ends at EOF. Raises OSError when the log
    cannot be read (kernel.dmesg_restrict=1 without root)."""
    messages: list[str] = []
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


def _message(record: str) -> str:
    """A /dev/kmsg record is 'priority,sequence,microseconds,flags;message'; plain lines pass through."""
    header, sep, message = record.partition(";")
    return message if sep and re.fullmatch(r"\d+,\d+,\d+,[^;]*", header) else record


def xid_events(lines: Iterable[str]) -> list[XidEvent]:
    events = []
    for line in lines:
        match = _XID.search(line)
        if match:
            domain, bus, device, xid, _ = match.groups()
            events.append(XidEvent((int(domain, 16), int(bus, 16), int(device, 16)), int(xid), line.strip()))
    return events


def pci_of(bus_id: str) -> tuple[int, int, int]:
    """(domain, bus, device) of an NVML bus id such as '00000000:3B:00.0'."""
    domain, bus, device_function = bus_id.strip().split(":")
    return int(domain, 16), int(bus, 16), int(device_function.split(".")[0], 16)
