"""Handling a failure of the gang: spend the failure class's budget or fail the job, quarantine
the nodes to blame, then restart in place (handlers/inplace.py), go on with fewer replica groups
when the lost ones cannot be placed (handlers/regroup.py), or delete the whole gang and back off
before the next one. The first failing pod's exit code, node and last words go into
the status, the condition and the Event (logic/failure_report.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from railyard.api.trainingjob import QuarantinedNode, TrainingJob
from railyard.handlers.cycle import Cycle
from railyard.handlers.regroup import shrink_groups
from railyard.handlers.inplace import begin_in_place, plan_restart, record_full
from railyard.logic.shrink import decide_shrink
from railyard.logic.failure_report import describe_failure, explain_failure
from railyard.logic.failures import Failure
from railyard.logic.inplace import RestartPlan, failed_pod_indices
from railyard.logic.lifecycle import FailJob, decide_failure
from railyard.logic.quarantine import QUARANTINE_KEY
from railyard.logic.restarts import restart_update


async def place_again(
    cycle: Cycle, current: Sequence[Mapping[str, Any]], nodes: Mapping[str, Mapping[str, Any]], reason: str, message: str,
) -> float:
    """Tear down a gang that cannot start where it was placed; the next attempt places it again."""
    await cycle.delete_pods(current, nodes)
    cycle.status = cycle.status.model_copy(update={"attempt": cycle.status.attempt + 1, "gang_created_time": None})
    cycle.phase("Placing", reason, message)
    return 0.5


async def handle_failure(
    cycle: Cycle,
    job: TrainingJob,
    failure: Failure,
    current: Sequence[Mapping[str, Any]],
    nodes: Mapping[str, Mapping[str, Any]],
) -> float | None:
    """Returns when to look again (None: the job Failed)."""
    m = cycle.runtime.metrics
    m.failures.labels(**{"class": failure.cls.value, "kind": failure.kind}).inc()
    spec = job.spec
    # the first failing pod's exit code, node and last words: its pod is deleted below (or at
    # the TTL), the status and the Event keep them
    failure, report = explain_failure(failure, current, nodes, attempt=cycle.status.attempt, time=cycle.iso)
    said = describe_failure(failure, report)
    cycle.update(last_failure=report)
    decision = decide_failure(failure, said, spec.restart_policy, cycle.status.restarts)
    if isinstance(decision, FailJob):
        cycle.phase("Failed", decision.reason, decision.message)
        return None
    quarantined = list(cycle.status.quarantined_nodes)
    for node in failure.nodes:
        if await cycle.io.quarantine_node(node, reason=failure.kind, job=f"{cycle.ns}/{cycle.name}", now=cycle.now):
            quarantined = [q for q in quarantined if q.node != node] + [QuarantinedNode(node=node, reason=failure.message, time=cycle.iso)]
            cycle.event("Warning", "NodeQuarantined", f"node {node} quarantined: {failure.message} (release: label {QUARANTINE_KEY}- or annotate railyard.dev/release=true)")
    # the pods themselves, not the launchers' reports laid over them (a launcher that waits to
    # restart in place is alive: it gets the normal grace)
    real = {str((p.get("metadata") or {}).get("name")): p for p in cycle.runtime.pods_of(cycle.ns, cycle.name)}
    gang = [real.get(str((p.get("metadata") or {}).get("name")), p) for p in current]
    plan: RestartPlan | None
    plan, stragglers = plan_restart(cycle, job, failure, gang, nodes, quarantined, failed=frozenset(failed_pod_indices(current)) | frozenset(failure.pod_indices))
    if plan.mode == "InPlace":
        got = await begin_in_place(cycle, job, failure, decision, plan, stragglers, gang, real, nodes, quarantined)
        if not isinstance(got, RestartPlan):
            return got
        # the lost replica groups found no place: the others go on without them (logic/shrink.py)
        shrink = decide_shrink(plan, got.message.removeprefix("full restart (NotPlaceable): "), replicas=spec.replica_groups,
                               min_replicas=spec.fault_tolerance.min_replicas) if got.reason == "NotPlaceable" else None
        if shrink is not None:
            shrunk = await shrink_groups(cycle, job, failure, decision, shrink, gang, real, nodes, quarantined)
            if not isinstance(shrunk, RestartPlan):
                return shrunk
            got = shrunk
        plan = got
    await cycle.delete_pods(gang, nodes)
    backoff = decision.backoff_seconds
    cycle.status = cycle.status.model_copy(update={
        **restart_update(cycle.status, failure, attempt=cycle.status.attempt + 1, now=cycle.now, now_iso=cycle.iso, backoff_s=backoff,
                         quarantined=quarantined, in_place=False),
        "gang_created_time": None,
    })
    m.restarts.labels(**{"class": failure.cls.value}).inc()
    record_full(cycle, plan)
    wait = f", next gang in {backoff:g}s" if backoff > 0 else ""
    full = f"; {plan.message}" if plan.reason and plan.reason != "InPlaceDisabled" else ""
    cycle.phase("Restarting", failure.kind, f"{said}; {decision.reason}{full}{wait}")
    return backoff if backoff > 0 else 0.2
