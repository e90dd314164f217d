"""`fleet summary --confirm`: a failed node is taken out only for the checks that failed again in a second run of
them on the node (`pytest ... --gb-rerun-failed=ITS_REPORT`, the fleet recipe's confirm step): Azure's runbook
for its health checks drains only what still fails after a second run. A check that passed the second time is
flapping: listed, never drained, and counted where the node's history is (`fleet offenders`). A failed node with no
second run here, or whose checks the second run neither failed nor passed (skipped, too noisy, not collected), is
not confirmed: no verdict, no drain line, and the summary fails saying so (the health check's rule, healthcheck/
confirm.py, on reports). Pure: no I/O."""

from __future__ import annotations

from typing import Protocol

from pytest_gbvalidate.fleet.findings import FailedCheck
from pytest_gbvalidate.fleet.reports import Report

NO_SECOND_RUN = "no second run of its failed checks here (pytest --gb-rerun-failed=ITS_REPORT)"


class Confirmed(Protocol):
    """What the rule sets on a failed node (fleet/summary.py's Node)."""

    failed: list[FailedCheck]
    flapping: list[str]
    unconfirmed: str | None


def apply(node: Confirmed, again: Report | None) -> None:
    """Keep the node's failed checks that `again` (the second run of them) failed too; the ones it passed go to
    `flapping`; where none is kept and some neither failed nor passed, say why in `unconfirmed`."""
    if again is None:
        node.unconfirmed = NO_SECOND_RUN
        return
    failed_again = {t["test_id"] for t in again.tests if t["outcome"] == "failed"}
    passed = {t["test_id"] for t in again.tests if t["outcome"] == "passed" and t["when"] == "call"} - failed_again
    kept = [c for c in node.failed if c.test_id in failed_again]
    node.flapping = [c.name for c in node.failed if c.test_id in passed]
    untold = [c.name for c in node.failed if c.test_id not in failed_again | passed]
    node.failed = kept
    if not kept and untold:
        node.unconfirmed = f"its second run ({again.path}) did not say again: {', '.join(untold)}"
