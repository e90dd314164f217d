"""NVIDIA's reference tools, run beside our own measurements so an operator can compare them side by side:
nccl-tests (`all_reduce_perf`, `all_gather_perf`, ...) and nvbandwidth. Their text output is parsed into the
measurements our suites make -- same metric names, same scope labels, tagged with the tool. Pure Python.

nccl-tests prints one row per size (`size count type redop root`, then `time algbw busbw #wrong` out of place,
then the same in place; `#wrong` is `N/A` without `-c`); comment lines start with `#`. Builds from late 2025 on
also write JSON (`-J/--output_file PATH.json`: `results`, one object per size with `size`, `count`, `type`,
`redop`, `root`, `out_of_place` and `in_place` of `time` (or `cpu_time`), `alg_bw`, `bus_bw`, `nwrong`;
`devices`, one per rank; `average_bus_bandwidth.bandwidth`): read where the binary offers it (its usage names
`--output_file`), the text table otherwise. nvbandwidth prints
`Running <testcase>.`, a line naming the matrix, a header of column indices, then one row per source.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_gbvalidate.labels import gpu_label, gpu_pair_label, size_label

NCCL_TESTS = "nccl-tests"
NVBANDWIDTH = "nvbandwidth"
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
    try:
        doc = json.loads(text)
        rows = [_nccl_tests_json_row(r) for r in doc["results"]]
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ToolError(f"nccl-tests JSON output: cannot read it: {type(exc).__name__}: {exc}") from None
    if not rows:
        raise ToolError("nccl-tests JSON output has no results")
    average = (doc.get("average_bus_bandwidth") or {}).get("bandwidth")
    return NcclTestsOutput(rows, len(doc.get("devices") or []), _float_or_none(average), source="json")


def _nccl_tests_json_row(r: dict[str, Any]) -> NcclTestsRow:
    in_place = _nccl_tests_json_result(r["in_place"])
    out_of_place = None if r.get("out_of_place") is None else _nccl_tests_json_result(r["out_of_place"])
    return NcclTestsRow(
        int(r["size"]), int(r["count"]), str(r["type"]), str(r["redop"]), int(r["root"]), out_of_place, in_place
    )


def _nccl_tests_json_result(half: dict[str, Any]) -> NcclTestsResult:
    time_us = half["time"] if "time" in half else half["cpu_time"]
    wrong = None if half.get("nwrong") is None else int(half["nwrong"])
    return NcclTestsResult(float(time_us), float(half["alg_bw"]), float(half["bus_bw"]), wrong)


def _float_or_none(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


def writes_json(binary: str, *, env: Mapping[str, str], timeout_s: float) -> bool:
    """Whether this nccl-tests build can write JSON: its usage (`-h`) names `--output_file`."""
    try:
        done = subprocess.run(
            [binary, "-h"], capture_output=True, text=True, timeout=timeout_s, env={**os.environ, **env}, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--output_file" in done.stdout + done.stderr


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
                values = [None if c == "N/A" else float(c) for c in cells[1:]]
                rows[int(cells[0])] = values
            except ValueError:
                raise ToolError(f"nvbandwidth {testcase}: cannot read row {lines[i - 1].strip()!r}") from None
            if len(values) != len(columns):
                raise ToolError(f"nvbandwidth {testcase}: row {cells[0]} has {len(values)} values for {len(columns)}")
        matrices.append(NvbMatrix(testcase, description, columns, rows))
    if not matrices:
        raise ToolError("nvbandwidth printed no bandwidth matrix")
    return matrices


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
                    details = {"tool": NVBANDWIDTH, "testcase": m.testcase, "matrix": m.description}
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


def nvbandwidth_command(binary: str, *, buffer_bytes: int) -> list[str]:
    return [binary, "-b", str(max(1, buffer_bytes // 2**20)), "-t", *NVBANDWIDTH_TESTCASES]


# --- perftest's ib_write_bw ------------------------------------------------------------------------------------

IB_WRITE_BW = "ib_write_bw"
_PERFTEST_HEADER = re.compile(r"#bytes\s+#iterations\s+BW peak\[(\S+)\]\s+BW average\[(\S+)\]")


def ib_write_bw_command(
    binary: str, device: str, port: int, *, size_bytes: int, iterations: int, cuda_device: int | None
) -> list[str]:
    """One side of a loopback run on an HCA port (the server; the client adds the host): RDMA writes of one size,
    bandwidth in Gb/s, GPU memory through GPUDirect RDMA where `cuda_device` names a GPU."""
    command = [binary, "-d", device, "-i", str(port), "-s", str(size_bytes), "-n", str(iterations)]
    command += ["-F", "--report_gbits"]
    return command + ([f"--use_cuda={cuda_device}"] if cuda_device is not None else [])


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
