"""Straggler scores with hysteresis.

In synchronous training every rank waits for the slowest, so wall-clock step time hides the
culprit; the signal is each rank's compute time before the collectives. A rank's score is the
median of its peers' window medians over its own window median (1.0: typical, 0.77: 1.3x
slower). Robustness comes twice: the window median ignores a few slow steps (a GC pause, a
page fault), and a rank is flagged only when the score is below the threshold for the windows
ending at each of the last ``straggler_confirm_steps`` steps; a flag clears only once the score
is back above threshold + margin for as many steps, so a rank near the line does not flap.
Counting in steps, not timer ticks, makes the latency independent of how often we evaluate.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass

from railyard.logic.health.model import (
    Action,
    FaultKind,
    HealthPolicy,
    RankSignals,
    StragglerScore,
    Verdict,
)
from railyard.logic.health.stats import median_excluding, median_sorted


@dataclass(frozen=True, slots=True)
class RankScores:
    """One rank's scores, flat: one object per rank (16,384 per evaluation) and no more; the
    :class:`StragglerScore` the decision reports is built only for the few ranks it names."""

    rank: int
    node: str
    pod_index: int
    #: Median of the other ranks' median compute time over this rank's (1.0: typical).
    score: float
    nvrx_score: float
    median_compute_s: float
    #: Scores of the windows ending at the newest step, the one before, ... (newest first).
    positions: tuple[float, ...]

    def straggler_score(self) -> StragglerScore:
        return StragglerScore(self.rank, self.node, self.pod_index, self.score, self.nvrx_score, self.median_compute_s)


def compute_straggler_scores(
    ranks: Iterable[RankSignals],
    policy: HealthPolicy,
    flagged: Container[int] = (),
) -> list[RankScores]:
    """Scores of every rank with enough samples.

    The window ending at the newest step is scored for every rank; the earlier positions only
    for ranks near the line (below the clear level, or flagged), against the same peer median:
    adjacent windows of thousands of peers have the same median for all practical purposes,
    and this keeps one evaluation of 16,384 ranks to one sort of a short window each. Nothing
    per rank outlives its turn in the first loop but the rank and its median (a rank's window is
    read again for the few near the line): at 16,384 ranks, tens of thousands of surviving
    tuples and lists made the garbage collector walk the whole heap during every evaluation.
    """
    w = policy.straggler_window_steps
    m = max(1, policy.straggler_confirm_steps)
    min_samples = max(3, w // 2)
    near = policy.straggler_threshold + policy.straggler_clear_margin
    scored: list[RankSignals] = []
    medians: list[float] = []
    for r in ranks:
        xs = r.recent_compute(w)
        n = len(xs)
        if n < min_samples:
            continue
        win = sorted(xs)
        med = win[n // 2] if n % 2 else (win[n // 2 - 1] + win[n // 2]) * 0.5
        if med > 0.0:
            scored.append(r)
            medians.append(med)
    if len(scored) < 2:
        return []
    meds = sorted(medians)
    overall = median_sorted(meds)
    out: list[RankScores] = []
    for r, med in zip(scored, medians, strict=True):
        ref = median_excluding(meds, bisect_left(meds, med))
        if ref is None:
            continue
        score = ref / med
        positions: tuple[float, ...] = (score,)
        if score < near or r.rank in flagged:
            positions = _earlier_positions(r.recent_compute(w + m - 1), score, ref, w, m, min_samples)
        out.append(RankScores(r.rank, r.node, r.pod_index, score, overall / med, med, positions))
    return out


def _earlier_positions(
    xs: Sequence[float], score: float, ref: float, w: int, m: int, min_samples: int
) -> tuple[float, ...]:
    positions = [score]
    n = len(xs)
    for j in range(1, m):
        end = n - j
        if min(end, w) < min_samples:
            break
        mj = _window_median(xs, end, w)
        if mj <= 0.0:
            break
        positions.append(ref / mj)
    return tuple(positions)


def _window_median(xs: Sequence[float], end: int, w: int) -> float:
    win = sorted(xs[max(0, end - w) : end])
    k = len(win)
    return win[k // 2] if k % 2 else (win[k // 2 - 1] + win[k // 2]) * 0.5


def decide_stragglers(
    scores: list[RankScores],
    flagged: Mapping[int, float],
    policy: HealthPolicy,
    now: float,
) -> tuple[dict[int, float], list[Verdict], list[StragglerScore]]:
    """New flag set, verdicts for newly flagged ranks, and the currently flagged scores.

    A rank whose only scored position is above the clear level counts as clearly fast.
    """
    m = max(1, policy.straggler_confirm_steps)
    low = policy.straggler_threshold
    high = policy.straggler_threshold + policy.straggler_clear_margin
    restart = policy.straggler_action is Action.RESTART
    nxt: dict[int, float] = {}
    new: list[Verdict] = []
    current: list[StragglerScore] = []
    scored = {s.rank for s in scores}
    for s in scores:
        rank = s.rank
        full = len(s.positions) >= m
        if rank in flagged:
            if (full or s.positions[0] >= high) and all(p >= high for p in s.positions):
                continue
            nxt[rank] = flagged[rank]
            current.append(s.straggler_score())
        elif full and all(p < low for p in s.positions):
            nxt[rank] = s.score
            current.append(s.straggler_score())
            new.append(
                Verdict(
                    kind=FaultKind.STRAGGLER,
                    rank=rank,
                    node=s.node,
                    pod_index=s.pod_index,
                    reason="SlowRank",
                    message=(
                        f"rank {rank} on {s.node or '?'} computes {1 / s.score:.2f}x slower than "
                        f"its peers' median (score {s.score:.3f} < {low:g} for the last {m} steps)"
                    ),
                    detected_at=now,
                    fault_at=now,
                    action=policy.straggler_action,
                    quarantine_node=restart,
                    score=s.score,
                )
            )
    # A flagged rank with no score this time (no fresh data) stays flagged until it proves fast.
    for rank, sc in flagged.items():
        if rank not in scored:
            nxt[rank] = sc
    return nxt, new, current
