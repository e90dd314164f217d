"""Sample outputs of the reference tools, as they print or write them."""

from __future__ import annotations

import json
from typing import Any

# --- nccl-tests


def nccl_row(size: int, count: int, redop: str, root: int, *halves: tuple[float, float, float, str]) -> str:
    """A result row as nccl-tests prints it: '%12li  %12li  %8s  %6s  %6s' then '  %7s  %6s  %6s  %6s' per half."""
    line = f"{size:12d}  {count:12d}  {'float':>8}  {redop:>6}  {root:6d}"
    for time_us, algbw, busbw, wrong in halves:
        line += f"  {time_us:7.2f}  {algbw:6.2f}  {busbw:6.2f}  {wrong:>6}"
    return line


NCCL_HEADER = """\
# nccl-tests version 2.17.1 nccl-headers=22704 nccl-library=22704
# Collective test starting: all_reduce_perf
# nThread 1 nGpus 2 minBytes 8 maxBytes 1073741824 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 \
validation: 1 graph: 0 unalign: 0
#
# Using devices
#  Rank  0 Group  0 Pid   4242 on     node-a device  0 [0008:01:00] NVIDIA GB200
#  Rank  1 Group  0 Pid   4242 on     node-a device  1 [0009:01:00] NVIDIA GB200
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)
"""


NCCL_OUTPUT = (
    NCCL_HEADER
    + "\n".join(
        [
            nccl_row(8, 2, "sum", -1, (20.5, 0.0, 0.0, "0"), (20.1, 0.0, 0.0, "0")),
            "node-a:4242:4242 [0] NCCL INFO comm 0x5 rank 0 nranks 2 - Init COMPLETE",  # NCCL_DEBUG=INFO noise
            nccl_row(134217728, 33554432, "sum", -1, (400.0, 335.54, 335.54, "0"), (398.0, 337.23, 337.23, "0")),
            nccl_row(1073741824, 268435456, "sum", -1, (3000.0, 357.91, 357.91, "0"), (3100.0, 346.37, 346.37, "3")),
        ]
    )
    + """
# Out of bounds values : 3 FAILED
# Avg bus bandwidth    : 229.4
#
# Collective test concluded: all_reduce_perf
"""
)


def nccl_json_result(size: int, count: int, *halves: tuple[float, float, float, int | None]) -> dict[str, Any]:
    """A result object as nccl-tests' JSON writer (src/util.cu) makes it: the row's head, then `out_of_place` and
    `in_place` halves of time, alg_bw, bus_bw and nwrong (null without -c)."""
    result: dict[str, Any] = {"size": size, "count": count, "type": "float", "redop": "sum", "root": "    -1"}
    for name, (time_us, algbw, busbw, wrong) in zip(("out_of_place", "in_place"), halves, strict=True):
        result[name] = {"time": time_us, "alg_bw": algbw, "bus_bw": busbw, "nwrong": wrong}
    return result | {"actual_iterations": 20, "experiment_name": "all_reduce_perf"}


# The same run as NCCL_OUTPUT, as `-J run.json` writes it, but for the in-place 1GiB figure (351.0 here, 346.37
# in the table): a reader of the JSON file must not read the table.
NCCL_JSON = json.dumps(
    {
        "version": 1,
        "nccl_version": 22704,
        "config": {"nthreads": 1, "ngpus": 2, "minimum_bytes": 8, "maximum_bytes": 1073741824, "iterations": 20},
        "devices": [{"rank": 0, "hostname": "node-a", "device": 0}, {"rank": 1, "hostname": "node-a", "device": 1}],
        "results": [
            nccl_json_result(8, 2, (20.5, 0.0, 0.0, 0), (20.1, 0.0, 0.0, 0)),
            nccl_json_result(134217728, 33554432, (400.0, 335.54, 335.54, 0), (398.0, 337.23, 337.23, 0)),
            nccl_json_result(1073741824, 268435456, (3000.0, 357.91, 357.91, 0), (3100.0, 351.0, 351.0, 3)),
        ],
        "out_of_bounds": {"count": 3, "okay": False},
        "average_bus_bandwidth": {"bandwidth": 229.4, "okay": "unchecked"},
    }
)


# --- nvbandwidth


def nvb_matrix(testcase: str, description: str, rows: list[list[float | None]]) -> str:
    """A test case as nvbandwidth prints it: column indices in %10d, rows of %10.2f (N/A where none), SUM."""
    columns = len(rows[0])
    lines = [f"Running {testcase}.", description, "  " + "".join(f"{c:10d}" for c in range(columns))]
    for i, row in enumerate(rows):
        lines.append(f"{i:2d}" + "".join(f"{'N/A':>10}" if v is None else f"{v:10.2f}" for v in row))
    total = sum(v for row in rows for v in row if v is not None)
    return "\n".join([*lines, "", f"SUM {testcase} {total:.2f}", ""])


