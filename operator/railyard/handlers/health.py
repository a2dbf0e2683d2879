"""Health glue: each cycle of a running job, read its heartbeat window, ask logic.health for a
verdict, turn Restart verdicts into failures the reconcile handles like any other, copy
progress (step, loss, checkpoints, restore) into the status, and say when Running pods are not
heard at all (the ``Blind`` condition, logic/health/silence.py). Also the one place the URL the
pods reach the operator at is chosen (logic/health/address.py)."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from railyard.api.trainingjob import CheckpointRef, RestoreStatus, StragglerStatus, TrainingJob
from railyard.handlers.cycle import Cycle
from railyard.handlers.runtime import Runtime
from railyard.logic.conditions import format_time, parse_time
from railyard.logic.failures import Failure, build_verdict_failure
from railyard.logic.gang import pod_index_of, pod_name_of
from railyard.logic.goodput import compute_goodput
from railyard.logic.health import (
    HealthDecision,
    HealthPolicy,
    HealthState,
    PodStatus,
    decide_health,
)
from railyard.logic.health.address import (
    build_heartbeat_url,
    carried_heartbeat_base,
    decide_heartbeat_base,
    heartbeat_url_of,
)
from railyard.logic.health.silence import (
    Silence,
    apply_silence,
    compute_silence_bound,
    decide_silence,
)
from railyard.logic.health.window import JobWindow
from railyard.logic.restarts import best_checkpoint
from railyard.protocol.restore import compute_steps_lost, latest_verified_per_tier
from railyard.protocol.trainerconfig import to_wire

log = logging.getLogger(__name__)


def _running_since(pod: Mapping[str, Any], floor: float | None = None) -> float | None:
    """When the pod's trainer started running this attempt: its container's start, or for a pod
    kept by an in-place restart, the restart (``floor``), when its workers started again."""
    status = pod.get("status") or {}
    since = None
    for cs in status.get("containerStatuses") or ():
        started = ((cs.get("state") or {}).get("running") or {}).get("startedAt")
        if started:
            since = parse_time(started)
            break
    else:
        since = parse_time(status.get("startTime"))
    if since is not None and floor is not None:
        return max(since, floor)
    return since


def evaluate_health(
    cycle: Cycle, job: TrainingJob, pods: Sequence[Mapping[str, Any]], *, report: bool = True
) -> Failure | None:
    """Update ``cycle.status`` from the job's heartbeats; return a failure when a verdict asks for a
    restart. ``c`` is the reconcile Cycle. ``report=False`` (the gang has finished): progress
    only, no verdict Events and no failure."""
    runtime = cycle.runtime
    window = runtime.store.job(cycle.ns, cycle.name)
    if window is None or window.attempt != cycle.status.attempt:
        return None
    # the gang's pods (``pods`` are its members: an in-place restart keeps pods of older attempts)
    current = {pod_index_of(p): p for p in pods}
    floor = parse_time(cycle.status.gang_created_time)
    pod_status = {
        i: PodStatus(
            i,
            str((p.get("status") or {}).get("phase") or "Pending"),
            str((p.get("spec") or {}).get("nodeName") or ""),
            _running_since(p, floor),
        )
        for i, p in current.items()
    }
    try:
        bundled = job.spec.trainer.program is None
        policy = HealthPolicy.from_spec(to_wire(job.spec.health), heartbeats_expected=bundled,
                                        final_step=job.spec.trainer.steps if bundled else None)
    except ValueError as exc:
        log.warning("%s/%s: health policy: %s", cycle.ns, cycle.name, exc)
        return None
    state = cycle.worker.health_state if cycle.worker.health_state is not None else HealthState()
    decision = decide_health(window, pod_status, state, policy, cycle.now,
                             fingerprints=window.rank_signals() if window.layout is not None else None,
                             group_of=window.layout.group_of if window.layout is not None else None)
    cycle.worker.health_state = decision.state
    runtime.health_metrics.observe_decision(cycle.ns, cycle.name, decision)
    _copy_progress(cycle, window, decision)
    runtime.checkpoint_metrics.set_goodput(
        cycle.ns,
        cycle.name,
        compute_goodput(cycle.status.step, decision.p50_step_time_s, parse_time(cycle.status.start_time), cycle.now),
    )
    if not report:
        return None
    if cycle.status.phase == "Running":
        _judge_silence(cycle, window, current, pod_status, policy)
    for v in decision.verdicts:
        cycle.event("Warning", v.reason or v.kind.value, v.message)
    if not decision.restart:
        return None
    restarting = [v for v in decision.verdicts if v.action.value == "Restart"]
    first = restarting[0] if restarting else decision.verdicts[0]
    # the pods the verdicts name: with replica groups only their groups restart
    return build_verdict_failure(
        first.kind.value,
        first.message,
        decision.quarantine_nodes,
        pod_indices=[v.pod_index for v in restarting],
        restore_not_after=first.restore_not_after,
    )


def _judge_silence(
    cycle: Cycle,
    window: JobWindow,
    current: Mapping[int, Mapping[str, Any]],
    pod_status: Mapping[int, PodStatus],
    policy: HealthPolicy,
) -> None:
    """The Blind condition: heard are pods with a rank in the heartbeat window of this attempt,
    and pods whose launcher (this very pod, by name) reported on the control channel."""
    runtime = cycle.runtime
    if cycle.worker.watching_since is None:
        cycle.worker.watching_since = cycle.now
    heard = {r.pod_index for r in window.rank_signals()}
    names = {i: pod_name_of(p) for i, p in current.items()}
    heard |= {
        i
        for i, (report, _) in runtime.control.reports(cycle.ns, cycle.name).items()
        if report.pod and report.pod == names.get(i)
    }
    table = runtime.control.table(cycle.ns, cycle.name, cycle.status.attempt)
    ranks_of: dict[int, list[int]] = {}
    for r in table.ranks if table is not None else ():
        ranks_of.setdefault(r.pod_index, []).append(r.rank)
    silent = [i for i in sorted(pod_status) if i not in heard]
    silence = decide_silence(
        pod_status,
        heard,
        bound_s=compute_silence_bound(policy),
        watching_since=cycle.worker.watching_since,
        now=cycle.now,
        ranks_of=ranks_of,
        pods_url=heartbeat_url_of(current[silent[0]]) if silent else "",
        operator_url=heartbeat_url_for(runtime, cycle.ns, cycle.name),
    )
    runtime.health_metrics.set_silent_pods(cycle.ns, cycle.name, len(silence.silent))
    _set_blind(cycle, silence)


def settle_blind(cycle: Cycle) -> None:
    """Each cycle: a job without a running gang is not Blind (no Event)."""
    _set_blind(cycle, None)


def _set_blind(cycle: Cycle, silence: Silence | None) -> None:
    st, event = apply_silence(cycle.status, silence, now=cycle.iso)
    cycle.status = st
    if event is not None:
        cycle.event(*event)


def heartbeat_url_for(runtime: Runtime, namespace: str, job: str) -> str:
    """The heartbeat URL for the job's new pods: the advertised base, else the base its pods
    already carry (learned once per job and kept: an operator restarted under running pods does
    not move them to another address), else the chart's Service."""
    carried = ""
    if not runtime.settings.heartbeat_url:
        worker = runtime.workers.get((namespace, job))
        carried = worker.heartbeat_base if worker is not None else ""
        if not carried:
            carried = carried_heartbeat_base(runtime.pods_of(namespace, job), namespace, job)
            if worker is not None:
                worker.heartbeat_base = carried
    base = decide_heartbeat_base(
        advertised=runtime.settings.heartbeat_url, carried=carried, metrics_port=runtime.settings.metrics_port
    )
    return build_heartbeat_url(base, namespace, job)


