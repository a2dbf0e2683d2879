"""In-place restarts in the reconcile cycle: keep the pods on healthy nodes, replace the others,
tell every kept launcher to restart its workers, fall back to a full restart when that cannot
work. What to do is decided in logic/ (railyard.logic.recovery's plan, railyard.logic.lifecycle's
steps); this module executes it through the cycle's GangIO.

The sequence (docs/operator.md "Restarting in place"):

1. :func:`begin_in_place` (the failure's cycle) executes a :class:`RestartInPlace` or
   :class:`RepairGroups` plan: write the new attempt's ConfigMap, delete the pods that move,
   record attempt + 1 with ``lastRestart`` (mode InPlace, state Pending) and the backoff. The
   launchers of the failed attempt are told to wait; those of replaced pods to stop.
2. :func:`continue_in_place` (once the backoff passed; every cycle until all pods run): create
   the replacements gated, delete the hot-spare placeholders on their nodes, lift each gate once
   its placeholder is gone; then (state Started, after the status is written) open the restart
   orders, which the waiting launchers receive at once.
3. :func:`observe_relaunch`: which kept launchers have not reported the new attempt running;
   railyard.logic.lifecycle decides: all have (:func:`finish_in_place`: state Done, and the gang
   is Running as any other), or one has not within ``restartPolicy.inPlaceTimeoutSeconds``
   (:func:`fall_back_to_full`), or wait (:func:`await_relaunch`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from railyard.api.trainingjob import LastRestart, QuarantinedNode, TrainingJob
from railyard.handlers.attempts import member_names, write_attempt
from railyard.handlers.cycle import Cycle
from railyard.handlers.health import heartbeat_url_for
from railyard.handlers.spares import PLACEHOLDER_GRACE_S
from railyard.k8s.client import ApiError
from railyard.logic.conditions import format_micro_time, parse_time
from railyard.logic.failure_report import describe_failure
from railyard.logic.gang import attempt_of, gang_members, is_gated, pod_index_of, pod_name_of
from railyard.logic.health.window import GroupLayout
from railyard.logic.inplace import GROUP_REPAIR, decide_capable, decide_unacknowledged
from railyard.logic.inplace import members_since as logic_members_since
from railyard.logic.lifecycle import KEPT_ATTEMPTS, Relaunch, earlier_attempts
from railyard.logic.manifests import (
    build_pod,
    configmap_name,
    owner_reference,
    pod_name,
    spare_pod_name,
    with_addresses,
)
from railyard.logic.recovery import RestartInPlace
from railyard.logic.restarts import new_fence, restore_hint
from railyard.logic.schedulers import apply_to_pods
from railyard.logic.shrink import WAITING
from railyard.logic.status import placement_status
from railyard.protocol.exitcodes import FailureClass

log = logging.getLogger(__name__)
Obj = Mapping[str, Any]



def in_place_restart(cycle: Cycle) -> LastRestart | None:
    """The in-place restart the current attempt is going through (None: none, or done)."""
    lr = cycle.status.last_restart
    if lr is None or lr.mode != "InPlace" or lr.attempt != cycle.status.attempt or lr.state == "Done":
        return None
    return lr


def carried_on(lr: LastRestart | None, attempt: int) -> tuple[int, ...]:
    """The pod indices that carry on with an older attempt after a replica-group repair of
    ``attempt`` (their launchers are never told to restart)."""
    if lr is None or lr.attempt != attempt or lr.reason != GROUP_REPAIR:
        return ()
    return tuple(lr.carried_on)


def carried_attempts(lr: LastRestart | None, attempt: int, members: Sequence[Obj]) -> dict[int, int]:
    """Pod index -> the attempt its pod was created in, for the pods that carry on: the
    heartbeat store accepts their beats from that attempt on."""
    carry = set(carried_on(lr, attempt))
    return {pod_index_of(p): attempt_of(p) for p in members if pod_index_of(p) in carry}


def members_since(cycle: Cycle) -> int | None:
    """The ``since`` of :func:`railyard.logic.gang.gang_members` for the cycle's attempt."""
    return logic_members_since(cycle.status)


def capable_pods(cycle: Cycle, members: Sequence[Obj]) -> frozenset[int]:
    """Pod indices whose launcher spoke the control protocol in the current attempt (or, for a
    pod that carries on after a replica-group repair, in the older attempt it still runs; or,
    while the current attempt's in-place restart is under way, in the attempt it came from):
    railyard.logic.inplace's decide_capable."""
    attempt = cycle.status.attempt
    return decide_capable(
        members,
        cycle.runtime.control.reports(cycle.ns, cycle.name),
        attempt=attempt,
        restarting_from=attempt - 1 if in_place_restart(cycle) is not None else None,
        carried=carried_attempts(cycle.status.last_restart, attempt, members),
    )


