"""One reconcile cycle of one TrainingJob: observe, decide (logic/), act (k8s/), write status once.

The cycle is a small state machine over what :func:`railyard.logic.gang.assess_gang` sees:

- Absent: place the gang (sticky on the previous attempt's nodes) and create it whole, gated;
  unplaceable -> Placed=False with the reason, retry with backoff and on node events.
- Partial/Gated (an operator died mid-creation): finish creating from the attempt's ConfigMap,
  lift all gates.
- Starting: all Running within the schedule timeout, else tear down and re-place.
- Running / Succeeded: record it.
- Failed: classify, spend the class's budget or fail the job, quarantine the nodes to blame,
  delete the gang (force on dead nodes), bump the attempt, back off, re-place; the first
  failing pod's exit code, node and last words go into the status, the condition and the Event.
- Finished (Succeeded/Failed): keep the last attempt's finished pods until
  ``spec.cleanup.ttlSecondsAfterFinished`` (logic/finished.py), delete the rest at once.

The API server refusing one of the gang's own objects fails the job or makes it wait with the
server's message (logic/rejections.py), never a silent retry.

Status changes are collected on a copy and written in one patch at the end; every condition
that flips becomes an Event.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from railyard.api.trainingjob import QuarantinedNode, TrainingJob, TrainingJobStatus
from railyard.handlers.cleanup import cleanup_checkpoints
from railyard.handlers.cycle import Cycle, GangIO, KubeGangIO
from railyard.handlers.health import evaluate_health
from railyard.handlers.inplace import (
    begin_in_place,
    check_restarted,
    continue_in_place,
    drop_old_configmaps,
    fall_back_to_full,
    in_place_restart,
    members_since,
    plan_restart,
    record_full,
    republish,
)
from railyard.handlers.runtime import JobWorker, Runtime
from railyard.handlers.spares import reconcile_spares
from railyard.k8s.client import ApiError
from railyard.logic.conditions import (
    find_condition,
    format_micro_time,
    parse_time,
)
from railyard.logic.failure_report import describe_failure, explain_failure
from railyard.logic.failures import Failure
from railyard.logic.finished import decide_finished_pods
from railyard.logic.gang import (
    DEFAULT_ECHO_SETTLE_S,
    GangAssessment,
    assess_gang,
    attempt_of,
    find_stale_placement,
    first_exit_time,
    gang_members,
)
from railyard.logic.inplace import RestartPlan, apply_launcher_reports
from railyard.logic.manifests import (
    CLEANUP_FINALIZER,
    build_configmap,
    build_gang_pods,
    build_secret,
    build_service,
    build_trainer_config,
    check_names,
    configmap_name,
    is_owned_by,
    owner_reference,
    pod_name,
    secret_name,
    service_name,
    with_addresses,
)
from railyard.logic.placement import Placement, Unplaceable, build_placement_input, plan_placement
from railyard.logic.quarantine import QUARANTINE_KEY, decide_still_quarantined
from railyard.logic.rejections import PERMANENT_REASONS, decide_rejection
from railyard.logic.restarts import (
    decide_restart,
    decide_streak_reset,
    record_restart,
    restore_hint,
)
from railyard.logic.schedulers import (
    GangSchedulingPlan,
    apply_to_pods,
    describe_unavailable,
    group_name,
)
from railyard.logic.status import (
    TERMINAL_PHASES,
    build_placement_status,
    decide_degraded,
    placement_status,
)
from railyard.protocol.exitcodes import FailureClass
from railyard.protocol.ranktable import RankTable

log = logging.getLogger(__name__)

#: Seconds between tries to create a PodGroup whose CRD is missing (spec.gang.schedulerName).
PODGROUP_RETRY_S = 10.0
#: Failed reasons a new spec generation recovers from: the spec itself, or an object built from
#: it, could not be accepted.
RESTART_ON_EDIT = frozenset({"InvalidSpec"}) | PERMANENT_REASONS

def _format_validation(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()))
        parts.append(f"{loc}: {err.get('msg')}")
    return "; ".join(parts)


async def reconcile_job(rt: Runtime, w: JobWorker, *, now: float | None = None, io: GangIO | None = None) -> float | None:
    """Run one cycle; returns seconds until the next check is due (None: only on events).

    ``now`` and ``io`` default to the clock and the real API; tests pass their own."""
    c = Cycle(rt, w, time.time() if now is None else now, io if io is not None else KubeGangIO(rt.api()))
    finalizers = list(c.meta.get("finalizers") or [])
    ours = CLEANUP_FINALIZER in finalizers
    if c.meta.get("deletionTimestamp"):
        if not ours:
            await c.io.delete_owned(c.ns, c.name)
            return None
        return await cleanup_checkpoints(c, finalizers)
    wants = bool(((c.body.get("spec") or {}).get("checkpoint") or {}).get("cleanupOnDelete"))
    if wants != ours:
        # a finalizer only while the job asks for its checkpoints to be deleted with it
        new = [*finalizers, CLEANUP_FINALIZER] if wants else [f for f in finalizers if f != CLEANUP_FINALIZER]
        await c.io.patch_job_finalizers(c.ns, c.name, new, c.meta.get("resourceVersion"))
    try:
        job = TrainingJob.model_validate({"metadata": {"name": c.name, "namespace": c.ns}, "spec": c.body.get("spec") or {}})
        problems = check_names(c.name, job.spec.nodes)
    except ValidationError as exc:
        job, problems = None, [_format_validation(exc)]
    if job is None or problems:
        nodes = rt.node_map()
        await c.delete_pods(rt.pods_of(c.ns, c.name), nodes)
        if c.st.phase != "Failed" or c.st.message != "; ".join(problems):
            c.st = c.st.model_copy(update={"observed_generation": c.generation})
            c.phase("Failed", "InvalidSpec", "; ".join(problems) + " (fix the spec; the job stays Failed until then)")
        await c.commit()
        return None
    delay = await _step(c, job)
    spares_in = await reconcile_spares(c, job)
    if spares_in is not None:
        delay = spares_in if delay is None else min(delay, spares_in)
    await c.commit()
    return delay


async def _step(c: Cycle, job: TrainingJob) -> float | None:
    rt, spec = c.rt, job.spec
    pods = _own_pods(c)
    nodes = rt.node_map()
    if c.w.deleting:
        # forget the deletions of pods that are gone (the names of every attempt would pile up)
        present = {str((p.get("metadata") or {}).get("name")) for p in pods}
        c.w.deleting = {n: t for n, t in c.w.deleting.items() if n in present}
    _refresh_quarantine(c, nodes)
    if c.st.phase in ("Succeeded", "Failed"):
        failed = find_condition(c.st.conditions, "Failed")
        if (c.st.phase == "Failed" and failed is not None and failed.reason in RESTART_ON_EDIT
                and c.st.observed_generation != c.generation):
            # the spec was fixed: start over
            c.st = TrainingJobStatus(attempt=c.st.attempt + 1, restarts=c.st.restarts, last_failure=c.st.last_failure)
        else:
            return await _release_finished(c, job, nodes)
    if spec.suspend:
        if pods:
            await c.delete_pods(pods, nodes)
        if c.st.phase != "Suspended":
            c.st = c.st.model_copy(update={"observed_generation": c.generation, "gang_created_time": None, "next_attempt_time": None})
            c.phase("Suspended", "Suspended", "spec.suspend is true: the gang's pods are deleted, checkpoints kept")
        return 2.0 if pods else None
    if c.st.phase == "Suspended":
        c.st = c.st.model_copy(update={"attempt": c.st.attempt + 1})
        c.phase("Placing", "Resumed", "spec.suspend is false: placing the gang again")
    if not c.old_wire.get("attempt") and pods:
        # an unreadable or missing status: the pods' attempt labels say where we were
        c.st = c.st.model_copy(update={"attempt": max(c.st.attempt, *(attempt_of(p) for p in pods))})
    if pods and rt.tokens(c.ns, c.name) is None:
        # an operator restarted under a running gang: accept its heartbeats again
        token = await c.io.read_token(c.ns, c.name)
        if token:
            rt.tokens.set(c.ns, c.name, token)
            rt.store.begin_attempt(c.ns, c.name, c.st.attempt)
    expected = c.st.placement.node_count if (c.st.placement and c.st.gang_created_time) else spec.nodes
    # what the launchers report (their workers' exits, while the pod runs on) is pod evidence too
    view = apply_launcher_reports(pods, rt.control.reports(c.ns, c.name), attempt=c.st.attempt)
    since = members_since(c)
    a = assess_gang(view, nodes, attempt=c.st.attempt, expected=expected, now=c.now, not_ready_grace_s=rt.settings.not_ready_grace_s,
                    echo_settle_s=DEFAULT_ECHO_SETTLE_S, since=since)
    old = set(a.stale)
    stale = [p for p in pods if str((p.get("metadata") or {}).get("name")) in old]
    if stale:
        await c.delete_pods(stale, nodes)
    members, _ = gang_members(view, attempt=c.st.attempt, since=since)
    if pods and rt.control.get(c.ns, c.name) is None:
        await republish(c, members)  # an operator restarted under a running gang
    state_delay = await _act_in_place(c, job, a, view, nodes, stale, members)
    if c.st.phase in TERMINAL_PHASES:
        return await _release_finished(c, job, nodes)
    _update_degraded(c, job)
    if a.recheck_after > 0:
        state_delay = a.recheck_after if state_delay is None else min(state_delay, a.recheck_after)
    return state_delay


async def _act_in_place(
    c: Cycle,
    job: TrainingJob,
    a: GangAssessment,
    view: Sequence[Mapping[str, Any]],
    nodes: Mapping[str, Mapping[str, Any]],
    stale: Sequence[Mapping[str, Any]],
    members: Sequence[Mapping[str, Any]],
) -> float | None:
    """The in-place restart's steps (handlers/inplace.py) around the state machine of
    :func:`_act`: the replacements are created and the launchers told by continue_in_place,
    and the gang is Running once every kept launcher has restarted its workers."""
    lr = in_place_restart(c)
    if lr is None:
        return await _act(c, job, a, view, nodes, stale)
    if lr.state == "Pending":
        # the replaced indices have no pod yet: that is the plan, not a lost pod
        return await continue_in_place(c, job, nodes)
    if a.state in ("Partial", "Gated"):
        return await continue_in_place(c, job, nodes)
    if a.state in ("Starting", "Running"):
        got = check_restarted(c, job, members)
        if isinstance(got, str):
            return await fall_back_to_full(c, job, "RestartNotAnswered", got, nodes)
        if got is None:
            # every kept launcher runs the attempt: the restart is done (old ConfigMaps can go)
            await drop_old_configmaps(c, members)
        if got is not None:
            if a.state == "Starting":
                state = await _act(c, job, a, view, nodes, stale)
                return got if state is None else min(got, state)
            return got
    return await _act(c, job, a, view, nodes, stale)


async def _act(
    c: Cycle,
    job: TrainingJob,
    a: GangAssessment,
    pods: Sequence[Mapping[str, Any]],
    nodes: Mapping[str, Mapping[str, Any]],
    stale: Sequence[Mapping[str, Any]],
) -> float | None:
    spec = job.spec
    current, _ = gang_members(pods, attempt=c.st.attempt, since=members_since(c))
    if a.state == "Absent":
        if stale:
            if c.st.phase not in ("Restarting", "Placing"):
                c.phase("Restarting", "WaitingForOldPods", f"waiting for {len(stale)} pods of earlier attempts to terminate")
            return 1.0
        nat = parse_time(c.st.next_attempt_time)
        if nat is not None and c.now < nat:
            return nat - c.now
        return await _place_and_create(c, job, nodes)
    if a.state in ("Partial", "Gated"):
        if current and all(_name(p) in c.w.deleting for p in current):
            # what is left of a creation the API server refused (rolled back): let it go
            await c.delete_pods(current, nodes)
            return 1.0
        return await _finish_creation(c, job, current, a)
    if a.state == "Starting":
        created = parse_time(c.st.gang_created_time) or c.now
        deadline = created + spec.gang.schedule_timeout_seconds
        if c.now >= deadline:
            return await _place_again(
                c, current, nodes, "GangTimeout",
                f"{a.running}/{a.expected} pods Running after {spec.gang.schedule_timeout_seconds}s "
                "(spec.gang.scheduleTimeoutSeconds): tearing down and re-placing",
            )
        stale_nodes = find_stale_placement(job, current, nodes)
        if stale_nodes:
            stuck = stale_nodes[0]
            return await _place_again(
                c, current, nodes, "NodeUnusable",
                f"pod {stuck.pod} cannot be scheduled on its node {stuck.node} any more ({stuck.why}"
                + (f"; {len(stale_nodes) - 1} more pods likewise" if len(stale_nodes) > 1 else "")
                + "): tearing down and re-placing without waiting for spec.gang.scheduleTimeoutSeconds",
            )
        if c.st.phase != "Starting":
            c.phase("Starting", "GangStarting", f"attempt {c.st.attempt}: {a.running}/{a.expected} pods Running; waiting for the rest "
                    f"(spec.gang.scheduleTimeoutSeconds={spec.gang.schedule_timeout_seconds})")
        verdict = evaluate_health(c, job, current)
        if verdict is not None:
            return await _handle_failure(c, job, verdict, current, nodes)
        return min(deadline - c.now, job.spec.health.heartbeat_interval_seconds)
    if a.state == "Running":
        _mark_running(c, job, a)
        verdict = evaluate_health(c, job, current)
        if verdict is not None:
            return await _handle_failure(c, job, verdict, current, nodes)
        reset_in = _reset_restart_streak(c, job)
        due = job.spec.health.heartbeat_interval_seconds if c.rt.store.job(c.ns, c.name) is not None else None
        return reset_in if due is None else (due if reset_in is None else min(due, reset_in))
    if a.state == "Succeeded":
        evaluate_health(c, job, current, report=False)  # the last progress (step, checkpoints); no more verdicts
        c.phase("Succeeded", "AllRanksSucceeded", f"all {a.expected} pods exited 0 (attempt {c.st.attempt})")
        return None
    if a.state == "Failed":
        assert a.failure is not None
        failure = a.failure
        if failure.cls is FailureClass.SDC and failure.kind == "SDCExitCode":
            culprit = _sdc_culprit(c, job, current)
            if culprit is None:
                # the suspect's heartbeat may trail its exit by a beat: wait a little for it
                first = first_exit_time(current)
                left = (first + SDC_VERDICT_WAIT_S - c.now) if first is not None else 0.0
                if left > 0:
                    return min(left, 0.5)
            failure = culprit or dataclasses.replace(failure, nodes=())
        return await _handle_failure(c, job, failure, current, nodes)
    return None


async def _place_again(
    c: Cycle, current: Sequence[Mapping[str, Any]], nodes: Mapping[str, Mapping[str, Any]], reason: str, message: str,
) -> float:
    """Tear down a gang that cannot start where it was placed; the next attempt places it again."""
    await c.delete_pods(current, nodes)
    c.st = c.st.model_copy(update={"attempt": c.st.attempt + 1, "gang_created_time": None})
    c.phase("Placing", reason, message)
    return 0.5


def _reset_restart_streak(c: Cycle, job: TrainingJob) -> float | None:
    """Clear the restart streak once the gang has run healthy long enough; returns the seconds
    until that is due (None: nothing to wait for)."""
    created = parse_time(c.st.gang_created_time)
    if created is None or c.st.time_to_all_ready_seconds is None:
        return None
    running_since = created + c.st.time_to_all_ready_seconds
    reset = decide_streak_reset(c.st.restarts, job.spec.restart_policy, running_since, c.now)
    if reset is not None:
        c.st = c.st.model_copy(update={"restarts": reset})
        return None
    streak = c.st.restarts.streak
    if job.spec.restart_policy.reset_after_seconds <= 0 or (streak is not None and not any(streak.values())) or c.st.restarts.total == 0:
        return None
    return max(running_since + job.spec.restart_policy.reset_after_seconds - c.now, 0.5)


#: How long an SDC exit waits for the heartbeat that names the suspect (then: no node blamed).
SDC_VERDICT_WAIT_S = 5.0


def _sdc_culprit(c: Cycle, job: TrainingJob, current: Sequence[Mapping[str, Any]]) -> Failure | None:
    """Every rank of an SDC vote exits 75, so the exit codes do not say whose node is bad: the
    suspect named in the heartbeats does. The health verdict when there is one (None: not yet);
    without one the gang restarts without quarantining anything (docs/operator.md)."""
    verdict = evaluate_health(c, job, current)
    if verdict is not None and verdict.cls is FailureClass.SDC:
        return verdict
    return None


def _mark_running(c: Cycle, job: TrainingJob, a: GangAssessment) -> None:
    pending = ""
    if c.generation != c.st.observed_generation and c.st.observed_generation:
        pending = (
            f"spec generation {c.generation} differs from the running gang's ({c.st.observed_generation}); "
            "it takes effect at the next restart (suspend and resume to apply it now)"
        )
    if pending != c.st.pending_spec_changes:
        c.st = c.st.model_copy(update={"pending_spec_changes": pending})
    if c.st.phase == "Running":
        return
    update: dict[str, Any] = {}
    created = parse_time(c.st.gang_created_time)
    m = c.rt.metrics
    if created is not None:
        update["time_to_all_ready_seconds"] = round(c.now - created, 3)
        m.gang_ready.observe(max(c.now - created, 0.0))
    if c.st.start_time is None:
        update["start_time"] = c.iso
        born = parse_time(str(c.meta.get("creationTimestamp") or ""))
        if born is not None:
            m.job_start.observe(max(c.now - born, 0.0))
    failed_at = parse_time(c.st.failure_time)
    if failed_at is not None:
        m.restart_duration.observe(max(c.now - failed_at, 0.0))
        update["failure_time"] = None
    c.st = c.st.model_copy(update=update)
    c.phase("Running", "AllPodsRunning", f"all {a.expected} pods Running (attempt {c.st.attempt})")


async def _handle_failure(
    c: Cycle,
    job: TrainingJob,
    f: Failure,
    current: Sequence[Mapping[str, Any]],
    nodes: Mapping[str, Mapping[str, Any]],
) -> float | None:
    m = c.rt.metrics
    m.failures.labels(**{"class": f.cls.value, "kind": f.kind}).inc()
    spec = job.spec
    # the first failing pod's exit code, node and last words: its pod is deleted below (or at
    # the TTL), the status and the Event keep them
    f, report = explain_failure(f, current, nodes, attempt=c.st.attempt, time=c.iso)
    said = describe_failure(f, report)
    c.update(last_failure=report)
    if f.cls is FailureClass.PERMANENT:
        c.phase("Failed", f.kind, f"{said}: not retried (permanent)")
        return None
    decision = decide_restart(spec.restart_policy, c.st.restarts, f.cls)
    if not decision.allowed:
        c.phase("Failed", "RestartBudgetSpent", f"{said}; {decision.reason}")
        return None
    quarantined = list(c.st.quarantined_nodes)
    for node in f.nodes:
        if await c.io.quarantine_node(node, reason=f.kind, job=f"{c.ns}/{c.name}", now=c.now):
            quarantined = [q for q in quarantined if q.node != node] + [QuarantinedNode(node=node, reason=f.message, time=c.iso)]
            c.event("Warning", "NodeQuarantined", f"node {node} quarantined: {f.message} (release: label {QUARANTINE_KEY}- or annotate railyard.dev/release=true)")
    # the pods themselves, not the launchers' reports laid over them (a launcher that waits to
    # restart in place is alive: it gets the normal grace)
    real = {str((p.get("metadata") or {}).get("name")): p for p in c.rt.pods_of(c.ns, c.name)}
    gang = [real.get(str((p.get("metadata") or {}).get("name")), p) for p in current]
    plan: RestartPlan | None
    plan, stragglers = plan_restart(c, job, f, gang, nodes, quarantined)
    if plan.mode == "InPlace":
        got = await begin_in_place(c, job, f, decision, plan, stragglers, gang, real, nodes, quarantined)
        if not isinstance(got, RestartPlan):
            return got
        plan = got
    await c.delete_pods(gang, nodes)
    backoff = decision.backoff_seconds
    c.st = c.st.model_copy(
        update={
            "restarts": record_restart(c.st.restarts, f.cls, f"{f.kind}: {f.message}", c.iso),
            "attempt": c.st.attempt + 1,
            "failure_time": format_micro_time(c.now),
            "next_attempt_time": format_micro_time(c.now + backoff) if backoff > 0 else None,
            "gang_created_time": None,
            "quarantined_nodes": quarantined,
        }
    )
    m.restarts.labels(**{"class": f.cls.value}).inc()
    record_full(c, plan)
    wait = f", next gang in {backoff:g}s" if backoff > 0 else ""
    full = f"; {plan.message}" if plan.reason and plan.reason != "InPlaceDisabled" else ""
    c.phase("Restarting", f.kind, f"{said}; {decision.reason}{full}{wait}")
    return backoff if backoff > 0 else 0.2


async def _previous_placement(c: Cycle) -> RankTable | None:
    if c.st.attempt == 0:
        return None
    for prev in range(c.st.attempt - 1, max(c.st.attempt - 4, -1), -1):
        table = await c.io.read_rank_table(c.ns, c.name, prev)
        if table is not None:
            return table
    return None


async def _place_and_create(c: Cycle, job: TrainingJob, nodes: Mapping[str, Mapping[str, Any]]) -> float | None:
    rt, spec, attempt = c.rt, job.spec, c.st.attempt
    prev = await _previous_placement(c)
    t0 = time.perf_counter()
    result = plan_placement(build_placement_input(
        job, nodes=list(nodes.values()), pods=rt.all_bound_pods(), attempt=attempt,
        previous_nodes=[p.node for p in sorted(prev.pods, key=lambda p: p.pod_index)] if prev is not None else None,
        previous_spares=c.st.placement.spares if c.st.placement else (),
        failed={q.node for q in c.st.quarantined_nodes}, cache=c.w.topology_cache,
    ))
    rt.metrics.placement.observe(time.perf_counter() - t0)

    if isinstance(result, Unplaceable):
        c.w.placement_failures += 1
        if result.permanent:
            c.phase("Failed", result.condition_reason, result.message)
            return None
        retry = min(2.0 ** c.w.placement_failures, 30.0)
        c.phase("Placing", result.condition_reason, f"{result.message}; retrying (and on every node change)")
        return retry
    c.w.placement_failures = 0
    try:
        created = await create_gang(c, job, result)
    except GangRefused as refused:
        return await _gang_refused(c, refused)
    if created is None:
        return PODGROUP_RETRY_S
    pods, plan = created
    placement = placement_status(result, attempt=attempt)
    levels = [k for k in result.cross_bytes_per_step if k not in ("host", "network")]
    spine = levels[-1] if levels else None
    rt.metrics.set_cross_bytes(c.ns, c.name, dict(result.cross_bytes_per_step), spine)
    c.st = c.st.model_copy(
        update={
            "placement": placement, "gang_created_time": format_micro_time(c.now), "time_to_all_ready_seconds": None,
            "observed_generation": c.generation, "pending_spec_changes": "", "next_attempt_time": None,
        }
    )
    c.phase("Starting", "GangCreated", f"attempt {attempt}: {len(pods)} pods created and released together on {placement.summary}")
    await c.io.delete_configmaps(c.ns, [configmap_name(c.name, a) for a in range(max(attempt - 4, 0), attempt)])
    if plan.objects:
        # one PodGroup per attempt: the earlier attempts' groups go with their pods
        earlier = [group_name(c.name, a) for a in range(max(attempt - 4, 0), attempt)]
        await c.io.delete_podgroups(c.ns, plan.objects[0]["apiVersion"], earlier)
    return float(spec.gang.schedule_timeout_seconds)


async def create_gang(c: Cycle, job: TrainingJob, placed: Placement) -> tuple[list[dict[str, Any]], GangSchedulingPlan] | None:
    """Create the gang of ``c.st.attempt`` on ``placed``: the scheduler's PodGroup, the job's
    Secret and Service, the attempt's ConfigMap, every pod gated, then every gate lifted at once.
    None when the PodGroup kind is unavailable (the job stays Placing).

    Every object the API server may refuse for this gang is created here: a refusal raises
    :class:`GangRefused` (naming the object and what to roll back), which
    :func:`_gang_refused` turns into a Failed phase or a waiting condition."""
    rt, spec, attempt = c.rt, job.spec, c.st.attempt
    owner = owner_reference(c.body)
    plan = await c.plan_gang(spec, attempt=attempt, gang_nodes=placed.nodes)
    pods = build_gang_pods(spec, job=c.name, namespace=c.ns, owner=owner, attempt=attempt, nodes=placed.nodes, heartbeat_url=_heartbeat_url(rt, c.ns, c.name), annotations=rt.settings.pod_annotations)
    pods = apply_to_pods(pods, plan)  # schedulerName, queue/group labels; our gate and node affinity stay
    names = [str(p["metadata"]["name"]) for p in pods]
    cm = configmap_name(c.name, attempt)
    async with _refusals(f"PodGroup {plan.group_name}"):
        if not await _ensure_podgroups(c, plan):
            return None
    await _ensure_job_objects(c, owner)
    table = with_addresses(placed.rank_table, c.ns)
    # a new gang: no pod is kept (a memory tier in the pods is gone with them)
    restore = restore_hint(c.st, spec, pods_kept=False)
    config = build_trainer_config(spec, job=c.name, namespace=c.ns, attempt=attempt, restore=restore)
    async with _refusals(f"ConfigMap {cm}"):
        await c.io.create_object(build_configmap(c.name, c.ns, owner, attempt=attempt, rank_table=table, config=config))
    # the attempt's ConfigMap goes with a refused gang too: a retry may place it elsewhere
    async with _refusals("the gang's pods", pods=names, configmap=cm):
        rt.metrics.pods_created.inc(await c.io.create_pods(pods))
        await c.io.lift_gates(pods)
    rt.store.begin_attempt(c.ns, c.name, attempt)
    members = {i: pod_name(c.name, attempt, i) for i in range(len(pods))}
    c.after_commit.append(lambda: rt.control.publish(c.ns, c.name, attempt=attempt, members=members, table=table, restore=restore))
    return pods, plan


class GangRefused(Exception):
    """The API server refused one of the gang's own objects (``what``); ``pods`` and
    ``configmap`` are what this attempt may already have created of the gang."""

    def __init__(self, what: str, error: ApiError, pods: Sequence[str] = (), configmap: str | None = None) -> None:
        super().__init__(f"{what}: {error}")
        self.what = what
        self.error = error
        self.pods = list(pods)
        self.configmap = configmap


@contextlib.asynccontextmanager
async def _refusals(what: str, *, pods: Sequence[str] = (), configmap: str | None = None) -> AsyncIterator[None]:
    try:
        yield
    except ApiError as exc:
        raise GangRefused(what, exc, pods, configmap) from exc


async def _gang_refused(c: Cycle, refused: GangRefused) -> float | None:
    """Roll back what this attempt created of the gang (no half gang waits or runs), then fail
    the job (a refusal that cannot pass) or wait and create it again (one that can), with the
    server's message in the condition and its Event."""
    exc = refused.error
    message = exc.body.get("message", "") if isinstance(exc.body, dict) else str(exc.body or "")
    decision = decide_rejection(exc.status, exc.reason, str(message), what=refused.what)
    log.warning("%s/%s: %s", c.ns, c.name, decision.message)
    if refused.pods:
        for n in refused.pods:
            c.w.deleting[n] = c.now
        await c.io.delete_pods(c.ns, refused.pods, grace_seconds=0)  # gated, never bound: gone at once
    if refused.configmap:
        await c.io.delete_configmaps(c.ns, [refused.configmap])
    c.st = c.st.model_copy(update={"observed_generation": c.generation, "gang_created_time": None})
    if decision.permanent:
        c.phase("Failed", decision.reason, decision.message)
        return None
    c.st = c.st.model_copy(update={"next_attempt_time": format_micro_time(c.now + decision.retry_after_s)})
    c.phase("Placing", decision.reason, decision.message)
    return decision.retry_after_s


