"""nccl-tests, nvbandwidth and perftest's ib_write_bw: parsers on output in their documented formats (written here,
row by row, with the tools' printf formats, and JSON in the shape their writers give it), JSON of the wrong shape,
and an end-to-end run with stand-in binaries on PATH."""

from __future__ import annotations

import json
import re
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest
import torch  # noqa: F401 -- in-process pytester runs drop modules they imported, and torch cannot load twice

from pytest_gbvalidate.reference_tools import nccl_tests, nvbandwidth, perftest, runner
from tests.test_plugin import SUITES, junit_cases

# --- nccl-tests ------------------------------------------------------------------------------------------------


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


def test_parse_nccl_tests() -> None:
    out = nccl_tests.parse_nccl_tests(NCCL_OUTPUT)
    assert out.ranks == 2 and out.avg_busbw_gbps == 229.4
    assert [r.size_bytes for r in out.rows] == [8, 134217728, 1073741824]
    big = out.rows[-1]
    assert (big.count, big.dtype, big.redop, big.root) == (268435456, "float", "sum", -1)
    assert big.out_of_place == nccl_tests.NcclTestsResult(3000.0, 357.91, 357.91, 0)
    assert big.in_place == nccl_tests.NcclTestsResult(3100.0, 346.37, 346.37, 3)


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


def test_parse_nccl_tests_json_gives_what_the_table_gives() -> None:
    from_json, from_text = nccl_tests.parse_nccl_tests_json(NCCL_JSON), nccl_tests.parse_nccl_tests(NCCL_OUTPUT)
    assert (from_json.source, from_json.ranks, from_json.avg_busbw_gbps) == ("json", 2, 229.4)
    assert from_json.rows[:2] == from_text.rows[:2]
    last = from_json.rows[2]
    assert (last.root, last.in_place.busbw_gbps, last.in_place.wrong) == (-1, 351.0, 3)
    measured = nccl_tests.nccl_tests_measurements("all_reduce", from_json)
    assert {m.details["read_from"] for m in measured} == {"json"}


def json_edit(text: str, path: str, value: str | None) -> str:
    """The JSON `text` with the value at `path` (keys and list indices, dot-separated) replaced by the JSON text
    `value` (any token, NaN and 1e999 included), or deleted where `value` is None."""
    doc = json.loads(text)
    *parents, last = [int(k) if k.isdigit() else k for k in path.split(".")]
    node = doc
    for key in parents:
        node = node[key]
    if value is None:
        del node[last]
        return json.dumps(doc)
    node[last] = "@value@"
    return json.dumps(doc).replace('"@value@"', value)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", "nccl-tests JSON output is empty"),
        ("{not json", "nccl-tests JSON output: not JSON: Expecting property name"),
        ("[]", "nccl-tests JSON output: the document is [], not an object"),
        ('{"results": [{"size": 8}]}', "nccl-tests JSON output: results[0].count is missing or null"),
        ('{"results": []}', "nccl-tests JSON output has no results"),
        ('{"results": {}}', "nccl-tests JSON output: results is {}, not a list"),
        ('{"results": [NaN]}', "nccl-tests JSON output: not JSON: NaN is not a number JSON allows"),
        ('{"results": [' + "1" * 5000 + "]}", "nccl-tests JSON output: not JSON: Exceeds the limit"),
        ("[" * 100000, "nccl-tests JSON output: not JSON: maximum recursion depth exceeded"),
    ],
)
def test_nccl_tests_bad_json(text: str, error: str) -> None:
    with pytest.raises(runner.ToolError, match="^" + re.escape(error)):
        nccl_tests.parse_nccl_tests_json(text)


