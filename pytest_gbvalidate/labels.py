"""Scope labels, written one way everywhere (test ids, baselines, reports): message sizes (`8B`, `1KiB`,
`128MiB`, `8GiB`), GPUs (`gpu3`), ordered GPU pairs (`gpu0->gpu1`) and NUMA nodes (`numa1`); a measured number as
people read it (`number`); texts as they may be shown. Pure Python."""

from __future__ import annotations

import math
import re
import socket

_UNITS = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))
_SIZE = re.compile(r"^\s*(\d+)\s*(B|KiB|MiB|GiB|TiB)\s*$")
_FACTORS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def size_label(size_bytes: int) -> str:
    """The exact size in the largest binary unit that divides it: 8B, 1536B, 1KiB, 128MiB, 8GiB."""
    if size_bytes < 0:
        raise ValueError(f"a size is not negative: {size_bytes}")
    for unit, factor in _UNITS:
        if size_bytes >= factor and size_bytes % factor == 0:
            return f"{size_bytes // factor}{unit}"
    return f"{size_bytes}B"


def bytes_label(size_bytes: int) -> str:
    """An amount of memory, rounded for a message: 1.5 GiB, 320.0 MiB, 12 B."""
    for unit, factor in _UNITS:
        if size_bytes >= factor:
            return f"{size_bytes / factor:.1f} {unit}"
    return f"{size_bytes} B"


def parse_size_label(label: str) -> int:
    """Bytes in a size label ('8GiB' -> 8589934592); ValueError for anything else."""
    match = _SIZE.match(label)
    if match is None:
        raise ValueError(f"{label!r} is not a size like 8B, 1KiB, 128MiB or 8GiB")
    return int(match.group(1)) * _FACTORS[match.group(2)]


def gpu_label(index: int, node: str | None = None) -> str:
    """`gpu3`, or `node1/gpu3` where results from several nodes sit side by side."""
    return f"gpu{index}" if node is None else f"{node}/gpu{index}"


def gpu_pair_label(src: int, dst: int, node: str | None = None) -> str:
    """An ordered pair, in the direction the data goes: `gpu0->gpu1`."""
    return f"{gpu_label(src, node)}->gpu{dst}"


def numa_label(node: int) -> str:
    """A NUMA node: `numa1`."""
    return f"numa{node}"


def number(x: float) -> str:
    """A measured figure as people read it, in the terminal, the fleet's summaries and messages alike: 4
    significant digits (`1234`, `0.01235`, `1.235e+05`), NaN and infinity as text (`nan`, `inf`, `-inf`)."""
    return f"{x:.4g}" if math.isfinite(x) else str(x)


def printable(text: str) -> str:
    """`text` as it may be shown to a person (a terminal, Markdown, a message): unchanged where it is printable
    ASCII, else with every other character escaped (`\\x1b`, `\\n`, `\\u0430` for a Cyrillic a that passes for a
    Latin one), so a name read from a file cannot move the cursor, break a line or pass for another name."""
    return text if text.isascii() and text.isprintable() else ascii(text)[1:-1]


def visible(text: str) -> str:
    """`text` with every character that does not print -- control characters, a terminal's escape sequences, line
    breaks, bidirectional overrides -- shown as its escape (`\\x01`), and every other one, letters of any script
    included, as it is: for a page, where HTML escaping leaves such characters raw."""
    return text if text.isprintable() else "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def printable_exactly(text: str) -> str:
    """`text` as printable() shows it, every backslash escaped too (`\\\\`): two texts are never shown alike, where
    printable() shows the name `né` and the name `n\\xe9` alike. For names that are counted as they are shown."""
    return printable(text) if "\\" not in text else ascii(text)[1:-1]


def text_safe(text: str) -> str:
    """`text` as any UTF-8 file can hold it: unchanged, except lone surrogates (bytes that were not UTF-8, as the OS
    hands over a hostname, a file name or an environment variable) become `\\xff` escapes of the bytes they stood
    for, or `\\ud800` where they stood for none."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def hostname() -> str:
    """This node's hostname, as every file the run writes can hold it (text_safe: the kernel allows any bytes)."""
    return text_safe(socket.gethostname())
