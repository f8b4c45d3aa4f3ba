"""Consumer-mode figures for hand-made measured results (issue 26: a measured result is dispatched only with a
speedup timed as consumers call the package, in graph and eager use)."""

from __future__ import annotations


def consumer_modes(median: float, speedup: float, low: float, high: float) -> dict[str, dict[str, float]]:
    """The same speedup and range in both modes (``Measurements.modes``)."""
    figures = {"median_ms": median, "baseline_median_ms": median * speedup, "speedup": speedup, "low": low,
               "high": high}
    return {"graph": dict(figures), "eager": dict(figures)}
