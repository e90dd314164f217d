"""pytest_gbvalidate/fleet/domains.py: the NVLink domain as a unit. The rule as a property over domains and
failures, and the fleet summary's command on node reports whose GPU inventory places them in domains."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from hypothesis import given
from hypothesis import strategies as st

from pytest_gbvalidate.fleet.cli import main
from pytest_gbvalidate.fleet.domains import FABRIC_CATEGORY, domain_findings
from pytest_gbvalidate.fleet.findings import FailedCheck
from pytest_gbvalidate.fleet.reports import Report
from tests.helpers.fleet_reports import write
from tests.helpers.healthcheck import FAULT
from tests.helpers.reports import minimal_report

RACK_A = "1e6c5a7d-2b3f-4c8e-9a01-5d2f7b9c4e60/32766"
RACK_B = "7f00aa11-0000-4c8e-9a01-5d2f7b9c4e61/1"


class _Node:
    def __init__(self, host: str, domain: str | None, fabric_failed: bool) -> None:
        data = cast(Any, {"status": "finished", "node": {"hostname": host}})
        self.report = Report(Path(f"{host}.json"), data, 0, domain)
        category = FABRIC_CATEGORY if fabric_failed else "link"
        self.failed = [FailedCheck(f"t.py::test_{category}", "m", category, None, None)] if fabric_failed else []


@given(
    st.lists(st.tuples(st.sampled_from([RACK_A, RACK_B, None]), st.booleans()), max_size=12),
)
def test_a_domain_speaks_as_one_exactly_where_most_of_its_nodes_fail_their_fabric_checks(
    nodes: list[tuple[str | None, bool]],
) -> None:
    given_nodes = [_Node(f"n{i:02d}", domain, failed) for i, (domain, failed) in enumerate(nodes)]
    found = {f.domain: f for f in domain_findings(given_nodes)}
    for domain in (RACK_A, RACK_B):
        members = [n for n in given_nodes if n.report.nvlink_domain == domain]
        failing = [n for n in members if n.failed]
        assert (domain in found) == (len(members) >= 2 and 2 * len(failing) > len(members))
        if domain in found:
            assert found[domain].hosts == tuple(n.report.hostname for n in members)  # every node: a unit
            assert found[domain].failing == tuple(n.report.hostname for n in failing)
    assert None not in found  # a node in no domain is its own


def _gb200_report(host: str, domain: str, fabric_failed: bool) -> dict[str, Any]:
    cluster, clique = domain.split("/")
    report = minimal_report()
    report["node"]["hostname"] = host
    devices = [{"index": i, "fabric_cluster_uuid": cluster, "fabric_clique_id": int(clique)} for i in range(4)]
    report["gpus"] = {"count": 4, "devices": devices, "failed": {}, "nvml_error": None}
    test: dict[str, Any] = {"test_id": "test_health.py::test_nvlink_fabric[gpu0]", "when": "call", "outcome": "passed"}
    test |= {"duration_s": 0.1, "message": None, "text": None}
    if fabric_failed:
        test |= {"outcome": "failed", "message": "registration failed", "fault": FAULT | {"category": FABRIC_CATEGORY}}
        report["exit_status"] = 1
    report["tests"].append(test)
    return report


def test_the_summary_takes_a_failing_domain_out_as_a_unit_and_a_lone_failure_by_itself(
    tmp_path: Path, capsys: Any
) -> None:
    """Rack A: 3 of its 4 nodes fail the fabric check -- one finding, and all 4 drain, the passing one too. Rack B:
    1 of 2 fails -- its own node, drained alone."""
    paths = [
        write(tmp_path, f"{host}.json", _gb200_report(host, domain, failed))
        for host, domain, failed in [
            ("gb-a0", RACK_A, True),
            ("gb-a1", RACK_A, True),
            ("gb-a2", RACK_A, True),
            ("gb-a3", RACK_A, False),
            ("gb-b0", RACK_B, True),
            ("gb-b1", RACK_B, False),
        ]
    ]
    code = main(["summary", *map(str, paths), "--out", str(tmp_path / "out"), "--max-drain-pct", "100"])
    out = capsys.readouterr().out
    assert code == 1
    assert (
        f"NVLink domain {RACK_A}: 3 of its 4 nodes here fail their fabric checks together (gb-a0, gb-a1, gb-a2): "
        "check the domain's NVLink switch trays and its fabric manager; its 4 nodes are taken out as a unit"
    ) in out
    assert "1 NVLink domain(s) fail their fabric checks together" in out
    drains = [line.strip() for line in out.splitlines() if line.strip().startswith("scontrol update")]
    unit = "gbvalidate: [hardware] nvlink domain 1e6c5a7d/32766 fails: 3 of 4 nodes"
    assert drains == [
        f"scontrol update nodename=gb-a0 state=drain reason='{unit}; nvlink_fabric: test_nvlink_fabric[gpu0]'",
        f"scontrol update nodename=gb-a1 state=drain reason='{unit}; nvlink_fabric: test_nvlink_fabric[gpu0]'",
        f"scontrol update nodename=gb-a2 state=drain reason='{unit}; nvlink_fabric: test_nvlink_fabric[gpu0]'",
        f"scontrol update nodename=gb-a3 state=drain reason='{unit}'",
        "scontrol update nodename=gb-b0 state=drain reason='gbvalidate: [hardware] nvlink_fabric: "
        "test_nvlink_fabric[gpu0]'",
    ]
    page = (tmp_path / "out" / "summary.md").read_text()
    assert "## NVLink domains" in page and "its 4 nodes are taken out as a unit" in page
    assert "kubectl label nodes gb-a3 gbvalidate/fault=nvlink_fabric --overwrite" in out
