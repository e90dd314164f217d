"""report/records.py and report/schema.py: the records as a JSON Schema (checked with the jsonschema library) and
the readers' own check, which must agree with it."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonschema
import pytest

from pytest_gbvalidate.report.records import REPORT_VERSION
from pytest_gbvalidate.report.schema import SCHEMA_FILE, json_schema, problem
from tests.helpers.reports import minimal_report


def a_report() -> dict[str, Any]:
    """A finished report of a run over two nodes."""
    gang = {"kind": "world", "world_size": 8, "device_type": "cuda", "nodes": 2, "failed_starts": []}
    hosts = [{"node_rank": 0, "hostname": "node7"}, {"node_rank": 1, "hostname": "node8"}]
    return minimal_report() | {"gang": gang | {"hosts": hosts}}


def test_the_shipped_schema_is_the_one_the_records_make() -> None:
    """Regenerate with `python -m pytest_gbvalidate.report.schema > pytest_gbvalidate/report/report.schema.json`."""
    assert json.loads(SCHEMA_FILE.read_text()) == json_schema()
    jsonschema.Draft202012Validator.check_schema(json_schema())
    assert json_schema()["properties"]["report_version"] == {"const": REPORT_VERSION}


def test_a_report_as_the_writer_makes_it_fits_the_strict_schema_and_the_readers_check() -> None:
    report = a_report()
    jsonschema.validate(report, json_schema(strict=True))
    assert problem(report) is None


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda r: r.pop("report_version"), "report_version is missing, not 2"),
        (lambda r: r.update(report_version=1), "report_version is 1, not 2"),
        (lambda r: r.update(status="done"), "status is 'done', not one of 'running', 'finished', 'interrupted'"),
        (lambda r: r.pop("measurements"), "measurements is missing"),
        (
            lambda r: r["measurements"][0].update(value=[1]),
            "measurements[0].value is a list, not number or text or null",
        ),
        (lambda r: r["measurements"][0].update(value=True), "measurements[0].value is true/false, not number or text"),
        (lambda r: r["measurements"][0].pop("metric"), "measurements[0].metric is missing"),
        (lambda r: r["measurements"][0].update(details=[]), "measurements[0].details is a list, not an object"),
        (lambda r: r["tests"][0].update(duration_s="1"), "tests[0].duration_s is text, not number"),
        (lambda r: r["gang"]["hosts"][1].update(node_rank="1"), "gang.hosts[1].node_rank is text, not an integer"),
        (lambda r: r["gang"].update(hosts=["node0 (node7)"]), "gang.hosts[0] is text, not an object"),
        (lambda r: r["node"].pop("hostname"), "node.hostname is missing"),
        (lambda r: r.update(sku="cpu"), "sku is text, not an object or null"),
    ],
)
def test_the_readers_check_names_the_first_field_that_does_not_fit_and_the_schema_agrees(
    change: Any, named: str
) -> None:
    report = a_report()
    change(report)
    assert problem(report) is not None and problem(report).startswith(named)  # type: ignore[union-attr]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(report, json_schema())


def test_a_field_a_later_version_adds_is_left_to_readers_and_only_the_strict_schema_refuses_it() -> None:
    report = a_report()
    later = copy.deepcopy(report) | {"history": []}
    later["measurements"][0]["new_field"] = 1
    assert problem(later) is None
    jsonschema.validate(later, json_schema())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(later, json_schema(strict=True))


def test_not_an_object_is_said_plainly() -> None:
    assert problem([1, 2]) == "not a JSON object but a list"
    assert problem({"schema": "pytest-gbvalidate/report/1"}) == (
        "report_version is missing, not 2 (a report of version 1 says `schema`)"
    )