def _copy_progress(cycle: Cycle, window: JobWindow, decision: HealthDecision) -> None:
    st = cycle.status
    update: dict[str, Any] = {}
    # a new attempt's first beats (before its first step) report 0: keep the step shown
    if window.max_step > 0 and window.max_step != st.step:
        update["step"] = int(window.max_step)
        loss, tokens_per_s = window.progress()
        if loss is not None and math.isfinite(loss):
            update["loss"] = round(float(loss), 5)
        update["tokens_per_second"] = round(float(tokens_per_s), 1)
    stragglers = [
        StragglerStatus(rank=s.rank, node=s.node, score=round(float(s.score), 4), since=format_time(cycle.now))
        for s in decision.stragglers
    ]
    old = {(s.rank, s.node): s for s in st.stragglers}
    stragglers = [old.get((s.rank, s.node), s).model_copy(update={"score": s.score}) for s in stragglers]
    if [(s.rank, s.node, s.score) for s in stragglers] != [(s.rank, s.node, s.score) for s in st.stragglers]:
        update["stragglers"] = stragglers
    latest = latest_verified_per_tier(window.last_checkpoints().values())
    if latest and (st.checkpoint_fence is None or window.attempt >= st.checkpoint_fence.attempt):
        # (an attempt before the fence may still beat until the next one begins: its saves after
        # the fence's step are the abandoned part of the run)
        per_tier = {ref.tier: ref for ref in st.checkpoints}
        changed = False
        for tier, step in latest.items():
            if tier not in per_tier or per_tier[tier].step < step:
                per_tier[tier] = CheckpointRef(step=step, tier=tier, time=format_time(cycle.now))
                changed = True
        if changed:
            refs = sorted(per_tier.values(), key=lambda r: r.tier)
            update["checkpoints"] = refs
            update["last_checkpoint"] = best_checkpoint(refs)
    if window.restored_tier and (
        st.restore is None or st.restore.tier != window.restored_tier or st.restore.step != window.restored_step
    ):
        # the previous attempt's newest step (kept by the store across the attempt change);
        # st.step may already show the new attempt's progress
        last = window.previous_max_step if window.previous_max_step >= 0 else st.step
        lost = compute_steps_lost(last, window.restored_step) if window.restored_step >= 0 else 0
        update["restore"] = RestoreStatus(tier=window.restored_tier, step=window.restored_step, steps_lost=lost)
        if cycle.status.attempt > 0:
            cycle.runtime.checkpoint_metrics.observe_steps_lost(lost)
    if update:
        cycle.status = st.model_copy(update=update)