@pytest.mark.parametrize(
    ("path", "value", "error"),
    [
        ("results.2.in_place", None, "results[2].in_place is missing or null"),
        ("results.2.in_place.bus_bw", "null", "results[2].in_place.bus_bw is missing or null"),
        ("results.2.in_place.bus_bw", '"nan"', "results[2].in_place.bus_bw is 'nan', not a finite number"),
        ("results.2.in_place.bus_bw", "1e999", "results[2].in_place.bus_bw is inf, not a finite number"),
        pytest.param("results.2.in_place.bus_bw", "9" * 400, "results[2].in_place.bus_bw is 999", id="huge-int"),
        ("results.2.in_place.bus_bw", "NaN", "not JSON: NaN is not a number JSON allows"),
        ("results.2.in_place.alg_bw", "true", "results[2].in_place.alg_bw is True, not a finite number"),
        ("results.2.in_place.nwrong", "2.5", "results[2].in_place.nwrong is 2.5, not an integer"),
        ("results.2.size", str(2**64), "results[2].size is 18446744073709551616, not an integer"),
        ("results.2.root", '"none"', "results[2].root is 'none', not an integer"),
        ("results.2.type", "4", "results[2].type is 4, not a string"),
        ("results.2.out_of_place", "[]", "results[2].out_of_place is [], not an object"),
        ("devices", '{"rank": 0}', "devices is {'rank': 0}, not a list"),
        ("average_bus_bandwidth", "[229.4]", "average_bus_bandwidth is [229.4], not an object"),
    ],
)
def test_nccl_tests_json_of_the_wrong_shape(path: str, value: str | None, error: str) -> None:
    with pytest.raises(runner.ToolError, match="^" + re.escape(f"nccl-tests JSON output: {error}")):
        nccl_tests.parse_nccl_tests_json(json_edit(NCCL_JSON, path, value))


def test_nccl_tests_json_average_is_reported_only_where_it_is_a_number() -> None:
    # nccl-tests writes a NaN double as the string "nan" (src/util.cu, jsonDouble)
    text = json_edit(NCCL_JSON, "average_bus_bandwidth.bandwidth", '"nan"')
    assert nccl_tests.parse_nccl_tests_json(text).avg_busbw_gbps is None


def test_nccl_tests_rows_without_a_check_or_an_out_of_place_half() -> None:
    text = "\n".join(
        [
            nccl_row(1024, 256, "none", 0, (5.0, 0.2, 0.2, "N/A"), (5.0, 0.2, 0.2, "N/A")),
            f"{1024:12d}  {256:12d}  {'float':>8}  {'none':>6}  {0:6d}"
            + " " * 32
            + "     5.00    0.20    0.20       0",
        ]
    )
    first, second = nccl_tests.parse_nccl_tests(text).rows
    assert first.in_place.wrong is None and first.out_of_place is not None
    assert second.out_of_place is None and second.in_place.wrong == 0


def test_nccl_tests_measurements_use_our_metric_and_size_labels() -> None:
    ms = nccl_tests.nccl_tests_measurements("all_reduce", nccl_tests.parse_nccl_tests(NCCL_OUTPUT))
    assert [(m.metric, m.scope, m.details["placement"]) for m in ms[-2:]] == [
        ("all_reduce_busbw_gbps", "1GiB", "out_of_place"),
        ("all_reduce_busbw_gbps", "1GiB", "in_place"),
    ]
    assert ms[-1].value == 346.37
    assert ms[-1].details | {"tool": None} == {
        "tool": None,
        "placement": "in_place",
        "size_bytes": 1073741824,
        "count": 268435456,
        "dtype": "float",
        "time_us": 3100.0,
        "algbw_gbps": 346.37,
        "wrong": 3,
        "read_from": "text",
    }
    assert ms[-1].details["tool"] == "nccl-tests all_reduce_perf"


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("# nothing but comments\n", "nccl-tests printed no result rows"),
        (
            "        1024           256     float\n",
            "nccl-tests output line 1: cannot read '1024           256     float'",
        ),
    ],
)
def test_nccl_tests_bad_output(text: str, error: str) -> None:
    with pytest.raises(runner.ToolError, match=f"^{error}"):
        nccl_tests.parse_nccl_tests(text)


