"""Loss and gradient-norm spike detection: a symptom of corruption, never proof.

Robust z-score of log(value) against the rolling median and MAD of recent accepted values
(one-sided: only jumps up matter), plus non-finite values. A high exponent bit flipped in one
gradient element moves the norm by orders of magnitude (z in the hundreds); ordinary training
noise stays far below the threshold. Spikes are not added to the history, so a corrupted step
cannot raise the baseline. A trigger asks for a replay; only the replay confirms.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Spike:
    spike: bool
    z: float
    detail: str = ""


class SpikeDetector:
    def __init__(
        self, *, window: int = 128, z_threshold: float = 8.0, min_samples: int = 16, early_ratio: float = 1e3
    ) -> None:
        self.z_threshold = z_threshold
        self.min_samples = min_samples
        #: With too little history for a MAD, flag only jumps of this factor over the median.
        self.early_ratio = early_ratio
        self.history: deque[float] = deque(maxlen=window)

    def check(self, value: float, name: str = "value") -> Spike:
        if not math.isfinite(value):
            return Spike(True, math.inf, f"{name} is {value}")
        x = math.log(max(value, 1e-30))
        h = sorted(self.history)
        if len(h) < 3:
            return Spike(False, 0.0)
        med = _median(h)
        if len(h) < self.min_samples:
            if x - med > math.log(self.early_ratio):
                return Spike(True, math.inf, f"{name} {value:.3g} is {math.exp(x - med):.3g}x the recent median")
            return Spike(False, 0.0)
        mad = _median(sorted(abs(v - med) for v in h))
        z = (x - med) / (1.4826 * mad + 1e-3)
        if z > self.z_threshold:
            return Spike(
                True, z, f"{name} {value:.3g} is {math.exp(x - med):.3g}x the recent median (robust z {z:.1f})"
            )
        return Spike(False, z)

    def accept(self, value: float) -> None:
        if math.isfinite(value):
            self.history.append(math.log(max(value, 1e-30)))


def _median(s: list[float]) -> float:
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2.0
