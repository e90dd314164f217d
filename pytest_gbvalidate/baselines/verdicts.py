"""A measurement against its reference: the verdict (pass, warn, fail, or info when nothing gates it) and the
message that triages itself in a CI log."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pytest_gbvalidate.baselines.model import DEFAULT_NEEDED, Reference
from pytest_gbvalidate.labels import number
from pytest_gbvalidate.report.records import FAIL, INFO, PASS, UNRESOLVED, WARN, ResolutionRecord
from pytest_gbvalidate.report.records import Verdict as VerdictWord
from pytest_gbvalidate.rules import noise
from pytest_gbvalidate.rules import resolution as rs

__all__ = ["FAIL", "INFO", "PASS", "UNRESOLVED", "WARN", "Verdict", "compare"]


@dataclass(frozen=True)
class Verdict:
    """One measurement against its reference. `message` is written to triage itself in a CI log."""

    metric: str
    scope: str
    value: float
    unit: str
    direction: str
    expected: float | None
    fail_limit: float | None
    warn_limit: float | None
    verdict: VerdictWord
    status: str
    provenance: str
    noise_note: str = ""  # why a value past a limit did not get that limit's verdict, or got none: its resolution
    resolution: rs.Resolution | None = None
    needed: rs.Needed = DEFAULT_NEEDED

    @property
    def delta_pct(self) -> float | None:
        if self.expected in (None, 0) or not math.isfinite(self.value):
            return None
        assert self.expected is not None
        return (self.value - self.expected) / abs(self.expected) * 100.0

    @property
    def message(self) -> str:
        parts = [f"{self.metric} [{self.scope}]: measured {number(self.value)} {self.unit}"]
        if self.expected is not None:
            parts.append(f"expected {number(self.expected)} {self.unit}")
        if self.fail_limit is not None:
            parts.append(f"fail limit {number(self.fail_limit)} {self.unit}")
        if self.warn_limit is not None:
            parts.append(f"warn limit {number(self.warn_limit)} {self.unit}")
        if self.delta_pct is not None:
            parts.append(f"delta {self.delta_pct:+.1f}%")
        parts.append(f"{self.direction} is better")
        text = ", ".join(parts) + self.noise_note + f" -> {self.verdict.upper()}"
        if self.verdict != PASS:
            text += f" ({self.status} baseline: {self.provenance})"
        return text

    def limits(self) -> tuple[float | None, float | None]:
        """The fail and warn limits as the report keeps them (six significant digits)."""
        return _round(self.fail_limit), _round(self.warn_limit)

    def resolution_record(self) -> ResolutionRecord | None:
        """The figure's resolution for the report, or None where its evidence gave none."""
        if (r := self.resolution) is None:
            return None
        spreads, n = {name: round(spread, 3) for name, spread in r.spreads}, self.needed
        return {"pct": round(r.pct, 3), "spreads": spreads, "needed_pct": n.pct, "needed_source": n.source}

    def rounded_delta_pct(self) -> float | None:
        return None if self.delta_pct is None else round(self.delta_pct, 3)

    def as_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "scope": self.scope,
            "value": self.value,
            "unit": self.unit,
            "direction": self.direction,
            "expected": self.expected,
            "limit": self.limits()[0],
            "warn_limit": self.limits()[1],
            "delta_pct": self.rounded_delta_pct(),
            "verdict": self.verdict,
            "status": self.status,
            "provenance": self.provenance,
            "message": self.message,
        }


def compare(ref: Reference, value: float, scope: str, resolution: rs.Resolution | None = None) -> Verdict:
    """The verdict for `value` measured at `scope`, its evidence resolving `resolution` (None: taken as it is). A value
    that is not a finite number fails. Each limit is judged by resolution.side against `ref.needed`: past the fail
    limit beyond the noise fails, within it warns; past the warn limit warns, within its noise passes; a coarse
    figure between is UNRESOLVED, and one at least as good as the expected value passes. The message says by what
    allowance a figure past a limit was not given that limit's verdict."""
    fail_side = _side(value, ref.fail_limit, ref.direction, resolution, ref.needed)
    warn_side = _side(value, ref.warn_limit, ref.direction, resolution, ref.needed)
    if ref.expected is not None and math.isfinite(value) and rs.at_least_as_good(value, ref.expected, ref.direction):
        fail_side = warn_side = "within"  # at or above what the SKU expects: its noise cannot hide a fall
    allowed = "" if resolution is None else f"its {resolution.describe()}"
    coarse = resolution is not None and resolution.pct > ref.needed.pct
    verdict: VerdictWord
    note = ""
    if not math.isfinite(value) or fail_side == "beyond":
        verdict = FAIL
    elif "unresolved" in (fail_side, warn_side) or (warn_side == "beyond" and coarse):
        verdict = UNRESOLVED
        note = f", too noisy to judge: {allowed}, coarser than the {ref.needed.pct:g}% needed ({ref.needed.source})"
    elif fail_side == "within_noise":
        verdict, note = WARN, f", past the fail limit within the noise {allowed} allows"
    elif warn_side == "beyond":
        verdict = WARN
    elif warn_side == "within_noise":
        verdict, note = PASS, f", past the warn limit within the noise {allowed} allows"
    else:
        verdict = PASS
    return Verdict(
        metric=ref.metric,
        scope=scope,
        value=value,
        unit=ref.unit,
        direction=ref.direction,
        expected=ref.expected,
        fail_limit=ref.fail_limit,
        warn_limit=ref.warn_limit,
        verdict=verdict,
        status=ref.status,
        provenance=ref.provenance,
        noise_note=note,
        resolution=resolution,
        needed=ref.needed,
    )


def resolution_of(own: noise.Noise | None, ref: Reference) -> rs.Resolution | None:
    """What a measurement's evidence can tell against its baseline: its own noise (its figure's error and its
    waits for a CPU) and the spread its baseline recorded; None where neither is known."""
    return rs.of_spreads(
        samples=None if own is None else own.error_of(),
        reference=ref.spread_pct,
        explained_pct=noise.explained_pct(own),
    )


def _side(
    value: float, limit: float | None, direction: str, resolution: rs.Resolution | None, needed: rs.Needed
) -> rs.Side | None:
    return None if limit is None else rs.side(rs.worse_pct(value, limit, direction), resolution, needed)


def _round(x: float | None) -> float | None:
    """Limits derived from percentages print as 1.0899999999999999; six significant digits are plenty."""
    return None if x is None else float(f"{x:.6g}")
