"""`--gb-rerun-failed REPORT`: run only the checks that failed in an earlier JSON report of this plugin, as pytest's
`--lf` does from its cache -- but from the report, so it works where the cache is off (`-p no:cacheprovider`, as
the health check runs) and on another machine than the one that failed (healthcheck/confirm.py).

A check is named by its test id as the earlier run wrote it: a failed check this run does not collect is a usage
error naming it, never a run of the others alone. Where a check of the run as a whole failed (`gbvalidate::...`:
node/preconditions.py, run/ending.py), its checks did not run or were all part of it: every check runs again."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gbvalidate.files import InputError, read_json
from pytest_gbvalidate.node.preconditions import PRECONDITIONS_TEST_ID
from pytest_gbvalidate.report import schema

OPTION = "--gb-rerun-failed"
# The test ids of the checks of a run as a whole (PRECONDITIONS_TEST_ID, ending.PACE_TEST_ID): none is collected.
RUN_CHECKS = PRECONDITIONS_TEST_ID.split("::")[0] + "::"


def failed_checks(path: Path) -> frozenset[str] | None:
    """The test ids that failed in the report at `path`; None where every check is to run again. A report that
    cannot be read is a usage error naming the file and the field."""
    try:
        report = read_json(path)
    except InputError as exc:
        raise pytest.UsageError(f"{OPTION} {exc}") from None
    problem = schema.problem(report)
    if problem is not None:
        raise pytest.UsageError(f"{OPTION} {path}: {problem}")
    failed = frozenset(t["test_id"] for t in report["tests"] if t["outcome"] == "failed")
    if not failed:
        raise pytest.UsageError(f"{OPTION} {path}: no check failed in that run: nothing to run again")
    return None if any(test_id.startswith(RUN_CHECKS) for test_id in failed) else failed


def select(config: pytest.Config, items: list[pytest.Item], failed: frozenset[str] | None) -> None:
    """Deselect every check but `failed` (counted in pytest's summary line, as -k deselects); None: keep all. A
    failed check not among `items` is a usage error naming it."""
    if failed is None:
        return
    missing = sorted(failed - {item.nodeid for item in items})
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise pytest.UsageError(
            f"{OPTION}: {len(missing)} failed check(s) of that run not collected here: {shown} (renamed or removed "
            "since, or not under the paths given: give the same paths and rootdir as that run)"
        )
    kept = [item for item in items if item.nodeid in failed]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if item.nodeid not in failed])
        items[:] = kept
