"""What an operator's bad day does to a run: an interrupted record, a failure's text in the JSON report, the gang
under xdist, a start-up of the ranks that fails once. End-to-end through pytester, reading the files written."""

from __future__ import annotations

import json
import socket
import textwrap
from typing import Any

import pytest
import torch  # imported here too: in-process pytester runs drop modules they imported, torch cannot load twice

from tests.helpers.fakenvml import FakeGpu, FakeNvmlLib, install

LAB = """\
schema_version: 1
sku: LAB
description: a CPU-only lab SKU for the reliability tests
detect: {gpu_count: 0}
metrics:
  host_copy_bandwidth_gbps: {unit: GB/s, direction: higher, scope: node, status: measured, expected: 100,
                             fail: 50%, provenance: the plugin's tests}
"""
ARGS = ["--gb-sku=LAB", "--gb-baselines=baselines", "--gb-report=r.json", "-p", "no:cacheprovider"]


@pytest.fixture
def lab(pytester: pytest.Pytester) -> pytest.Pytester:
    (pytester.path / "baselines").mkdir()
    (pytester.path / "baselines" / "LAB.yaml").write_text(LAB)
    return pytester


def report(pytester: pytest.Pytester) -> dict[str, Any]:
    return dict(json.loads((pytester.path / "r.json").read_text()))


@pytest.mark.parametrize(
    ("checks", "flags", "why"),
    [
        ("def test_b():\n    raise KeyboardInterrupt\n", [], "interrupted"),  # Ctrl-C
        ("def test_b():\n    assert False\ndef test_c(gb_expect):\n    gb_expect('x', 1.0)\n", ["-x"], "stopped"),
    ],
)
def test_a_record_is_written_only_from_a_run_that_completed(
    lab: pytest.Pytester, checks: str, flags: list[str], why: str
) -> None:
    before = (lab.path / "baselines" / "LAB.yaml").read_bytes()
    lab.makepyfile(test_a="def test_a(gb_expect):\n    gb_expect('host_copy_bandwidth_gbps', 101.0)\n" + checks)
    result = lab.runpytest_subprocess(*ARGS, "--gb-record=baselines/LAB.yaml", *flags)
    assert result.ret in (pytest.ExitCode.INTERRUPTED, pytest.ExitCode.TESTS_FAILED)
    assert (lab.path / "baselines" / "LAB.yaml").read_bytes() == before  # byte for byte
    note = f"nothing recorded: the run did not complete ({why}); {lab.path}/baselines/LAB.yaml left as it was"
    result.stdout.fnmatch_lines([note])
    assert report(lab)["record"] == {"path": f"{lab.path}/baselines/LAB.yaml", "written": False, "note": note}


def test_the_json_report_carries_the_failure_as_the_terminal_shows_it(lab: pytest.Pytester) -> None:
    lab.makepyfile(
        test_a="""
        def ranks():
            raise RuntimeError("rank 1 crashed: during sweep_on_rank: process exited with code 7")

        def test_a(gb_expect):
            ranks()
        """
    )
    lab.runpytest(*ARGS).assert_outcomes(failed=1)
    (test,) = report(lab)["tests"]
    assert test["message"] == "RuntimeError: rank 1 crashed: during sweep_on_rank: process exited with code 7"
    assert "def test_a(gb_expect):" in test["text"] and "E       RuntimeError: rank 1 crashed" in test["text"]


def test_under_xdist_the_report_has_the_gang_section(lab: pytest.Pytester) -> None:
    lab.makepyfile(test_a="def test_a(gb_gang):\n    assert gb_gang.world_size == 2\n")
    lab.runpytest_subprocess(*ARGS, "-n", "1").assert_outcomes(passed=1)
    assert report(lab)["gang"] == {
        **{"kind": "local", "world_size": 2, "device_type": "cpu", "failed_starts": []},
        **{"nodes": 1, "hosts": [{"node_rank": 0, "hostname": socket.gethostname()}]},
    }


def test_a_start_of_the_ranks_that_fails_once_is_retried_and_reported(lab: pytest.Pytester) -> None:
    lab.makeconftest(
        """
        from pytest_gbvalidate.ranks import gang

        real_start, tries = gang.LocalGang._start, []

        def fails_once(self):  # as one rank dying at start-up once
            tries.append(1)
            if len(tries) == 1:
                raise gang.GangError(1, "crashed", "during start-up: process exited with code 7")
            real_start(self)

        gang.LocalGang._start = fails_once
        """
    )
    lab.makepyfile(
        test_a=textwrap.dedent(
            """
            def rank(ctx):
                return ctx.rank

            def test_a(gb_gang):
                assert gb_gang.run(rank) == [0, 1]
            """
        )
    )
    result = lab.runpytest_subprocess(*ARGS)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "the ranks' start-up failed 1 time(s) and was tried again:",
            "  rank 1 crashed: during start-up: process exited with code 7",
        ]
    )
    assert report(lab)["gang"]["failed_starts"] == ["rank 1 crashed: during start-up: process exited with code 7"]


@pytest.mark.parametrize("gpus", [0, 3])
def test_a_sku_recorded_for_the_first_time_gets_the_node_s_gpus(
    lab: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, gpus: int
) -> None:
    """Not a CPU-sized gang of 2 on an 8-GPU node: with no baseline to say, the node's GPUs (NVML) do."""
    install(
        monkeypatch, FakeNvmlLib([FakeGpu(pci_bus_id=f"00000000:0{i}:00.0") for i in range(gpus)]) if gpus else None
    )
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)  # torch sees the GPUs NVML lists, as it would
    lab.makepyfile(
        test_a=f"""
        def test_a(gb_target, gb_gang, gb_expect):
            assert (gb_target.gpu_count, gb_target.is_gpu, gb_gang.world_size) == ({gpus}, {gpus > 0}, {gpus or 2})
            gb_expect("host_copy_bandwidth_gbps", 101.0)
        """
    )
    lab.runpytest("--gb-sku=NEW", "--gb-baselines=baselines", "--gb-record=baselines/NEW.yaml").assert_outcomes(
        passed=1
    )
    text = (lab.path / "baselines" / "NEW.yaml").read_text()
    assert f"detect:\n  gpu_count: {gpus}\n" in text
