"""What one test hands the JSON report, carried from wherever the test ran (an xdist worker, or this process) to
the controller that writes the report."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pytest_gbvalidate.report.records import FaultRecord, MeasurementRecord
    from pytest_gbvalidate.report.writer import ListSection, NodeSection


class Payload:
    """What one test hands the JSON report: its measurements, its records of list sections (`telemetry`,
    `suspects`), the node sections (`gpus`, `numa_map`, `gang`) set since the last test, and a failure's fault.
    Made wherever the test runs and carried to the controller as one plain attribute of the test's report, which
    survives xdist's report serialisation (so only plain data: see `as_dict`)."""

    def __init__(self) -> None:
        self.measurements: list[MeasurementRecord] = []
        self.records: list[tuple[ListSection, Any]] = []
        self.sections: dict[NodeSection, Any] = {}
        self.fault: FaultRecord | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "measurements": self.measurements,
            "records": self.records,
            "sections": self.sections,
            "fault": self.fault,
        }


PAYLOAD = pytest.StashKey[Payload]()


def payload(item: pytest.Item) -> Payload:
    return item.stash.setdefault(PAYLOAD, Payload())
