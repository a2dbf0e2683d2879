"""Health glue: each cycle of a running job, read its heartbeat window, ask logic.health for a
verdict, turn Restart verdicts into failures the reconcile handles like any other, and copy
progress (step, loss, checkpoints, restore) into the status."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from railyard.api.trainingjob import CheckpointRef, RestoreStatus, StragglerStatus, TrainingJob
from railyard.handlers.cycle import Cycle
from railyard.logic.conditions import format_time, parse_time
from railyard.logic.failures import Failure, build_verdict_failure
from railyard.logic.gang import pod_index_of
from railyard.logic.goodput import compute_goodput
from railyard.logic.health import (
    HealthDecision,
    HealthPolicy,
    HealthState,
    PodStatus,
    decide_health,
)
from railyard.logic.health.window import JobWindow
from railyard.logic.restarts import best_checkpoint
from railyard.protocol.restore import compute_steps_lost, latest_verified_per_tier

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


def evaluate_health(c: Cycle, job: TrainingJob, pods: Sequence[Mapping[str, Any]], *, report: bool = True) -> Failure | None:
    """Update ``c.st`` from the job's heartbeats; return a failure when a verdict asks for a
    restart. ``c`` is the reconcile Cycle. ``report=False`` (the gang has finished): progress
    only, no verdict Events and no failure."""
    rt = c.rt
    window = rt.store.job(c.ns, c.name)
    if window is None or window.attempt != c.st.attempt:
        return None
    # the gang's pods (``pods`` are its members: an in-place restart keeps pods of older attempts)
    current = {pod_index_of(p): p for p in pods}
    floor = parse_time(c.st.gang_created_time)
    pod_status = {
        i: PodStatus(i, str((p.get("status") or {}).get("phase") or "Pending"), str((p.get("spec") or {}).get("nodeName") or ""), _running_since(p, floor))
        for i, p in current.items()
    }
    try:
        policy = HealthPolicy.from_spec(job.spec.health.model_dump(by_alias=True), heartbeats_expected=job.spec.trainer.program is None)
    except ValueError as exc:
        log.warning("%s/%s: health policy: %s", c.ns, c.name, exc)
        return None
    state = c.w.health_state if c.w.health_state is not None else HealthState()
    decision = decide_health(window, pod_status, state, policy, c.now)
    c.w.health_state = decision.state
    rt.health_metrics.observe_decision(c.ns, c.name, decision)
    _copy_progress(c, window, decision)
    rt.checkpoint_metrics.set_goodput(c.ns, c.name, compute_goodput(c.st.step, decision.p50_step_time_s, parse_time(c.st.start_time), c.now))
    if not report:
        return None
    for v in decision.verdicts:
        c.event("Warning", v.reason or v.kind.value, v.message)
    if not decision.restart:
        return None
    restarting = [v for v in decision.verdicts if v.action.value == "Restart"]
    first = restarting[0] if restarting else decision.verdicts[0]
    return build_verdict_failure(first.kind.value, first.message, decision.quarantine_nodes)


def _copy_progress(c: Cycle, window: JobWindow, decision: HealthDecision) -> None:
    st = c.st
    update: dict[str, Any] = {}
    # a new attempt's first beats (before its first step) report 0: keep the step shown
    if window.max_step > 0 and window.max_step != st.step:
        update["step"] = int(window.max_step)
        loss, tokens_per_s = window.progress()
        if loss is not None and math.isfinite(loss):
            update["loss"] = round(float(loss), 5)
        update["tokens_per_second"] = round(float(tokens_per_s), 1)
    stragglers = [
        StragglerStatus(rank=s.rank, node=s.node, score=round(float(s.score), 4), since=format_time(c.now))
        for s in decision.stragglers
    ]
    old = {(s.rank, s.node): s for s in st.stragglers}
    stragglers = [old.get((s.rank, s.node), s).model_copy(update={"score": s.score}) for s in stragglers]
    if [(s.rank, s.node, s.score) for s in stragglers] != [(s.rank, s.node, s.score) for s in st.stragglers]:
        update["stragglers"] = stragglers
    latest = latest_verified_per_tier(window.last_checkpoints().values())
    if latest:
        per_tier = {ref.tier: ref for ref in st.checkpoints}
        changed = False
        for tier, step in latest.items():
            if tier not in per_tier or per_tier[tier].step < step:
                per_tier[tier] = CheckpointRef(step=step, tier=tier, time=format_time(c.now))
                changed = True
        if changed:
            refs = sorted(per_tier.values(), key=lambda r: r.tier)
            update["checkpoints"] = refs
            update["last_checkpoint"] = best_checkpoint(refs)
    if window.restored_tier and (st.restore is None or st.restore.tier != window.restored_tier or st.restore.step != window.restored_step):
        # the previous attempt's newest step (kept by the store across the attempt change);
        # st.step may already show the new attempt's progress
        last = window.previous_max_step if window.previous_max_step >= 0 else st.step
        lost = compute_steps_lost(last, window.restored_step) if window.restored_step >= 0 else 0
        update["restore"] = RestoreStatus(tier=window.restored_tier, step=window.restored_step, steps_lost=lost)
        if c.st.attempt > 0:
            c.rt.checkpoint_metrics.observe_steps_lost(lost)
    if update:
        c.st = st.model_copy(update=update)
