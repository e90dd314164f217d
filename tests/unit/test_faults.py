"""The fault table (pytest_gbvalidate/faults.yaml): every bundled check maps to a category, rules pick the
specific case before the general one, and a broken table says where it is broken."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from pytest_gbvalidate import faults
from tests.helpers.runs import SUITES

TABLE = faults.load()


def check_names(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    return [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]


@pytest.mark.parametrize("suite", ["test_health.py", "test_topology.py", "test_nic.py"])
def test_every_health_and_topology_check_has_a_category(suite: str) -> None:
    for name in check_names(SUITES / suite):
        fault = TABLE.classify(f"suites/{suite}::{name}[gpu0]", "AssertionError: something is wrong")
        assert fault.category.name != faults.UNCLASSIFIED, name


# How any bundled check can fail whatever it measures, as the run records it: below its limit, regressed, its
# process killed under it (pytest-xdist's worker), one of its ranks dead or hung (the gang's messages).
ANY_CHECK_FAILS: list[tuple[str, tuple[str, ...], str | None]] = [
    ("all_reduce_busbw_gbps [1GiB]: 10 GB/s, expected 400 -> FAIL", ("fail",), None),  # the check's own, else
    ("... -> REGRESSED", ("pass", "regressed"), None),  # performance
    ("crashed: worker 'gw0' crashed while running 'suites/t.py::test_x'", (), "crashed"),
    ("GangError: rank 1 crashed: during copy_on_rank: process exited with code -9", (), "crashed"),
    ("GangError: gang timed out: copy_on_rank did not finish within 30 s (rank 0 at a; rank 1 at b)", (), "hung"),
    ("GangError: rank 1 timed out: gemm_on_rank did not finish within 300 s (rank 1 at sync)", (), "hung"),
]


@pytest.mark.parametrize("suite", sorted(p.name for p in SUITES.glob("test_*.py")))
def test_every_bundled_check_s_common_failures_have_a_category_with_an_action(suite: str) -> None:
    """The fault-table walk: each check of each bundled suite, failing in each way any check can, maps to a category
    whose action says what to do; `unclassified` is left for a site's own checks."""
    for name in check_names(SUITES / suite):
        for message, verdicts, expected in ANY_CHECK_FAILS:
            fault = TABLE.classify(f"suites/{suite}::{name}", message, verdicts)
            found = fault.category.name
            assert found == expected if expected else found != faults.UNCLASSIFIED, (name, message, found)
            assert fault.category.action


