"""The clean leave before a planned move with faultTolerance ReplicaGroups: the state machine
"leave ordered at step S -> the moved groups left the quorum -> move", decided from what was
observed (no clock: ``now`` is a parameter) and executed by handlers/planned.py.

A planned move restarts only the replica groups with a pod on a node announced to go. Deleted as
they train, such a group dies at some moment of a step: when it is inside the step's cross-group
all-reduce, the other groups' step fails and is tried again (torchft does not commit it). So first
the operator orders the moved groups' launchers, and only theirs (the control channel's ``save``
order naming their pod indices, logic/jitsave.py's :class:`SaveOrder`), to leave at a step boundary
no earlier than ``S = the newest step reported + LEAD_STEPS``. The ranks of a group agree on the one
step in the group's own loss all-reduce (railyard_trainer/jitsave.py), and after that step's commit
they stop their torchft Manager (its heartbeats to the Lighthouse end), save to their memory tier
and hold still. The other groups' next quorum leaves them out once the Lighthouse's heartbeat
timeout has passed: one quorum change, no failed step. Each launcher reports the step its workers
left after (``left_step``); when every moved pod has, the move goes ahead and the moved group
heals from a live peer. When they have not within ``timeout_s`` (a job's own program, which does
not read the order; a launcher that does not answer), the move goes ahead as without it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from railyard.logic.jitsave import (
    DEFAULT_TIMEOUT_S,
    LEAD_STEPS,
    RECHECK_S,
    AwaitSave,
    JitSavePlan,
    MoveNow,
    RequestSave,
    SaveOrder,
)
from railyard.protocol.mesh import group_of_pod_index, pods_of_group, pods_per_group


def leaving_pods(moved: Collection[int], *, pods: int, replicas: int) -> tuple[int, ...]:
    """Every pod index of the replica groups that have a pod in ``moved``: a group restarts
    whole, so all its pods leave together."""
    size = pods_per_group(pods, replicas)
    groups = {group_of_pod_index(i, size) for i in moved}
    return tuple(sorted(i for g in groups for i in pods_of_group(g, size)))


def leave_message(order: SaveOrder) -> str:
    """What the ``PlannedMoveLeaving`` Event says."""
    return (f"pods {list(order.pods)} leave the replica groups' quorum at step {order.step} or the next step "
            f"boundary after it before the planned move off {', '.join(order.nodes)}")


def decide_group_leave(
    *,
    pending: SaveOrder | None,
    attempt: int,
    going: Mapping[str, str],
    pods: tuple[int, ...],
    left: Mapping[int, int],
    reported_step: int,
    now: float,
    in_place: bool,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> JitSavePlan:
    """What to do about the leave before a planned move off ``going``.

    ``pods``: the pod indices that leave (:func:`leaving_pods`); ``pending``: the order published
    earlier (None: none); ``left``: pod index -> the step its workers left after, as the
    launchers of ``attempt`` reported it; ``reported_step``: the newest step the ranks reported."""
    if not in_place:
        return MoveNow(-1, "no clean leave: in-place restarts are off (no launcher to tell)")
    if not pods:
        return MoveNow(-1, "no clean leave: no pod of the gang is on the going nodes")
    if pending is None or pending.attempt != attempt or pending.pods != pods:
        return RequestSave(SaveOrder(attempt=attempt, step=max(reported_step, 0) + LEAD_STEPS, requested_at=now,
                                     nodes=tuple(sorted(going)), pods=pods))
    steps = [left[i] for i in pods if left.get(i, -1) >= 0]
    if len(steps) == len(pods):
        return MoveNow(-1, f"pods {list(pods)} left the replica groups' quorum after step {max(steps)}; the moved "
                           "groups heal from a live peer")
    waited = now - pending.requested_at
    if waited >= timeout_s:
        return MoveNow(-1, f"pods {list(pods)} did not leave the replica groups' quorum within {timeout_s:g}s; moved "
                           "as they were (the other groups may try a step again)")
    return AwaitSave(pending, min(RECHECK_S, timeout_s - waited))
