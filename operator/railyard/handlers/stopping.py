"""A stop on purpose loses no step: before ``spec.suspend: true`` or Kueue's eviction deletes a
running gang's pods, the ranks save to the memory tier at a step boundary (the planned move's
just-in-time save, the same order on the control channel). railyard.logic.jitsave decides (save
first, or stop now and say why); this module reads its inputs and executes it. The next attempt
(resumed, readmitted) is placed sticky on the same nodes and restores that save: its first step
is the saved step + 1.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from railyard.api.trainingjob import TrainingJob
from railyard.handlers.cycle import Cycle
from railyard.handlers.health import evaluate_health
from railyard.handlers.inplace import capable_pods, in_place_restart, members_since
from railyard.logic.gang import gang_members, pod_index_of
from railyard.logic.jitsave import RequestSave, StopNow, decide_stop_save

Obj = Mapping[str, Any]


def _trains_whole(cycle: Cycle, members: Sequence[Obj]) -> bool:
    """Every rank can hear the order: the job Running, no restart under way, each pod of the gang
    Running (not being deleted) with its launcher on the control channel for this attempt."""
    placement = cycle.status.placement
    if cycle.status.phase != "Running" or in_place_restart(cycle) is not None or placement is None:
        return False
    live = [p for p in members if not (p.get("metadata") or {}).get("deletionTimestamp")
            and (p.get("status") or {}).get("phase") == "Running"]
    if len(live) != placement.node_count:
        return False
    return {pod_index_of(p) for p in live} <= capable_pods(cycle, live)


def save_before_stop(
    cycle: Cycle, job: TrainingJob, pods: Sequence[Obj], *, purpose: str, quota_released: bool = False
) -> StopNow | float:
    """The gang may stop now (:class:`StopNow` says from what the next attempt resumes), or the
    seconds until the next look while the save is asked for and awaited (the gang trains on; its
    heartbeats bring the save's commit into the status, where the next attempt's restore hint
    reads it)."""
    members, _ = gang_members(pods, attempt=cycle.status.attempt, since=members_since(cycle))
    running = _trains_whole(cycle, members)
    if running:
        evaluate_health(cycle, job, members, report=False)  # progress only: the gang stops anyway
    spec, control = job.spec, cycle.runtime.control
    plan = decide_stop_save(
        purpose=purpose, pending=control.save_order(cycle.ns, cycle.name), attempt=cycle.status.attempt,
        running=running, reported_step=cycle.status.step,
        memory_saved_step=max((r.step for r in cycle.status.checkpoints if r.tier == "memory"), default=-1),
        now=cycle.now, replica_groups=spec.replica_groups, in_place=spec.restart_policy.in_place,
        memory_tier=spec.checkpoint.memory.enabled, memory_on_host=spec.checkpoint.memory.medium == "HostPath",
        quota_released=quota_released, timeout_s=cycle.runtime.settings.save_before_stop_s,
    )
    if isinstance(plan, StopNow):
        if control.save_order(cycle.ns, cycle.name) is not None:
            control.withdraw_save(cycle.ns, cycle.name)
        if running:
            cycle.event("Normal" if plan.saved >= 0 else "Warning", "SavedBeforeStop" if plan.saved >= 0
                        else "StoppedWithoutSave", f"{purpose}: {plan.note}")
        return plan
    if isinstance(plan, RequestSave):
        control.order_save(cycle.ns, cycle.name, plan.order)
        cycle.event("Normal", "SavingBeforeStop", plan.message)
    return plan.recheck_s
