"""Replica groups that shrink and grow back, in the reconcile cycle (faultTolerance ReplicaGroups): the job shrinks
when a lost group cannot be placed, and grows back once a node is usable. The decisions are
railyard.logic.shrink's (:func:`decide_shrink`, :func:`decide_grow_back`); this module executes
them through the cycle's GangIO, with the pieces of an in-place restart (handlers/inplace.py).

- :func:`shrink_groups` (the failure's cycle): the attempt moves on (its ConfigMap is the running
  table, unchanged), the lost groups' pods that must move are deleted, their other pods' launchers
  told to wait, the others carry on; ``lastRestart.state`` Waiting with the waiting groups; the
  job stays Running, Degraded with the count.
- :func:`grow_back` (each cycle while groups wait and the rest runs): place the gang again; when
  the waiting groups fit, start them as a group repair of the next attempt (``lastRestart``
  Pending, then :func:`railyard.handlers.inplace.continue_in_place` as for any in-place restart).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from railyard.api.trainingjob import LastRestart, QuarantinedNode, TrainingJob
from railyard.handlers.cycle import Cycle
from railyard.handlers.inplace import (
    _current_table,
    _place,
    carried_attempts,
    continue_in_place,
    fall_back_to_full,
    in_place_restart,
)
from railyard.logic.shrink import WAITING, KeepWaiting, Shrink, decide_grow_back
from railyard.logic.failure_report import describe_failure
from railyard.logic.failures import Failure
from railyard.logic.gang import pod_index_of
from railyard.logic.health.window import GroupLayout
from railyard.logic.inplace import GROUP_REPAIR, RestartPlan
from railyard.logic.manifests import (
    build_configmap,
    build_trainer_config,
    owner_reference,
    pod_name,
    with_addresses,
)
from railyard.logic.restarts import RestartDecision, restart_update, restore_hint
from railyard.logic.status import placement_status
from railyard.protocol.ranktable import RankTable

Obj = Mapping[str, Any]


def _name(p: Obj) -> str:
    return str((p.get("metadata") or {}).get("name") or "")


async def _write_attempt(cycle: Cycle, job: TrainingJob, attempt: int, table: RankTable) -> tuple[RankTable, Any]:
    """The attempt's ConfigMap (rank table, trainer config); one written by an earlier try of
    this same step (an operator that died before its status patch) is the one that counts."""
    spec = job.spec
    restore = restore_hint(cycle.status, spec, pods_kept=True)
    config = build_trainer_config(spec, job=cycle.name, namespace=cycle.ns, attempt=attempt, restore=restore)
    if not await cycle.io.create_object(build_configmap(cycle.name, cycle.ns, owner_reference(cycle.body), attempt=attempt, rank_table=table,
                                                    config=config, replica_groups=spec.replica_groups)):
        again = await cycle.io.read_rank_table(cycle.ns, cycle.name, attempt)
        if again is not None and len(again.pods) == len(table.pods):
            table = again
            written = await cycle.io.read_attempt_config(cycle.ns, cycle.name, attempt)
            restore = (written or {}).get("restore", restore)
    return table, restore


async def shrink_groups(
    cycle: Cycle,
    job: TrainingJob,
    failure: Failure,
    decision: RestartDecision,
    shrink: Shrink,
    members: Sequence[Obj],
    real: Mapping[str, Obj],
    nodes: Mapping[str, Obj],
    quarantined: list[QuarantinedNode],
) -> float | RestartPlan:
    """The job goes on with fewer replica groups; returns when to look again, or a Full plan
    when the running attempt's rank table is gone (nothing to go on from)."""
    runtime, spec, attempt = cycle.runtime, job.spec, cycle.status.attempt + 1
    prev = await _current_table(cycle)
    if prev is None:
        return RestartPlan("Full", "NotPlaceable", "full restart (NotPlaceable): the running attempt's rank table is gone")
    # the running table, renumbered: the carried-on groups run on it; the waiting groups' entries
    # keep their old nodes until the grow back places them
    table, restore = await _write_attempt(cycle, job, attempt, with_addresses(dataclasses.replace(prev, attempt=attempt), cycle.ns))
    delete = set(shrink.delete)
    await cycle.delete_pods([real[_name(p)] for p in members if pod_index_of(p) in delete and _name(p) in real], nodes)
    by_index = {pod_index_of(p): _name(p) for p in members}
    names = {i: (by_index[i] if i in by_index and i not in delete else pod_name(cycle.name, attempt, i)) for i in range(len(table.pods))}
    backoff = decision.backoff_seconds
    lr = LastRestart(attempt=attempt, mode="InPlace", state=WAITING, message=shrink.message, kept=len(table.pods) - len(delete),
                     replaced=sorted(delete)[:64], reason=GROUP_REPAIR, carried_on=list(shrink.carry_on), waiting_groups=list(shrink.waiting))
    cycle.status = cycle.status.model_copy(update={
        **restart_update(cycle.status, failure, attempt=attempt, now=cycle.now, now_iso=cycle.iso, backoff_s=backoff,
                         quarantined=quarantined, in_place=True),
        "last_restart": lr,
    })
    runtime.control.publish(cycle.ns, cycle.name, attempt=attempt, members=names, table=table, restore=restore, open_=False,
                       carry_on=shrink.carry_on, waiting=shrink.message)
    carry = carried_attempts(lr, attempt, members)

    def watch_on() -> None:
        # the carried-on groups' rank windows go on into the attempt (their beats keep counting)
        runtime.store.begin_attempt(cycle.ns, cycle.name, attempt, layout=GroupLayout.of(table, spec.replica_groups), carry_on=carry)

    cycle.after_commit.append(watch_on)
    runtime.metrics.restarts.labels(**{"class": failure.cls.value}).inc()
    said = describe_failure(failure, cycle.status.last_failure) if cycle.status.last_failure is not None else failure.message
    cycle.event("Warning", failure.kind, f"{said}; {decision.reason}; the job goes on with fewer replica groups: {shrink.message}")
    cycle.phase("Running", "ReplicaGroupsWaiting", shrink.message)
    return 1.0