def test_nccl_tests_command() -> None:
    assert nccl_tests.nccl_tests_command(
        "/opt/all_reduce_perf", gpus=4, min_bytes=8, max_bytes=2**33, warmup=5, iterations=20
    ) == ["/opt/all_reduce_perf", "-b", "8", "-e", "8589934592", "-f", "2", "-g", "4", "-w", "5", "-n", "20", "-c", "1"]


# --- nvbandwidth -----------------------------------------------------------------------------------------------


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


def test_parse_nvbandwidth() -> None:
    matrices = nvbandwidth.parse_nvbandwidth(NVB_OUTPUT)
    assert [m.testcase for m in matrices] == list(nvbandwidth.NVBANDWIDTH_TESTCASES)
    write = matrices[3]
    assert write.columns == [0, 1] and write.rows == {0: [None, 700.0], 1: [710.0, None]}


def test_nvbandwidth_measurements_follow_the_data() -> None:
    ms = {
        (m.metric, m.scope, m.details["testcase"]): m.value
        for m in nvbandwidth.nvbandwidth_measurements(nvbandwidth.parse_nvbandwidth(NVB_OUTPUT))
    }
    assert ms == {
        ("h2d_bandwidth_gbps", "gpu0", "host_to_device_memcpy_ce"): 201.5,
        ("h2d_bandwidth_gbps", "gpu1", "host_to_device_memcpy_ce"): 180.0,
        ("d2h_bandwidth_gbps", "gpu0", "device_to_host_memcpy_ce"): 190.0,
        ("d2h_bandwidth_gbps", "gpu1", "device_to_host_memcpy_ce"): 191.0,
        ("d2d_bandwidth_gbps", "gpu0", "device_local_copy"): 1500.0,
        ("d2d_bandwidth_gbps", "gpu1", "device_local_copy"): 1490.0,
        ("p2p_bandwidth_gbps", "gpu0->gpu1", "device_to_device_memcpy_write_ce"): 700.0,
        ("p2p_bandwidth_gbps", "gpu1->gpu0", "device_to_device_memcpy_write_ce"): 710.0,
        # a read by GPU 0 of GPU 1's memory moves data from GPU 1 to GPU 0
        ("p2p_bandwidth_gbps", "gpu1->gpu0", "device_to_device_memcpy_read_ce"): 650.0,
    }


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("Waived: \n", "nvbandwidth printed no bandwidth matrix"),
        (
            "Running device_local_copy.\nmemcpy local GPU(column) bandwidth (GB/s)\n\n",
            "nvbandwidth device_local_copy: no",
        ),
        (
            "Running device_local_copy.\nmemcpy local GPU(column) bandwidth (GB/s)\n    0    1\n 0  5.0\n",
            "nvbandwidth device_local_copy: row 0 has 1 values for 2",
        ),
        (
            "Running device_local_copy.\nmemcpy local GPU(column) bandwidth (GB/s)\n    0    1\n 0  nan  5.0\n",
            "nvbandwidth device_local_copy: cannot read row '0  nan  5.0'",
        ),
    ],
)
def test_nvbandwidth_bad_output(text: str, error: str) -> None:
    with pytest.raises(runner.ToolError, match=f"^{error}"):
        nvbandwidth.parse_nvbandwidth(text)


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


def test_parse_nvbandwidth_json_gives_what_the_text_gives() -> None:
    from_json, from_text = nvbandwidth.parse_nvbandwidth_json(NVB_JSON), nvbandwidth.parse_nvbandwidth(NVB_OUTPUT)
    assert [(m.source, m.testcase, m.description) for m in from_json] == [
        ("json", m.testcase, m.description) for m in from_text
    ]
    assert [(m.columns, m.rows) for m in from_json[1:]] == [(m.columns, m.rows) for m in from_text[1:]]
    assert from_json[0].rows == {0: [201.5, 185.25]}
    measured = nvbandwidth.nvbandwidth_measurements(from_json)
    assert len(measured) == 9 and {m.details["read_from"] for m in measured} == {"json"}


