"""nccl-tests (`all_reduce_perf`, `all_gather_perf`, ...): the command line of a single-process run over this node's
GPUs, and its output as our collectives suite's busbw per size and placement. Pure Python.

nccl-tests prints one row per size (`size count type redop root`, then `time algbw busbw #wrong` out of place,
then the same in place; `#wrong` is `N/A` without `-c`); comment lines start with `#`. Builds from late 2025 on
also write JSON (`-J/--output_file PATH.json`: `results`, one object per size with `size`, `count`, `type`,
`redop`, `root` (a string, "%6i"), `out_of_place` and `in_place` of `time` (or `cpu_time`), `alg_bw`, `bus_bw`,
`nwrong`; `devices`, one per rank; `average_bus_bandwidth.bandwidth`): read where the binary's usage names
`--output_file`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pytest_gbvalidate.labels import size_label
from pytest_gbvalidate.reference_tools.runner import Measurement, ToolError, ToolJson

NCCL_TESTS = "nccl-tests"
# What the usage (`-h`) names where the binary can write JSON.
NCCL_TESTS_JSON_OPTION = "--output_file"
# nccl-tests binaries per collective; each is `<collective>_perf`. The collectives are those bench/collectives.py
# measures itself (its COLLECTIVES; a test keeps the two the same), so each figure has ours beside it. Named here,
# not imported, so that reading a tool's output needs no torch.
NCCL_TESTS_BINARIES = {c: f"{c}_perf" for c in ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast")}


@dataclass(frozen=True)
class NcclTestsResult:
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    wrong: int | None  # None: not checked (`-c 0`)


@dataclass(frozen=True)
class NcclTestsRow:
    size_bytes: int
    count: int
    dtype: str
    redop: str
    root: int
    out_of_place: NcclTestsResult | None
    in_place: NcclTestsResult


@dataclass(frozen=True)
class NcclTestsOutput:
    rows: list[NcclTestsRow]
    ranks: int  # `#  Rank N ...` lines, or JSON `devices` (0 when the tool did not say)
    avg_busbw_gbps: float | None  # the footer's average over the sweep: reported, never gated
    source: str = "text"  # what it was read from: "text" (the table) or "json" (-J)


_NCCL_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*([0-9.eE+-]+)")
_NCCL_RANK = re.compile(r"^#\s+Rank\s+\d+\s")


def nccl_tests_command(
    binary: str, *, gpus: int, min_bytes: int, max_bytes: int, warmup: int, iterations: int
) -> list[str]:
    """A single-process run over this node's GPUs, doubling sizes, checking every size once."""
    return [
        binary,
        *("-b", str(min_bytes), "-e", str(max_bytes), "-f", "2", "-g", str(gpus)),
        *("-w", str(warmup), "-n", str(iterations), "-c", "1"),
    ]


def parse_nccl_tests(text: str) -> NcclTestsOutput:
    rows: list[NcclTestsRow] = []
    ranks, avg = 0, None
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            ranks += bool(_NCCL_RANK.match(stripped))
            if match := _NCCL_AVG.match(stripped):
                avg = float(match.group(1))
            continue
        fields = stripped.split()
        if not fields[0].isdigit():
            continue  # NCCL's own log lines (NCCL_DEBUG=INFO), warnings
        try:
            rows.append(_nccl_tests_row(fields))
        except (ValueError, IndexError):
            raise ToolError(f"nccl-tests output line {number}: cannot read {stripped!r}") from None
    if not rows:
        raise ToolError("nccl-tests printed no result rows")
    return NcclTestsOutput(rows, ranks, avg)


def parse_nccl_tests_json(text: str) -> NcclTestsOutput:
    doc = ToolJson.load(NCCL_TESTS, text)
    rows = [_nccl_tests_json_row(r) for r in doc["results"].items()]
    if not rows:
        raise ToolError("nccl-tests JSON output has no results")
    average = doc.get("average_bus_bandwidth")  # reported, never gated: "nan" where nccl-tests had none
    ranks = 0 if (devices := doc.get("devices")) is None else len(devices.items())
    return NcclTestsOutput(rows, ranks, None if average is None else average["bandwidth"].number_or_none(), "json")


def _nccl_tests_json_row(r: ToolJson) -> NcclTestsRow:
    head = (r["size"].integer(), r["count"].integer(), r["type"].string(), r["redop"].string(), r["root"].integer())
    out_of_place = None if (half := r.get("out_of_place")) is None else _nccl_tests_json_result(half)
    return NcclTestsRow(*head, out_of_place, _nccl_tests_json_result(r["in_place"]))


def _nccl_tests_json_result(half: ToolJson) -> NcclTestsResult:
    time_us = half.get("time") or half["cpu_time"]
    wrong = half.get("nwrong")  # a double, null without -c
    return NcclTestsResult(
        time_us.number(), half["alg_bw"].number(), half["bus_bw"].number(), None if wrong is None else wrong.integer()
    )


def _nccl_tests_row(fields: list[str]) -> NcclTestsRow:
    head, results = fields[:5], fields[5:]
    if len(results) >= 8:
        out_of_place, in_place = _nccl_tests_result(results[0:4]), _nccl_tests_result(results[4:8])
    elif len(results) >= 4:  # a row with the in-place half only
        out_of_place, in_place = None, _nccl_tests_result(results[0:4])
    else:
        raise ValueError("too few columns")
    return NcclTestsRow(int(head[0]), int(head[1]), head[2], head[3], int(head[4]), out_of_place, in_place)


def _nccl_tests_result(cols: list[str]) -> NcclTestsResult:
    wrong = None if cols[3] == "N/A" else int(float(cols[3]))
    return NcclTestsResult(float(cols[0]), float(cols[1]), float(cols[2]), wrong)


def nccl_tests_measurements(collective: str, output: NcclTestsOutput) -> list[Measurement]:
    """busbw per size and placement, scoped by size label like our collectives suite."""
    tool = f"{NCCL_TESTS} {NCCL_TESTS_BINARIES[collective]}"
    out = []
    for row in output.rows:
        for placement, result in (("out_of_place", row.out_of_place), ("in_place", row.in_place)):
            if result is None:
                continue
            details = {"tool": tool, "placement": placement, "size_bytes": row.size_bytes, "count": row.count}
            details |= {"dtype": row.dtype, "time_us": result.time_us, "algbw_gbps": result.algbw_gbps}
            details |= {"wrong": result.wrong, "read_from": output.source}
            out.append(Measurement(f"{collective}_busbw_gbps", size_label(row.size_bytes), result.busbw_gbps, details))
    return out
