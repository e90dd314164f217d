"""Text for one line of a table, a terminal or a Slurm drain reason: whitespace folded, cut to a length, parts
joined within a limit."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import get_args

from pytest_gbvalidate.report.records import ReasonClass

LEADER = "gbvalidate: "  # whose drain a reason is (NHC's start with "NHC:")
# Whose problem a node's findings are, most pressing first: a reason names the first its findings have, so one that
# starts `gbvalidate: [job_leftovers]` has no hardware or configuration finding (the health check resumes it).
CLASS_ORDER: tuple[ReasonClass, ...] = get_args(ReasonClass)


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


def category_parts(checks: Iterable[tuple[str, str | None, str]]) -> list[str]:
    """A drain reason's parts for failed checks given as (category, repair, name): one per fault category, with the
    repair it calls for where the report says one (`link (rma): test_pcie_link[gpu3],test_nvlinks[gpu3]`; a
    category whose repair is `none`, unclassified, names none)."""
    by_category: dict[tuple[str, str | None], list[str]] = {}
    for category, repair, name in checks:
        by_category.setdefault((category, repair), []).append(name)
    return [
        f"{category_label(category, repair)}: {','.join(names)}" for (category, repair), names in by_category.items()
    ]


def category_label(category: str, repair: str | None) -> str:
    """A fault category as a drain reason names it: with its repair, where there is one to name."""
    return category if repair in (None, "none") else f"{category} ({repair})"


def drain_reason(classes: Iterable[ReasonClass], parts: Sequence[str], limit: int) -> str:
    """A drain reason: whose drain it is, the most pressing class of the findings (`[hardware]` where none is
    given), and as many `parts` as fit in `limit` characters."""
    first = min(classes, key=CLASS_ORDER.index, default="hardware")
    return join_within(f"{LEADER}[{first}] ", parts, limit)
