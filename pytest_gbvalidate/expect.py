"""`gb_expect`: a measurement checked against the SKU's baseline inside the test that made it, and recorded in
the reports whatever the verdict."""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import pytest

from pytest_gbvalidate.hooks import GbValidateWarning as GbValidateWarning  # its documented place
from pytest_gbvalidate.metrics import CATALOG, MetricSpec
from pytest_gbvalidate.report.junit_properties import junit_properties
from pytest_gbvalidate.report.records import FAIL, INFO, PASS, RECORDED, SKIP, UNRESOLVED, WARN, MeasurementRecord
from pytest_gbvalidate.report.writer import json_safe, utc_now
from pytest_gbvalidate.rules import noise as nz
from pytest_gbvalidate.rules import resolution as rs
from pytest_gbvalidate.rules import sampling

if TYPE_CHECKING:
    from pytest_gbvalidate import baselines as bl
    from pytest_gbvalidate.report.records import Verdict as VerdictWord
    from pytest_gbvalidate.run.session import GbSession


# What an unresolved figure's failure line starts with: the fault table's `unresolved` category matches it.
UNRESOLVED_PREFIX = "UNRESOLVED: "
Figures = Mapping[str, tuple[float, Mapping[str, Any]]]  # label -> (value, details): the devices of one node


class Judged(NamedTuple):
    """A measurement judged (Expect._judge), nothing stored or raised yet: its record (with its `compare` section),
    its reference's verdict, the verdict word and message the record gets, the lines that fail its test (None:
    nothing), and the reason it skips where nothing gates it."""

    record: MeasurementRecord
    verdict: bl.Verdict | None
    word: VerdictWord
    message: str
    failures: tuple[str | None, ...] = ()
    skip: str | None = None

    @property
    def flagged(self) -> bool:
        """Whether a second pass could change its verdict: judged other than PASS by its reference, or regressed or
        unresolved against the earlier report."""
        earlier = self.record.get("compare", {}).get("verdict")
        return (self.verdict is not None and self.verdict.verdict != PASS) or earlier in ("regressed", "unresolved")

    @property
    def unresolved(self) -> bool:
        """Whether it is too noisy to judge against its baseline or the earlier report: what more evidence settles."""
        return self.word == UNRESOLVED or self.record.get("compare", {}).get("verdict") == "unresolved"


class Measured(NamedTuple):
    """One measurement handed to `gb_expect.each`, in gb_expect's own order: metric, value, scope, details."""

    metric: str
    value: float
    scope: str
    details: Mapping[str, Any]


