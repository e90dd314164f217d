"""InfiniBand write bandwidth per HCA port through perftest's ib_write_bw in loopback: its report parsed, and an
end-to-end run on a fake GB200 node (four HCAs in sysfs) with a stand-in ib_write_bw on PATH."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from pytest_gbvalidate.reference_tools import perftest, runner
from tests.fakenode import nd_gb200_v6
from tests.test_plugin import SUITES
from tests.test_reference_tools import IB_WRITE_BW_JSON

# ib_write_bw --report_gbits, as perftest prints it (server and client print the same table)
REPORT = """\
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


def test_parse_ib_write_bw_reads_the_average_in_gigabytes() -> None:
    text = REPORT.format(device="mlx5_0", size=1048576, peak="392.10", avg="390.40")
    assert perftest.parse_ib_write_bw(text) == pytest.approx(48.8)
    with pytest.raises(runner.ToolError, match="not Gb/sec"):
        perftest.parse_ib_write_bw(text.replace("[Gb/sec]", "[MB/sec]"))
    with pytest.raises(runner.ToolError, match="no result row"):
        perftest.parse_ib_write_bw(text.split(" 1048576")[0])


def stand_in(bin_dir: Path, version: str = "6.17") -> None:
    """An ib_write_bw of perftest `version` that notes its arguments and prints a report: 380 Gb/s on every HCA but
    mlx5_2 (180). Where it is asked for JSON (--out_json_file=PATH) it writes 4 Gb/s more to PATH, as
    tests/test_reference_tools.py's IB_WRITE_BW_JSON has it."""
    cat, echo, cp = (shutil.which(tool, path=os.defpath) for tool in ("cat", "echo", "cp"))  # not the node's PATH
    for device, avg in (("mlx5_0", 380.0), ("mlx5_1", 380.0), ("mlx5_2", 180.0), ("mlx5_3", 380.0)):
        (bin_dir / f"{device}.out").write_text(REPORT.format(device=device, size=1048576, peak=avg + 1, avg=avg))
        json_text = IB_WRITE_BW_JSON.replace("mlx5_0", device).replace("390.40", f"{avg + 4:.2f}")
        (bin_dir / f"{device}.json").write_text(json_text)
    script = bin_dir / "ib_write_bw"
    script.write_text(
        f'#!/bin/sh\nif [ "$1" = "--version" ]; then {echo} "Version: {version}"; exit 10; fi\n'
        f'{echo} "$@" >> {bin_dir}/args\n'
        'for a in "$@"; do\n  [ "$prev" = "-d" ] && dev="$a"\n'
        '  case "$a" in --out_json_file=*) json="${a#--out_json_file=}";; esac\n  prev="$a"\ndone\n'
        f'if [ -n "$json" ]; then {cp} {bin_dir}/$dev.json "$json"; fi\n'
        f"{cat} {bin_dir}/$dev.out\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


# The bundled GB200 baseline asks for GPUDirect (use_cuda) and gives no figure yet: this test gives one.
BASELINE_EDIT = (
    "  ib_write_bandwidth_gbps:\n    unit: GB/s\n    direction: higher\n    scope: link\n    status: provisional\n",
    "  ib_write_bandwidth_gbps:\n    unit: GB/s\n    direction: higher\n    scope: link\n    status: provisional\n"
    "    expected: 47.5\n    fail: 10%\n",
)


def test_each_hca_port_is_measured_in_loopback_and_gated(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    nd_gb200_v6().install(monkeypatch, tmp_path)
    baselines = pytester.path / "b"
    shutil.copytree(Path(__file__).resolve().parents[1] / "baselines", baselines)
    text = (baselines / "ND_GB200_v6.yaml").read_text()
    assert BASELINE_EDIT[0] in text
    (baselines / "ND_GB200_v6.yaml").write_text(text.replace(*BASELINE_EDIT, 1))
    bin_dir = pytester.path / "bin"
    bin_dir.mkdir()
    stand_in(bin_dir)
    monkeypatch.setenv("PATH", str(bin_dir))
    result = pytester.runpytest(
        str(SUITES / "test_topology.py"),
        "--gb-sku=ND_GB200_v6",
        "--gb-baselines=b",
        "--gb-report=r.json",
        "-k",
        "infiniband_write",
    )
    result.assert_outcomes(failed=1)
    report = json.loads((pytester.path / "r.json").read_text())
    measured = {m["scope"]: m for m in report["measurements"]}
    assert {scope: m["value"] for scope, m in measured.items()} == {
        "mlx5_0:1": 47.5,
        "mlx5_1:1": 47.5,
        "mlx5_2:1": 22.5,
        "mlx5_3:1": 47.5,
    }
    assert [m["verdict"] for m in measured.values()] == ["pass", "pass", "fail", "pass"]
    assert {m["details"]["read_from"] for m in measured.values()} == {"text"}  # perftest 6.17 writes no JSON
    result.stdout.fnmatch_lines(["*ib_write_bandwidth_gbps [[]mlx5_2:1[]]: measured 22.5 GB/s*"])
    calls = (bin_dir / "args").read_text().splitlines()
    assert len(calls) == 8  # a server and a client per port
    # GPUDirect RDMA from the GPU on the HCA's NUMA node: mlx5_0, mlx5_1 on node 0 (gpu0), mlx5_2, mlx5_3 on 1
    assert calls[1].split() == [
        *("-d", "mlx5_0", "-i", "1", "-s", "1048576", "-n", "5000", "-F", "--report_gbits", "--use_cuda=0", "localhost")
    ]
    assert "--use_cuda=2" in calls[4]


def test_a_perftest_that_writes_json_is_read_from_the_clients_json(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    nd_gb200_v6().install(monkeypatch, tmp_path)
    bin_dir = pytester.path / "bin"
    bin_dir.mkdir()
    stand_in(bin_dir, version="6.20")
    monkeypatch.setenv("PATH", str(bin_dir))
    args = ("--gb-sku=ND_GB200_v6", "--gb-report=r.json", "-k", "infiniband_write")
    pytester.runpytest(str(SUITES / "test_topology.py"), *args)
    report = json.loads((pytester.path / "r.json").read_text())
    assert {m["scope"]: (m["value"], m["details"]["read_from"]) for m in report["measurements"]} == {
        "mlx5_0:1": (48.0, "json"),  # 384 Gb/s in the file, 380 in the table
        "mlx5_1:1": (48.0, "json"),
        "mlx5_2:1": (23.0, "json"),
        "mlx5_3:1": (48.0, "json"),
    }
    server, client = (call.split() for call in (bin_dir / "args").read_text().splitlines()[:2])
    assert not any(a.startswith("--out_json") for a in server)  # both sides would write their file
    assert client[-4:-3] == ["--use_cuda=0"] and client[-3] == "--out_json" and client[-1] == "localhost"
    assert client[-2].startswith("--out_json_file=") and client[-2].endswith("mlx5_0-1.json")


def test_a_port_that_cannot_be_measured_fails_beside_ports_without_a_figure(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The bundled GB200 baseline has no figure yet (the working ports' measurements are recorded, not gated): a
    dead port still fails the test, not a skip for the missing figure."""
    nd_gb200_v6().install(monkeypatch, tmp_path)
    bin_dir = pytester.path / "bin"
    bin_dir.mkdir()
    stand_in(bin_dir)
    (bin_dir / "mlx5_2.out").write_text("Couldn't connect to localhost:18515\n")
    monkeypatch.setenv("PATH", str(bin_dir))
    args = ("--gb-sku=ND_GB200_v6", "--gb-report=r.json", "-k", "infiniband_write")
    result = pytester.runpytest(str(SUITES / "test_topology.py"), *args)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*mlx5_2 port 1: *no result row*"])
    report = json.loads((pytester.path / "r.json").read_text())
    assert {m["scope"]: m["verdict"] for m in report["measurements"]} == dict.fromkeys(
        ("mlx5_0:1", "mlx5_1:1", "mlx5_3:1"), "skip"
    )


def test_a_server_side_that_dies_is_named_with_its_error() -> None:
    server = ["sh", "-c", "echo 'Couldn''t listen to port 18515' >&2; exit 3"]
    with pytest.raises(runner.ToolError, match="the server side exited with code 3: Couldnt listen to port 18515"):
        perftest.run_loopback(server, ["sh", "-c", "exit 1"], env={}, timeout_s=5)
