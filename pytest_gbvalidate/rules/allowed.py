"""The change --gb-compare allows where --gb-compare-fail does not say: a figure the resolution its metric needs
(compare.AllowedRegression.for_metric), the run's pace DEFAULT_ALLOWED_PCT (compare.run_pace). Pure and light: the
settings' help text reads it as the plugin loads (no numpy there)."""

from __future__ import annotations

# pytest-benchmark's documented example threshold (`--benchmark-compare-fail=mean:5%`), about twice the run-to-run
# spread of GPU figures (docs/noise.md: one H100's moved 0.3-2%).
DEFAULT_ALLOWED_PCT = 5.0


def compare_fail_default() -> str:
    """The default in words, as --gb-compare-fail's help, docs/settings.md and docs/history.md give it (tests hold)."""
    return (
        "each figure may fall by the resolution its metric needs (the baseline's `resolution`), the run's pace as a "
        f"whole by {DEFAULT_ALLOWED_PCT:g}%"
    )
