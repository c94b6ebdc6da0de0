"""The statistics both benchmarks report: medians, spreads, rounding for report.json, where two outputs part."""
from __future__ import annotations

import math
import statistics
from typing import Optional


def median(xs) -> Optional[float]:
    """The median of the values that are not None or NaN; None when there are none."""
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return float(statistics.median(xs)) if xs else None


def quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    pos = (len(xs) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def spread(xs: list[float]) -> Optional[dict[str, float]]:
    """Median, quartiles, min, max and count; None for no values."""
    if not xs:
        return None
    return {"median": float(statistics.median(xs)), "p25": quantile(xs, 0.25), "p75": quantile(xs, 0.75),
            "min": min(xs), "max": max(xs), "n": len(xs)}


def worst_median(values: dict[str, list[float]], lower_is_better: bool = False) -> Optional[tuple[str, float]]:
    """The key whose values have the worst median (the lowest; the highest where a lower figure is better) and that
    median: a row's floor over its prompts or cells, each key's values one ratio per repeat. None: no values."""
    medians = {key: m for key, m in ((key, median(v)) for key, v in values.items()) if m is not None}
    worst = (max if lower_is_better else min)(medians, key=medians.get, default=None)
    return (worst, medians[worst]) if worst is not None else None


def rounded(value, digits=3):
    """Every float in value (nested dicts and lists too) rounded to digits; NaN becomes None."""
    if isinstance(value, float):
        return None if math.isnan(value) else round(value, digits)
    if isinstance(value, dict):
        return {k: rounded(v, digits) for k, v in value.items()}
    if isinstance(value, list):
        return [rounded(v, digits) for v in value]
    return value


def first_difference(a, b) -> int:
    """The first index where two sequences differ (the shorter one's length when one is a prefix of the other)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))
