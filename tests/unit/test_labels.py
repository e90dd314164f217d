"""Scope labels: one formatter for sizes, GPUs and GPU pairs, and its inverse; one for measured numbers."""

from __future__ import annotations

import pytest

from pytest_gbvalidate.labels import gpu_label, gpu_pair_label, number, parse_size_label, size_label


@pytest.mark.parametrize(
    ("size_bytes", "label"),
    [
        (0, "0B"),
        (8, "8B"),
        (1000, "1000B"),
        (1536, "1536B"),  # exact, not rounded to 1.5KiB
        (1024, "1KiB"),
        (3 * 1024, "3KiB"),
        (128 * 2**20, "128MiB"),
        (2**30, "1GiB"),
        (8 * 2**30, "8GiB"),
        (16 * 2**30, "16GiB"),
        (1024 * 2**30, "1024GiB"),
    ],
)
def test_size_labels_round_trip(size_bytes: int, label: str) -> None:
    assert size_label(size_bytes) == label
    assert parse_size_label(label) == size_bytes


def test_the_shipped_baselines_labels_parse() -> None:
    assert [parse_size_label(s) for s in ("128MiB", "1GiB", "8GiB", "16GiB")] == [2**27, 2**30, 2**33, 2**34]


@pytest.mark.parametrize("bad", ["8 GB", "1.5GiB", "GiB", "8gib", "-8B", ""])
def test_bad_size_labels(bad: str) -> None:
    with pytest.raises(ValueError, match="is not a size like 8B"):
        parse_size_label(bad)


def test_gpu_labels() -> None:
    assert gpu_label(3) == "gpu3"
    assert gpu_label(3, "node1") == "node1/gpu3"
    assert gpu_pair_label(0, 1) == "gpu0->gpu1"
    assert gpu_pair_label(7, 2, "node4") == "node4/gpu7->gpu2"


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (1234.0, "1234"),
        (0.012346, "0.01235"),
        (123456.0, "1.235e+05"),
        (2.0, "2"),
        (5, "5"),
        (-0.5, "-0.5"),
        (float("nan"), "nan"),
        (float("inf"), "inf"),
        (float("-inf"), "-inf"),
    ],
)
def test_a_measured_number_has_four_significant_digits_and_nan_and_inf_read_as_text(value: float, shown: str) -> None:
    assert number(value) == shown
    assert number(value) == f"{value:.4g}"  # the format every table and message used before: byte for byte