def test_nvbandwidth_json_reads_only_the_test_cases_that_passed() -> None:
    """A waived test case, and one that failed (nvbandwidth.cpp: its entry stays "Running" and an "Error" entry
    follows), have no matrix."""
    doc = json.loads(NVB_JSON)
    cases = doc["nvbandwidth"]["testcases"]
    cases[3:] = [
        {"name": "device_to_device_memcpy_write_ce", "status": "Waived"},
        {"name": "device_to_device_memcpy_read_ce", "status": "Running"},
        {"name": "device_to_device_memcpy_read_ce", "status": "Error"},
    ]
    assert [m.testcase for m in nvbandwidth.parse_nvbandwidth_json(json.dumps(doc))] == list(
        nvbandwidth.NVBANDWIDTH_TESTCASES[:3]
    )
    doc["nvbandwidth"]["testcases"] = cases[3:]
    doc["nvbandwidth"]["error"] = "CUDA_ERROR_OUT_OF_MEMORY: out of memory"
    with pytest.raises(runner.ToolError, match=r"^nvbandwidth wrote no bandwidth matrix: CUDA_ERROR_OUT_OF_MEMORY"):
        nvbandwidth.parse_nvbandwidth_json(json.dumps(doc))


@pytest.mark.parametrize(
    ("path", "value", "error"),
    [
        ("nvbandwidth", None, "nvbandwidth is missing or null"),
        ("nvbandwidth", "[]", "nvbandwidth is [], not an object"),
        ("nvbandwidth.testcases", '{"name": "device_local_copy"}', "nvbandwidth.testcases is {'name': "),
        ("nvbandwidth.testcases.0.status", None, "nvbandwidth.testcases[0].status is missing or null"),
        ("nvbandwidth.testcases.0.status", "true", "nvbandwidth.testcases[0].status is True, not a string"),
        ("nvbandwidth.testcases.0.name", "0", "nvbandwidth.testcases[0].name is 0, not a string"),
        ("nvbandwidth.testcases.0.bandwidth_matrix", None, "nvbandwidth.testcases[0].bandwidth_matrix is missing"),
        ("nvbandwidth.testcases.0.bandwidth_matrix", "[]", "nvbandwidth.testcases[0].bandwidth_matrix is empty"),
        ("nvbandwidth.testcases.0.bandwidth_matrix", '"201.5"', "bandwidth_matrix is '201.5', not a list"),
        ("nvbandwidth.testcases.0.bandwidth_matrix.0", '{"0": "201.5"}', "bandwidth_matrix[0] is {'0': '201.5'}"),
        ("nvbandwidth.testcases.0.bandwidth_matrix.0.1", "185.25", "bandwidth_matrix[0][1] is 185.25, not a string"),
        ("nvbandwidth.testcases.0.bandwidth_matrix.0.1", '"nan"', "bandwidth_matrix[0][1] is 'nan', not a bandwidth"),
        ("nvbandwidth.testcases.0.bandwidth_matrix.0.1", '"1e999"', "bandwidth_matrix[0][1] is '1e999', not a band"),
        ("nvbandwidth.testcases.0.bandwidth_matrix.0.1", '"fast"', "bandwidth_matrix[0][1] is 'fast', not a band"),
        ("nvbandwidth.testcases.3.bandwidth_matrix.1", '["710"]', "testcases[3].bandwidth_matrix has rows of differ"),
        ("nvbandwidth.testcases.0.bandwidth_description", None, "testcases[0].bandwidth_description is missing"),
        ("nvbandwidth.testcases.0.sum", "Infinity", "not JSON: Infinity is not a number JSON allows"),
    ],
)
def test_nvbandwidth_json_of_the_wrong_shape(path: str, value: str | None, error: str) -> None:
    with pytest.raises(runner.ToolError, match=r"^nvbandwidth JSON output: (.*\.)?" + re.escape(error)):
        nvbandwidth.parse_nvbandwidth_json(json_edit(NVB_JSON, path, value))


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", "nvbandwidth JSON output is empty"),
        (NVB_OUTPUT, "nvbandwidth JSON output: not JSON: Expecting value: line 1 column 1 (char 0); it starts 'nvb"),
        ('{"nvbandwidth": {"version": "v0.8"}}', "nvbandwidth wrote no bandwidth matrix"),
    ],
)
def test_nvbandwidth_bad_json(text: str, error: str) -> None:
    with pytest.raises(runner.ToolError, match="^" + re.escape(error)):
        nvbandwidth.parse_nvbandwidth_json(text)


