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
from collections.abc import Iterable, Mapping
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


def compute_straggler_scores(ranks: Iterable[RankSignals], policy: HealthPolicy) -> list[RankScores]:
    w = policy.straggler_window_steps
    m = max(1, policy.straggler_confirm_steps)
    min_samples = max(3, w // 2)
    rows: list[tuple[RankSignals, list[float]]] = []
    for r in ranks:
        xs = list(r.recent_compute(w + m - 1))
        n = len(xs)
        if n < min_samples:
            continue
        meds: list[float] = []
        for j in range(m):
            end = n - j
            start = max(0, end - w)
            if end - start < min_samples:
                break
            win = sorted(xs[start:end])
            med = median_sorted(win)
            if med <= 0.0:
                break
            meds.append(med)
        if meds:
            rows.append((r, meds))
    if len(rows) < 2:
        return []
    by_pos = [sorted(meds[j] for _, meds in rows if len(meds) > j) for j in range(m)]
    overall = [median_sorted(v) if v else 0.0 for v in by_pos]
    out: list[RankScores] = []
    for r, meds in rows:
        scores: list[float] = []
        for j, med in enumerate(meds):
            ref = median_excluding(by_pos[j], bisect_left(by_pos[j], med))
            if ref is None:
                break
            scores.append(ref / med)
        if not scores:
            continue
        out.append(
            RankScores(
                score=StragglerScore(
                    rank=r.rank,
                    node=r.node,
                    pod_index=r.pod_index,
                    score=scores[0],
                    nvrx_score=overall[0] / meds[0],
                    median_compute_s=meds[0],
                ),
                positions=tuple(scores),
            )
        )
    return out


def decide_stragglers(
    scores: list[RankScores],
    flagged: Mapping[int, float],
    policy: HealthPolicy,
    now: float,
) -> tuple[dict[int, float], list[Verdict], list[StragglerScore]]:
    """New flag set, verdicts for newly flagged ranks, and the currently flagged scores."""
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
            if full and all(p >= high for p in s.positions):
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