@pytest.mark.parametrize(
    ("test", "message", "verdicts", "category"),
    [
        (
            "test_row_remapping[gpu2]",
            "gpu2 (x): a row remap failed: the GPU has no spare rows left",
            (),
            "gpu_hardware",
        ),
        ("test_row_remapping[gpu2]", "gpu2 (x): a row remap is pending: reset the GPU to apply it", (), "gpu_reset"),
        (
            "test_no_critical_xid[gpu0]",
            "gpu0 (x): Xid events since boot: Xid 74 NVLINK_ERROR (WORKFLOW_NVLINK_ERR): ...; repair: gpu_reset",
            (),
            "gpu_reset",
        ),
        (
            "test_no_critical_xid[gpu0]",
            "gpu0 (x): Xid events since boot: Xid 79 ... repair: reboot (...) | Xid 62 ... repair: rma (...)",
            (),
            "gpu_hardware",
        ),
        (
            "test_no_critical_xid[gpu0]",
            "gpu0 (x): Xid events since boot: Xid 145 NVLINK_RLW_ERROR (WORKFLOW_NVLINK5_ERR): ...; repair: reboot",
            (),
            "reboot",
        ),
        ("test_gpu_count", "nvmlDeviceGetCount_v2: Driver/library version mismatch", (), "reboot"),
        ("test_ecc_enabled[gpu1]", "gpu1 (x): nvmlDeviceGetEccMode: GPU is lost", (), "gpu_hardware"),
        ("test_all_reduce_busbw[in_place]", "all_reduce_busbw_gbps [1GiB]: ... -> FAIL", ("fail",), "performance"),
        (
            "test_all_reduce_busbw[in_place]",
            "all_reduce in_place returned wrong data at 1 of 20 sizes: 1MiB: 3 wrong of 262144 elements (rank 1: 3)",
            ("fail",),
            "gpu_hardware",
        ),
        ("test_pairwise_all_reduce_busbw", "pairwise all_reduce: node2 (b): slow in all 2 of its pairs", (), "link"),
        (
            "test_pairwise_all_reduce_busbw",
            "pairwise all_reduce: node3 (c): wrong data in all 2 of its pairs (on its own ranks: 3)",
            (),
            "gpu_hardware",
        ),
        (
            "test_pairwise_all_reduce_busbw",
            "pairwise all_reduce: node1+node2 (a, b): wrong data in this pair (rank 2: 8 elements)",
            (),
            "link",
        ),
        ("test_host_copy_bandwidth", "... -> REGRESSED", ("pass", "regressed"), "performance"),
        # every way the storage checks fail (bench/storage.py's StorageError, under the suite's `scratch DIR: `)
        (
            "test_scratch_throughput",
            "Failed: scratch /s: cannot create a directory in /s: No space left on device",
            (),
            "configuration",
        ),
        ("test_scratch_throughput", "Failed: scratch /s: cannot open /s/f: Read-only file system", (), "configuration"),
        (
            "test_scratch_throughput",
            "Failed: scratch /s: writing /s/f: a short write of 0 of 4 bytes (the device is full?)",
            (),
            "configuration",
        ),
        ("test_scratch_throughput", "Failed: scratch /s: reading /s/f back: Permission denied", (), "configuration"),
        (
            "test_scratch_throughput",
            "Failed: scratch /s: flushing /s/f to its device: Input/output error",
            (),
            "storage",
        ),
        (
            "test_scratch_throughput",
            "Failed: scratch /s: writing /s/f failed after 8 of 64 MiB: Input/output error",
            (),
            "storage",
        ),
        (
            "test_checkpoint_write_and_read",
            "Failed: scratch /s: reading the checkpoint /s/c back failed: I/O error",
            (),
            "storage",
        ),
        (
            "test_checkpoint_write_and_read",
            "Failed: scratch /s: the checkpoint /s/c read back differs from what was written: w",
            (),
            "storage",
        ),
        # the run as a whole slower than the node's history (run/ending.py's PACE_TEST_ID, no suite's check)
        (
            "node_pace",
            "the node as a whole: 57 figures, at the median +24.1% ... -> REGRESSED",
            ("regressed",),
            "performance",
        ),
        ("test_pretrain", "the NeMo engine is not installed", (), "software"),
        ("test_something_of_a_site", "AssertionError: no", ("pass",), "unclassified"),
    ],
)
def test_a_failure_gets_the_first_matching_rule(
    test: str, message: str, verdicts: tuple[str, ...], category: str
) -> None:
    fault = TABLE.classify(f"suites/x.py::{test}", message, verdicts).as_dict()
    assert fault["category"] == category
    assert fault["action"] and fault["disposition"] in faults.DISPOSITIONS


def test_a_broken_table_names_the_file_and_what_is_wrong(tmp_path: Path) -> None:
    table = tmp_path / "faults.yaml"
    table.write_text(
        "categories:\n  unclassified: {title: t, action: a, disposition: MONITOR, class: hardware, repair: none}\n"
        "rules:\n  - {category: gone, why: w}\n"
    )
    with pytest.raises(faults.FaultTableError, match=r"faults.yaml: categories used but not defined: gone"):
        faults.load(table)
    table.write_text(
        "categories:\n  unclassified: {title: t, action: a, disposition: PANIC, class: hardware, repair: none}\n"
        "rules: []\n"
    )
    with pytest.raises(faults.FaultTableError, match=r"disposition 'PANIC' is not one of ISOLATE"):
        faults.load(table)
    table.write_text(
        "categories:\n  unclassified: {title: t, action: a, disposition: MONITOR, class: user, repair: none}\n"
        "rules: []\n"
    )
    with pytest.raises(faults.FaultTableError, match=r"class 'user' is not one of hardware, configuration, job_"):
        faults.load(table)
    table.write_text(
        "categories:\n  unclassified: {title: t, action: a, disposition: MONITOR, class: hardware, repair: pray}\n"
        "rules: []\n"
    )
    with pytest.raises(faults.FaultTableError, match=r"repair 'pray' is not one of reboot, gpu_reset, reprovision"):
        faults.load(table)
    # A category written twice (two changes that each added one) would silently lose the first.
    table.write_text(
        "categories:\n  unclassified: {title: t, action: a, disposition: MONITOR, class: hardware, repair: none}\n"
        "  unclassified: {title: u, action: b, disposition: ISOLATE, class: hardware, repair: rma}\nrules: []\n"
    )
    with pytest.raises(faults.FaultTableError, match=r"faults.yaml: 3: duplicate key 'unclassified'"):
        faults.load(table)