def test_nvbandwidth_command() -> None:
    assert nvbandwidth.nvbandwidth_command("nvbandwidth", buffer_bytes=2**29, as_json=True)[:6] == [
        *("nvbandwidth", "-b", "512", "--json", "-t", "host_to_device_memcpy_ce")
    ]


# --- perftest's ib_write_bw ----------------------------------------------------------------------------------

# `ib_write_bw ... --report_gbits --use_cuda=0 --out_json --out_json_file=PATH`'s file, byte for byte as perftest
# writes it (src/perftest_parameters.c: print_full_bw_report, write_test_info_to_file, write_bw_report_to_file;
# src/perftest_parameters.h: REPORT_FMT_JSON), the figures of the table in tests/test_infiniband.py.
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


def test_parse_ib_write_bw_json_reads_the_average_in_gigabytes() -> None:
    assert perftest.parse_ib_write_bw_json(IB_WRITE_BW_JSON) == pytest.approx(48.8)  # 390.40 Gb/s, as from the table


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", "ib_write_bw JSON output is empty"),
        # before perftest 6.19 (src/perftest_parameters.h at v4.5-0.11: REPORT_FMT_JSON), keys were not quoted
        ('{\n"test_info": {\n},\nresults: {\nMsgSize: 1048576,\n', "ib_write_bw JSON output: not JSON: Expecting"),
        (IB_WRITE_BW_JSON.replace("390.40", "-nan"), "ib_write_bw JSON output: not JSON: Expecting value"),
        (IB_WRITE_BW_JSON.replace("390.40", "Infinity"), "ib_write_bw JSON output: not JSON: Infinity is not a"),
        (IB_WRITE_BW_JSON.replace("390.40", "1e999"), "ib_write_bw JSON output: results.BW_average is inf, not a"),
        (IB_WRITE_BW_JSON.replace("390.40", '"390.40"'), "ib_write_bw JSON output: results.BW_average is '390.40'"),
        (IB_WRITE_BW_JSON.replace('"BW_average"', '"bw_avg"'), "ib_write_bw JSON output: results.BW_average is miss"),
        (IB_WRITE_BW_JSON.replace('"results"', '"Results"'), "ib_write_bw JSON output: results is missing or null"),
        ("[390.40]", "ib_write_bw JSON output: the document is [390.4], not an object"),
    ],
)
def test_ib_write_bw_bad_json(text: str, error: str) -> None:
    with pytest.raises(runner.ToolError, match="^" + re.escape(error)):
        perftest.parse_ib_write_bw_json(text)


def executable(path: Path, script: str) -> str:
    path.write_text(script)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


@pytest.mark.parametrize(
    ("printed", "writes"),
    [
        ("Version: 6.20", True),
        ("Version: 6.19", True),
        ("Version: 7.0", True),
        ("Version: 6.18", False),  # "Make output JSON standard" came during 6.18: the first 6.18 builds wrote no JSON
        ("Version: 5.93", False),
        ("ib_write_bw: unrecognized option '--version'", False),
    ],
)
def test_perftest_writes_json_from_6_19(tmp_path: Path, printed: str, writes: bool) -> None:
    binary = executable(tmp_path / "ib_write_bw", f'#!/bin/sh\n[ "$1" = --version ] && echo "{printed}"\nexit 10\n')
    assert perftest.perftest_writes_json(binary, env={}, timeout_s=10) is writes
    assert not perftest.perftest_writes_json(str(tmp_path / "missing"), env={}, timeout_s=10)