async def grow_back(cycle: Cycle, job: TrainingJob, members: Sequence[Obj], nodes: Mapping[str, Obj]) -> float | None:
    """Place the waiting groups if a node is usable; then start them (the next attempt, a group
    repair: the carried-on groups go on untouched). Returns when to look again."""
    lr = in_place_restart(cycle)
    if lr is None or lr.state != WAITING:
        return None
    runtime, spec = cycle.runtime, job.spec
    prev = await _current_table(cycle)
    if prev is None:
        return await fall_back_to_full(cycle, job, "NotPlaceable", f"the rank table of attempt {cycle.status.attempt} is gone", nodes)
    attempt = cycle.status.attempt + 1
    result = _place(cycle, job, prev, nodes, {q.node for q in cycle.status.quarantined_nodes}, attempt)
    present = {pod_index_of(p) for p in members}
    d = decide_grow_back(result, waiting=lr.waiting_groups, group_size=len(prev.pods) // max(spec.replica_groups, 1),
                         present=present, carry_on=lr.carried_on, old_nodes={p.pod_index: p.node for p in prev.pods})
    if isinstance(d, KeepWaiting):
        return None
    table, restore = await _write_attempt(cycle, job, attempt, with_addresses(d.placement.rank_table, cycle.ns))
    moving = [p for p in members if pod_index_of(p) in d.replace]
    if moving:
        await cycle.delete_pods(moving, nodes)
    by_index = {pod_index_of(p): _name(p) for p in members}
    names = {i: (by_index[i] if i in by_index and i not in d.replace else pod_name(cycle.name, attempt, i)) for i in range(len(table.pods))}
    cycle.status = cycle.status.model_copy(update={
        "attempt": attempt,
        "placement": placement_status(d.placement, attempt=attempt),
        "last_restart": LastRestart(attempt=attempt, mode="InPlace", state="Pending", message=d.message, kept=len(d.keep),
                                    replaced=sorted(d.replace)[:64], reason=GROUP_REPAIR, carried_on=list(d.carry_on)),
    })
    runtime.control.publish(cycle.ns, cycle.name, attempt=attempt, members=names, table=table, restore=restore, open_=False, carry_on=d.carry_on,
                       waiting=f"preparing attempt {attempt}")
    runtime.metrics.replica_group_restarts.inc(len(lr.waiting_groups))
    runtime.metrics.pods_replaced.inc(len(d.replace))
    cycle.event("Normal", "ReplicaGroupsPlaced", d.message)
    return await continue_in_place(cycle, job, nodes)
