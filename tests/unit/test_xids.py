"""Unit tests of NVIDIA's Xid catalog as the plugin ships it and of the rule that judges a GPU's Xid events over a
window (pytest_gbvalidate/rules/xids.py), with property tests for the rule's promises."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_gbvalidate.baselines.loading import strict_yaml
from pytest_gbvalidate.rules import xids
from pytest_gbvalidate.rules.xids import XidEvent

GPU = (8, 1, 0)
CATALOG = xids.load()


def event(code: int, seq: int, time_s: float | None = None, text: str = "x") -> XidEvent:
    line = f"NVRM: Xid (PCI:0008:01:00): {code}, pid=1, name=python, {text}"
    return XidEvent(GPU, code, line, seq, float(seq) if time_s is None else time_s)


# --- the catalog ------------------------------------------------------------------------------------------------


def test_every_code_of_the_catalog_has_an_action_and_a_repair() -> None:
    assert sorted(CATALOG.codes) == list(range(1, 173))  # NVIDIA's catalog of 2025-10-29: Xid 1 to 172
    for entry in CATALOG.codes.values():
        assert entry.policy.action in xids.XID_ACTIONS and entry.policy.repair in xids.REPAIR_ACTIONS, entry
        assert entry.policy.why, entry
        assert (entry.policy.action == "drain") == (entry.policy.repair not in ("none", "fix_job")), entry
    text = xids.CATALOG.read_text(encoding="utf-8")
    assert strict_yaml(text) == yaml.safe_load(text)  # no key written twice (safe_load would keep the last)
    assert "2025-10-29" in CATALOG.provenance and "catalog_generated.go" in CATALOG.provenance


@pytest.mark.parametrize(
    ("codes", "action", "repair"),
    [
        ((144, 145, 146, 147, 148, 149, 150), "drain", "reboot"),  # Blackwell NVLink5
        ((48, 62, 64, 74, 95, 109, 110, 119, 120, 136, 140, 143, 155, 156, 158), "drain", "gpu_reset"),
        ((79,), "drain", "reboot"),  # RESTART_BM, then CONTACT_SUPPORT
        ((13, 31, 45, 68, 69, 80, 94), "job", "fix_job"),  # the application's
        ((63, 92, 43, 154), "ignore", "none"),  # IGNORE (63: a row-remap event); 154: the recovery action check
        ((56, 57, 58, 65, 73, 81), "ignore", "none"),  # unused by current drivers
        ((162, 167), "warn", "none"),  # listed with no resolution yet
    ],
)
def test_what_the_catalog_calls_for(codes: tuple[int, ...], action: str, repair: str) -> None:
    assert {(c, CATALOG.code(c).policy.action, CATALOG.code(c).policy.repair) for c in codes} == {
        (c, action, repair) for c in codes
    }


def test_a_code_the_catalog_does_not_know_is_reported_never_drained() -> None:
    entry = CATALOG.code(999)
    assert (entry.policy.action, entry.name) == ("warn", "UNKNOWN")
    assert "health.xid_actions" in entry.policy.why


def test_a_site_sets_its_own_action_for_a_code() -> None:
    site = CATALOG.with_actions({13: "drain", 95: "warn", 63: "job"}, "the site's baseline")
    assert site.code(13).policy == xids.Policy("drain", "gpu_reset", "set to drain by the site's baseline")
    assert (site.code(95).policy.action, site.code(95).policy.repair) == ("warn", "none")
    assert site.code(63).policy.repair == "fix_job"
    assert CATALOG.code(13).policy.action == "job"  # the shipped catalog is unchanged
    newer = CATALOG.with_actions({175: "drain"}, "the site's baseline").code(175)  # a driver newer than the catalog
    assert (newer.name, newer.policy.action, newer.policy.repair) == ("UNKNOWN", "drain", "gpu_reset")


def test_a_broken_catalog_is_one_line_naming_the_file_and_field(tmp_path: Path) -> None:
    text = xids.CATALOG.read_text(encoding="utf-8")
    broken = tmp_path / "catalog.yaml"
    broken.write_text(
        text.replace("RESET_GPU: {action: drain, repair: gpu_reset", "RESET_GPU: {action: drain, repair: reset")
    )
    with pytest.raises(
        xids.CatalogError, match=r"catalog\.yaml: resolutions\.RESET_GPU\.repair: 'reset' is not one of"
    ):
        xids.load(broken)
    broken.write_text(text.replace("  - {code: 2,", "  - {code: 1,"))
    with pytest.raises(xids.CatalogError, match=r"catalog\.yaml: codes: Xid 1 is listed twice"):
        xids.load(broken)
    broken.write_text("codes: [")
    with pytest.raises(xids.CatalogError, match=r"^.*catalog\.yaml: \w*Error: ") as raised:
        xids.load(broken)
    assert "\n" not in str(raised.value).strip() or "line" in str(raised.value)


# --- judging a GPU's events -------------------------------------------------------------------------------------


def test_an_nvlink5_xid_drains_with_its_repair_and_says_what_it_saw() -> None:
    seen = [event(145, 10, 100.0, "RLW_RXPIPE Nonfatal XC0 i0 Link 13"), event(145, 11, 100.5, "other link")]
    (finding,) = xids.judge(seen, CATALOG, None, None, now_s=200.0)
    assert finding.drains and finding.policy.repair == "reboot"
    assert finding.describe() == (
        "Xid 145 NVLINK_RLW_ERROR (WORKFLOW_NVLINK5_ERR): 2 lines (2 distinct) in 1 burst, 100.0-100.5 s after boot; "
        "repair: reboot"
    )


def test_an_event_before_the_last_clean_check_is_never_judged_again() -> None:
    seen = [event(79, 5), event(13, 6)]
    assert [f.entry.code for f in xids.judge(seen, CATALOG, None, None, 100.0)] == [13, 79]
    assert xids.judge(seen, CATALOG, after_seq=6, floor_seq=None, now_s=100.0) == []


def test_a_burst_of_ten_thousand_identical_lines_is_one_finding_fast() -> None:
    seen = [event(95, i, 50.0 + i / 1000, "Uncontained memory error") for i in range(10_000)]
    started = time.perf_counter()
    (finding,) = xids.judge(seen, CATALOG, None, None, 100.0)
    assert time.perf_counter() - started < 2.0  # about 20 ms here; generous for a busy CI machine
    assert (finding.lines, finding.distinct, finding.bursts, finding.drains) == (10_000, 1, 1, True)


def test_a_jobs_xid_is_the_jobs_until_it_repeats_on_the_gpu() -> None:
    gap = CATALOG.burst_gap_s
    four = [event(13, i, 1000.0 + i * (gap + 1)) for i in range(4)]
    (alone,) = xids.judge(four, CATALOG, None, None, now_s=5000.0)
    assert (alone.policy.action, alone.bursts) == ("job", 4)
    five = [*four, event(13, 4, 1000.0 + 4 * (gap + 1))]
    (repeated,) = xids.judge(five, CATALOG, after_seq=3, floor_seq=None, now_s=5000.0)  # across clean checks
    assert (repeated.drains, repeated.policy.repair, repeated.bursts) == (True, "gpu_reset", 5)
    assert "NVSentinel" in repeated.policy.why
    day_later = 1000.0 + 4 * (gap + 1) + 24 * 3600 + 1
    assert not any(f.drains for f in xids.judge(five, CATALOG, None, None, now_s=day_later + 1000))
    assert xids.judge(five, CATALOG, None, floor_seq=4, now_s=5000.0) == []  # a repair acknowledged


def test_bursts_are_counted_by_the_gap_between_lines() -> None:
    assert xids.bursts([], 180) == 0
    assert xids.bursts([None, None], 180) == 1
    assert xids.bursts([0.0, 100.0, 279.0, 460.0, 10.0], 180) == 2
    assert xids.bursts([0.0, None, 1000.0], 180) == 2


codes = st.sampled_from([13, 31, 45, 48, 63, 79, 92, 95, 140, 145, 999])


@st.composite
def logs(draw: st.DrawFn) -> list[XidEvent]:
    times = draw(st.lists(st.floats(0, 90_000, allow_nan=False), max_size=30))
    return [event(draw(codes), seq, t) for seq, t in enumerate(sorted(times))]


@settings(max_examples=150, deadline=None)
@given(logs(), st.integers(-1, 31), st.integers(-1, 31), st.floats(90_000, 200_000))
def test_property_what_drains(seen: list[XidEvent], after: int, floor: int, now_s: float) -> None:
    findings = xids.judge(seen, CATALOG, after, floor, now_s)
    for f in findings:
        judged = [e for e in seen if e.xid == f.entry.code and e.seq is not None and e.seq > floor]
        assert judged, f  # nothing at or before an acknowledged repair is judged
        if f.entry.policy.action in ("ignore", "warn"):
            assert not f.drains  # an IGNORE, unused or unknown code never fails the node
        if f.entry.policy.action == "job":
            recent = [e.time_s for e in judged if now_s - (e.time_s or 0) <= CATALOG.escalation.within_s]
            assert f.drains == (xids.bursts(recent, CATALOG.burst_gap_s) >= CATALOG.escalation.bursts)
        if f.entry.policy.action == "drain":
            assert f.drains and any(e.seq is not None and e.seq > after for e in judged)  # judged once
    drained = {f.entry.code for f in findings if f.entry.policy.action == "drain"}
    fresh = {e.xid for e in seen if e.seq is not None and e.seq > max(after, floor)}
    assert drained == {c for c in fresh if CATALOG.code(c).policy.action == "drain"}
