"""Fault categories: what an operator does about a failing check. The table is data (`faults.yaml` beside this file):
categories with their action and disposition, and rules that map a failing check to a category. No pytest here."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from pytest_gbvalidate.report.node_verdict import UNCLASSIFIED as UNCLASSIFIED  # where the fault table names it
from pytest_gbvalidate.report.records import ReasonClass
from pytest_gbvalidate.rules.xids import REPAIR_ACTIONS, RepairAction

if TYPE_CHECKING:
    from pytest_gbvalidate.report.records import FaultRecord

TABLE = Path(__file__).with_name("faults.yaml")
DISPOSITIONS = ("ISOLATE", "RESET", "REBOOT", "MONITOR")


@dataclass(frozen=True)
class Category:
    name: str
    title: str
    action: str
    disposition: str  # ISOLATE, RESET, REBOOT or MONITOR: what happens to the node until the action is done
    reason_class: ReasonClass  # whose problem it is: a drain reason starts with it
    repair: RepairAction  # what brings the node back: a drain reason names it beside the category


@dataclass(frozen=True)
class Rule:
    """A failing check matches when each given field matches: `test` (the test function's name, parameters
    left off), `message` (a regular expression searched in the failure's first line), `measurement` (a
    verdict of one of the test's measurements: `fail`, or `regressed` against the earlier report)."""

    category: str
    test: str | None
    message: re.Pattern[str] | None
    measurement: str | None
    why: str

    def matches(self, test: str, message: str, verdicts: frozenset[str]) -> bool:
        return (
            (self.test is None or self.test == test)
            and (self.message is None or self.message.search(message) is not None)
            and (self.measurement is None or self.measurement in verdicts)
        )


@dataclass(frozen=True)
class Fault:
    category: Category
    rule: Rule | None  # None: no rule matched (the `unclassified` category)

    def as_dict(self) -> FaultRecord:
        return {
            "category": self.category.name,
            "title": self.category.title,
            "action": self.category.action,
            "disposition": self.category.disposition,
            "reason_class": self.category.reason_class,
            "repair": self.category.repair,
            "why": None if self.rule is None else self.rule.why,
        }


@dataclass(frozen=True)
class FaultTable:
    categories: Mapping[str, Category]
    rules: tuple[Rule, ...]

    def classify(self, test_id: str, message: str | None, verdicts: Iterable[str] = ()) -> Fault:
        """The fault of a failed test: the first rule that matches, else `unclassified`."""
        test = test_id.rsplit("::", 1)[-1].split("[", 1)[0]
        seen = frozenset(verdicts)
        for rule in self.rules:
            if rule.matches(test, message or "", seen):
                return Fault(self.categories[rule.category], rule)
        return Fault(self.categories[UNCLASSIFIED], None)


class FaultTableError(Exception):
    pass


@functools.cache
def load(path: Path = TABLE) -> FaultTable:
    from pytest_gbvalidate.baselines.loading import strict_yaml
    from pytest_gbvalidate.baselines.model import BaselineError

    try:
        data = strict_yaml(path.read_text(encoding="utf-8"))
    except BaselineError as exc:  # a category written twice would silently lose one
        raise FaultTableError(f"{path}: {exc}") from None
    try:
        categories = {name: _category(name, fields) for name, fields in data["categories"].items()}
        rules = tuple(_rule(fields) for fields in data["rules"])
    except (KeyError, TypeError, re.error) as exc:
        raise FaultTableError(f"{path}: {type(exc).__name__}: {exc}") from None
    unknown = sorted({r.category for r in rules} - set(categories))
    unknown += [] if UNCLASSIFIED in categories else [UNCLASSIFIED]
    if unknown:
        raise FaultTableError(f"{path}: categories used but not defined: {', '.join(unknown)}")
    return FaultTable(categories, rules)


def _category(name: str, fields: Mapping[str, Any]) -> Category:
    disposition = str(fields["disposition"])
    if disposition not in DISPOSITIONS:
        raise TypeError(f"{name}: disposition {disposition!r} is not one of {', '.join(DISPOSITIONS)}")
    reason_class = fields["class"]
    if reason_class not in get_args(ReasonClass):
        raise TypeError(f"{name}: class {reason_class!r} is not one of {', '.join(get_args(ReasonClass))}")
    repair = fields["repair"]
    if repair not in REPAIR_ACTIONS:
        raise TypeError(f"{name}: repair {repair!r} is not one of {', '.join(REPAIR_ACTIONS)}")
    return Category(name, str(fields["title"]), str(fields["action"]), disposition, reason_class, repair)


def _rule(fields: Mapping[str, Any]) -> Rule:
    message = fields.get("message")
    return Rule(
        category=str(fields["category"]),
        test=fields.get("test"),
        message=None if message is None else re.compile(str(message), re.IGNORECASE),
        measurement=fields.get("measurement"),
        why=str(fields["why"]),
    )
