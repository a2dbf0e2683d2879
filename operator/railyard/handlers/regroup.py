"""Replica groups shrink and grow back, in the reconcile cycle (faultTolerance ReplicaGroups):
the job goes on with fewer groups when a lost group cannot be placed, and the group comes back
once a node is usable. railyard.logic.recovery decides both (:class:`ShrinkAndWait`,
:class:`GrowBack`); this module executes the plans through the cycle's GangIO, with the steps
every recovery that keeps pods shares (handlers/attempts.py).

- :func:`shrink_groups` (the failure's cycle): the attempt moves on (its ConfigMap is the running
  table, unchanged), the lost groups' pods that must move are deleted, their other pods' launchers
  told to wait, the others carry on; ``lastRestart.state`` Waiting with the waiting groups; the
  job stays Running, Degraded with the count.
- :func:`grow_back` (each cycle while groups wait and the rest runs): when the plan says the
  waiting groups fit, start them as a group repair of the next attempt (``lastRestart`` Pending,
  then :func:`railyard.handlers.inplace.continue_in_place` as for any in-place restart).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from railyard.api.trainingjob import LastRestart, QuarantinedNode, TrainingJob
from railyard.handlers.attempts import member_names, running_table, write_attempt
from railyard.handlers.cycle import Cycle
from railyard.handlers.inplace import (
    carried_attempts,
    continue_in_place,
    fall_back_to_full,
    in_place_restart,
)
from railyard.logic.failure_report import describe_failure
from railyard.logic.gang import pod_index_of, pod_name_of
from railyard.logic.health.window import GroupLayout
from railyard.logic.lifecycle import FallBackToFull
from railyard.logic.manifests import with_addresses
from railyard.logic.placement import job_tolerations
from railyard.logic.planned import find_going_nodes
from railyard.logic.recovery import (
    GrowBack,
    KeepWaiting,
    Observed,
    ShrinkAndWait,
    WaitingGroups,
    decide_recovery,
)
from railyard.logic.restarts import restore_hint
from railyard.logic.shrink import WAITING
from railyard.logic.status import placement_status
from railyard.protocol.ranktable import RankTable

Obj = Mapping[str, Any]



async def shrink_groups(
    cycle: Cycle,
    job: TrainingJob,
    plan: ShrinkAndWait,
    table: RankTable,
    members: Sequence[Obj],
    real: Mapping[str, Obj],
    nodes: Mapping[str, Obj],
    quarantined: list[QuarantinedNode],
) -> float:
    """The job goes on with fewer replica groups (``table``: the running attempt's); returns
    when to look again."""
    runtime, spec, attempt = cycle.runtime, job.spec, cycle.status.attempt + 1
    failure, budget, shrink = plan.failure, plan.budget, plan.groups
    # the running table, renumbered: the carried-on groups run on it; the waiting groups' entries
    # keep their old nodes until the grow back places them
    renumbered = with_addresses(dataclasses.replace(table, attempt=attempt), cycle.ns)
    table, restore = await write_attempt(
        cycle, job, attempt, renumbered, restore_hint(cycle.status, spec, pods_kept=True)
    )
    delete = set(shrink.delete)
    await cycle.delete_pods(
        [real[pod_name_of(p)] for p in members if pod_index_of(p) in delete and pod_name_of(p) in real], nodes
    )
    names = member_names(cycle, members, attempt, len(table.pods), delete)
    backoff = budget.backoff_seconds
    lr = LastRestart(
        attempt=attempt,
        mode="InPlace",
        state=WAITING,
        message=plan.message,
        kept=len(table.pods) - len(delete),
        replaced=sorted(delete)[:64],
        reason=plan.reason,
        carried_on=list(shrink.carry_on),
        waiting_groups=list(shrink.waiting),
    )
    cycle.record_restart(failure, attempt=attempt, backoff_s=backoff, quarantined=quarantined, in_place=True,
                         last_restart=lr)
    runtime.control.publish(
        cycle.ns,
        cycle.name,
        attempt=attempt,
        members=names,
        table=table,
        restore=restore,
        open_=False,
        carry_on=shrink.carry_on,
        waiting=plan.message,
    )
    carry = carried_attempts(lr, attempt, members)

    def watch_on() -> None:
        # the carried-on groups' rank windows go on into the attempt (their beats keep counting)
        runtime.store.begin_attempt(
            cycle.ns, cycle.name, attempt, layout=GroupLayout.of(table, spec.replica_groups), carry_on=carry
        )

    cycle.after_commit.append(watch_on)
    runtime.metrics.count_restart(failure.cls)
    said = (
        describe_failure(failure, cycle.status.last_failure)
        if cycle.status.last_failure is not None
        else failure.message
    )
    cycle.event(
        "Warning", failure.kind, f"{said}; {budget.reason}; the job goes on with fewer replica groups: {plan.message}"
    )
    cycle.phase("Running", "ReplicaGroupsWaiting", plan.message)
    return 1.0


async def grow_back(cycle: Cycle, job: TrainingJob, members: Sequence[Obj], nodes: Mapping[str, Obj]) -> float | None:
    """Ask railyard.logic.recovery whether the waiting groups fit; start them if they do (the
    next attempt, a group repair: the carried-on groups go on untouched). Returns when to look
    again."""
    lr = in_place_restart(cycle)
    if lr is None or lr.state != WAITING:
        return None
    table = await running_table(cycle)
    plan = decide_recovery(
        Observed(
            cause=WaitingGroups(groups=tuple(lr.waiting_groups), carry_on=tuple(lr.carried_on)),
            job=job,
            status=cycle.status,
            generation=cycle.generation,
            members=members,
            nodes=nodes,
            cluster_pods=cycle.runtime.all_bound_pods(),
            table=table,
            refused=cycle.refused_nodes(),
            admitted=cycle.worker.kueue_topology,
            topology_cache=cycle.runtime.topology_cache,
            going=find_going_nodes(nodes, signals=cycle.runtime.settings.maintenance_signals,
                                   tolerations=job_tolerations(job)),
        )
    )
    match plan:
        case KeepWaiting():
            return None
        case FallBackToFull(reason, message):
            return await fall_back_to_full(cycle, job, reason, message, nodes)
        case GrowBack():
            return await _start_waiting_groups(cycle, job, plan, lr, members, nodes)
    raise AssertionError(f"{plan!r} is no plan for waiting replica groups")


async def _start_waiting_groups(
    cycle: Cycle, job: TrainingJob, plan: GrowBack, lr: LastRestart, members: Sequence[Obj], nodes: Mapping[str, Obj]
) -> float | None:
    runtime, spec, attempt = cycle.runtime, job.spec, cycle.status.attempt + 1
    table, restore = await write_attempt(
        cycle,
        job,
        attempt,
        with_addresses(plan.placement.rank_table, cycle.ns),
        restore_hint(cycle.status, spec, pods_kept=True),
    )
    moving = [p for p in members if pod_index_of(p) in plan.replace]
    if moving:
        await cycle.delete_pods(moving, nodes)
    names = member_names(cycle, members, attempt, len(table.pods), plan.replace)
    cycle.status = cycle.status.model_copy(
        update={
            "attempt": attempt,
            "placement": placement_status(plan.placement, attempt=attempt),
            "last_restart": LastRestart(
                attempt=attempt,
                mode="InPlace",
                state="Pending",
                message=plan.message,
                kept=len(plan.keep),
                replaced=sorted(plan.replace)[:64],
                reason=plan.reason,
                carried_on=list(plan.carry_on),
            ),
        }
    )
    runtime.control.publish(
        cycle.ns,
        cycle.name,
        attempt=attempt,
        members=names,
        table=table,
        restore=restore,
        open_=False,
        carry_on=plan.carry_on,
        waiting=f"preparing attempt {attempt}",
    )
    runtime.metrics.replica_group_restarts.inc(len(lr.waiting_groups))
    runtime.metrics.pods_replaced.inc(len(plan.replace))
    cycle.event("Normal", "ReplicaGroupsPlaced", plan.message)
    return await continue_in_place(cycle, job, nodes)
