"""Dead and hung ranks.

Dead: a rank of a Running pod sent nothing for ``heartbeat_timeout_s`` (or a Running pod never
sent anything within ``first_heartbeat_timeout_s``). Hung: heartbeats still arrive but the step
has not advanced within max(k x p99 step time, floor). A rank that says it is saving is never
hung, and the clock restarts when the save ends, so long checkpoint writes are not hangs.
A rank that has trained its last step (``HealthPolicy.final_step``) is finishing: its final save
and its exit, while its pod waits for its peers; it is judged on the first-step bound instead.
A rank whose program has not opted into step reports (``progress`` false) is never hung: its
step says nothing. With replica groups, a group with a rank that waits for the other groups is
never hung (:func:`excuse_waiting_groups`): the hung group is named alone; and like a save, a
wait restarts the group's clock when it ends (:func:`groups_waited_at`). Verdicts are one per
pod (naming its lowest affected rank): a hang usually stops every rank, and 2,048 verdicts are
easier to act on than 16,384.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence

from railyard.logic.health.model import (
    Action,
    FaultKind,
    HealthPolicy,
    PodStatus,
    RankSignals,
    Verdict,
)
from railyard.logic.health.stats import quantile

RUNNING = "Running"


def compute_hang_timeout(step_times: Sequence[float], policy: HealthPolicy) -> float:
    """max(k x p99 step time, floor); before any step completed, the first-step timeout."""
    if not step_times:
        return max(policy.first_step_timeout_s, policy.hang_timeout_floor_s)
    return max(policy.hang_p99_multiplier * quantile(step_times, 0.99), policy.hang_timeout_floor_s)


def decide_dead_ranks(
    ranks: Iterable[RankSignals],
    pods: Mapping[int, PodStatus],
    policy: HealthPolicy,
    now: float,
) -> list[Verdict]:
    worst: dict[int, tuple[RankSignals, int]] = {}
    seen_pods: set[int] = set()
    for r in ranks:
        seen_pods.add(r.pod_index)
        pod = pods.get(r.pod_index)
        if pod is None or pod.phase != RUNNING:
            continue
        if now - r.last_seen_at >= policy.teardown_bound(r.step, policy.heartbeat_timeout_s):
            _tally(worst, r)
    out = []
    for pod_index, (r, count) in sorted(worst.items()):
        pod = pods[pod_index]
        age = now - r.last_seen_at
        out.append(
            Verdict(
                kind=FaultKind.DEAD,
                rank=r.rank,
                node=pod.node or r.node,
                pod_index=pod_index,
                reason="HeartbeatTimeout",
                message=(
                    f"{count} rank(s) of pod {pod_index} (first: rank {r.rank}) sent no heartbeat "
                    f"for {age:.1f}s (timeout {policy.heartbeat_timeout_s:g}s) while the pod is Running"
                ),
                detected_at=now,
                fault_at=r.last_seen_at,
                action=Action.RESTART,
            )
        )
    for pod_index, pod in sorted(pods.items()):
        if pod_index in seen_pods or pod.phase != RUNNING or pod.running_since is None:
            continue
        if now - pod.running_since > policy.first_heartbeat_timeout_s:
            out.append(
                Verdict(
                    kind=FaultKind.DEAD,
                    rank=-1,
                    node=pod.node,
                    pod_index=pod_index,
                    reason="NoFirstHeartbeat",
                    message=(
                        f"pod {pod_index} has been Running for {now - pod.running_since:.0f}s "
                        f"without a heartbeat (limit {policy.first_heartbeat_timeout_s:g}s)"
                    ),
                    detected_at=now,
                    fault_at=pod.running_since,
                    action=Action.RESTART,
                )
            )
    return out


def decide_hung_ranks(
    ranks: Iterable[RankSignals],
    pods: Mapping[int, PodStatus],
    hang_timeout_s: float,
    policy: HealthPolicy,
    now: float,
    *,
    group_of: Callable[[int], int] | None = None,
) -> list[Verdict]:
    """Hung ranks, one verdict per pod (``group_of``: faultTolerance ReplicaGroups, pod index ->
    replica group, :func:`excuse_waiting_groups`)."""
    ranks = list(ranks)
    group = group_of or _own_group
    waited = groups_waited_at(ranks, group)

    def waited_at(r: RankSignals) -> float:
        return waited.get(group(r.pod_index), -math.inf)

    worst: dict[int, tuple[RankSignals, int]] = {}
    for r in excuse_waiting_groups(
        stalled_ranks(ranks, pods, hang_timeout_s, policy, now, waited_at=waited_at), ranks, group
    ):
        _tally(worst, r)
    out = []
    for pod_index, (r, count) in sorted(worst.items()):
        since = stalled_since(r, waited_at(r))
        bound = policy.teardown_bound(r.step, hang_timeout_s)
        out.append(
            Verdict(
                kind=FaultKind.HANG,
                rank=r.rank,
                node=pods[pod_index].node or r.node,
                pod_index=pod_index,
                reason="StepStalled",
                message=(
                    f"{count} rank(s) of pod {pod_index} (first: rank {r.rank}) stuck at step {r.step} "
                    f"for {now - since:.1f}s (hang timeout {bound:.1f}s) while heartbeats arrive"
                ),
                detected_at=now,
                fault_at=since,
                action=Action.RESTART,
            )
        )
    return out


def stalled_ranks(
    ranks: Iterable[RankSignals],
    pods: Mapping[int, PodStatus],
    hang_timeout_s: float,
    policy: HealthPolicy,
    now: float,
    *,
    waited_at: Callable[[RankSignals], float] | None = None,
) -> list[RankSignals]:
    """Ranks of Running pods that beat but whose step has not advanced within the hang bound
    (counted from the step, the end of a save, or ``waited_at``: the end of their group's wait
    for the other groups)."""
    out = []
    for r in ranks:
        pod = pods.get(r.pod_index)
        if pod is None or pod.phase != RUNNING or r.saving:
            continue
        if not r.progress:
            continue  # a program that does not report its steps cannot be judged hung by them
        if now - r.last_seen_at >= policy.heartbeat_timeout_s:
            continue  # silent, not hung: the dead rule owns it
        since = stalled_since(r, waited_at(r) if waited_at is not None else -math.inf)
        if now - since >= policy.teardown_bound(r.step, hang_timeout_s):
            out.append(r)
    return out


def stalled_since(r: RankSignals, waited_at: float = -math.inf) -> float:
    """Since when ``r`` has shown no progress: its last new step, the last beat of a save, or
    ``waited_at`` (the last beat in which its group waited for the other groups)."""
    return max(r.step_advanced_at, r.last_saving_at, waited_at)


def groups_waited_at(ranks: Iterable[RankSignals], group_of: Callable[[int], int] | None = None) -> dict[int, float]:
    """faultTolerance ReplicaGroups: replica group -> the last beat in which one of its ranks
    waited for the other groups. A group released from the exchange (the quorum formed without
    the hung group, or with its replacement) has its step still to train, and its clock starts
    there, as after a save: judged from its last step before the wait, a group that waited out
    a peer's hang would be hung itself the moment it stops waiting. Its group-mates' clocks
    start there too (the waiting rank held them up)."""
    group = group_of or _own_group
    out: dict[int, float] = {}
    for r in ranks:
        if r.last_waiting_at > -math.inf:
            g = group(r.pod_index)
            out[g] = max(out.get(g, -math.inf), r.last_waiting_at)
    return out


def _own_group(pod_index: int) -> int:
    return pod_index


def excuse_waiting_groups(stalled: Sequence[RankSignals], ranks: Iterable[RankSignals],
                          group_of: Callable[[int], int] | None = None) -> list[RankSignals]:
    """faultTolerance ReplicaGroups: a group stuck in a step stalls every other group in the
    exchange (their gradient sum, or the next quorum, waits for it). The ranks that only wait
    for the other groups are not hung themselves, and neither are their group-mates, which a
    rank that waits holds up in the group's own collectives (``group_of``: pod index -> replica
    group; without it every pod is its own). The stalled ranks of groups where no rank waits are
    the culprits, and the verdict names their group alone (only it restarts). A group may wait
    for one that saves, restarts its workers or heals, or for torchft's Lighthouse to drop a
    dying member (up to its join timeout), which is no hang of anyone; a wait that never ends
    (the Lighthouse is gone) is the trainer's watchdog's to end (``trainer.watchdogSeconds``:
    the workers exit with the hang code, and the restart follows from their exits)."""
    group = group_of or _own_group
    waiting = {group(r.pod_index) for r in ranks if r.waiting_for_groups}
    return [r for r in stalled if group(r.pod_index) not in waiting]


def _tally(worst: dict[int, tuple[RankSignals, int]], r: RankSignals) -> None:
    """Count ``r`` against its pod, keeping the pod's lowest-numbered offending rank."""
    prev = worst.get(r.pod_index)
    if prev is None:
        worst[r.pod_index] = (r, 1)
    else:
        worst[r.pod_index] = (prev[0] if prev[0].rank < r.rank else r, prev[1] + 1)
