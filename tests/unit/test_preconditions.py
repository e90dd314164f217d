"""The node's GPU preconditions (node/preconditions.py): which one a node does not meet, and which checks depend
on it (pure module; the end-to-end runs are in e2e/test_node_suites.py and e2e/test_suite_runs.py)."""

from __future__ import annotations

import pytest

from pytest_gbvalidate.node import preconditions as pc

BUILD = "torch 2.13.0+cpu, CUDA none: a CPU build"


def test_nvml_that_does_not_load_is_the_cause_whatever_torch_sees() -> None:
    found = pc.unmet("Driver Not Loaded", 0, BUILD)
    assert found == pc.Unmet("nvml", "NVML does not load: Driver Not Loaded")
    assert found.skip_reason() == (
        "not run: the node's GPUs cannot be used (NVML does not load: Driver Not Loaded); "
        "gbvalidate::node_gpus_usable failed"
    )


def test_torch_seeing_none_of_the_gpus_nvml_lists_is_the_cause() -> None:
    assert pc.unmet(8, 0, BUILD) == pc.Unmet("torch_gpus", f"torch sees none of the 8 GPUs NVML lists ({BUILD})")


def test_nvml_listing_no_gpu_is_the_cause() -> None:
    assert pc.unmet(0, 0, BUILD) == pc.Unmet("nvml", "NVML lists no GPU")


@pytest.mark.parametrize(("nvml_gpus", "torch_gpus"), [(8, 8), (8, 7), (4, 8)])
def test_a_node_whose_gpus_can_be_used_meets_them(nvml_gpus: int, torch_gpus: int) -> None:
    """Some GPUs listed and seen: a missing one is the GPU count check's to name, per GPU."""
    assert pc.unmet(nvml_gpus, torch_gpus, BUILD) is None


@pytest.mark.parametrize(
    ("gpu_check", "fixtures", "nvml", "torch_gpus"),
    [
        (True, set(), True, False),  # a gb_gpu check reading NVML: needs the driver, not torch
        (False, {"gpu", "gb_target"}, True, False),  # one case per GPU the SKU promises
        (False, {"gb_telemetry"}, True, False),  # samples the GPUs
        (False, {"gb_gang", "gb_expect"}, True, True),  # starts ranks on the GPUs: needs both
        (False, {"gpus", "numa_map"}, False, False),  # the NUMA map from sysfs: neither
        (False, set(), False, False),
    ],
)
def test_which_checks_depend_on_which_precondition(
    gpu_check: bool, fixtures: set[str], nvml: bool, torch_gpus: bool
) -> None:
    assert pc.Unmet("nvml", "x").blocks(gpu_check, fixtures) is nvml
    assert pc.Unmet("torch_gpus", "x").blocks(gpu_check, fixtures) is torch_gpus


GB200 = pc.Promised("ND_GB200_v6", 4, "GB200")


def test_gpus_of_another_model_are_the_cause_before_their_count() -> None:
    """An H100 node checked as a GB200 one (a wrong --gb-sku): eight GPUs of another model, not four missing."""
    found = pc.unmet(8, 8, BUILD, GB200, ("NVIDIA H100 80GB HBM3",) * 8)
    assert found == pc.Unmet("gpu_model", "they are 'NVIDIA H100 80GB HBM3', not ND_GB200_v6's ('GB200' in the name)")


@pytest.mark.parametrize(("nvml_gpus", "torch_gpus"), [(3, 3), (4, 3), (3, 4)])
def test_fewer_gpus_than_the_sku_promises_to_nvml_or_to_torch_are_the_cause(nvml_gpus: int, torch_gpus: int) -> None:
    found = pc.unmet(nvml_gpus, torch_gpus, BUILD, GB200, ("NVIDIA GB200",) * nvml_gpus)
    assert found == pc.Unmet(
        "gpu_count",
        f"only 3 of the 4 GPUs ND_GB200_v6 promises are there (NVML lists {nvml_gpus}, torch sees {torch_gpus}; "
        f"{BUILD})",
    )


def test_the_sku_s_gpus_all_there_meet_them_and_a_sku_that_promises_nothing_asks_nothing() -> None:
    assert pc.unmet(4, 4, BUILD, GB200, ("NVIDIA GB200",) * 4) is None
    assert pc.unmet(4, 3, BUILD, pc.Promised("SITE"), ("Some GPU",) * 4) is None


@pytest.mark.parametrize(
    ("gpu_check", "fixtures", "model", "count"),
    [
        (True, {"gb_expected"}, False, False),  # a health check reading NVML: it names what is wrong
        (False, {"gpu", "gb_expect"}, True, False),  # a figure judged against the SKU's baseline
        (False, {"gb_gang"}, True, True),  # starts one rank per promised GPU
    ],
)
def test_which_checks_depend_on_the_gpus_model_and_count(
    gpu_check: bool, fixtures: set[str], model: bool, count: bool
) -> None:
    assert pc.Unmet("gpu_model", "x").blocks(gpu_check, fixtures) is model
    assert pc.Unmet("gpu_count", "x").blocks(gpu_check, fixtures) is count
