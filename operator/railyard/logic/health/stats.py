"""Small order statistics without numpy (the operator image does not carry it)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def median_sorted(v: Sequence[float]) -> float:
    n = len(v)
    if n == 0:
        raise ValueError("median of an empty sequence")
    mid = n // 2
    return v[mid] if n % 2 else (v[mid - 1] + v[mid]) / 2.0


def median(v: Sequence[float]) -> float:
    return median_sorted(sorted(v))


def median_excluding(sorted_vals: Sequence[float], i: int) -> float | None:
    """Median of ``sorted_vals`` without the element at index ``i``, in O(1)."""
    c = len(sorted_vals) - 1
    if c <= 0:
        return None

    def at(k: int) -> float:
        return sorted_vals[k] if k < i else sorted_vals[k + 1]

    return at(c // 2) if c % 2 else (at(c // 2 - 1) + at(c // 2)) / 2.0


def quantile(v: Sequence[float], q: float) -> float:
    """Nearest-rank quantile (q in [0, 1])."""
    if not v:
        raise ValueError("quantile of an empty sequence")
    s = sorted(v)
    k = max(0, min(len(s) - 1, math.ceil(q * len(s)) - 1))
    return s[k]
