"""perftest's `ib_write_bw`: the command line of a loopback run on one HCA port (server and client on this host),
the run itself, and the client's figure in GB/s. Pure Python.

ib_write_bw prints a table whose average is in Gb/s with `--report_gbits`; `--out_json --out_json_file=PATH`
writes `{"test_info": {...}, "results": {"MsgSize", "n_iterations", "BW_peak", "BW_average", "MsgRate"}}` in the
same unit, unnamed. Its usage names `--out_json` from perftest 6.03 (4.5-0.11) on, but the file is JSON only from
6.19 (24.01.0-0.38; keys were unquoted before): read where `--version` says 6.19 or later.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from pytest_gbvalidate.reference_tools.runner import ToolError, ToolJson, environment, printed, run

IB_WRITE_BW = "ib_write_bw"
PERFTEST_JSON_VERSION = (6, 19)  # "Make output JSON standard" (perftest f9e82f7, 2024-01), first in 24.01.0-0.38
_PERFTEST_HEADER = re.compile(r"#bytes\s+#iterations\s+BW peak\[(\S+)\]\s+BW average\[(\S+)\]")
LOOPBACK_TRIES, LOOPBACK_WAIT_S = 3, 0.5  # the server binds its port within a moment of starting


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
    version = re.search(r"Version:\s*(\d+)\.(\d+)", printed([binary, "--version"], env=env, timeout_s=timeout_s))
    return version is not None and (int(version[1]), int(version[2])) >= PERFTEST_JSON_VERSION


def parse_ib_write_bw_json(text: str) -> float:
    """`results.BW_average` of the --out_json file, in GB/s: the file gives the table's figure in the table's unit
    without naming it, Gb/s with --report_gbits (which ib_write_bw_command passes)."""
    return ToolJson.load(IB_WRITE_BW, text)["results"]["BW_average"].number() / 8


def parse_ib_write_bw(text: str) -> float:
    """The average bandwidth of the result row, in GB/s (perftest prints Gb/s with --report_gbits)."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if (header := _PERFTEST_HEADER.search(line)) is None:
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
        list(server), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=environment(env)
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
