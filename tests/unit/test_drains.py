"""The node's drain log (healthcheck/drains.py): a node drained more than once within a week is a repeat offender,
for a person; a log that is not one is named, never replaced. (The health check draining by it:
unit/test_healthcheck_cli.py, e2e/test_slurm.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_gbvalidate.healthcheck import drains

NOW = 1_800_000_000.0


def test_a_drain_within_the_week_of_another_is_a_repeat_and_old_ones_are_dropped(tmp_path: Path) -> None:
    log = tmp_path / "state" / "drains.json"
    assert drains.read(log) == [] and not drains.repeats([], NOW)
    month_ago = drains.Drain(NOW - 40 * drains.DAY_S, "gbvalidate: [hardware] a: t")
    week_ago = drains.Drain(NOW - 8 * drains.DAY_S, "gbvalidate: [hardware] b: t")
    assert drains.record(log, month_ago) == [month_ago]
    assert drains.record(log, week_ago) == [week_ago]  # 32 days older than it: past what is kept
    assert not drains.repeats(drains.read(log), NOW)  # eight days ago: outside the window
    kept = drains.record(log, drains.Drain(NOW - drains.DAY_S, "gbvalidate: [hardware] c: t"))
    assert len(kept) == 2 and drains.repeats(kept, NOW)
    assert json.loads(log.read_text())["version"] == drains.LOG_VERSION


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("{", "is not JSON"),
        ('{"version": 9, "drains": []}', "`version` 1 and a list `drains` expected"),
        ('{"version": 1, "drains": [{"time_s": "now", "reason": "x"}]}', "drains[0].time_s is not a time"),
        ('{"version": 1, "drains": [{"time_s": 1, "reason": 7}]}', "drains[0].reason is not text"),
        ('{"version": 1, "drains": [{"time_s": NaN, "reason": "x"}]}', "drains[0].time_s is not a time"),
    ],
)
def test_a_log_that_is_not_one_is_named_and_never_replaced(tmp_path: Path, text: str, said: str) -> None:
    log = tmp_path / "drains.json"
    log.write_text(text)
    with pytest.raises(drains.DrainLogError, match=rf"^the drain log {log}"):
        drains.read(log)
    with pytest.raises(drains.DrainLogError) as raised:
        drains.record(log, drains.Drain(NOW, "r"))
    assert said in str(raised.value) and log.read_text() == text
