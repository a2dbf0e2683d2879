"""In-place restarts in the reconcile cycle: keep the pods on healthy nodes, replace the others,
tell every kept launcher to restart its workers, fall back to a full restart when that cannot
work. The decisions are railyard.logic.inplace's; this module reads the cycle, calls them and
acts through the cycle's GangIO.

The sequence (docs/operator.md "Restarting in place"):

1. :func:`begin_in_place` (the failure's cycle): decide which pods move, place them sticky,
   write the new attempt's ConfigMap, delete the pods that move, record attempt + 1 with
   ``lastRestart`` (mode InPlace, state Pending) and the backoff. The launchers of the failed
   attempt are told to wait; those of replaced pods to stop.
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
import time
from collections.abc import Mapping, Sequence
from typing import Any

from railyard.api.trainingjob import LastRestart, QuarantinedNode, TrainingJob
from railyard.handlers.cycle import Cycle
from railyard.handlers.health import heartbeat_url_for
from railyard.handlers.spares import delete_placeholders
from railyard.k8s.client import ApiError
from railyard.logic.conditions import format_micro_time, parse_time
from railyard.logic.elastic import WAITING
from railyard.logic.failure_report import describe_failure
from railyard.logic.failures import Failure
from railyard.logic.gang import attempt_of, gang_members, is_gated, pod_index_of
from railyard.logic.health.window import GroupLayout
from railyard.logic.inplace import (
    GROUP_REPAIR,
    RestartPlan,
    decide_group_repair,
    decide_nodes_to_leave,
    decide_restart_mode,
    decide_unacknowledged,
    plan_in_place_moves,
)
from railyard.logic.inplace import members_since as logic_members_since
from railyard.logic.lifecycle import KEPT_ATTEMPTS, Relaunch, earlier_attempts
from railyard.logic.manifests import (
    build_configmap,
    build_pod,
    build_trainer_config,
    configmap_name,
    owner_reference,
    pod_name,
    spare_pod_name,
    with_addresses,
)
from railyard.logic.placement import Placement, Unplaceable, build_placement_input, plan_placement
from railyard.logic.restarts import RestartDecision, new_fence, restart_update, restore_hint
from railyard.logic.schedulers import apply_to_pods
from railyard.logic.status import placement_status
from railyard.protocol.ranktable import RankTable

log = logging.getLogger(__name__)
Obj = Mapping[str, Any]


def _name(p: Obj) -> str:
    return str((p.get("metadata") or {}).get("name") or "")


def _node(p: Obj) -> str:
    return str((p.get("spec") or {}).get("nodeName") or "")


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
    pod that carries on after a replica-group repair, in the older attempt it still runs)."""
    reports = cycle.runtime.control.reports(cycle.ns, cycle.name)
    carried = carried_attempts(cycle.status.last_restart, cycle.status.attempt, members)
    out = set()
    for p in members:
        i = pod_index_of(p)
        got = reports.get(i)
        if got is None or got[0].pod != _name(p):
            continue
        if got[0].attempt == cycle.status.attempt or (i in carried and carried[i] <= got[0].attempt < cycle.status.attempt):
            out.add(i)
    return frozenset(out)


def plan_restart(cycle: Cycle, job: TrainingJob, failure: Failure, members: Sequence[Obj], nodes: Mapping[str, Obj],
                 quarantined: Sequence[QuarantinedNode], failed: frozenset[int] = frozenset()) -> tuple[RestartPlan, dict[str, str]]:
    """In place or full, and the nodes the restart moves off (blamed, quarantined, stragglers).
    ``failed``: pod indices whose workers failed (a replica-group repair restarts their groups)."""
    move_off = {n: f"blamed: {failure.kind}" for n in failure.nodes}
    for q in quarantined:
        move_off.setdefault(q.node, "quarantined")
    stragglers = decide_nodes_to_leave([(s.node, s.rank, s.score) for s in cycle.status.stragglers],
                                       [_node(p) for p in members if _node(p) not in move_off])
    spec_changed = bool(cycle.status.observed_generation) and cycle.generation != cycle.status.observed_generation
    expected = cycle.status.placement.node_count if cycle.status.placement and cycle.status.placement.node_count else job.spec.nodes
    plan = decide_restart_mode(
        enabled=job.spec.restart_policy.in_place, spec_changed=spec_changed, members=members, expected=expected,
        nodes=nodes, move_off=move_off, leave=stragglers, capable=capable_pods(cycle, members),
    )
    plan = decide_group_repair(plan, expected=expected, replicas=job.spec.replica_groups,
                               min_replicas=job.spec.fault_tolerance.min_replicas, failed=failed)
    return plan, stragglers


