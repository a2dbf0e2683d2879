"""Goodput: the fraction of a job's wall time that went into training steps that were kept.

``goodput = newest step x median step time / (now - first gang start)``. Scheduling and start-up
of every attempt, the time between a failure and the new gang, steps redone after a restore,
saves that block beyond the median step and stragglers all lower it; 1.0 is a job that never
stopped. Capped to [0, 1] (a median can undershoot the mean a little).
"""

from __future__ import annotations


def compute_goodput(step: int, median_step_s: float | None, started_at: float | None, now: float) -> float | None:
    """The goodput now; None while it is not defined (no step time yet, not started)."""
    if median_step_s is None or started_at is None or now <= started_at or step < 0:
        return None
    return max(0.0, min(1.0, step * median_step_s / (now - started_at)))
