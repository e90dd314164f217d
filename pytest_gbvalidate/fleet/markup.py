"""The summary's markups, for the sections to fill: Markdown cells and tables, CSV text, aligned terminal columns,
and the cells every format writes alike."""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence

from pytest_gbvalidate.fleet.findings import FailedCheck
from pytest_gbvalidate.fleet.text import one_line
from pytest_gbvalidate.labels import number


def md(text: str) -> str:
    """One line, a `|` that cannot end a table cell, and no HTML: a report's `<script>` is shown, not run, by
    whatever renders the Markdown."""
    html = one_line(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return html.replace("|", "\\|")


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    head = ["| " + " | ".join(md(h) for h in header) + " |", "|" + "---|" * len(header)]
    return head + ["| " + " | ".join(md(c) for c in row) + " |" for row in rows]


def csv_text(columns: Sequence[str], rows: Sequence[Mapping[str, object]]) -> str:
    """A header and the rows; a column a row lacks is empty."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, restval="", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def columns(rows: Sequence[Sequence[str]]) -> list[str]:
    """The rows (the first one the header) in columns as wide as their widest cell."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def yes(flag: bool) -> str:
    return "yes" if flag else "no"


def num(value: float | None) -> str:
    return "-" if value is None else number(value)


def checks_cell(checks: Sequence[FailedCheck]) -> str:
    """Failed checks for people: by name, with the fault category ("-" where the report has none)."""
    return ", ".join(f"{c.name} ({c.category or '-'})" for c in checks) or "-"
