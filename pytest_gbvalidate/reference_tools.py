"""NVIDIA's reference tools, run beside our own measurements so an operator can compare them side by side:
nccl-tests (`all_reduce_perf`, `all_gather_perf`, ...), nvbandwidth and perftest's `ib_write_bw`; fio for storage.
Their output is parsed into the measurements our suites make -- same metric names, same scope labels, tagged with
the tool. Pure Python. Each tool's JSON is read where the binary offers it, its text otherwise; a JSON document of
the wrong shape (a field missing or of the wrong type, NaN, a number out of range) is a ToolError naming the field.

nccl-tests prints one row per size (`size count type redop root`, then `time algbw busbw #wrong` out of place,
then the same in place; `#wrong` is `N/A` without `-c`); comment lines start with `#`. Builds from late 2025 on
also write JSON (`-J/--output_file PATH.json`: `results`, one object per size with `size`, `count`, `type`,
`redop`, `root` (a string, "%6i"), `out_of_place` and `in_place` of `time` (or `cpu_time`), `alg_bw`, `bus_bw`,
`nwrong`; `devices`, one per rank; `average_bus_bandwidth.bandwidth`): read where the binary's usage names
`--output_file`. nvbandwidth prints `Running <testcase>.`, a line naming the matrix, a header of column indices,
then one row per source. From v0.5 on, `-j/--json` prints instead one document (json_output.cpp):
`{"nvbandwidth": {"testcases": [{"name", "status", "bandwidth_description", "bandwidth_matrix", "sum"}]}}`, the
matrix a list of rows of strings (a number as C++ streams it, or "N/A"), present where `status` is "Passed";
read where its usage names `--json`. ib_write_bw prints a table whose average is in Gb/s with `--report_gbits`;
`--out_json --out_json_file=PATH` writes `{"test_info": {...}, "results": {"MsgSize", "n_iterations", "BW_peak",
"BW_average", "MsgRate"}}` in the same unit, unnamed. Its usage names `--out_json` from perftest 6.03 (4.5-0.11)
on, but the file is JSON only from 6.19 (24.01.0-0.38; keys were unquoted before): read where `--version` says
6.19 or later.
"""

from __future__ import annotations

import json
import math
import os
import re
import reprlib
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_gbvalidate.labels import gpu_label, gpu_pair_label, size_label

