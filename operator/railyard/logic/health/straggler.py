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
    score: StragglerScore
    #: Scores of the windows ending at the newest step, the one before, ... (newest first).
    positions: tuple[float, ...]


def compute_straggler_scores(
    ranks: Iterable[RankSignals],
    policy: HealthPolicy,
    flagged: Container[int] = (),
) -> list[RankScores]:
    """Scores of every rank with enough samples.

    The window ending at the newest step is scored for every rank; the earlier positions only
    for ranks near the line (below the clear level, or flagged), against the same peer median:
    adjacent windows of thousands of peers have the same median for all practical purposes,
    and this keeps one evaluation of 16,384 ranks to one sort of a short window each.
    """
    w = policy.straggler_window_steps
    m = max(1, policy.straggler_confirm_steps)
    min_samples = max(3, w // 2)
    near = policy.straggler_threshold + policy.straggler_clear_margin
    rows: list[tuple[RankSignals, Sequence[float], float]] = []
    for r in ranks:
        xs = r.recent_compute(w + m - 1)
        n = len(xs)
        if n < min_samples:
            continue
        med = _window_median(xs, n, w)
        if med > 0.0:
            rows.append((r, xs, med))
    if len(rows) < 2:
        return []
    meds = sorted(med for _, _, med in rows)
    overall = median_sorted(meds)
    out: list[RankScores] = []
    for r, xs, med in rows:
        ref = median_excluding(meds, bisect_left(meds, med))
        if ref is None:
            continue
        score = ref / med
        positions = [score]
        if score < near or r.rank in flagged:
            n = len(xs)
            for j in range(1, m):
                end = n - j
                if min(end, w) < min_samples:
                    break
                mj = _window_median(xs, end, w)
                if mj <= 0.0:
                    break
                positions.append(ref / mj)
        out.append(
            RankScores(
                score=StragglerScore(
                    rank=r.rank,
                    node=r.node,
                    pod_index=r.pod_index,
                    score=score,
                    nvrx_score=overall / med,
                    median_compute_s=med,
                ),
                positions=tuple(positions),
            )
        )
    return out


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
    scored = {s.score.rank for s in scores}
    for s in scores:
        rank = s.score.rank
        full = len(s.positions) >= m
        if rank in flagged:
            if (full or s.positions[0] >= high) and all(p >= high for p in s.positions):
                continue
            nxt[rank] = flagged[rank]
            current.append(s.score)
        elif full and all(p < low for p in s.positions):
            nxt[rank] = s.score.score
            current.append(s.score)
            new.append(
                Verdict(
                    kind=FaultKind.STRAGGLER,
                    rank=rank,
                    node=s.score.node,
                    pod_index=s.score.pod_index,
                    reason="SlowRank",
                    message=(
                        f"rank {rank} on {s.score.node or '?'} computes {1 / s.score.score:.2f}x slower than "
                        f"its peers' median (score {s.score.score:.3f} < {low:g} for the last {m} steps)"
                    ),
                    detected_at=now,
                    fault_at=now,
                    action=policy.straggler_action,
                    quarantine_node=restart,
                    score=s.score.score,
                )
            )
    # A flagged rank with no score this time (no fresh data) stays flagged until it proves fast.
    for rank, sc in flagged.items():
        if rank not in scored:
            nxt[rank] = sc
    return nxt, new, current