NVB_OUTPUT = "\n".join(
    [
        "nvbandwidth Version: v0.8",
        "Built from Git version: v0.8",
        "",
        "NOTE: The reported results may not reflect the full capabilities of the platform.",
        "",
        "node-a",
        "Device 0: NVIDIA GB200 (00000008:01:00)",
        "Device 1: NVIDIA GB200 (00000009:01:00)",
        "",
        nvb_matrix("host_to_device_memcpy_ce", "memcpy CE CPU(row) -> GPU(column) bandwidth (GB/s)", [[201.5, 180.0]]),
        nvb_matrix("device_to_host_memcpy_ce", "memcpy CE CPU(row) <- GPU(column) bandwidth (GB/s)", [[190.0, 191.0]]),
        nvb_matrix("device_local_copy", "memcpy local GPU(column) bandwidth (GB/s)", [[1500.0, 1490.0]]),
        nvb_matrix(
            "device_to_device_memcpy_write_ce",
            "memcpy CE GPU(row) <- GPU(column) bandwidth (GB/s)",
            [[None, 700.0], [710.0, None]],
        ),
        nvb_matrix(
            "device_to_device_memcpy_read_ce",
            "memcpy CE GPU(row) -> GPU(column) bandwidth (GB/s)",
            [[None, 650.0], [None, None]],
        ),
    ]
)


def nvb_json_case(testcase: str, description: str, rows: list[list[float | None]]) -> dict[str, Any]:
    """A test case as nvbandwidth --json writes it (json_output.cpp, addTestcase then addTestcaseResults): each
    value a string as a C++ stream writes a double (%g), "N/A" where none, and the sum of them all."""
    matrix = [["N/A" if v is None else f"{v:g}" for v in row] for row in rows]
    total = sum(v for row in rows for v in row if v is not None)
    return {
        "name": testcase,
        "status": "Passed",
        "bandwidth_matrix": matrix,
        "sum": total,
        "bandwidth_description": description,
    }


# The same run as NVB_OUTPUT, the document `nvbandwidth --json` prints (json_output.cpp: JsonOutput's
# addVersionInfo, addCudaAndDriverInfo, recordDevices, addTestcase, addTestcaseResults; jsoncpp sorts the keys), but
# for gpu1's host-to-device figure (185.25 here, 180.00 in the text): a reader of the JSON must not read the text.
NVB_JSON = json.dumps(
    {
        "nvbandwidth": {
            "version": "v0.8",
            "git_version": "v0.8",
            "CUDA Runtime Version": 12080,
            "Driver Version": "570.124.06",
            "GPU Device list": [
                "0: NVIDIA GB200 (00000008:01:00): (node-a)",
                "1: NVIDIA GB200 (00000009:01:00): (node-a)",
            ],
            "testcases": [
                nvb_json_case(
                    "host_to_device_memcpy_ce", "memcpy CE CPU(row) -> GPU(column) bandwidth (GB/s)", [[201.5, 185.25]]
                ),
                nvb_json_case(
                    "device_to_host_memcpy_ce", "memcpy CE CPU(row) <- GPU(column) bandwidth (GB/s)", [[190.0, 191.0]]
                ),
                nvb_json_case("device_local_copy", "memcpy local GPU(column) bandwidth (GB/s)", [[1500.0, 1490.0]]),
                nvb_json_case(
                    "device_to_device_memcpy_write_ce",
                    "memcpy CE GPU(row) <- GPU(column) bandwidth (GB/s)",
                    [[None, 700.0], [710.0, None]],
                ),
                nvb_json_case(
                    "device_to_device_memcpy_read_ce",
                    "memcpy CE GPU(row) -> GPU(column) bandwidth (GB/s)",
                    [[None, 650.0], [None, None]],
                ),
            ],
        }
    },
    indent=3,
    sort_keys=True,
)


# --- perftest's ib_write_bw

# ib_write_bw --report_gbits, as perftest prints it (server and client print the same table)
IB_WRITE_BW_REPORT = """\
---------------------------------------------------------------------------------------
                    RDMA_Write BW Test
 Dual-port       : OFF          Device         : {device}
 Number of qps   : 1            Transport type : IB
 Connection type : RC           Using SRQ      : OFF
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
 {size}      5000             {peak}              {avg}            0.186728
---------------------------------------------------------------------------------------
"""

# `ib_write_bw ... --report_gbits --use_cuda=0 --out_json --out_json_file=PATH`'s file, byte for byte as perftest
# writes it (src/perftest_parameters.c: print_full_bw_report, write_test_info_to_file, write_bw_report_to_file;
# src/perftest_parameters.h: REPORT_FMT_JSON), the figures of IB_WRITE_BW_REPORT's table.
IB_WRITE_BW_JSON = """\
{
"test_info": {
"test": "RDMA_Write_BW_Test",
"Dual_port": "OFF",
"Device": "mlx5_0",
"Number_of_qps": 1,
"Transport_type": "IB",
"Connection_type": "RC",
"Using_SRQ": "OFF",
"PCIe_relax_order": "ON",
"ibv_wr_API": "ON",
"TX_depth": 128,
"CQ_Moderation": 100,
"Mtu": 4096,
"Link_type": "IB",
"Max_inline_data": 0,
"rdma_cm_QPs": "OFF",
"cuda_device": 0,
"Use_ROCm_memory": "OFF",
"Use_MUSA_memory": "OFF",
"Data_ex_method": "Ethernet"
},
"results": {
"MsgSize": 1048576,
"n_iterations": 5000,
"BW_peak": 392.10,
"BW_average": 390.40,
"MsgRate": 0.046542
}
}
"""
