"""Small statistics: medians over repetitions, percentiles over latency samples."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation between closest ranks."""
    if not values:
        return math.nan
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = (len(ordered) - 1) * q / 100
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(present) if present else None


def summary(values: Sequence[float | None], digits: int = 3) -> dict[str, Any]:
    """{'median', 'min', 'max', 'values'} of one figure over repetitions."""
    present = [v for v in values if v is not None and not math.isnan(v)]
    if not present:
        return {"median": None, "min": None, "max": None, "values": []}
    return {
        "median": round(statistics.median(present), digits),
        "min": round(min(present), digits),
        "max": round(max(present), digits),
        "values": [round(v, digits) for v in present],
    }


def rate(n: int, seconds: float) -> float | None:
    """Tasks per second for n tasks over `seconds` (None when the span is not positive)."""
    return n / seconds if seconds > 0 else None


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b