async def _ensure_podgroups(c: Cycle, plan: GangSchedulingPlan) -> bool:
    """Create the gang scheduler's PodGroup before any pod (idempotent). False, with the job
    kept Placing and the reason in its status, when the API server does not serve the kind."""
    if not plan.objects:
        return True
    try:
        await c.io.create_podgroups(plan.objects)
    except ApiError as exc:
        if exc.status not in (403, 404):
            raise
        c.drop_detected(plan, exc.status)
        c.phase("Placing", "PodGroupUnavailable", describe_unavailable(plan, exc.status, retry_s=PODGROUP_RETRY_S))
        return False
    return True


async def _finish_creation(c: Cycle, job: TrainingJob, current: Sequence[Mapping[str, Any]], a: GangAssessment) -> float | None:
    """Resume a gang whose creation was interrupted: same names, same nodes (from the
    attempt's ConfigMap), then lift every gate."""
    rt = c.rt
    table = await c.io.read_rank_table(c.ns, c.name, c.st.attempt)
    if table is None:
        # nothing says where the rest goes: start this attempt over
        await c.delete_pods(current, rt.node_map())
        c.st = c.st.model_copy(update={"attempt": c.st.attempt + 1, "gang_created_time": None})
        return 0.5
    nodes = [p.node for p in sorted(table.pods, key=lambda p: p.pod_index)]
    owner = owner_reference(c.body)
    pods = build_gang_pods(job.spec, job=c.name, namespace=c.ns, owner=owner, attempt=c.st.attempt, nodes=nodes, heartbeat_url=_heartbeat_url(rt, c.ns, c.name), annotations=rt.settings.pod_annotations)
    plan = await c.plan_gang(job.spec, attempt=c.st.attempt, gang_nodes=nodes, begun=current)
    names = [str(p["metadata"]["name"]) for p in pods]
    try:
        async with _refusals(f"PodGroup {plan.group_name}"):
            if not await _ensure_podgroups(c, plan):
                return PODGROUP_RETRY_S
        pods = apply_to_pods(pods, plan)
        missing = [pods[i] for i in a.missing if i < len(pods)]
        async with _refusals("the gang's pods", pods=names, configmap=configmap_name(c.name, c.st.attempt)):
            if missing:
                rt.metrics.pods_created.inc(await c.io.create_pods(missing))
        await _ensure_job_objects(c, owner)
        async with _refusals("the gang's pods", pods=names, configmap=configmap_name(c.name, c.st.attempt)):
            await c.io.lift_gates(pods)
    except GangRefused as refused:
        # the rest of this gang exists already: it goes too
        refused.pods = names
        refused.configmap = configmap_name(c.name, c.st.attempt)
        return await _gang_refused(c, refused)
    update: dict[str, Any] = {}
    if c.st.gang_created_time is None:
        update["gang_created_time"] = format_micro_time(c.now)
    if c.st.placement is None or c.st.placement.attempt != c.st.attempt or c.st.placement.node_count != len(nodes):
        update["placement"] = build_placement_status(nodes, attempt=c.st.attempt)
    if update:
        c.st = c.st.model_copy(update=update)
    if c.st.phase != "Starting":
        c.phase("Starting", "GangResumed", f"attempt {c.st.attempt}: finished creating {len(missing)} missing pods and released the gang")
    return 1.0


