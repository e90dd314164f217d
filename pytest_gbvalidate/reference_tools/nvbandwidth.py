"""nvbandwidth: the command line that runs the test cases our per-GPU suites measure, and its bandwidth matrices as
our per-GPU and per-pair metrics. Pure Python.

nvbandwidth prints `Running <testcase>.`, a line naming the matrix, a header of column indices, then one row per
source. From v0.5 on, `-j/--json` prints instead one document (json_output.cpp):
`{"nvbandwidth": {"testcases": [{"name", "status", "bandwidth_description", "bandwidth_matrix", "sum"}]}}`, the
matrix a list of rows of strings (a number as C++ streams it, or "N/A"), present where `status` is "Passed";
read where its usage names `--json`.
"""

from __future__ import annotations

import math
import re
import reprlib
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_gbvalidate.labels import gpu_label, gpu_pair_label
from pytest_gbvalidate.reference_tools.runner import Measurement, ToolError, ToolJson

NVBANDWIDTH = "nvbandwidth"
# What the usage (`-h`) names where the binary can write JSON.
NVBANDWIDTH_JSON_OPTION = "--json"
# The nvbandwidth test cases that measure what our per-GPU suites measure (copy engine, one direction).
NVBANDWIDTH_TESTCASES = (
    *("host_to_device_memcpy_ce", "device_to_host_memcpy_ce", "device_local_copy"),
    *("device_to_device_memcpy_write_ce", "device_to_device_memcpy_read_ce"),
)


@dataclass(frozen=True)
class NvbMatrix:
    testcase: str
    description: str
    columns: list[int]
    rows: dict[int, list[float | None]]  # row index -> one value per column (None: N/A)
    source: str = "text"  # what it was read from: "text" or "json" (--json)


_NVB_RUNNING = re.compile(r"^Running (\S+)\.$")


def nvbandwidth_command(binary: str, *, buffer_bytes: int, as_json: bool = False) -> list[str]:
    json_option = [NVBANDWIDTH_JSON_OPTION] if as_json else []  # before -t, whose test cases run to the next option
    return [binary, "-b", str(max(1, buffer_bytes // 2**20)), *json_option, "-t", *NVBANDWIDTH_TESTCASES]


def parse_nvbandwidth(text: str) -> list[NvbMatrix]:
    matrices: list[NvbMatrix] = []
    testcase: str | None = None
    lines = [line.rstrip() for line in text.splitlines()]
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        i += 1
        if match := _NVB_RUNNING.match(line):
            testcase = match.group(1)
            continue
        if testcase is None or not line.endswith("(GB/s)"):
            continue
        description = line
        try:
            columns = [int(c) for c in lines[i].split()]
        except (IndexError, ValueError):
            columns = []
        if not columns:
            raise ToolError(f"nvbandwidth {testcase}: no column header after {description!r}")
        i += 1
        rows: dict[int, list[float | None]] = {}
        while i < len(lines) and lines[i].strip():
            cells = lines[i].split()
            i += 1
            try:
                values = [_nvb_cell(c) for c in cells[1:]]
                rows[int(cells[0])] = values
            except ValueError:
                raise ToolError(f"nvbandwidth {testcase}: cannot read row {lines[i - 1].strip()!r}") from None
            if len(values) != len(columns):
                raise ToolError(f"nvbandwidth {testcase}: row {cells[0]} has {len(values)} values for {len(columns)}")
        matrices.append(NvbMatrix(testcase, description, columns, rows))
    if not matrices:
        raise ToolError("nvbandwidth printed no bandwidth matrix")
    return matrices


def parse_nvbandwidth_json(text: str) -> list[NvbMatrix]:
    """nvbandwidth --json: the matrices of the test cases that passed (as in the text); columns and rows by position."""
    top = ToolJson.load(NVBANDWIDTH, text)["nvbandwidth"]
    testcases = top.get("testcases")
    matrices = []
    for case in [] if testcases is None else testcases.items():
        if case["status"].string() != "Passed":  # Waived, Error, or still Running where it failed
            continue
        matrix = case["bandwidth_matrix"]
        rows = [[_nvb_json_cell(c) for c in row.items()] for row in matrix.items()]
        if not rows or any(len(row) != len(rows[0]) for row in rows):
            raise matrix.error("has rows of different lengths" if rows else "is empty")
        columns = list(range(len(rows[0])))
        description = case["bandwidth_description"].string()
        matrices.append(NvbMatrix(case["name"].string(), description, columns, dict(enumerate(rows)), "json"))
    if not matrices:
        error = top.get("error")
        raise ToolError("nvbandwidth wrote no bandwidth matrix" + ("" if error is None else f": {error.value}"))
    return matrices


def _nvb_cell(cell: str) -> float | None:
    """A matrix cell: None for N/A, else a finite number (ValueError for anything else)."""
    if cell == "N/A":
        return None
    value = float(cell)
    if not math.isfinite(value):
        raise ValueError(f"{cell} is not a bandwidth")
    return value


def _nvb_json_cell(cell: ToolJson) -> float | None:
    try:
        return _nvb_cell(cell.string())
    except ValueError:
        raise cell.error(f"is {reprlib.repr(cell.value)}, not a bandwidth or N/A") from None


def nvbandwidth_measurements(matrices: Sequence[NvbMatrix]) -> list[Measurement]:
    """Our per-GPU metrics from nvbandwidth's matrices. Copy-engine writes go row -> column; reads pull the
    column's memory into the row's GPU, so their data goes column -> row: pair labels follow the data."""
    out = []
    for m in matrices:
        for row, values in m.rows.items():
            for col, value in zip(m.columns, values, strict=True):
                if value is None or (found := _nvb_scope(m.testcase, row, col)) is None:
                    continue
                details = {"tool": NVBANDWIDTH, "testcase": m.testcase, "matrix": m.description, "read_from": m.source}
                out.append(Measurement(*found, value, details))
    return out


def _nvb_scope(testcase: str, row: int, col: int) -> tuple[str, str] | None:
    if testcase == "host_to_device_memcpy_ce":
        return "h2d_bandwidth_gbps", gpu_label(col)
    if testcase == "device_to_host_memcpy_ce":
        return "d2h_bandwidth_gbps", gpu_label(col)
    if testcase == "device_local_copy":
        return "d2d_bandwidth_gbps", gpu_label(col)
    if testcase == "device_to_device_memcpy_write_ce":
        return "p2p_bandwidth_gbps", gpu_pair_label(row, col)
    if testcase == "device_to_device_memcpy_read_ce":
        return "p2p_bandwidth_gbps", gpu_pair_label(col, row)
    return None
