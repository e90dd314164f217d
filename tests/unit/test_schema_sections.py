"""The health section's NVLink fabric fields (pytest_gbvalidate/baselines/schema_sections.py): multi_node_nvlink,
c2c and nvlink_error_limits, read from a file and refused with the file, line and field when wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gbvalidate import baselines as bl
from pytest_gbvalidate.baselines import schema_sections
from pytest_gbvalidate.node import nvml
from tests.helpers.baseline_files import SECTIONS, write
from tests.helpers.runs import REPO

FABRIC = SECTIONS.replace(
    "  provenance: a public health check\n",
    """\
  multi_node_nvlink: true
  c2c: true
  nvlink_error_limits: {replay: 0, crc_data: 3}
  provenance: a public health check
""",
)


def test_the_fabric_fields_load_and_survive_recording(tmp_path: Path) -> None:
    b = bl.load_baseline(write(tmp_path, FABRIC))
    assert b.health is not None
    assert (b.health.multi_node_nvlink, b.health.c2c) == (True, True)
    assert b.health.nvlink_error_limits == {"replay": 0, "crc_data": 3}
    (tmp_path / "NEW.yaml").write_text(bl.dump_baseline(bl.recorded_baseline("NEW", b, [], "measured")))
    assert bl.load_baseline(tmp_path / "NEW.yaml").health == b.health
    plain = bl.load_baseline(write(tmp_path, SECTIONS)).health
    assert plain is not None and (plain.multi_node_nvlink, plain.c2c, plain.nvlink_error_limits) == (None, None, {})


@pytest.mark.parametrize(
    ("change", "expected_error"),
    [
        (
            ("multi_node_nvlink: true", "multi_node_nvlink: 72"),
            ":10: health.multi_node_nvlink: 72: must be true or false",
        ),
        (("c2c: true", "c2c: 'yes'"), ":11: health.c2c: 'yes': must be true or false"),
        (("replay: 0", "replay: -1"), ":12: health.nvlink_error_limits.replay: -1: must be a count (0 or more)"),
        (("crc_data: 3", "crc_dat: 3"), ":12: health.nvlink_error_limits.crc_dat: unknown field (allowed: crc_data"),
        (("{replay: 0, crc_data: 3}", "0"), ":12: health.nvlink_error_limits: must be a mapping, got int"),
    ],
)
def test_a_wrong_fabric_field_names_file_line_and_field(
    tmp_path: Path, change: tuple[str, str], expected_error: str
) -> None:
    old, new = change
    assert old in FABRIC
    path = write(tmp_path, FABRIC.replace(old, new, 1))
    with pytest.raises(bl.BaselineError) as excinfo:
        bl.load_baseline(path)
    assert str(excinfo.value).startswith(str(path)) and expected_error in str(excinfo.value), str(excinfo.value)


def test_the_limits_name_the_counters_nvml_reads() -> None:
    assert set(nvml.NVLINK_ERROR_COUNTERS) == schema_sections._NVLINK_ERROR_LIMIT_KEYS


def test_the_gb200_baseline_asks_for_the_fabric_imex_c2c_and_clean_links() -> None:
    health = bl.load_baseline(REPO / "baselines" / "ND_GB200_v6.yaml").health
    assert health is not None and (health.multi_node_nvlink, health.c2c) == (True, True)
    assert health.nvlink_error_limits == dict.fromkeys(nvml.NVLINK_ERROR_COUNTERS, 0)
    assert "facebookresearch/gcm" in health.provenance and "dgxc-benchmarking" in health.provenance
    h100 = bl.load_baseline(REPO / "baselines" / "ND_H100_v5.yaml").health
    assert h100 is not None and (h100.multi_node_nvlink, h100.c2c) == (None, None)


THERMAL = SECTIONS.replace("  provenance: a public health check\n", "  thermal_margin_offset_c: -2\n  provenance: x\n")


def test_the_thermal_margin_offset_loads_survives_recording_and_names_its_line_when_wrong(tmp_path: Path) -> None:
    b = bl.load_baseline(write(tmp_path, THERMAL))
    assert b.health is not None and b.health.thermal_margin_offset_c == -2
    (tmp_path / "NEW.yaml").write_text(bl.dump_baseline(bl.recorded_baseline("NEW", b, [], "measured")))
    assert bl.load_baseline(tmp_path / "NEW.yaml").health == b.health
    for wrong in ("-2.5", "'cold'", "true", "-51"):
        path = write(tmp_path, THERMAL.replace("offset_c: -2", f"offset_c: {wrong}"))
        with pytest.raises(bl.BaselineError) as excinfo:
            bl.load_baseline(path)
        line = THERMAL.splitlines().index("  thermal_margin_offset_c: -2") + 1
        shown = {"true": "True"}.get(wrong, wrong)  # as the file's value reads in Python
        said = f"{path}:{line}: health.thermal_margin_offset_c: {shown}: must be whole degrees C from -50 to 50"
        assert str(excinfo.value).startswith(said), str(excinfo.value)


def test_the_gb200_and_h100_baselines_give_nvsentinel_s_thermal_offset() -> None:
    for sku in ("ND_GB200_v6", "ND_H100_v5"):
        health = bl.load_baseline(REPO / "baselines" / f"{sku}.yaml").health
        assert health is not None and health.thermal_margin_offset_c == -2
        assert "NVSentinel ADR-042" in health.provenance
    a100 = bl.load_baseline(REPO / "baselines" / "ND96asr_v4.yaml").health
    assert a100 is not None and a100.thermal_margin_offset_c is None  # A100 has no offset: the check skips