async def begin_in_place(
    cycle: Cycle,
    job: TrainingJob,
    plan: RestartInPlace,
    members: Sequence[Obj],
    real: Mapping[str, Obj],
    nodes: Mapping[str, Obj],
    quarantined: list[QuarantinedNode],
) -> float | None:
    """Step 1: execute an in-place restart or a replica-group repair (railyard.logic.recovery
    decided it, placement included). Returns the delay until the next look."""
    runtime, spec, attempt = cycle.runtime, job.spec, cycle.status.attempt + 1
    failure, budget = plan.failure, plan.budget
    restore = restore_hint(cycle.status, spec, pods_kept=True, fence=new_fence(failure, attempt))
    table = with_addresses(plan.placement.rank_table, cycle.ns)
    table, restore = await write_attempt(cycle, job, attempt, table, restore)
    moving = [real[pod_name_of(p)] for p in members if pod_index_of(p) in plan.replace and pod_name_of(p) in real]
    await cycle.delete_pods(moving, nodes)

    backoff = budget.backoff_seconds
    names = member_names(cycle, members, attempt, len(table.pods), plan.replace)
    cycle.record_restart(
        failure, attempt=attempt, backoff_s=backoff, quarantined=quarantined, in_place=True,
        placement=placement_status(plan.placement, attempt=attempt),
        last_restart=LastRestart(attempt=attempt, mode="InPlace", state="Pending", message=plan.message,
                                 kept=len(plan.keep), replaced=sorted(plan.replace)[:64], reason=plan.reason,
                                 carried_on=list(plan.carry_on)),
    )
    waiting = f"restart to attempt {attempt} in {backoff:g}s" if backoff > 0 else f"preparing attempt {attempt}"
    runtime.control.publish(cycle.ns, cycle.name, attempt=attempt, members=names, table=table, restore=restore,
                            open_=False, carry_on=plan.carry_on, waiting=waiting)
    if plan.carry_on:  # a group repair (RepairGroups, or a planned move with ReplicaGroups)
        runtime.metrics.replica_group_restarts.inc(len(plan.moves.restarting_groups))
    runtime.metrics.count_restart(failure.cls)
    runtime.metrics.restart_modes.labels(mode="InPlace", reason="None").inc()
    runtime.metrics.pods_replaced.inc(len(plan.replace))
    wait = f", workers restart in {backoff:g}s" if backoff > 0 else ""
    planned = failure.cls is FailureClass.PLANNED  # a planned move: not a failure, its own words
    said = (
        failure.message
        if planned or cycle.status.last_failure is None
        else describe_failure(failure, cycle.status.last_failure)
    )
    cycle.phase("Restarting", failure.kind, f"{said}; {budget.reason}; {plan.message}{wait}")
    if backoff > 0:
        return backoff
    # the Restarting phase lasts no cycle: its Event is written here, the Starting one follows
    cycle.event("Normal" if planned else "Warning", failure.kind, cycle.status.message)
    return await continue_in_place(cycle, job, nodes)


