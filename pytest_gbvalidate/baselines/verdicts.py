"""A measurement against its reference: the verdict (pass, warn, fail, or info when nothing gates it) and the
message that triages itself in a CI log."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pytest_gbvalidate import noise
from pytest_gbvalidate.baselines.model import Reference, _better
from pytest_gbvalidate.report.records import FAIL, INFO, PASS, WARN
from pytest_gbvalidate.report.records import Verdict as VerdictWord

__all__ = ["FAIL", "INFO", "PASS", "WARN", "Verdict", "compare"]


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
    # Why a value beyond a limit did not get that limit's verdict: within the noise its own samples show.
    noise_note: str = ""

    @property
    def delta_pct(self) -> float | None:
        if self.expected in (None, 0) or not math.isfinite(self.value):
            return None
        assert self.expected is not None
        return (self.value - self.expected) / abs(self.expected) * 100.0

    @property
    def message(self) -> str:
        parts = [f"{self.metric} [{self.scope}]: measured {_fmt(self.value)} {self.unit}"]
        if self.expected is not None:
            parts.append(f"expected {_fmt(self.expected)} {self.unit}")
        if self.fail_limit is not None:
            parts.append(f"fail limit {_fmt(self.fail_limit)} {self.unit}")
        if self.warn_limit is not None:
            parts.append(f"warn limit {_fmt(self.warn_limit)} {self.unit}")
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


def compare(ref: Reference, value: float, scope: str, noise_margin_pct: float = 0.0) -> Verdict:
    """The verdict for `value` measured at `scope`. A value that is not a finite number always fails. A value
    beyond a limit by no more than `noise_margin_pct` percent of it (the change its own noise allows, noise.py)
    does not hold that limit's verdict: within the fail limit's noise it warns, within the warn limit's it passes,
    and the message says so."""
    fail_limit, warn_limit = ref.fail_limit, ref.warn_limit
    worse = _better("lower" if ref.direction == "higher" else "higher")
    verdict: VerdictWord

    def crossed(limit: float | None) -> bool:
        return limit is not None and worse(value, limit)

    def beyond(limit: float | None) -> bool:
        return limit is not None and crossed(limit) and noise.beyond(value, limit, noise_margin_pct)

    note = ""
    if not math.isfinite(value) or beyond(fail_limit):
        verdict = FAIL
    elif crossed(fail_limit):
        verdict, note = WARN, f", within the noise of the fail limit (its samples allow {noise_margin_pct:.1f}%)"
    elif beyond(warn_limit):
        verdict = WARN
    elif crossed(warn_limit):
        verdict, note = PASS, f", within the noise of the warn limit (its samples allow {noise_margin_pct:.1f}%)"
    else:
        verdict = PASS
    return Verdict(
        metric=ref.metric,
        scope=scope,
        value=value,
        unit=ref.unit,
        direction=ref.direction,
        expected=ref.expected,
        fail_limit=fail_limit,
        warn_limit=warn_limit,
        verdict=verdict,
        status=ref.status,
        provenance=ref.provenance,
        noise_note=note,
    )


def _round(x: float | None) -> float | None:
    """Limits derived from percentages print as 1.0899999999999999; six significant digits are plenty."""
    return None if x is None else float(f"{x:.6g}")


def _fmt(x: float) -> str:
    return f"{x:.4g}" if math.isfinite(x) else str(x)
