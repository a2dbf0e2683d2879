"""One health evaluation of one job: every rule, in one pass, from the store's signals.

Called from the operator's per-job timer with ``now``; pure and cheap (16,384 ranks in well
under a second of one core, see bench/heartbeats.py). The returned state goes into the next call.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping
from operator import attrgetter

from railyard.logic.health.groups import decide_group_sdc
from railyard.logic.health.liveness import (
    RUNNING,
    compute_hang_timeout,
    decide_dead_ranks,
    decide_hung_ranks,
)
from railyard.logic.health.model import (
    Action,
    FaultKind,
    HealthDecision,
    HealthPolicy,
    HealthState,
    JobSignals,
    PodStatus,
    RankSignals,
    Verdict,
)
from railyard.logic.health.sdc import decide_sdc
from railyard.logic.health.stats import quantile
from railyard.logic.health.straggler import compute_straggler_scores, decide_stragglers

STEP_TIME_SAMPLES = 256


def decide_health(
    job: JobSignals,
    pods: Mapping[int, PodStatus],
    state: HealthState,
    policy: HealthPolicy,
    now: float,
    *,
    fingerprints: Iterable[RankSignals] | None = None,
    group_of: Callable[[int], int] | None = None,
) -> HealthDecision:
    """Every rule over the job's signals. faultTolerance ReplicaGroups: ``fingerprints``, the
    ranks whose fingerprints the cross-group SDC vote compares (the store's rank windows);
    ``group_of``, pod index -> replica group (the hang rule excuses groups that wait)."""
    if state.attempt != job.attempt:
        state = HealthState(attempt=job.attempt)
    ranks = list(job.rank_signals())
    step_times = job.recent_step_times(STEP_TIME_SAMPLES)
    hang_timeout = compute_hang_timeout(step_times, policy)

    liveness: list[Verdict] = decide_dead_ranks(ranks, pods, policy, now)
    liveness += decide_hung_ranks(ranks, pods, hang_timeout, policy, now, group_of=group_of)
    open_now = frozenset((v.kind, v.pod_index) for v in liveness)
    new = [v for v in liveness if (v.kind, v.pod_index) not in state.open]

    scores = compute_straggler_scores(ranks, policy, state.stragglers)
    flagged, new_stragglers, current = decide_stragglers(scores, state.stragglers, policy, now)
    new += new_stragglers

    events = job.health_events()
    # the map that locates a suspect is built only when there is a new report to locate
    fresh = any(ev.seq > state.sdc_seen_seq for ev in events)
    nodes_by_rank = {r.rank: (r.node, r.pod_index) for r in ranks} if fresh else {}
    sdc, seen = decide_sdc(events, state.sdc_seen_seq, nodes_by_rank, policy, now)
    new += sdc
    groups = state.groups
    if fingerprints is not None:
        diverged, groups = decide_group_sdc(fingerprints, groups, policy, now)
        new += diverged

    ages = [now - r.last_seen_at for r in ranks if (p := pods.get(r.pod_index)) and p.phase == RUNNING]
    slowest = [s.straggler_score() for s in heapq.nsmallest(policy.slowest_ranks_reported, scores, key=_score_of)]
    return HealthDecision(
        verdicts=tuple(new),
        active=tuple(liveness),
        state=HealthState(attempt=job.attempt, open=open_now, stragglers=flagged, sdc_seen_seq=seen, groups=groups),
        restart=any(v.action is Action.RESTART for v in new),
        quarantine_nodes=tuple(sorted({v.node for v in new if v.quarantine_node and v.node})),
        slowest=tuple(slowest),
        stragglers=tuple(sorted(current, key=lambda s: s.rank)),
        hang_timeout_s=hang_timeout,
        p50_step_time_s=quantile(step_times, 0.5) if step_times else None,
        p99_step_time_s=quantile(step_times, 0.99) if step_times else None,
        max_heartbeat_age_s=max(ages) if ages else None,
    )


_score_of = attrgetter("score")

__all__ = ["FaultKind", "decide_health"]