async def _current_table(cycle: Cycle) -> RankTable | None:
    table = cycle.runtime.control.table(cycle.ns, cycle.name, cycle.status.attempt)
    if table is None:
        table = await cycle.io.read_rank_table(cycle.ns, cycle.name, cycle.status.attempt)
    return table


def _place(cycle: Cycle, job: TrainingJob, prev: RankTable, nodes: Mapping[str, Obj], failed: set[str], attempt: int) -> Placement | Unplaceable:
    return plan_placement(build_placement_input(
        job, nodes=list(nodes.values()), pods=cycle.runtime.all_bound_pods(), attempt=attempt,
        previous_nodes=[p.node for p in sorted(prev.pods, key=lambda p: p.pod_index)],
        previous_spares=cycle.status.placement.spares if cycle.status.placement else (), failed=failed,
        cache=cycle.runtime.topology_cache,
    ))


async def begin_in_place(
    cycle: Cycle,
    job: TrainingJob,
    failure: Failure,
    decision: RestartDecision,
    plan: RestartPlan,
    stragglers: Mapping[str, str],
    members: Sequence[Obj],
    real: Mapping[str, Obj],
    nodes: Mapping[str, Obj],
    quarantined: list[QuarantinedNode],
) -> float | RestartPlan | None:
    """Step 1. Returns the delay until the next look, or a Full :class:`RestartPlan` when the
    pods that must move cannot be placed (the caller restarts in full)."""
    runtime, spec, attempt = cycle.runtime, job.spec, cycle.status.attempt + 1
    prev = await _current_table(cycle)
    if prev is None:
        return RestartPlan("Full", "NotPlaceable", "full restart (NotPlaceable): the running attempt's rank table is gone")
    failed = {q.node for q in quarantined} | set(failure.nodes)
    t0 = time.perf_counter()
    moves = plan_in_place_moves(plan, prev, stragglers, failed, lambda avoid: _place(cycle, job, prev, nodes, avoid, attempt))
    runtime.metrics.placement.observe(time.perf_counter() - t0)
    if isinstance(moves, RestartPlan):
        return moves
    result, replace, keep, message = moves.placement, moves.replace, moves.keep, moves.message

    owner = owner_reference(cycle.body)
    table = with_addresses(result.rank_table, cycle.ns)
    restore = restore_hint(cycle.status, spec, pods_kept=True, fence=new_fence(failure, attempt))
    config = build_trainer_config(spec, job=cycle.name, namespace=cycle.ns, attempt=attempt, restore=restore)
    if not await cycle.io.create_object(build_configmap(cycle.name, cycle.ns, owner, attempt=attempt, rank_table=table, config=config,
                                                         replica_groups=spec.replica_groups)):
        # written by an earlier try of this same restart (an operator that died before its
        # status patch): that table is the one some launchers may already run
        again = await cycle.io.read_rank_table(cycle.ns, cycle.name, attempt)
        if again is not None and len(again.pods) == len(table.pods):
            table = again
            written = await cycle.io.read_attempt_config(cycle.ns, cycle.name, attempt)
            restore = (written or {}).get("restore", restore)
    moving = [real[_name(p)] for p in members if pod_index_of(p) in replace and _name(p) in real]
    await cycle.delete_pods(moving, nodes)

    backoff = decision.backoff_seconds
    by_index = {pod_index_of(p): _name(p) for p in members}
    names = {i: (by_index[i] if i in keep else pod_name(cycle.name, attempt, i)) for i in range(len(table.pods))}
    cycle.status = cycle.status.model_copy(update={
        **restart_update(cycle.status, failure, attempt=attempt, now=cycle.now, now_iso=cycle.iso, backoff_s=backoff,
                         quarantined=quarantined, in_place=True),
        "placement": placement_status(result, attempt=attempt),
        "last_restart": LastRestart(attempt=attempt, mode="InPlace", state="Pending", message=message, kept=len(keep), replaced=sorted(replace)[:64],
                                    reason=GROUP_REPAIR if moves.carry_on else "", carried_on=list(moves.carry_on)),
    })
    runtime.control.publish(cycle.ns, cycle.name, attempt=attempt, members=names, table=table, restore=restore, open_=False, carry_on=moves.carry_on,
                       waiting=f"restart to attempt {attempt} in {backoff:g}s" if backoff > 0 else f"preparing attempt {attempt}")
    if moves.carry_on:
        runtime.metrics.replica_group_restarts.inc(len({i // plan.group_size for i in range(len(table.pods)) if i not in set(moves.carry_on)}))
    runtime.metrics.restarts.labels(**{"class": failure.cls.value}).inc()
    runtime.metrics.restart_modes.labels(mode="InPlace", reason="None").inc()
    runtime.metrics.pods_replaced.inc(len(replace))
    wait = f", workers restart in {backoff:g}s" if backoff > 0 else ""
    said = describe_failure(failure, cycle.status.last_failure) if cycle.status.last_failure is not None else failure.message
    cycle.phase("Restarting", failure.kind, f"{said}; {decision.reason}; {message}{wait}")
    if backoff > 0:
        return backoff
    # the Restarting phase lasts no cycle: its Event is written here, the Starting one follows
    cycle.event("Warning", failure.kind, cycle.status.message)
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
    table = runtime.control.table(cycle.ns, cycle.name, attempt) or await cycle.io.read_rank_table(cycle.ns, cycle.name, attempt)
    if table is None:
        return await fall_back_to_full(cycle, job, "NotPlaceable", f"the rank table of attempt {attempt} is gone", nodes)
    # pods this operator asked to delete are gone as far as the plan goes (the watch may not
    # have caught up with the deletion yet)
    pods = [p for p in runtime.pods_of(cycle.ns, cycle.name) if _name(p) not in cycle.worker.deleting and not (p.get("metadata") or {}).get("deletionTimestamp")]
    members, _ = gang_members(pods, attempt=attempt, since=cycle.status.pods_since_attempt)
    present = {pod_index_of(p): p for p in members}
    owner = owner_reference(cycle.body)
    url = heartbeat_url_for(runtime, cycle.ns, cycle.name)
    missing = [
        build_pod(job.spec, job=cycle.name, namespace=cycle.ns, owner=owner, attempt=attempt, pod_index=e.pod_index, node=e.node,
                  heartbeat_url=url, annotations=runtime.settings.pod_annotations)
        for e in table.pods if e.pod_index not in present
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
    in_way = [s for s in runtime.pods_of(cycle.ns, cycle.name, spare=True) if _name(s) in in_way_names]
    if in_way:
        await delete_placeholders(cycle, in_way, nodes)
    blocked = {in_way_names[_name(s)] for s in in_way}
    ready = [p for p in gated if node_of[pod_index_of(p)] not in blocked]
    if ready:
        await cycle.io.lift_gates(ready)
    if lr.state == "Pending":
        started = format_micro_time(cycle.now)
        cycle.status = cycle.status.model_copy(update={
            "last_restart": lr.model_copy(update={"state": "Started", "started_time": started}),
            "gang_created_time": started, "time_to_all_ready_seconds": None, "next_attempt_time": None,
            "observed_generation": cycle.generation, "pending_spec_changes": "",
        })
        names = {i: _name(present[i]) if i in present else pod_name(cycle.name, attempt, i) for i in range(len(table.pods))}
        carry_on = carried_on(lr, attempt)

        def open_orders() -> None:
            runtime.control.publish(cycle.ns, cycle.name, attempt=attempt, members=names, table=table, open_=True, carry_on=carry_on)
            runtime.store.begin_attempt(cycle.ns, cycle.name, attempt, layout=GroupLayout.of(table, job.spec.replica_groups),
                                   carry_on=carried_attempts(lr, attempt, members))

        cycle.after_commit.append(open_orders)
        cycle.phase("Starting", "RestartedInPlace", f"attempt {attempt}: {lr.message}")
    # placeholders go within a kubelet round trip; their deletion events wake this job
    return 0.5 if blocked else None


async def _drop_old_configmaps(cycle: Cycle, members: Sequence[Obj]) -> None:
    """Delete the ConfigMaps of attempts no pod of the gang was created for (kept pods still
    mount their own attempt's), keeping those of the earlier attempts a new gang keeps."""
    used = {attempt_of(p) for p in members}
    kept_from = earlier_attempts(cycle.status.attempt).start
    old = [configmap_name(cycle.name, earlier) for earlier in range(max(kept_from - KEPT_ATTEMPTS, 0), kept_from) if earlier not in used]
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
    names = {pod_index_of(p): _name(p) for p in members}
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
        cycle.status = cycle.status.model_copy(update={"message": f"attempt {cycle.status.attempt}: waiting for {waiting} kept pods' launchers to restart their workers"})


def _said(got: Any, attempt: int) -> str:
    if got is None:
        return ", never reported"
    report = got[0]
    if report.attempt < attempt:
        return f", last reported attempt {report.attempt} {report.state.value}"
    return ""


async def fall_back_to_full(cycle: Cycle, job: TrainingJob, reason: str, message: str, nodes: Mapping[str, Obj]) -> float:
    """Turn the current in-place restart into a full one: every pod of the gang goes, the next
    attempt is created whole (the budget was spent when the failure was handled)."""
    runtime = cycle.runtime
    pods = runtime.pods_of(cycle.ns, cycle.name)
    await cycle.delete_pods(pods, nodes)
    attempt = cycle.status.attempt + 1
    cycle.status = cycle.status.model_copy(update={
        "attempt": attempt, "pods_since_attempt": None, "gang_created_time": None, "next_attempt_time": None,
        "last_restart": LastRestart(attempt=attempt, mode="Full", state="Pending", reason=reason, message=f"full restart ({reason}): {message}"),
    })
    runtime.control.publish(cycle.ns, cycle.name, attempt=attempt, members={}, open_=False, waiting="full restart")
    runtime.metrics.restart_modes.labels(mode="Full", reason=reason).inc()
    cycle.phase("Restarting", reason, f"in-place restart abandoned: {message}; restarting the whole gang")
    return 1.0


def record_full(cycle: Cycle, plan: RestartPlan | None) -> None:
    """A full restart's ``lastRestart`` (after the attempt was bumped), and the Event of a
    fallback from in place; the old launchers are told to stop."""
    attempt = cycle.status.attempt
    reason = plan.reason if plan is not None else ""
    message = plan.message if plan is not None else "full restart"
    cycle.status = cycle.status.model_copy(update={"pods_since_attempt": None,
                                   "last_restart": LastRestart(attempt=attempt, mode="Full", state="Pending", reason=reason, message=message)})
    cycle.runtime.control.publish(cycle.ns, cycle.name, attempt=attempt, members={}, open_=False, waiting="full restart")
    cycle.runtime.metrics.restart_modes.labels(mode="Full", reason=reason or "None").inc()  # not "": a scrape drops empty labels
    if plan is not None and reason and reason != "InPlaceDisabled":
        cycle.event("Warning", "FullRestart", message)


async def republish(cycle: Cycle, members: Sequence[Obj], *, replica_groups: int = 1) -> None:
    """After an operator restart: what the launchers of the current attempt are told, rebuilt
    from the attempt's ConfigMap and the pods."""
    attempt = cycle.status.attempt
    table = await cycle.io.read_rank_table(cycle.ns, cycle.name, attempt)
    config = await cycle.io.read_attempt_config(cycle.ns, cycle.name, attempt)
    if table is None:
        return
    present = {pod_index_of(p): _name(p) for p in members}
    names = {i: present.get(i, pod_name(cycle.name, attempt, i)) for i in range(len(table.pods))}
    lr = in_place_restart(cycle)
    cycle.runtime.control.publish(cycle.ns, cycle.name, attempt=attempt, members=names, table=table, restore=(config or {}).get("restore"),
                         open_=not (lr is not None and lr.state in ("Pending", WAITING)), carry_on=carried_on(cycle.status.last_restart, attempt),
                         replica_groups=replica_groups)
    cycle.runtime.store.begin_attempt(cycle.ns, cycle.name, attempt, layout=GroupLayout.of(table, replica_groups),
                             carry_on=carried_attempts(cycle.status.last_restart, attempt, members))
    for earlier in sorted({attempt_of(p) for p in members if attempt_of(p) < attempt}):
        # kept launchers run these tables: the delta of their restart is built against them
        old = await cycle.io.read_rank_table(cycle.ns, cycle.name, earlier)
        if old is not None:
            cycle.runtime.control.jobs[(cycle.ns, cycle.name)].tables.setdefault(earlier, old)