def test_ib_write_bw_json_options_and_a_missing_file(tmp_path: Path) -> None:
    assert perftest.ib_write_bw_json_options(tmp_path / "c.json") == [
        "--out_json",
        f"--out_json_file={tmp_path}/c.json",
    ]
    with pytest.raises(runner.ToolError, match=r"^ib_write_bw was asked for JSON but wrote no .*c\.json: No such file"):
        runner.read_json_file("ib_write_bw", tmp_path / "c.json")


def test_run_reports_a_failing_tool(tmp_path: Path) -> None:
    with pytest.raises(runner.ToolError, match=r"exited with code 3: no GPU"):
        runner.run(["sh", "-c", "echo no GPU >&2; exit 3"], env={}, timeout_s=10)
    with pytest.raises(runner.ToolError, match=r"did not finish within 0.2 s"):
        runner.run(["sleep", "5"], env={}, timeout_s=0.2)
    with pytest.raises(runner.ToolError, match="No such file"):
        runner.run([str(tmp_path / "missing")], env={}, timeout_s=10)


# --- end to end: stand-ins on PATH ------------------------------------------------------------------------------

LAB_GPU = """\
schema_version: 1
sku: LABGPU
description: a two-GPU lab SKU for the reference tool tests
detect: {gpu_count: 2}
metrics:
  h2d_bandwidth_gbps: {unit: GB/s, direction: higher, scope: gpu, status: provisional, expected: 200, fail: 10%,
                       provenance: the plugin's tests}
  p2p_bandwidth_gbps: {unit: GB/s, direction: higher, scope: gpu_pair, status: provisional, fail: 690,
                       provenance: the plugin's tests}
  all_reduce_busbw_gbps:
    unit: GB/s
    direction: higher
    scope: message_size
    status: provisional
    fail: 10%
    params: {nccl_env: {NCCL_ALGO: Ring}, max_bytes: 1073741824}
    provenance: the plugin's tests
    values:
      1GiB: {expected: 350}
"""


