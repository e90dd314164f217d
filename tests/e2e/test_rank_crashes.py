"""A rank that crashes, hangs or returns wrong data fails its test within the bound, naming the rank and the
cause; the gang is torn down and the rest of the session goes on. The collectives suite runs in a pytest
subprocess whose gang is wrapped (by a conftest written from tests/helpers/runs.py's CONFTEST) to inject one fault
per chosen test."""

from __future__ import annotations

import json
import os
import time
import uuid

import pytest

from tests.helpers.rank_faults import processes_with_marker
from tests.helpers.runs import REPO, collectives_lab, junit_cases

TIMEOUT_S = 3

BASELINE = """\
schema_version: 1
sku: LABCPU
description: a CPU-only lab SKU with short sweeps, for fault injection
detect: {gpu_count: 0}
metrics:
"""
for _collective in ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast"):
    BASELINE += f"""\
  {_collective}_busbw_gbps:
    unit: GB/s
    direction: higher
    scope: message_size
    status: provisional
    fail: 0.000001
    params: {{max_bytes: 65536, warmup: 1, iterations: 10}}
    provenance: the plugin's tests (a limit no working harness misses)
    values:
      64KiB: {{}}
"""

FAULTS = {
    "test_all_reduce_busbw[in_place]": "crash",
    "test_all_gather_busbw[in_place]": "hang",
    "test_broadcast_busbw[in_place]": "wrong",
}


def test_each_fault_fails_its_test_in_bounded_time_and_the_session_goes_on(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    collectives_lab(pytester, monkeypatch, BASELINE, FAULTS)
    marker = f"GBV_TEST_MARKER={uuid.uuid4().hex}"
    monkeypatch.setenv("GBV_TEST_MARKER", marker.split("=", 1)[1])
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    start = time.monotonic()
    result = pytester.runpytest_subprocess(
        "test_collectives.py",
        "-k",
        "(all_reduce or all_gather_busbw[in_place] or alltoall or broadcast) and not pairwise and not one_size"
        " and not nvls and not mnnvl",
        "--gb-sku=LABCPU",
        "--gb-baselines=baselines",
        f"--gb-timeout={TIMEOUT_S}",
        "--junitxml=r.xml",
        "--gb-report=r.json",
        "-p",
        "no:cacheprovider",
        timeout=120,
    )
    elapsed = time.monotonic() - start
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()

    cases = junit_cases(pytester.path / "r.xml")
    outcomes = {name: case["outcome"] for name, case in cases.items()}
    assert outcomes == {
        "test_all_reduce_busbw[in_place]": "failure",
        "test_all_gather_busbw[in_place]": "failure",
        "test_alltoall_busbw[out_of_place]": "passed",  # after a crash and a hang, a fresh gang works
        "test_broadcast_busbw[in_place]": "failure",
    }
    crash = cases["test_all_reduce_busbw[in_place]"]["message"] or ""
    assert "GangError: rank 1 crashed: during inject: process exited with code 7" in crash
    hang = cases["test_all_gather_busbw[in_place]"]["message"] or ""
    assert f"GangError: rank 1 timed out: inject did not finish within {TIMEOUT_S} s (--gb-timeout) (rank 0 at " in hang
    assert "rank 1 at " in hang and "faults.py" in hang
    wrong = cases["test_broadcast_busbw[in_place]"]["message"] or ""
    assert wrong.startswith(
        "Failed: broadcast in_place returned wrong data at 14 of 14 sizes: 8B: 1 wrong of 2 elements (rank 1: 1)"
    )

    report = json.loads((pytester.path / "r.json").read_text())
    durations = {t["test_id"].rsplit("::", 1)[-1]: t["duration_s"] for t in report["tests"] if t["when"] == "call"}
    # Bounded: a crash is seen when it happens and a hang after the timeout, never after the default 300 s. The
    # margins cover starting the ranks on a busy machine (10.9 s for the crash beside 14 other test workers).
    assert durations["test_all_reduce_busbw[in_place]"] < 60
    assert TIMEOUT_S <= durations["test_all_gather_busbw[in_place]"] < TIMEOUT_S + 60
    broadcast = [m for m in report["measurements"] if m["metric"] == "broadcast_busbw_gbps"]
    assert len(broadcast) == 14 and all(m["details"]["wrong"] == 1 for m in broadcast)  # reported all the same

    # the gang is torn down after a crash or a hang (and started afresh by the next test), not after wrong data
    ranks = [json.loads(line) for line in (pytester.path / "ranks.jsonl").read_text().splitlines()]
    assert ranks == [
        ["test_all_reduce_busbw[in_place]", 0],
        ["test_all_gather_busbw[in_place]", 0],
        ["test_alltoall_busbw[out_of_place]", 2],
        ["test_broadcast_busbw[in_place]", 2],
    ]
    deadline = time.monotonic() + 10
    while processes_with_marker(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_with_marker(marker) == [], "processes of the run outlived it"
    assert elapsed < 90
    assert os.environ["GBV_TEST_MARKER"] in marker
