"""The statistics of the report: nearest-rank percentiles and medians."""

from __future__ import annotations

import math


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


def median(values: list[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0


def summary(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "min": min(values),
        "median": median(values),
        "p95": percentile(values, 95),
        "max": max(values),
    }
