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
    # index k of the list without element i is sorted_vals[k] below i, sorted_vals[k + 1] from i
    hi = c // 2
    upper = sorted_vals[hi] if hi < i else sorted_vals[hi + 1]
    if c % 2:
        return upper
    lo = hi - 1
    return ((sorted_vals[lo] if lo < i else sorted_vals[lo + 1]) + upper) / 2.0


def quantile(v: Sequence[float], q: float) -> float:
    """Nearest-rank quantile (q in [0, 1])."""
    if not v:
        raise ValueError("quantile of an empty sequence")
    s = sorted(v)
    k = max(0, min(len(s) - 1, math.ceil(q * len(s)) - 1))
    return s[k]