class Expect:
    """`gb_expect(metric, value, scope=...)`: compare a measurement with the SKU baseline inside the test that
    measured it. Fails the test below the fail limit, warns in the warn band, fails it as UNRESOLVED where its
    evidence is too noisy for the resolution its metric needs (rules/resolution.py), skips (or, with --gb-strict,
    fails) when the baseline has no reference for it. Every call is recorded in the reports, whatever the
    verdict, with its noise (rules/noise.py: given, or from its details' `samples_<unit>` / `passes`) and resolution."""

    def __init__(self, gb: GbSession, item: pytest.Item) -> None:
        self.gb = gb
        self.item = item

    def __call__(
        self,
        metric: str,
        value: float,
        scope: str = "node",
        *,
        spec: MetricSpec | None = None,
        details: Mapping[str, Any] | None = None,
        noise: nz.Noise | None = None,
    ) -> bl.Verdict | None:
        judged = self._judge(Measured(metric, float(value), scope, details or {}), spec, noise)
        self._store(judged.record, judged.word, judged.message, judged.verdict)
        _fail_with(*judged.failures)
        if judged.skip is not None:
            # Reported at the test's own location, as a skip marker would be, not at this line.
            raise pytest.skip.Exception(judged.skip, _use_item_location=True)
        if judged.word == WARN:
            # Attributed to the test itself, however deep the helper that measured it sits.
            path, line, _ = self.item.location
            warnings.warn_explicit(GbValidateWarning(judged.message), GbValidateWarning, path, (line or 0) + 1)
        return judged.verdict

    def _judge(self, measured: Measured, spec: MetricSpec | None = None, noise: nz.Noise | None = None) -> Judged:
        """A measurement judged against its reference and --gb-compare's report, nothing stored or raised: what
        gb_expect then keeps and does, and what measure_again asks before it measures again."""
        from pytest_gbvalidate import baselines as bl
        from pytest_gbvalidate.baselines.verdicts import resolution_of

        target, (metric, value, scope, _) = self.gb.target, measured
        spec, ref, record = self._record(measured, spec, noise)
        regressed = self._compare(record, ref)
        if ref is not None and (ref.unit, ref.direction) != (spec.unit, spec.direction):
            reason = f"{metric}: measured in {spec.unit} ({spec.direction} is better) but the baseline says "
            reason += f"{ref.unit} ({ref.direction} is better) in {target.baseline_file}"
            return Judged(record, None, FAIL, reason, (reason,))
        if ref is None or not ref.has_reference:
            if self.gb.settings.record.value is not None:
                return Judged(record, None, RECORDED, "recorded, no baseline to compare with", (regressed,))
            if target.baseline is None or metric not in target.baseline.metrics:
                reason = f"{target.sku} baseline has no {metric}"
            elif ref is None:
                reason = f"{target.sku} baseline has no {metric} value for {scope}"
            else:
                reason = (
                    f"{target.sku} baseline for {metric} is provisional with no reference value yet ({ref.provenance})"
                )
            if self.gb.settings.strict.value:
                return Judged(record, None, FAIL, reason, (f"{reason} (--gb-strict)", regressed), reason)
            return Judged(record, None, SKIP, reason, (regressed,), reason)
        verdict = bl.compare(ref, value, scope, resolution_of(nz.from_record(record.get("noise")), ref))
        if verdict.verdict == UNRESOLVED:
            verdict = dataclasses.replace(verdict, noise_note=verdict.noise_note + _sampled(record["details"]))
        missed = {FAIL: verdict.message, UNRESOLVED: f"{UNRESOLVED_PREFIX}{verdict.message}"}
        return Judged(record, verdict, verdict.verdict, verdict.message, (missed.get(verdict.verdict), regressed))

    def record(
        self,
        metric: str,
        value: float,
        scope: str = "node",
        *,
        spec: MetricSpec | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        """Keep a measurement in the reports without comparing it with anything (verdict `info`): the sizes of
        a sweep that the baseline does not gate, so every measured size is reported."""
        _, ref, record = self._record(Measured(metric, float(value), scope, details or {}), spec)
        self._compare(record, ref)  # reported, never failing: the baseline does not gate this scope
        self._store(record, INFO, "measured; not gated at this scope")

    def not_measured(
        self, metric: str, reason: str, scope: str = "node", *, gated: bool, details: Mapping[str, Any] | None = None
    ) -> None:
        """Keep, in the reports, a measurement that was planned but not taken (a sweep size too large for the
        free memory): verdict `fail` where the scope is gated (the caller fails the test), else `info`."""
        _, _, record = self._record(Measured(metric, math.nan, scope, details or {}), taken=False)
        self._store(record, FAIL if gated else INFO, f"not run: {reason}")

    def suspect(self, host: str, why: str) -> None:
        """A node of a multi-node run that this check finds at fault, for the report's `suspects` section, with
        its fault category: the fleet summary puts it on the drain list (its own report may show nothing)."""
        from pytest_gbvalidate import faults

        fault = faults.load().classify(self.item.nodeid, why).as_dict()
        entry = {"test_id": self.item.nodeid, "host": host, "why": why, "fault": fault}
        self.gb.add_report_record(self.item, "suspects", entry)

    def _record(
        self, measured: Measured, spec: MetricSpec | None = None, noise: nz.Noise | None = None, taken: bool = True
    ) -> tuple[MetricSpec, bl.Reference | None, MeasurementRecord]:
        """The metric's spec (built-in, given, or the baseline's), its reference, and the measurement's report
        record, its verdict `info` until _store gives it the one it gets; with no value where it was not `taken`."""
        metric, value, scope, details = measured
        ref = self.gb.target.reference(metric, scope)
        spec = spec or CATALOG.get(metric) or _spec_from(ref)
        if spec is None:
            raise TypeError(f"{metric!r} is not a built-in metric: pass spec=MetricSpec(...) to say its unit")
        record = MeasurementRecord(
            test_id=self.item.nodeid,
            metric=metric,
            scope=scope,
            scope_kind=spec.scope_kind,
            value=json_safe(value) if taken else None,
            unit=spec.unit,
            direction=rs.direction_of(spec.direction),
            details=dict(details or {}),
            verdict=INFO,
            message="",
        )
        noise = noise or nz.from_details(dict(details or {}))
        if noise is not None and taken:
            record["noise"] = noise.as_record()
        return spec, ref, record

    def _compare(self, record: MeasurementRecord, ref: bl.Reference | None) -> str | None:
        """With --gb-compare: the measurement against the node's earlier report, kept in the record's `compare` section;
        the message where it regressed or is too noisy to tell (UNRESOLVED_PREFIX), else None."""
        comparison = self.gb.comparison
        if comparison is None:
            return None
        from pytest_gbvalidate import baselines as bl
        from pytest_gbvalidate import compare as cmp

        (earlier, same_node), baseline = comparison, self.gb.target.baseline
        # The change allowed: the resolution the measurement's reference needs, else its SKU's.
        needed = ref.needed if ref is not None else bl.DEFAULT_NEEDED if baseline is None else baseline.resolution
        allowed = self.gb.settings.compare_fail.value or cmp.AllowedRegression()
        section = cmp.compare_one(earlier, record, allowed, needed, same_node, utc_now())
        if section is None:
            return None
        record["compare"] = section
        if section["verdict"] == cmp.UNRESOLVED:
            section["message"] += _sampled(record["details"])
            return f"{UNRESOLVED_PREFIX}{section['message']}"
        return str(section["message"]) if section["verdict"] == cmp.REGRESSED else None

    def each(
        self,
        measurements: Sequence[Measured],
        problems: Sequence[str] = (),
        again: Callable[[], Sequence[Measured]] | None = None,
    ) -> None:
        """`gb_expect(metric, value, scope=..., details=...)` for every Measured(metric, value, scope, details), all
        recorded before the test fails with the `problems` the caller found (wrong data, a port that could not be
        measured) and every missed gate in one message. Without a failure it skips only when no measurement had a
        reference: a provisional metric beside a gated one does not hide the gated one. `again`: measure_again's."""
        measurements = [_measured(m) for m in measurements]
        if again is not None:
            measurements = self.measure_again(measurements, again)
        failures = list(problems)
        skip: BaseException | None = None
        compared = False
        for metric, value, scope, details in measurements:
            try:
                self(metric, value, scope, details=details)
                compared = True
            except pytest.fail.Exception as exc:
                failures.append(str(exc.msg))
            except pytest.skip.Exception as exc:
                skip = skip or exc
        _fail_with(*failures)
        if skip is not None and not compared:
            raise skip

    def siblings(
        self, metric: str, figures: Figures, of: str = "GPU", again: Callable[[], Figures] | None = None
    ) -> None:
        """Each device's figure of `metric` (label -> (value, details), the devices of one node) against its
        siblings': fails naming every device behind them by rules/outliers.py's sibling rule, whatever the baseline
        says -- on day one most figures have none, and a GPU 25% behind its seven siblings is a GPU to look at.
        `again` measures every device once more before one is named (outliers.sibling_verdict)."""
        from pytest_gbvalidate.rules import outliers

        if len(figures) < outliers.MIN_NODES:
            pytest.skip(f"{metric}: {len(figures)} {of}(s) measured; telling one apart needs {outliers.MIN_NODES}")
        direction = self.direction(metric, next(iter(figures)))
        found, figures = outliers.sibling_verdict(figures, direction, again)
        values = {label: float(value) for label, (value, _) in figures.items()}
        center = outliers.spread(list(values.values())).median
        unit = (CATALOG.get(metric) or MetricSpec(metric, "", direction, "", "")).unit
        shown = ", ".join(f"{label} {value:.4g}" for label, value in values.items())
        if found:
            lines = [
                f"{metric} [{o.host}]: {o.value:.4g} {unit}, {o.worse_pct or 0:.1f}% behind the node's "
                f"{len(values)} {of}s (median {center:.4g} {unit}; {'; '.join(o.rules)})"
                for o in found
            ]
            pytest.fail("\n".join([*lines, f"every {of}: {shown} {unit}"]), pytrace=False)

    def measure_again(
        self, first: Sequence[Measured], again: Callable[[], Sequence[Measured]], gated: Collection[str] | None = None
    ) -> list[Measured]:
        """A check's figures (`first`, its first pass) measured again by `again` while rules/sampling.py says to
        (_pending: `gated` holds the scopes whose verdict decides the test; None: every one), each the best of its
        passes (best_of_passes), how many passes and what stopped them in its details' `sampling`. `again` may
        measure only some of them (a sweep's gated sizes): the rest keep their first pass."""
        from pytest_gbvalidate.levels import BUDGET_S

        directions = {m.metric: self.direction(m.metric, m.scope) for m in first}
        budget_s = BUDGET_S[self.gb.settings.level.value]
        measured, pending = list(first), self._pending(first, 1, None, gated)
        while (stopped := sampling.stop(pending, budget_s)) is None:
            start = time.monotonic()
            measured = best_of_passes(measured, again(), directions, merged=pending.passes > 1)
            pending = self._pending(measured, pending.passes + 1, time.monotonic() - start, gated)
        if pending.passes == 1:
            return measured
        said = {"passes": pending.passes, "stopped": stopped}
        return [m._replace(details={**m.details, "sampling": said}) if "passes" in m.details else m for m in measured]

    def _pending(
        self, measured: Sequence[Measured], passes: int, pass_s: float | None, gated: Collection[str] | None
    ) -> sampling.Pending:
        """Where `measured` stand after `passes` passes (rules/sampling.py): flagged where any would fail, warn,
        regress or is unresolved (with --gb-record, always: the recording must see the node's spread), unresolved
        where one in `gated` is, or, recording, is too noisy to record where the baseline gates it."""
        from pytest_gbvalidate.baselines.recording import too_noisy_to_record

        recording = self.gb.settings.record.value is not None
        flagged, unresolved = recording, False
        for metric, value, scope, details in measured:
            ref = self.gb.target.reference(metric, scope)
            if (CATALOG.get(metric) or _spec_from(ref)) is None:
                continue
            judged = self._judge(Measured(metric, float(value), scope, details))
            flagged = flagged or judged.flagged
            cannot_tell = judged.unresolved or (
                recording and ref is not None and ref.has_reference and too_noisy_to_record(judged.record, ref.needed)
            )
            unresolved = unresolved or (cannot_tell and (gated is None or scope in gated))
        return sampling.Pending(passes, flagged, unresolved, pass_s)

    def direction(self, metric: str, scope: str) -> str:
        """Which way the metric is better: the catalog's, else the baseline's (higher where neither says)."""
        spec = CATALOG.get(metric) or _spec_from(self.gb.target.reference(metric, scope))
        return "higher" if spec is None else spec.direction

    def _store(
        self, record: MeasurementRecord, verdict: VerdictWord, message: str, judged: bl.Verdict | None = None
    ) -> None:
        """Keep a measurement's record (_record's) with its verdict and message, and, where its reference judged
        it, the reference's figures: expected, limits, delta, status and provenance."""
        stored = record.copy()
        stored["verdict"], stored["message"] = verdict, message
        if judged is not None:
            stored["expected"], stored["delta_pct"] = judged.expected, judged.rounded_delta_pct()
            stored["limit"], stored["warn_limit"] = judged.limits()
            stored["status"], stored["provenance"] = judged.status, judged.provenance
            if (resolution := judged.resolution_record()) is not None:
                stored["resolution"] = resolution
        self.gb.add_measurement(self.item, stored)
        self.item.user_properties.extend(junit_properties(stored))


def _fail_with(*messages: str | None) -> None:
    """Fail the test with every message given (None: none), one per line, an UNRESOLVED one last: the first line
    decides the test's fault category, and UNRESOLVED is not one. Pass on without."""
    lines = sorted((m for m in messages if m is not None), key=lambda m: m.startswith(UNRESOLVED_PREFIX))
    if lines:
        pytest.fail("\n".join(lines), pytrace=False)


def _sampled(details: Mapping[str, Any]) -> str:
    """What an unresolved figure's message adds where it was measured more than once (rules/sampling.py)."""
    said = details.get("sampling")
    if not isinstance(said, dict):
        return ""
    return f" (measured in {said.get('passes')} passes, stopped: {said.get('stopped')})"


def best_of_passes(
    first: Sequence[Measured], second: Sequence[Measured], directions: Mapping[str, str], *, merged: bool = False
) -> list[Measured]:
    """Each measurement of `first` as the better of it and the same one in `second` (records.measurement_key) by the
    metric's direction in `directions` (interference only slows a pass; a degraded node is slow in all), its details
    the better pass's with `passes` (every pass's figure, in order) added; in `first`'s order, one for each. A figure
    the second pass lacks stays as it was. `merged`: `first` is itself what this gave, its `passes` so far."""
    from pytest_gbvalidate.report.records import measurement_key

    again = {measurement_key(m._asdict()): m for m in second}
    combined = []
    for m in first:
        other = again.get(measurement_key(m._asdict()))
        if other is None:
            combined.append(m)
            continue
        better = other if rs.is_worse(m.value, other.value, directions.get(m.metric, "higher")) else m
        so_far = list(m.details.get("passes", [m.value])) if merged else [m.value]
        combined.append(m._replace(value=better.value, details={**better.details, "passes": [*so_far, other.value]}))
    return combined


def _measured(given: Sequence[Any]) -> Measured:
    """`given` as a Measured: a site's check may hand plain tuples, in the same order. A tuple in another order is a
    TypeError that says so, never a measurement of a size label."""
    shown = ", ".join(repr(x) for x in list(given)[:3])
    if len(given) != 4 or not isinstance(given[0], str) or not isinstance(given[2], str):
        raise TypeError(f"gb_expect.each takes Measured(metric, value, scope, details), not ({shown}, ...)")
    metric, value, scope, details = given
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"gb_expect.each takes Measured(metric, value, scope, details): ({shown}, ...) has no value")
    return Measured(metric, float(value), scope, details)


def _spec_from(ref: bl.Reference | None) -> MetricSpec | None:
    return None if ref is None else MetricSpec(ref.metric, ref.unit, ref.direction, ref.scope_kind, "")