NCCL_TESTS = "nccl-tests"
NVBANDWIDTH = "nvbandwidth"
# What each tool's usage (`-h`) names where it can write JSON.
NCCL_TESTS_JSON_OPTION, NVBANDWIDTH_JSON_OPTION = "--output_file", "--json"
# nccl-tests binaries per collective; each is `<collective>_perf`.
NCCL_TESTS_BINARIES = {c: f"{c}_perf" for c in ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast")}
# The nvbandwidth test cases that measure what our per-GPU suites measure (copy engine, one direction).
NVBANDWIDTH_TESTCASES = (
    "host_to_device_memcpy_ce",
    "device_to_host_memcpy_ce",
    "device_local_copy",
    "device_to_device_memcpy_write_ce",
    "device_to_device_memcpy_read_ce",
)


class ToolError(RuntimeError):
    """A reference tool failed to run or printed something we cannot read."""


@dataclass(frozen=True)
class Measurement:
    """One tool figure in our terms: `gb_expect(metric, value, scope=scope, details=details)`."""

    metric: str
    scope: str
    value: float
    details: dict[str, Any] = field(default_factory=dict)


# --- JSON from the tools ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Json:
    """A value in a tool's JSON document and the path to it: a field of the wrong shape is a ToolError that names
    the tool and the field, never a KeyError or TypeError."""

    tool: str
    value: Any
    path: str = ""

    @classmethod
    def load(cls, tool: str, text: str) -> _Json:
        if not text.strip():
            raise ToolError(f"{tool} JSON output is empty")
        try:
            return cls(tool, json.loads(text, parse_constant=_no_constant))
        except (ValueError, RecursionError) as exc:  # not JSON, NaN/Infinity, digits past int's limit, too deep
            raise ToolError(f"{tool} JSON output: not JSON: {exc}; it starts {text[:40]!r}") from None

    def error(self, problem: str) -> ToolError:
        return ToolError(f"{self.tool} JSON output: {self.path or 'the document'} {problem}")

    def get(self, key: str) -> _Json | None:
        """The field, or None where it is missing or null."""
        if not isinstance(self.value, dict):
            raise self.error(f"is {reprlib.repr(self.value)}, not an object")
        value = self.value.get(key)
        return None if value is None else _Json(self.tool, value, f"{self.path}.{key}".lstrip("."))

    def __getitem__(self, key: str) -> _Json:
        found = self.get(key)
        if found is None:
            raise _Json(self.tool, None, f"{self.path}.{key}".lstrip(".")).error("is missing or null")
        return found

    def items(self) -> list[_Json]:
        if not isinstance(self.value, list):
            raise self.error(f"is {reprlib.repr(self.value)}, not a list")
        return [_Json(self.tool, v, f"{self.path}[{i}]") for i, v in enumerate(self.value)]

    def number(self) -> float:
        value = _float_or_none(self.value)
        if value is None:
            raise self.error(f"is {reprlib.repr(self.value)}, not a finite number")
        return value

    def integer(self) -> int:
        """An integer, or a whole double or a string holding one (nccl-tests writes `nwrong` and `root` so)."""
        value = self.value
        whole = isinstance(value, float) and value.is_integer()
        if whole or (isinstance(value, str) and re.fullmatch(r"\s*-?[0-9]{1,20}\s*", value)):
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not -(2**63) <= value < 2**64:
            raise self.error(f"is {reprlib.repr(self.value)}, not an integer")
        return value

    def string(self) -> str:
        if not isinstance(self.value, str):
            raise self.error(f"is {reprlib.repr(self.value)}, not a string")
        return self.value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _float_or_none(value: Any) -> float | None:
    """A JSON number as a float; None for anything else, a bool, or a number past a double's range."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def read_json_file(binary: str, path: str | Path) -> str:
    """The JSON file a tool was asked to write; ToolError where it wrote none."""
    try:
        return Path(path).read_text(errors="replace")
    except OSError as exc:
        raise ToolError(f"{binary} was asked for JSON but wrote no {path}: {exc.strerror}") from None


def writes_json(binary: str, option: str, *, env: Mapping[str, str], timeout_s: float) -> bool:
    """Whether this build can write JSON: its usage (`-h`) names `option` (NCCL_TESTS_JSON_OPTION,
    NVBANDWIDTH_JSON_OPTION)."""
    return option in _printed([binary, "-h"], env=env, timeout_s=timeout_s)


def _printed(command: list[str], *, env: Mapping[str, str], timeout_s: float) -> str:
    """What the command prints, out and error; nothing where it cannot run."""
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout_s, env={**os.environ, **env}, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout + done.stderr


# --- nccl-tests -------------------------------------------------------------------------------------------------


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


def parse_nccl_tests(text: str) -> NcclTestsOutput:
    rows: list[NcclTestsRow] = []
    ranks, avg = 0, None
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            ranks += bool(_NCCL_RANK.match(stripped))
            match = _NCCL_AVG.match(stripped)
            if match:
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
    doc = _Json.load(NCCL_TESTS, text)
    rows = [_nccl_tests_json_row(r) for r in doc["results"].items()]
    if not rows:
        raise ToolError("nccl-tests JSON output has no results")
    average = doc.get("average_bus_bandwidth")  # reported, never gated: "nan" where nccl-tests had none
    devices = doc.get("devices")
    return NcclTestsOutput(
        rows,
        0 if devices is None else len(devices.items()),
        None if average is None else _float_or_none(average["bandwidth"].value),
        source="json",
    )


def _nccl_tests_json_row(r: _Json) -> NcclTestsRow:
    out_of_place = r.get("out_of_place")
    return NcclTestsRow(
        r["size"].integer(),
        r["count"].integer(),
        r["type"].string(),
        r["redop"].string(),
        r["root"].integer(),
        None if out_of_place is None else _nccl_tests_json_result(out_of_place),
        _nccl_tests_json_result(r["in_place"]),
    )


def _nccl_tests_json_result(half: _Json) -> NcclTestsResult:
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
            details = {
                "tool": tool,
                "placement": placement,
                "size_bytes": row.size_bytes,
                "count": row.count,
                "dtype": row.dtype,
                "time_us": result.time_us,
                "algbw_gbps": result.algbw_gbps,
                "wrong": result.wrong,
                "read_from": output.source,
            }
            out.append(Measurement(f"{collective}_busbw_gbps", size_label(row.size_bytes), result.busbw_gbps, details))
    return out


def nccl_tests_command(
    binary: str, *, gpus: int, min_bytes: int, max_bytes: int, warmup: int, iterations: int
) -> list[str]:
    """A single-process run over this node's GPUs, doubling sizes, checking every size once."""
    return [
        binary,
        *("-b", str(min_bytes), "-e", str(max_bytes), "-f", "2", "-g", str(gpus)),
        *("-w", str(warmup), "-n", str(iterations), "-c", "1"),
    ]


# --- nvbandwidth ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NvbMatrix:
    testcase: str
    description: str
    columns: list[int]
    rows: dict[int, list[float | None]]  # row index -> one value per column (None: N/A)
    source: str = "text"  # what it was read from: "text" or "json" (--json)


_NVB_RUNNING = re.compile(r"^Running (\S+)\.$")


def parse_nvbandwidth(text: str) -> list[NvbMatrix]:
    matrices: list[NvbMatrix] = []
    testcase: str | None = None
    lines = [line.rstrip() for line in text.splitlines()]
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        i += 1
        match = _NVB_RUNNING.match(line)
        if match:
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
    """nvbandwidth --json: the matrices of its test cases that passed (one that did not has none, as in the text);
    columns and rows by position."""
    top = _Json.load(NVBANDWIDTH, text)["nvbandwidth"]
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


def _nvb_json_cell(cell: _Json) -> float | None:
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
                if value is None:
                    continue
                found = _nvb_scope(m.testcase, row, col)
                if found is not None:
                    metric, scope = found
                    details = {
                        "tool": NVBANDWIDTH,
                        "testcase": m.testcase,
                        "matrix": m.description,
                        "read_from": m.source,
                    }
                    out.append(Measurement(metric, scope, value, details))
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


def nvbandwidth_command(binary: str, *, buffer_bytes: int, as_json: bool = False) -> list[str]:
    json_option = [NVBANDWIDTH_JSON_OPTION] if as_json else []  # before -t, whose test cases run to the next option
    return [binary, "-b", str(max(1, buffer_bytes // 2**20)), *json_option, "-t", *NVBANDWIDTH_TESTCASES]


# --- perftest's ib_write_bw ------------------------------------------------------------------------------------

IB_WRITE_BW = "ib_write_bw"
PERFTEST_JSON_VERSION = (6, 19)  # "Make output JSON standard" (perftest f9e82f7, 2024-01), first in 24.01.0-0.38
_PERFTEST_HEADER = re.compile(r"#bytes\s+#iterations\s+BW peak\[(\S+)\]\s+BW average\[(\S+)\]")


def ib_write_bw_command(
    binary: str, device: str, port: int, *, size_bytes: int, iterations: int, cuda_device: int | None
) -> list[str]:
    """One side of a loopback run on an HCA port (the server; the client adds the host): RDMA writes of one size,
    bandwidth in Gb/s, GPU memory through GPUDirect RDMA where `cuda_device` names a GPU."""
    command = [binary, "-d", device, "-i", str(port), "-s", str(size_bytes), "-n", str(iterations)]
    command += ["-F", "--report_gbits"]
    return command + ([f"--use_cuda={cuda_device}"] if cuda_device is not None else [])


def ib_write_bw_json_options(path: str | Path) -> list[str]:
    """For one side only (the client): both sides write their file, the server the client's figures."""
    return ["--out_json", f"--out_json_file={path}"]


def perftest_writes_json(binary: str, *, env: Mapping[str, str], timeout_s: float) -> bool:
    """Whether this perftest build writes JSON with --out_json: `--version` says 6.19 or later."""
    printed = _printed([binary, "--version"], env=env, timeout_s=timeout_s)
    version = re.search(r"Version:\s*(\d+)\.(\d+)", printed)
    return version is not None and (int(version[1]), int(version[2])) >= PERFTEST_JSON_VERSION


def parse_ib_write_bw_json(text: str) -> float:
    """`results.BW_average` of the --out_json file, in GB/s: the file gives the table's figure in the table's unit
    without naming it, Gb/s with --report_gbits (which ib_write_bw_command passes)."""
    return _Json.load(IB_WRITE_BW, text)["results"]["BW_average"].number() / 8


def parse_ib_write_bw(text: str) -> float:
    """The average bandwidth of the result row, in GB/s (perftest prints Gb/s with --report_gbits)."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        header = _PERFTEST_HEADER.search(line)
        if header is None:
            continue
        if header.group(2) != "Gb/sec":
            raise ToolError(f"ib_write_bw reports its average in {header.group(2)}, not Gb/sec (--report_gbits)")
        for row in lines[i + 1 :]:
            fields = row.split()
            if len(fields) >= 4 and fields[0].isdigit():
                try:
                    return float(fields[3]) / 8
                except ValueError:
                    raise ToolError(f"ib_write_bw: cannot read the result row {row.strip()!r}") from None
    raise ToolError("ib_write_bw printed no result row")


def run_loopback(server: Sequence[str], client: Sequence[str], *, env: Mapping[str, str], timeout_s: float) -> str:
    """Start the server side, then the client against it on this host (tried again while the server is not yet
    listening); the client's output. Both sides are gone when this returns."""
    with subprocess.Popen(
        list(server), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env={**os.environ, **env}
    ) as process:
        try:
            return _client_against(process, client, env=env, timeout_s=timeout_s)
        finally:
            if process.poll() is None:
                process.kill()


def _client_against(
    server: subprocess.Popen[str], client: Sequence[str], *, env: Mapping[str, str], timeout_s: float
) -> str:
    for attempt in range(1, LOOPBACK_TRIES + 1):
        time.sleep(LOOPBACK_WAIT_S)
        try:
            return run(client, env=env, timeout_s=timeout_s)
        except ToolError as exc:
            if server.poll() is not None:
                stderr = server.stderr.read() if server.stderr is not None else ""
                tail = " | ".join(stderr.strip().splitlines()[-3:])
                died = f"the server side exited with code {server.returncode}: {tail}"
                raise ToolError(f"{exc}; {died}") from None
            if attempt == LOOPBACK_TRIES:
                raise
    raise ToolError("no loopback attempt was made")  # LOOPBACK_TRIES >= 1


LOOPBACK_TRIES, LOOPBACK_WAIT_S = 3, 0.5  # the server binds its port within a moment of starting


# --- fio -------------------------------------------------------------------------------------------------------------

FIO = "fio"


def fio_command(binary: str, file: str, *, size_bytes: int, rw: str, direct: bool = True) -> list[str]:
    """One sequential job (`rw`: write or read) on `file`, 16 MiB blocks as our own check writes, direct I/O where
    the file system has it (as ours), the write fsync'd at its end; JSON output."""
    return [
        *(binary, "--name=gbvalidate", f"--filename={file}", f"--size={size_bytes}", "--bs=16M", f"--rw={rw}"),
        *(f"--direct={int(direct)}", "--ioengine=psync", "--end_fsync=1", "--output-format=json"),
    ]


def parse_fio(text: str, rw: str) -> float:
    """The job's `rw` bandwidth in GB/s (fio's `bw_bytes`, bytes per second)."""
    try:
        job = json.loads(text[text.index("{") :])["jobs"][0]
        return float(job[rw]["bw_bytes"]) / 1e9
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise ToolError(
            f"fio --output-format=json: cannot read the {rw} bandwidth: {type(exc).__name__}: {exc}"
        ) from None


# --- running ------------------------------------------------------------------------------------------------------


def find(binary: str, path: str | None = None) -> str | None:
    return shutil.which(binary, path=path)


def run(command: Sequence[str], *, env: Mapping[str, str], timeout_s: float) -> str:
    """The tool's standard output; ToolError with the end of its error output when it fails or overruns."""
    try:
        done = subprocess.run(
            list(command), capture_output=True, text=True, timeout=timeout_s, env={**os.environ, **env}, check=False
        )
    except subprocess.TimeoutExpired:
        raise ToolError(f"{' '.join(command)} did not finish within {timeout_s:g} s") from None
    except OSError as exc:
        raise ToolError(f"{' '.join(command)}: {exc}") from None
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise ToolError(f"{' '.join(command)} exited with code {done.returncode}: {tail}")
    return done.stdout