async def continue_in_place(cycle: Cycle, job: TrainingJob, nodes: Mapping[str, Obj]) -> float | None:
    """Step 2, idempotent: replacements created, placeholders out of their way, gates lifted,
    orders opened. Returns when to look again (None: on events)."""
    lr = in_place_restart(cycle)
    assert lr is not None
    runtime, attempt = cycle.runtime, cycle.status.attempt
    if lr.state == "Pending":
        next_attempt = parse_time(cycle.status.next_attempt_time)
        if next_attempt is not None and cycle.now < next_attempt:
            return next_attempt - cycle.now
    table = runtime.control.table(cycle.ns, cycle.name, attempt) or await cycle.io.read_rank_table(
        cycle.ns, cycle.name, attempt
    )
    if table is None:
        return await fall_back_to_full(
            cycle, job, "NotPlaceable", f"the rank table of attempt {attempt} is gone", nodes
        )
    # pods this operator asked to delete are gone as far as the plan goes (the watch may not
    # have caught up with the deletion yet)
    pods = [
        p
        for p in runtime.pods_of(cycle.ns, cycle.name)
        if pod_name_of(p) not in cycle.worker.deleting and not (p.get("metadata") or {}).get("deletionTimestamp")
    ]
    members, _ = gang_members(pods, attempt=attempt, since=cycle.status.pods_since_attempt)
    present = {pod_index_of(p): p for p in members}
    owner = owner_reference(cycle.body)
    url = heartbeat_url_for(runtime, cycle.ns, cycle.name)
    missing = [
        build_pod(
            job.spec,
            job=cycle.name,
            namespace=cycle.ns,
            owner=owner,
            attempt=attempt,
            pod_index=e.pod_index,
            node=e.node,
            heartbeat_url=url,
            annotations=runtime.settings.pod_annotations,
        )
        for e in table.pods
        if e.pod_index not in present
    ]
    if missing:
        # the replacements are the new attempt's group on their own (logic/schedulers.py): the
        # kept pods' group was scheduled, and a pod's group is immutable
        kept = {pod_index_of(p) for p in members if attempt_of(p) < attempt}
        replaced = [e.node for e in sorted(table.pods, key=lambda e: e.pod_index) if e.pod_index not in kept]
        sched = await cycle.plan_gang(job.spec, attempt=attempt, gang_nodes=replaced)
        if sched.objects:
            try:
                await cycle.io.create_podgroups(sched.objects)
            except ApiError as exc:
                if not cycle.drop_detected(sched, exc.status):
                    raise
                sched = await cycle.plan_gang(job.spec, attempt=attempt, gang_nodes=replaced)
        missing = apply_to_pods(missing, sched)
        runtime.metrics.pods_created.inc(await cycle.io.create_pods(missing))
    # replacements (new or from a previous cycle) still gated, and the placeholders in their way
    # (found by name: the pod index keeps no annotations)
    node_of = {e.pod_index: e.node for e in table.pods}
    gated = [p for p in [*missing, *(p for p in members if is_gated(p))] if attempt_of(p) == attempt]
    in_way_names = {spare_pod_name(cycle.name, node_of[pod_index_of(p)]): node_of[pod_index_of(p)] for p in gated}
    in_way = [s for s in runtime.pods_of(cycle.ns, cycle.name, spare=True) if pod_name_of(s) in in_way_names]
    if in_way:
        await cycle.delete_pods(in_way, nodes, grace_seconds=PLACEHOLDER_GRACE_S)
    blocked = {in_way_names[pod_name_of(s)] for s in in_way}
    ready = [p for p in gated if node_of[pod_index_of(p)] not in blocked]
    if ready:
        await cycle.io.lift_gates(ready)
    if lr.state == "Pending":
        # when the orders open: after this cycle's writes above, just before the status write
        # they wait for (not when the cycle began: those writes take seconds on a loaded server)
        started = format_micro_time(cycle.clock())
        cycle.status = cycle.status.model_copy(update={
            "last_restart": lr.model_copy(update={"state": "Started", "started_time": started}),
            "gang_created_time": started, "time_to_all_ready_seconds": None, "next_attempt_time": None,
            "observed_generation": cycle.generation, "pending_spec_changes": "",
        })
        names = {
            i: pod_name_of(present[i]) if i in present else pod_name(cycle.name, attempt, i)
            for i in range(len(table.pods))
        }
        carry_on = carried_on(lr, attempt)

        def open_orders() -> None:
            runtime.control.publish(
                cycle.ns, cycle.name, attempt=attempt, members=names, table=table, open_=True, carry_on=carry_on
            )
            runtime.store.begin_attempt(
                cycle.ns,
                cycle.name,
                attempt,
                layout=GroupLayout.of(table, job.spec.replica_groups),
                carry_on=carried_attempts(lr, attempt, members),
            )

        cycle.after_commit.append(open_orders)
        cycle.phase("Starting", "RestartedInPlace", f"attempt {attempt}: {lr.message}")
    # placeholders go within a kubelet round trip; their deletion events wake this job
    return 0.5 if blocked else None


async def _drop_old_configmaps(cycle: Cycle, members: Sequence[Obj]) -> None:
    """Delete the ConfigMaps of attempts no pod of the gang was created for (kept pods still
    mount their own attempt's), keeping those of the earlier attempts a new gang keeps."""
    used = {attempt_of(p) for p in members}
    kept_from = earlier_attempts(cycle.status.attempt).start
    old = [
        configmap_name(cycle.name, earlier)
        for earlier in range(max(kept_from - KEPT_ATTEMPTS, 0), kept_from)
        if earlier not in used
    ]
    if old:
        await cycle.io.delete_configmaps(cycle.ns, old)