async def _ensure_job_objects(c: Cycle, owner: Mapping[str, Any]) -> None:
    """The per-job Secret (heartbeat token) and headless Service; idempotent, and the token is
    re-read after an operator restart so heartbeats authenticate against the same one."""
    rt = c.rt
    if rt.tokens(c.ns, c.name) is None:
        async with _refusals(f"Secret {secret_name(c.name)}"):
            token = await c.io.ensure_secret(build_secret(c.name, c.ns, owner, c.io.new_token()))
        rt.tokens.set(c.ns, c.name, token)
    async with _refusals(f"Service {service_name(c.name)}"):
        await c.io.create_object(build_service(c.name, c.ns, owner))


async def _release_finished(c: Cycle, job: TrainingJob, nodes: Mapping[str, Mapping[str, Any]]) -> float | None:
    """A finished job: delete what must go now (other attempts, spares, placeholders), keep the
    last attempt's finished pods until ``spec.cleanup`` says, give its members still running a
    little time to exit on their own (logic/finished.py); no more health news. Returns when to
    look again (a settle time or the TTL)."""
    if c.st.stragglers:
        c.update(stragglers=[])
    _update_degraded(c, job)  # a finished job is not Degraded (no Event: it finished)
    done = decide_finished_pods(
        _own_pods(c), job_phase=c.st.phase, attempt=c.st.attempt, cleanup=job.spec.cleanup,
        completion_time=parse_time(c.st.completion_time), now=c.now, since=members_since(c),
    )
    if done.delete:
        await c.delete_pods(done.delete, nodes)
        return 2.0 if done.due_in is None else min(2.0, done.due_in)
    return done.due_in


def _own_pods(c: Cycle) -> list[dict[str, Any]]:
    """The job's gang pods; a deleted job's pods (same name, another uid, finished pods kept for
    their TTL) are not this job's, whatever their labels say."""
    uid = c.meta.get("uid")
    return [p for p in c.rt.pods_of(c.ns, c.name) if is_owned_by(p, str(uid) if uid else None)]


def _name(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("name") or "")


def _heartbeat_url(rt: Runtime, namespace: str, job: str) -> str:
    base = rt.settings.heartbeat_url or f"http://railyard-operator.railyard-system.svc:{rt.settings.metrics_port}"
    return f"{base.rstrip('/')}/v1/heartbeats/{namespace}/{job}"


def _refresh_quarantine(c: Cycle, nodes: Mapping[str, Mapping[str, Any]]) -> None:
    """Drop nodes a person released (label or taint removed) from the job's quarantine list."""
    keep = decide_still_quarantined(c.st.quarantined_nodes, nodes)
    if len(keep) != len(c.st.quarantined_nodes):
        c.update(quarantined_nodes=keep)


def _update_degraded(c: Cycle, job: TrainingJob) -> None:
    c.st = decide_degraded(c.st, hot_spares=job.spec.gang.hot_spares, now=c.iso)
