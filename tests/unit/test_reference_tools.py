"""nccl-tests, nvbandwidth and perftest's ib_write_bw (pytest_gbvalidate/reference_tools.py): parsers on output in
their documented formats (tests/helpers/tool_output.py, row by row, with the tools' printf formats, and JSON in
the shape their writers give it), JSON of the wrong shape, the commands and a failing tool. (End to end:
e2e/test_reference_tools_suite.py.)"""

from __future__ import annotations

import json
import re
import stat
from pathlib import Path

import pytest
import torch  # noqa: F401 -- in-process pytester runs drop modules they imported, and torch cannot load twice

from pytest_gbvalidate.reference_tools import nccl_tests, nvbandwidth, perftest, runner
from tests.helpers.tool_output import (
    IB_WRITE_BW_JSON,
    IB_WRITE_BW_REPORT,
    NCCL_JSON,
    NCCL_OUTPUT,
    NVB_JSON,
    NVB_OUTPUT,
    nccl_row,
)


def test_parse_nccl_tests() -> None:
    out = nccl_tests.parse_nccl_tests(NCCL_OUTPUT)
    assert out.ranks == 2 and out.avg_busbw_gbps == 229.4
    assert [r.size_bytes for r in out.rows] == [8, 134217728, 1073741824]
    big = out.rows[-1]
    assert (big.count, big.dtype, big.redop, big.root) == (268435456, "float", "sum", -1)
    assert big.out_of_place == nccl_tests.NcclTestsResult(3000.0, 357.91, 357.91, 0)
    assert big.in_place == nccl_tests.NcclTestsResult(3100.0, 346.37, 346.37, 3)


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


def test_parse_ib_write_bw_reads_the_average_in_gigabytes() -> None:
    text = IB_WRITE_BW_REPORT.format(device="mlx5_0", size=1048576, peak="392.10", avg="390.40")
    assert perftest.parse_ib_write_bw(text) == pytest.approx(48.8)
    with pytest.raises(runner.ToolError, match="not Gb/sec"):
        perftest.parse_ib_write_bw(text.replace("[Gb/sec]", "[MB/sec]"))
    with pytest.raises(runner.ToolError, match="no result row"):
        perftest.parse_ib_write_bw(text.split(" 1048576")[0])


def test_a_server_side_that_dies_is_named_with_its_error() -> None:
    server = ["sh", "-c", "echo 'Couldn''t listen to port 18515' >&2; exit 3"]
    with pytest.raises(runner.ToolError, match="the server side exited with code 3: Couldnt listen to port 18515"):
        perftest.run_loopback(server, ["sh", "-c", "exit 1"], env={}, timeout_s=5)
