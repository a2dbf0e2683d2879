"""Planned moves in the reconcile cycle: a node of the running gang announced to go (cordoned,
tainted by someone else, maintenance announced; logic/planned.py) moves the gang's pods off it
ahead of time. railyard.logic.recovery decides (:class:`MoveAhead`, or the full restart or
shrink it falls back to, all of class Planned: no restart budget); the executors are the
failure path's (handlers/inplace.py, handlers/regroup.py, handlers/failures.py). Nothing is
quarantined: the node is not to blame. The job's PodDisruptionBudget keeps ``kubectl drain``
waiting (429) until the operator's own deletion has moved the pod; then the drain completes.

Without ReplicaGroups the move first waits for a just-in-time save to the memory tier
(logic/jitsave.py decides: request, wait, move; the order goes out on the control channel), so
the in-place restart resumes from the step the gang had reached. With ReplicaGroups it first waits
for the moved groups to leave the quorum at a step boundary (logic/groupleave.py: the same order,
to their launchers only), so the other groups never fail a step for the move.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from railyard.api.trainingjob import TrainingJob
from railyard.handlers.attempts import running_table
from railyard.handlers.cycle import Cycle
from railyard.handlers.failures import restart_whole_gang
from railyard.handlers.inplace import begin_in_place, capable_pods
from railyard.handlers.regroup import shrink_groups
from railyard.logic.gang import pod_index_of
from railyard.logic.groupleave import decide_group_leave, leave_message, leaving_pods
from railyard.logic.jitsave import AwaitSave, JitSavePlan, MoveNow, RequestSave, decide_jit_save
from railyard.logic.placement import job_tolerations
from railyard.logic.planned import find_going_nodes, find_planned_moves
from railyard.logic.recovery import (
    Fail,
    FullRestart,
    Observed,
    PlannedMoves,
    RestartInPlace,
    ShrinkAndWait,
    decide_recovery,
)
from railyard.protocol.restore import latest_verified_per_tier

Obj = Mapping[str, Any]


def _node(p: Obj) -> str:
    return str((p.get("spec") or {}).get("nodeName") or "")


def announced_moves(cycle: Cycle, job: TrainingJob, members: Sequence[Obj], nodes: Mapping[str, Obj]) -> dict[str, str]:
    """The gang's nodes announced to go now (node -> why); only pods not being deleted count."""
    on = [_node(p) for p in members if not (p.get("metadata") or {}).get("deletionTimestamp")]
    return find_planned_moves(nodes, on, signals=cycle.runtime.settings.maintenance_signals,
                              tolerations=job_tolerations(job))


def save_first(cycle: Cycle, job: TrainingJob, going: Mapping[str, str]) -> JitSavePlan:
    """Whether the move off ``going`` waits for a just-in-time save (logic/jitsave.py decides
    from the status: the newest step reported, the memory tier's newest committed save), or with
    ReplicaGroups for the moved groups to leave the quorum (logic/groupleave.py)."""
    spec = job.spec
    saved = [r.step for r in cycle.status.checkpoints if r.tier == "memory"]
    step = cycle.status.step
    window = cycle.runtime.store.job(cycle.ns, cycle.name)
    if window is not None and window.attempt == cycle.status.attempt:
        # the heartbeats as they arrived set the save step (the status shows them from the end of
        # this cycle on); whether the save is there is read from the status, as the restore hint is
        step = max(
            step, int(window.max_step), latest_verified_per_tier(window.last_checkpoints().values()).get("memory", -1)
        )
    if spec.replica_groups > 1:
        return _leave_first(cycle, job, going, step)
    return decide_jit_save(
        pending=cycle.runtime.control.save_order(cycle.ns, cycle.name), attempt=cycle.status.attempt, going=going,
        reported_step=step, memory_saved_step=max(saved, default=-1), now=cycle.now,
        replica_groups=spec.replica_groups, in_place=spec.restart_policy.in_place,
        memory_tier=spec.checkpoint.memory.enabled, timeout_s=cycle.runtime.settings.save_before_stop_s,
    )


