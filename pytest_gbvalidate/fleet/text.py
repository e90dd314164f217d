"""Text for one line of a table, a terminal or a Slurm drain reason (fleet/drain.py): whitespace folded, cut to a
length, parts joined within a limit."""

from __future__ import annotations

import re
from collections.abc import Sequence


def one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def shorten(text: str, limit: int) -> str:
    text = one_line(text)
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def join_within(prefix: str, parts: Sequence[str], limit: int) -> str:
    """`prefix` and as many of `parts` as fit in `limit` characters, joined by "; ", then "+N more" for the rest
    (the first part cut short where even it does not fit)."""
    parts = [one_line(p) for p in parts]
    kept: list[str] = []
    for i, part in enumerate(parts):
        dropped_after = len(parts) - i - 1
        tail = f"; +{dropped_after} more" if dropped_after else ""
        if len(prefix + "; ".join([*kept, part]) + tail) > limit:
            break
        kept.append(part)
    if len(kept) == len(parts):
        return prefix + "; ".join(kept)
    tail = f"; +{len(parts) - max(len(kept), 1)} more" if len(parts) > max(len(kept), 1) else ""
    if not kept:
        return shorten(prefix + parts[0], limit - len(tail)) + tail
    return prefix + "; ".join(kept) + tail
