"""One reconcile cycle of one TrainingJob: read what is there, ask logic/lifecycle.py what to do,
execute it through the cycle's GangIO, write the status once.

The decisions are :func:`railyard.logic.lifecycle.decide_standing` (a finished, suspended or
edited job) and :func:`railyard.logic.lifecycle.decide_lifecycle` (the steps for the gang). This
module reads their inputs and executes their steps; creating a gang (and rolling back a refused
one) is handlers/creation.py, handling a failure handlers/failures.py, an in-place restart
handlers/inplace.py. Status changes are collected on a copy and written in one patch at the
end; every condition that flips becomes an Event.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from railyard.api.trainingjob import TrainingJob, TrainingJobStatus
from railyard.handlers.cleanup import cleanup_checkpoints
from railyard.handlers.creation import finish_creation, place_and_create
from railyard.handlers.cycle import Cycle, GangIO, KubeGangIO
from railyard.handlers.failures import handle_failure, place_again
from railyard.handlers.health import evaluate_health, settle_blind
from railyard.handlers.inplace import (
    await_relaunch,
    carried_attempts,
    continue_in_place,
    fall_back_to_full,
    finish_in_place,
    in_place_restart,
    members_since,
    observe_relaunch,
    republish,
)
from railyard.handlers.kueue import (
    KUEUE_WATCH_S,
    await_admission,
    delete_workload,
    finish_workload,
    flavored,
    queue_of,
)
from railyard.handlers.lighthouse import reconcile_lighthouse
from railyard.handlers.planned import announced_moves, move_ahead, request_save, save_first
from railyard.handlers.regroup import grow_back
from railyard.handlers.runtime import JobWorker, Runtime
from railyard.handlers.spares import reconcile_spares
from railyard.handlers.stopping import save_before_stop
from railyard.logic import lifecycle as lc
from railyard.logic.conditions import find_condition, parse_time
from railyard.logic.finished import decide_finished_pods
from railyard.logic.gang import (
    DEFAULT_ECHO_SETTLE_S,
    GangAssessment,
    assess_gang,
    attempt_of,
    find_stale_placement,
    first_exit_time,
    gang_members,
    pod_index_of,
    pod_name_of,
)
from railyard.logic.groups import resolve_replica_groups
from railyard.logic.inplace import apply_launcher_reports
from railyard.logic.jitsave import MoveNow, StopNow
from railyard.logic.manifests import CLEANUP_FINALIZER, check_names, is_owned_by
from railyard.logic.pending import (
    PendingReason,
    decide_pending_reason,
    decide_refused_nodes,
    find_gpu_shortages,
    unschedulable_message,
)
from railyard.logic.quarantine import decide_still_quarantined
from railyard.logic.schedulers import pod_group_of
from railyard.logic.shrink import count_training_groups, decide_groups_finished, waiting_pods
from railyard.logic.status import TERMINAL_PHASES, decide_degraded
from railyard.logic.topology import compute_used_gpus, node_gpus

log = logging.getLogger(__name__)


def _format_validation(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()))
        parts.append(f"{loc}: {err.get('msg')}")
    return "; ".join(parts)


async def reconcile_job(
    runtime: Runtime,
    worker: JobWorker,
    *,
    now: float | None = None,
    io: GangIO | None = None,
    clock: Callable[[], float] | None = None,
) -> float | None:
    """Run one cycle; returns seconds until the next check is due (None: only on events).

    ``now``, ``io`` and ``clock`` (the time as the cycle goes on) default to the clock and the
    real API; tests pass their own (with ``now`` alone the cycle's clock stays at ``now``)."""
    cycle = Cycle(
        runtime,
        worker,
        time.time() if now is None else now,
        io if io is not None else KubeGangIO(runtime.api()),
        clock=clock if clock is not None else (time.time if now is None else None),
    )
    finalizers = list(cycle.meta.get("finalizers") or [])
    ours = CLEANUP_FINALIZER in finalizers
    if cycle.meta.get("deletionTimestamp"):
        if not ours:
            await cycle.io.delete_owned(cycle.ns, cycle.name)
            await delete_workload(cycle.io, cycle.body, cycle.ns, cycle.name)
            return None
        return await cleanup_checkpoints(cycle, finalizers)
    wants = bool(((cycle.body.get("spec") or {}).get("checkpoint") or {}).get("cleanupOnDelete"))
    if wants != ours:
        # a finalizer only while the job asks for its checkpoints to be deleted with it
        new = [*finalizers, CLEANUP_FINALIZER] if wants else [name for name in finalizers if name != CLEANUP_FINALIZER]
        await cycle.io.patch_job_finalizers(cycle.ns, cycle.name, new, cycle.meta.get("resourceVersion"))
    try:
        job = TrainingJob.model_validate(
            {"metadata": {"name": cycle.name, "namespace": cycle.ns}, "spec": cycle.body.get("spec") or {}}
        )
        job, problems = _resolve_groups(cycle, job)
        problems += check_names(cycle.name, job.spec.nodes, lighthouse=job.spec.replica_groups > 1)
    except ValidationError as exc:
        job, problems = None, [_format_validation(exc)]
    if job is None or problems:
        await cycle.delete_pods(runtime.pods_of(cycle.ns, cycle.name), runtime.node_map())
        if cycle.status.phase != "Failed" or cycle.status.message != "; ".join(problems):
            cycle.update(observed_generation=cycle.generation)
            cycle.phase(
                "Failed", "InvalidSpec", "; ".join(problems) + " (fix the spec; the job stays Failed until then)"
            )
        await cycle.commit()
        return None
    delay = await _step(cycle, job)
    job = flavored(cycle, job)  # spares and the Lighthouse on the admitted Kueue flavor's nodes too
    settle_blind(cycle)
    for again_in in (await reconcile_spares(cycle, job), await reconcile_lighthouse(cycle, job)):
        if again_in is not None:
            delay = again_in if delay is None else min(delay, again_in)
    await cycle.commit()
    return delay


def _resolve_groups(cycle: Cycle, job: TrainingJob) -> tuple[TrainingJob, list[str]]:
    """``parallelism.dataReplicas: 0``: the number of replica groups chosen once (logic/groups.py)
    from the cluster's nodes and kept in ``status.replicaGroups`` for the job's life."""
    nodes = list(cycle.runtime.node_map().values())
    job, choice = resolve_replica_groups(job, nodes, recorded=cycle.status.replica_groups)
    if choice is None:
        return job, []
    if not choice.groups:
        return job, [f"parallelism.dataReplicas: 0 (the operator's choice): {choice.reason}"]
    if nodes:  # chosen from the topology only once the nodes are known
        cycle.update(replica_groups=choice.groups)
        cycle.event("Normal", "ReplicaGroupsChosen", choice.reason)
    return job, []


async def _step(cycle: Cycle, job: TrainingJob) -> float | None:
    runtime, spec = cycle.runtime, job.spec
    pods = _own_pods(cycle)
    nodes = runtime.node_map()
    if cycle.worker.deleting:
        # forget the deletions of pods that are gone (the names of every attempt would pile up)
        present = {pod_name_of(p) for p in pods}
        cycle.worker.deleting = {n: t for n, t in cycle.worker.deleting.items() if n in present}
    _refresh_quarantine(cycle, nodes)
    for _ in range(3):  # a StartOver or a Resume is followed by the decision on the new status
        failed = find_condition(cycle.status.conditions, "Failed")
        standing = lc.decide_standing(
            cycle.status,
            generation=cycle.generation,
            suspend=spec.suspend,
            has_pods=bool(pods),
            failed_reason=failed.reason if failed is not None else None,
        )
        if standing is None:
            break
        if isinstance(standing, lc.Release):
            return await _release_finished(cycle, job, nodes)
        if isinstance(standing, lc.Suspend):
            return await _suspend(cycle, job, standing, pods, nodes)
        if isinstance(standing, lc.StartOver):
            cycle.status = TrainingJobStatus(
                attempt=cycle.status.attempt + 1, restarts=cycle.status.restarts, last_failure=cycle.status.last_failure
            )
        else:
            cycle.update(attempt=cycle.status.attempt + 1)
            cycle.phase("Placing", "Resumed", "spec.suspend is false: placing the gang again")
    queue = queue_of(cycle, spec)
    if queue is not None:
        queued = await await_admission(
            cycle, job, queue, pods=pods, nodes=nodes
        )  # no pod before Kueue admitted the job
        if queued is not None:
            return queued
        job = flavored(cycle, job)
        spec = job.spec
    if not cycle.old_wire.get("attempt") and pods:
        # an unreadable or missing status: the pods' attempt labels say where we were
        cycle.update(attempt=max(cycle.status.attempt, *(attempt_of(p) for p in pods)))
    if pods and runtime.tokens(cycle.ns, cycle.name) is None:
        # an operator restarted under a running gang: accept its heartbeats again
        token = await cycle.io.read_token(cycle.ns, cycle.name)
        if token:
            runtime.tokens.set(cycle.ns, cycle.name, token)
            runtime.store.begin_attempt(cycle.ns, cycle.name, cycle.status.attempt)
    expected = (
        cycle.status.placement.node_count if (cycle.status.placement and cycle.status.gang_created_time) else spec.nodes
    )
    # what the launchers report (their workers' exits, while the pod runs on) is pod evidence too
    since = members_since(cycle)
    # a replica group that carries on reports the attempt its pods were created in
    carried = carried_attempts(
        cycle.status.last_restart,
        cycle.status.attempt,
        gang_members(pods, attempt=cycle.status.attempt, since=since)[0],
    )
    view = apply_launcher_reports(
        pods, runtime.control.reports(cycle.ns, cycle.name), attempt=cycle.status.attempt, carried=carried
    )
    gang = assess_gang(
        view,
        nodes,
        attempt=cycle.status.attempt,
        expected=expected,
        now=cycle.now,
        not_ready_grace_s=runtime.settings.not_ready_grace_s,
        echo_settle_s=DEFAULT_ECHO_SETTLE_S,
        since=since,
        waiting=waiting_pods(cycle.status, spec.replica_groups),
    )
    old = set(gang.stale)
    stale = [p for p in pods if pod_name_of(p) in old]
    if stale:
        await cycle.delete_pods(stale, nodes)
    members, _ = gang_members(view, attempt=cycle.status.attempt, since=since)
    if pods and runtime.control.get(cycle.ns, cycle.name) is None:
        await republish(
            cycle, members, replica_groups=job.spec.replica_groups
        )  # an operator restarted under a running gang
    if gang.state == "Starting" or cycle.worker.refused_nodes:
        _refresh_refused_nodes(cycle, members, nodes)
    pending = await _pending_reason(cycle, members) if gang.state == "Starting" else None
    decision = lc.decide_lifecycle(_observe(cycle, job, gang, members, nodes, pending))
    going = _announced(cycle, job, decision, gang, members, nodes)
    saved = save_first(cycle, job, going) if going else None
    if not going and runtime.control.save_order(cycle.ns, cycle.name) is not None:
        # the announcement was taken back before the move: a later one asks for a save of its own
        runtime.control.withdraw_save(cycle.ns, cycle.name)
    if going and isinstance(saved, MoveNow):
        delay = await move_ahead(cycle, job, going, members, nodes, saved)
    else:
        delay = await _execute(cycle, job, decision, gang, members, nodes)
        if saved is not None and not isinstance(saved, MoveNow) and cycle.status.phase == "Running" \
                and in_place_restart(cycle) is None:
            # the gang trains on (its heartbeats bring the save) until the save or the timeout
            wait = request_save(cycle, saved)
            delay = wait if delay is None else min(delay, wait)
    if cycle.status.phase in TERMINAL_PHASES:
        return await _release_finished(cycle, job, nodes)
    _update_degraded(cycle, job)
    if gang.recheck_after > 0:
        delay = gang.recheck_after if delay is None else min(delay, gang.recheck_after)
    if queue is not None:  # look for Kueue's eviction even when nothing else happens
        delay = KUEUE_WATCH_S if delay is None else min(delay, KUEUE_WATCH_S)
    return delay


def _announced(
    cycle: Cycle, job: TrainingJob, decision: lc.Decision, gang: GangAssessment, members: Sequence[Mapping[str, Any]],
    nodes: Mapping[str, Mapping[str, Any]],
) -> dict[str, str]:
    """The gang's nodes announced to go (handlers/planned.py), asked only of a gang that trains
    whole and has no failure to handle (a failure's restart moves off them as well: the
    placement leaves cordoned and tainted nodes out) nor a restart under way; none with planned moves off."""
    if not cycle.runtime.settings.planned_moves:
        return {}
    if gang.state != "Running" or cycle.status.phase != "Running" or in_place_restart(cycle) is not None:
        return {}
    if any(isinstance(s, lc.HandleFailure | lc.AwaitSdcVerdict) for s in decision.steps):
        return {}
    return announced_moves(cycle, job, members, nodes)


def _refresh_refused_nodes(
    cycle: Cycle, members: Sequence[Mapping[str, Any]], nodes: Mapping[str, Mapping[str, Any]],
) -> None:
    """The nodes the scheduler refuses the job's pods on for GPUs the operator does not see in
    use (logic/pending.py); the bound pods are counted only when there is such a refusal."""
    shortages = find_gpu_shortages(members)
    seen_free: dict[str, int] = {}
    if shortages:
        used = compute_used_gpus(cycle.runtime.all_bound_pods())
        seen_free = {node: node_gpus(nodes[node]) - used.get(node, 0) for node in shortages if node in nodes}
    cycle.worker.refused_nodes = decide_refused_nodes(shortages, now=cycle.now, held=cycle.worker.refused_nodes,
                                                      seen_free=seen_free)


async def _pending_reason(cycle: Cycle, members: Sequence[Mapping[str, Any]]) -> PendingReason | None:
    """Why the gang's pods wait (logic/pending.py); Kubernetes' PodGroup is read only while the
    scheduler reports one of its pods Unschedulable (one GET a cycle, then)."""
    group = next((name for p in members if (name := pod_group_of(p))), None)
    condition = None
    if group and any(unschedulable_message(p) is not None for p in members):
        condition = await cycle.io.read_podgroup_condition(cycle.ns, group)
    return decide_pending_reason(members, now=cycle.now, group_condition=condition, group=group or "")


def _observe(
    cycle: Cycle,
    job: TrainingJob,
    gang: GangAssessment,
    members: Sequence[Mapping[str, Any]],
    nodes: Mapping[str, Mapping[str, Any]],
    pending: PendingReason | None = None,
) -> lc.Observed:
    """The inputs of :func:`railyard.logic.lifecycle.decide_lifecycle` (what only some states
    read is read only then)."""
    spec = job.spec
    lr = in_place_restart(cycle)
    return lc.Observed(
        status=cycle.status,
        generation=cycle.generation,
        now=cycle.now,
        gang=gang,
        schedule_timeout_s=spec.gang.schedule_timeout_seconds,
        heartbeat_interval_s=spec.health.heartbeat_interval_seconds,
        restart_policy=spec.restart_policy,
        stale_placement=tuple(find_stale_placement(job, members, nodes)) if gang.state == "Starting" else (),
        rolled_back=bool(members) and all(pod_name_of(p) in cycle.worker.deleting for p in members),
        in_place=lr.state if lr is not None else None,
        relaunch=observe_relaunch(cycle, job, members) if lr is not None else None,
        heartbeats=cycle.runtime.store.job(cycle.ns, cycle.name) is not None,
        first_exit=first_exit_time(members) if gang.state == "Failed" else None,
        groups_finished=decide_groups_finished(
            members,
            replicas=spec.replica_groups,
            expected=gang.expected,
            now=cycle.now,
            waiting=waiting_pods(cycle.status, spec.replica_groups),
        ),
        pending=pending,
    )


async def _execute(
    cycle: Cycle,
    job: TrainingJob,
    decision: lc.Decision,
    gang: GangAssessment,
    members: Sequence[Mapping[str, Any]],
    nodes: Mapping[str, Mapping[str, Any]],
) -> float | None:
    """Run the decision's steps in order; returns the smallest delay they asked for (None: only
    events). A health verdict that asks for a restart is handled at once and ends the steps."""
    delay: float | None = None
    for step in decision.steps:
        if isinstance(step, lc.CheckHealth):
            verdict = evaluate_health(cycle, job, _watched(cycle, job, members), report=step.report)
            if verdict is None:
                continue
            failed = await handle_failure(cycle, job, verdict, members, nodes)
            return failed if delay is None else (delay if failed is None else min(delay, failed))
        got = await _run(cycle, job, step, gang, members, nodes)
        if got is not None:
            delay = got if delay is None else min(delay, got)
    return delay


async def _run(
    cycle: Cycle,
    job: TrainingJob,
    step: lc.Step,
    gang: GangAssessment,
    members: Sequence[Mapping[str, Any]],
    nodes: Mapping[str, Mapping[str, Any]],
) -> float | None:
    """One step of the lifecycle; returns when to look again (None: no wish)."""
    match step:
        case lc.Wait(seconds):
            return seconds
        case lc.WaitForOldPods(count, enter):
            if enter:
                cycle.phase(
                    "Restarting", "WaitingForOldPods", f"waiting for {count} pods of earlier attempts to terminate"
                )
            return 1.0
        case lc.Place():
            return await place_and_create(cycle, job, nodes)
        case lc.LetGo():
            # what is left of a creation the API server refused (rolled back)
            await cycle.delete_pods(members, nodes)
            return 1.0
        case lc.FinishCreation():
            return await finish_creation(cycle, job, members, gang)
        case lc.PlaceAgain(reason, message):
            return await place_again(cycle, members, nodes, reason, message)
        case lc.MarkStarting(message, reason):
            cycle.phase("Starting", reason, message)
            return None
        case lc.MarkRunning():
            _mark_running(cycle, step)
            return None
        case lc.ResetStreak(restarts):
            cycle.update(restarts=restarts)
            return None
        case lc.Succeed(message):
            cycle.phase("Succeeded", "AllRanksSucceeded", message)
            return None
        case lc.HandleFailure(failure):
            return await handle_failure(cycle, job, failure, members, nodes)
        case lc.AwaitSdcVerdict():
            got = lc.decide_sdc(step, evaluate_health(cycle, job, _watched(cycle, job, members)))
            if isinstance(got, float):
                return got
            return await handle_failure(cycle, job, got, members, nodes)
        case lc.ContinueInPlace():
            return await continue_in_place(cycle, job, nodes)
        case lc.FallBackToFull(reason, message):
            return await fall_back_to_full(cycle, job, reason, message, nodes)
        case lc.FinishInPlace():
            await finish_in_place(cycle, members)
            return None
        case lc.AwaitRelaunch(waiting, seconds):
            await_relaunch(cycle, waiting)
            return seconds
        case lc.GrowBack():
            return await grow_back(cycle, job, members, nodes)
    raise AssertionError(f"unknown lifecycle step {step!r}")


async def _suspend(
    cycle: Cycle, job: TrainingJob, step: lc.Suspend, pods: Sequence[Mapping[str, Any]],
    nodes: Mapping[str, Mapping[str, Any]],
) -> float | None:
    """A running gang first saves at a step boundary (handlers/stopping.py), then its pods go;
    the status keeps the checkpoints, and the resumed attempt restores the save."""
    said = "spec.suspend is true: the gang's pods are deleted, checkpoints kept"
    if step.pods:
        stop = save_before_stop(cycle, job, pods, purpose="spec.suspend")
        if not isinstance(stop, StopNow):
            return stop  # the gang trains on until its save is committed (or the wait timed out)
        said = f"{said}; {stop.note}"
        await cycle.delete_pods(pods, nodes)
    if step.enter:
        cycle.update(observed_generation=cycle.generation, gang_created_time=None, next_attempt_time=None)
        cycle.phase("Suspended", "Suspended", said)
    return 2.0 if step.pods else None


def _mark_running(cycle: Cycle, step: lc.MarkRunning) -> None:
    if step.pending_spec_changes != cycle.status.pending_spec_changes:
        cycle.update(pending_spec_changes=step.pending_spec_changes)
    if not step.enter:
        return
    update: dict[str, Any] = {}
    created = parse_time(cycle.status.gang_created_time)
    metrics = cycle.runtime.metrics
    if created is not None:
        update["time_to_all_ready_seconds"] = round(cycle.now - created, 3)
        metrics.gang_ready.observe(max(cycle.now - created, 0.0))
    if cycle.status.start_time is None:
        update["start_time"] = cycle.iso
        born = parse_time(str(cycle.meta.get("creationTimestamp") or ""))
        if born is not None:
            metrics.job_start.observe(max(cycle.now - born, 0.0))
    failed_at = parse_time(cycle.status.failure_time)
    if failed_at is not None:
        metrics.restart_duration.observe(max(cycle.now - failed_at, 0.0))
        update["failure_time"] = None
    cycle.update(**update)
    cycle.phase("Running", "AllPodsRunning", step.message)


async def _release_finished(cycle: Cycle, job: TrainingJob, nodes: Mapping[str, Mapping[str, Any]]) -> float | None:
    """A finished job: delete what must go now (other attempts, spares, placeholders), keep the
    last attempt's finished pods until ``spec.cleanup`` says, give its members still running a
    little time to exit on their own (logic/finished.py); no more health news. Returns when to
    look again (a settle time or the TTL)."""
    if cycle.status.stragglers:
        cycle.update(stragglers=[])
    if queue_of(cycle, job.spec) is not None:
        await finish_workload(cycle)
    _update_degraded(cycle, job)  # a finished job is not Degraded (no Event: it finished)
    done = decide_finished_pods(
        _own_pods(cycle), job_phase=cycle.status.phase, attempt=cycle.status.attempt, cleanup=job.spec.cleanup,
        completion_time=parse_time(cycle.status.completion_time), now=cycle.now, since=members_since(cycle),
    )
    if done.delete:
        await cycle.delete_pods(done.delete, nodes)
        return 2.0 if done.due_in is None else min(2.0, done.due_in)
    return done.due_in


def _own_pods(cycle: Cycle) -> list[dict[str, Any]]:
    """The job's gang pods; a deleted job's pods (same name, another uid, finished pods kept for
    their TTL) are not this job's, whatever their labels say."""
    uid = cycle.meta.get("uid")
    return [p for p in cycle.runtime.pods_of(cycle.ns, cycle.name) if is_owned_by(p, str(uid) if uid else None)]



def _refresh_quarantine(cycle: Cycle, nodes: Mapping[str, Mapping[str, Any]]) -> None:
    """Drop nodes a person released (label or taint removed) from the job's quarantine list."""
    keep = decide_still_quarantined(cycle.status.quarantined_nodes, nodes)
    if len(keep) != len(cycle.status.quarantined_nodes):
        cycle.update(quarantined_nodes=keep)


def _update_degraded(cycle: Cycle, job: TrainingJob) -> None:
    groups = job.spec.replica_groups
    cycle.status = decide_degraded(
        cycle.status, hot_spares=job.spec.gang.hot_spares, now=cycle.iso, replica_groups=groups
    )
    cycle.runtime.metrics.set_replica_groups(
        cycle.ns, cycle.name, wanted=groups, training=count_training_groups(cycle.status, groups)
    )


def _watched(cycle: Cycle, job: TrainingJob, members: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The members whose heartbeats the health rules judge: not the pods of replica groups that
    wait for a node (idle by plan)."""
    waiting = waiting_pods(cycle.status, job.spec.replica_groups)
    return [p for p in members if pod_index_of(p) not in waiting] if waiting else list(members)