def _leave_first(cycle: Cycle, job: TrainingJob, going: Mapping[str, str], step: int) -> JitSavePlan:
    """ReplicaGroups: the moved groups' pods (every pod of a group with a pod on a going node) and
    the steps their launchers reported leaving the quorum after, for logic/groupleave.py."""
    on_going = [  # (spares and the Lighthouse have no pod index: -1)
        pod_index_of(p) for p in cycle.runtime.pods_of(cycle.ns, cycle.name)
        if _node(p) in going and not (p.get("metadata") or {}).get("deletionTimestamp") and pod_index_of(p) >= 0
    ]
    pending = cycle.runtime.control.save_order(cycle.ns, cycle.name)
    left = {
        i: r.left_step for i, (r, _) in cycle.runtime.control.reports(cycle.ns, cycle.name).items()
        if pending is not None and r.attempt == pending.attempt
    }
    return decide_group_leave(
        pending=pending, attempt=cycle.status.attempt, going=going,
        pods=leaving_pods(on_going, pods=job.spec.nodes, replicas=job.spec.replica_groups), left=left,
        reported_step=step, now=cycle.now, in_place=job.spec.restart_policy.in_place,
        timeout_s=cycle.runtime.settings.save_before_stop_s,
    )


def request_save(cycle: Cycle, plan: RequestSave | AwaitSave) -> float:
    """Publish the save order (once: its Event says what is saved, or which pods leave the
    quorum, and why); when to look again."""
    if isinstance(plan, RequestSave):
        cycle.runtime.control.order_save(cycle.ns, cycle.name, plan.order)
        if plan.order.pods:
            cycle.event("Normal", "PlannedMoveLeaving", leave_message(plan.order))
        else:
            cycle.event("Normal", "PlannedMoveSaving", plan.message)
    return plan.recheck_s


async def move_ahead(
    cycle: Cycle, job: TrainingJob, going: Mapping[str, str], members: Sequence[Obj], nodes: Mapping[str, Obj],
    saved: MoveNow,
) -> float | None:
    """Execute the planned move off ``going`` (node -> why); ``saved``: what it resumes from
    (:func:`save_first`'s answer). Returns when to look again."""
    runtime = cycle.runtime
    real = {str((p.get("metadata") or {}).get("name")): p for p in runtime.pods_of(cycle.ns, cycle.name)}
    gang = [real.get(str((p.get("metadata") or {}).get("name")), p) for p in members]
    table = await running_table(cycle) if job.spec.restart_policy.in_place else None
    cause = PlannedMoves(dict(going))
    t0 = time.perf_counter()
    plan = decide_recovery(Observed(
        cause=cause, job=job, status=cycle.status, generation=cycle.generation, members=gang, nodes=nodes,
        cluster_pods=runtime.all_bound_pods() if table is not None else (), table=table,
        capable=capable_pods(cycle, gang), reported=members, said=cause.failure.message,
        refused=cycle.refused_nodes(), topology_cache=runtime.topology_cache, admitted=cycle.worker.kueue_topology,
        going=find_going_nodes(nodes, signals=runtime.settings.maintenance_signals, tolerations=job_tolerations(job)),
    ))
    runtime.metrics.placement.observe(time.perf_counter() - t0)
    moved = sorted(pod_index_of(p) for p in gang if _node(p) in going)
    runtime.metrics.planned_moves.inc()
    quarantined = list(cycle.status.quarantined_nodes)
    match plan:
        case RestartInPlace():  # MoveAhead, with ReplicaGroups a group repair
            cycle.event("Normal", "PlannedMove", f"{plan.message}; {saved.note}")
            return await begin_in_place(cycle, job, plan, gang, real, nodes, quarantined)
        case ShrinkAndWait():
            assert table is not None, "a shrink goes on from the running table"
            cycle.event(
                "Normal", "PlannedMove", f"{cause.failure.message}: pods {moved} move; {plan.message}; {saved.note}"
            )
            return await shrink_groups(cycle, job, plan, table, gang, real, nodes, quarantined)
        case FullRestart():
            cycle.event(
                "Normal", "PlannedMove", f"{cause.failure.message}: the whole gang moves; {plan.message}; {saved.note}"
            )
            return await restart_whole_gang(cycle, plan, cause.failure.message, gang, nodes, quarantined)
        case Fail():  # a planned move spends no budget: never, but say so if it were
            cycle.event("Warning", "PlannedMoveRefused", plan.message)
            return None
    raise AssertionError(f"{plan!r} is no plan of a planned move")