def observe_relaunch(cycle: Cycle, job: TrainingJob, members: Sequence[Obj]) -> Relaunch | None:
    """Step 3, what is seen: the kept launchers that have not reported the new attempt yet
    (None: no in-place restart is Started)."""
    lr = in_place_restart(cycle)
    if lr is None or lr.state != "Started":
        return None
    attempt = cycle.status.attempt
    carry_on = set(carried_on(lr, attempt))
    kept = [pod_index_of(p) for p in members if attempt_of(p) < attempt and pod_index_of(p) not in carry_on]
    names = {pod_index_of(p): pod_name_of(p) for p in members}
    reports = cycle.runtime.control.reports(cycle.ns, cycle.name)
    waiting = decide_unacknowledged(kept, reports, names, attempt=attempt)
    return Relaunch(
        waiting=tuple(f"{names[i]} (index {i}{_said(reports.get(i), attempt)})" for i in waiting),
        started=parse_time(lr.started_time) or cycle.now,
        timeout_s=job.spec.restart_policy.in_place_timeout_seconds,
    )


async def finish_in_place(cycle: Cycle, members: Sequence[Obj]) -> None:
    """Every kept launcher runs the attempt: the restart is Done (old ConfigMaps can go)."""
    lr = in_place_restart(cycle)
    assert lr is not None
    started = parse_time(lr.started_time) or cycle.now
    cycle.runtime.metrics.in_place_restart.observe(max(cycle.now - started, 0.0))
    cycle.status = cycle.status.model_copy(update={"last_restart": lr.model_copy(update={"state": "Done"})})
    await _drop_old_configmaps(cycle, members)


def await_relaunch(cycle: Cycle, waiting: int) -> None:
    if cycle.status.phase == "Starting":
        cycle.status = cycle.status.model_copy(
            update={
                "message": f"attempt {cycle.status.attempt}: waiting for {waiting} kept pods' launchers to restart "
                           "their workers"
            }
        )


def _said(got: Any, attempt: int) -> str:
    if got is None:
        return ", never reported"
    report = got[0]
    if report.attempt < attempt:
        return f", last reported attempt {report.attempt} {report.state.value}"
    return ""


async def fall_back_to_full(
    cycle: Cycle, job: TrainingJob, reason: str, message: str, nodes: Mapping[str, Obj]
) -> float:
    """Turn the current in-place restart into a full one: every pod of the gang goes, the next
    attempt is created whole (the budget was spent when the failure was handled)."""
    runtime = cycle.runtime
    pods = runtime.pods_of(cycle.ns, cycle.name)
    await cycle.delete_pods(pods, nodes)
    attempt = cycle.status.attempt + 1
    cycle.status = cycle.status.model_copy(
        update={
            "attempt": attempt,
            "pods_since_attempt": None,
            "gang_created_time": None,
            "next_attempt_time": None,
            "last_restart": LastRestart(
                attempt=attempt,
                mode="Full",
                state="Pending",
                reason=reason,
                message=f"full restart ({reason}): {message}",
            ),
        }
    )
    runtime.control.publish(cycle.ns, cycle.name, attempt=attempt, members={}, open_=False, waiting="full restart")
    runtime.metrics.restart_modes.labels(mode="Full", reason=reason).inc()
    cycle.phase("Restarting", reason, f"in-place restart abandoned: {message}; restarting the whole gang")
    return 1.0


async def republish(cycle: Cycle, members: Sequence[Obj], *, replica_groups: int = 1) -> None:
    """After an operator restart: what the launchers of the current attempt are told, rebuilt
    from the attempt's ConfigMap and the pods."""
    attempt = cycle.status.attempt
    table = await cycle.io.read_rank_table(cycle.ns, cycle.name, attempt)
    config = await cycle.io.read_attempt_config(cycle.ns, cycle.name, attempt)
    if table is None:
        return
    present = {pod_index_of(p): pod_name_of(p) for p in members}
    names = {i: present.get(i, pod_name(cycle.name, attempt, i)) for i in range(len(table.pods))}
    lr = in_place_restart(cycle)
    cycle.runtime.control.publish(
        cycle.ns,
        cycle.name,
        attempt=attempt,
        members=names,
        table=table,
        restore=(config or {}).get("restore"),
        open_=not (lr is not None and lr.state in ("Pending", WAITING)),
        carry_on=carried_on(cycle.status.last_restart, attempt),
        replica_groups=replica_groups,
    )
    cycle.runtime.store.begin_attempt(cycle.ns, cycle.name, attempt, layout=GroupLayout.of(table, replica_groups),
                             carry_on=carried_attempts(cycle.status.last_restart, attempt, members))
    for earlier in sorted({attempt_of(p) for p in members if attempt_of(p) < attempt}):
        # kept launchers run these tables: the delta of their restart is built against them
        old = await cycle.io.read_rank_table(cycle.ns, cycle.name, earlier)
        if old is not None:
            cycle.runtime.control.jobs[(cycle.ns, cycle.name)].tables.setdefault(earlier, old)

