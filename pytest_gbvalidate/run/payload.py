"""What one test hands the JSON report, carried from wherever the test ran (an xdist worker, or this process) to
the controller that writes the report: both ends here, so its fields are spelled once."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pytest_gbvalidate.report.records import FaultRecord, MeasurementRecord
    from pytest_gbvalidate.report.writer import ListSection, NodeSection

# The test report's attribute that carries it: one plain attribute survives xdist's report serialisation.
ATTRIBUTE = "gb_payload"


@dataclass
class Payload:
    """What one test hands the JSON report: its measurements, list sections' records, the node sections set since
    the last test, and a failure's fault. Plain data only: it travels as a dict of its fields."""

    measurements: list[MeasurementRecord] = field(default_factory=list)
    records: list[tuple[ListSection, Any]] = field(default_factory=list)
    sections: dict[NodeSection, Any] = field(default_factory=dict)
    fault: FaultRecord | None = None

    def attach(self, report: pytest.TestReport) -> None:
        """Where the test ran: onto its report, when it carries anything."""
        carried = {f.name: getattr(self, f.name) for f in fields(self)}
        if any(carried.values()):
            setattr(report, ATTRIBUTE, carried)

    @classmethod
    def carried(cls, report: pytest.TestReport) -> Payload:
        """On the controller: what the report carries (nothing, for a report without it). A record's section
        comes back from xdist's serialisation as a list: the pairs are tuples again."""
        data: dict[str, Any] = getattr(report, ATTRIBUTE, None) or {}
        found = cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})
        found.records = [(section, record) for section, record in found.records]
        return found


PAYLOAD = pytest.StashKey[Payload]()


def payload(item: pytest.Item) -> Payload:
    return item.stash.setdefault(PAYLOAD, Payload())