def stand_in(bin_dir: Path, name: str, output: str) -> None:
    """An executable that prints `output` and notes its arguments and NCCL environment. It names the tools it
    uses by their full paths, so that PATH can be `bin_dir` alone."""
    env, grep, cat = (shutil.which(tool) for tool in ("env", "grep", "cat"))
    (bin_dir / f"{name}.out").write_text(output)
    script = bin_dir / name
    script.write_text(
        f'#!/bin/sh\necho "$@" > {bin_dir}/{name}.args\n{env} | {grep} ^NCCL_ > {bin_dir}/{name}.env\n'
        f"{cat} {bin_dir}/{name}.out\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def lab_gpu_node(pytester: pytest.Pytester) -> Path:
    """The LABGPU baseline under baselines/, and an empty bin/ for the stand-ins (made before PATH is set to bin/
    alone: a GPU host may have the real tools installed)."""
    (pytester.path / "baselines").mkdir()
    (pytester.path / "baselines" / "LABGPU.yaml").write_text(LAB_GPU)
    bin_dir = pytester.path / "bin"
    bin_dir.mkdir()
    return bin_dir


def test_reference_tools_run_and_report_beside_ours(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = lab_gpu_node(pytester)
    stand_in(bin_dir, "all_reduce_perf", NCCL_OUTPUT)
    stand_in(bin_dir, "nvbandwidth", NVB_OUTPUT)
    monkeypatch.setenv("PATH", str(bin_dir))
    args = ["--gb-sku=LABGPU", "--gb-baselines=baselines", "--junitxml=r.xml", "--gb-report=r.json", "-rs"]
    result = pytester.runpytest(str(SUITES / "test_reference_tools.py"), *args, "--gb-reference-tools")

    cases = junit_cases(pytester.path / "r.xml")
    outcomes = {name: case["outcome"] for name, case in cases.items()}
    assert outcomes == {
        # the in-place 1GiB result is 1% below expected, but nccl-tests counted 3 wrong elements
        "test_nccl_tests_busbw[all_reduce]": "failure",
        "test_nccl_tests_busbw[all_gather]": "skipped",  # not on PATH
        "test_nccl_tests_busbw[alltoall]": "skipped",
        "test_nccl_tests_busbw[broadcast]": "skipped",
        "test_nccl_tests_busbw[reduce_scatter]": "skipped",
        "test_nvbandwidth[h2d_bandwidth_gbps]": "passed",  # gpu1 at 180: on the limit (10% below 200), not below
        "test_nvbandwidth[d2h_bandwidth_gbps]": "skipped",  # LABGPU has no reference
        "test_nvbandwidth[d2d_bandwidth_gbps]": "skipped",
        "test_nvbandwidth[p2p_bandwidth_gbps]": "failure",  # the read of gpu1->gpu0: 650 < 690
    }
    result.stdout.fnmatch_lines(["*all_gather_perf is not on PATH*"])
    message = cases["test_nccl_tests_busbw[all_reduce]"]["message"] or ""
    assert "reported wrong data (#wrong): 1GiB in_place: 3" in message
    assert "p2p_bandwidth_gbps [gpu1->gpu0]: measured 650 GB/s" in (
        cases["test_nvbandwidth[p2p_bandwidth_gbps]"]["message"] or ""
    )

    args_seen = (bin_dir / "all_reduce_perf.args").read_text().split()
    assert args_seen == ["-b", "8", "-e", "1073741824", "-f", "2", "-g", "2", "-w", "5", "-n", "20", "-c", "1"]
    assert "NCCL_ALGO=Ring" in (bin_dir / "all_reduce_perf.env").read_text()
    assert (bin_dir / "nvbandwidth.args").read_text().split()[:2] == ["-b", "512"]

    report = json.loads((pytester.path / "r.json").read_text())
    tool_records = [m for m in report["measurements"] if m["details"].get("tool", "").startswith("nccl-tests")]
    assert {(m["scope"], m["details"]["placement"], m["verdict"]) for m in tool_records} == {
        ("8B", "out_of_place", "info"),
        ("8B", "in_place", "info"),
        ("128MiB", "out_of_place", "info"),
        ("128MiB", "in_place", "info"),
        ("1GiB", "out_of_place", "pass"),
        ("1GiB", "in_place", "pass"),
    }
    h2d = [m for m in report["measurements"] if m["metric"] == "h2d_bandwidth_gbps"]
    assert [(m["scope"], m["value"], m["details"]["tool"], m["details"]["read_from"]) for m in h2d] == [
        ("gpu0", 201.5, "nvbandwidth", "text"),
        ("gpu1", 180.0, "nvbandwidth", "text"),
    ]
    result.stdout.fnmatch_lines(
        ["all_reduce_busbw_gbps (nccl-tests all_reduce_perf; GB/s*", "*1GiB*PASS (expected 350)"]
    )


def test_reference_tools_are_off_unless_asked(pytester: pytest.Pytester) -> None:
    (pytester.path / "baselines").mkdir()
    (pytester.path / "baselines" / "LABGPU.yaml").write_text(LAB_GPU)
    result = pytester.runpytest(
        str(SUITES / "test_reference_tools.py"), "--gb-sku=LABGPU", "--gb-baselines=baselines", "-rs"
    )
    result.assert_outcomes(skipped=9)
    result.stdout.fnmatch_lines(["*reference tools not asked for (--gb-reference-tools, GBVALIDATE_REFERENCE_TOOLS*"])


def stand_in_writing_json(bin_dir: Path, name: str, output: str, json_text: str) -> None:
    """A newer nccl-tests: its usage names --output_file, and it writes `json_text` where -J says (printing the
    table as well, as the real one does)."""
    cat, cp = shutil.which("cat"), shutil.which("cp")
    (bin_dir / f"{name}.out").write_text(output)
    (bin_dir / f"{name}.json").write_text(json_text)
    script = bin_dir / name
    script.write_text(
        '#!/bin/sh\nif [ "$1" = "-h" ]; then echo "[-J,--output_file <file> write output to filepath]"; exit 0; fi\n'
        f'echo "$@" > {bin_dir}/{name}.args\n'
        'while [ $# -gt 0 ]; do if [ "$1" = "-J" ]; then out="$2"; fi; shift; done\n'
        f'{cp} {bin_dir}/{name}.json "$out"\n{cat} {bin_dir}/{name}.out\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def test_a_build_that_writes_json_is_read_from_its_json(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = lab_gpu_node(pytester)
    stand_in_writing_json(bin_dir, "all_reduce_perf", NCCL_OUTPUT, NCCL_JSON)
    monkeypatch.setenv("PATH", str(bin_dir))
    args = ["--gb-sku=LABGPU", "--gb-baselines=baselines", "--gb-report=r.json", "--gb-reference-tools"]
    pytester.runpytest(str(SUITES / "test_reference_tools.py"), *args, "-k", "nccl_tests_busbw and all_reduce")
    args_seen = (bin_dir / "all_reduce_perf.args").read_text().split()
    assert args_seen[-2] == "-J" and args_seen[-1].endswith("all_reduce.json")
    report = json.loads((pytester.path / "r.json").read_text())
    one_gib = [m for m in report["measurements"] if m["scope"] == "1GiB" and m["details"]["placement"] == "in_place"]
    assert [(m["value"], m["details"]["read_from"]) for m in one_gib] == [(351.0, "json")]


def stand_in_nvbandwidth_json(bin_dir: Path, output: str, json_text: str) -> None:
    """An nvbandwidth from v0.5 on: its usage names --json (as boost prints it), and with --json it prints
    `json_text` instead of `output`."""
    cat = shutil.which("cat")
    (bin_dir / "nvbandwidth.text").write_text(output)
    (bin_dir / "nvbandwidth.json").write_text(json_text)
    script = bin_dir / "nvbandwidth"
    script.write_text(
        '#!/bin/sh\nif [ "$1" = "-h" ]; then echo "  -j [ --json ]  Print output in json format"; exit 0; fi\n'
        f'echo "$@" > {bin_dir}/nvbandwidth.args\nout=text\n'
        'for a in "$@"; do if [ "$a" = "--json" ]; then out=json; fi; done\n'
        f"{cat} {bin_dir}/nvbandwidth.$out\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def test_an_nvbandwidth_that_writes_json_is_read_from_its_json(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = lab_gpu_node(pytester)
    stand_in_nvbandwidth_json(bin_dir, NVB_OUTPUT, NVB_JSON)
    monkeypatch.setenv("PATH", str(bin_dir))
    args = ["--gb-sku=LABGPU", "--gb-baselines=baselines", "--gb-report=r.json", "--gb-reference-tools"]
    pytester.runpytest(str(SUITES / "test_reference_tools.py"), *args, "-k", "nvbandwidth")
    assert (bin_dir / "nvbandwidth.args").read_text().split()[:4] == ["-b", "512", "--json", "-t"]
    report = json.loads((pytester.path / "r.json").read_text())
    h2d = [m for m in report["measurements"] if m["metric"] == "h2d_bandwidth_gbps"]
    assert [(m["scope"], m["value"], m["details"]["read_from"]) for m in h2d] == [
        ("gpu0", 201.5, "json"),
        ("gpu1", 185.25, "json"),
    ]
