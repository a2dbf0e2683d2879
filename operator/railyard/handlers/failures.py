"""Handling a failure of the gang: ask railyard.logic.recovery for the plan and execute it. The
plan says everything (fail the job; or restart in full, in place, only the touched replica
groups, or go on with fewer groups); this module quarantines the nodes the failure blames and
hands each plan to its executor: handlers/inplace.py (in place, group repair),
handlers/regroup.py (shrink), the full restart here. The first failing pod's exit code, node and
last words go into the status, the condition and the Event (logic/failure_report.py)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from railyard.api.trainingjob import LastRestart, QuarantinedNode, TrainingJob
from railyard.handlers.attempts import running_table
from railyard.handlers.cycle import Cycle
from railyard.handlers.inplace import begin_in_place, capable_pods
from railyard.handlers.regroup import shrink_groups
from railyard.logic.failure_report import describe_failure, explain_failure
from railyard.logic.failures import Failure
from railyard.logic.gang import pod_name_of
from railyard.logic.placement import job_tolerations
from railyard.logic.planned import find_going_nodes
from railyard.logic.quarantine import QUARANTINE_KEY
from railyard.logic.recovery import (
    Fail,
    FullRestart,
    Observed,
    RestartInPlace,
    ShrinkAndWait,
    decide_recovery,
)


async def place_again(
    cycle: Cycle,
    current: Sequence[Mapping[str, Any]],
    nodes: Mapping[str, Mapping[str, Any]],
    reason: str,
    message: str,
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
    runtime = cycle.runtime
    runtime.metrics.failures.labels(**{"class": failure.cls.value, "kind": failure.kind}).inc()
    # the first failing pod's exit code, node and last words: its pod is deleted below (or at
    # the TTL), the status and the Event keep them
    failure, report = explain_failure(failure, current, nodes, attempt=cycle.status.attempt, time=cycle.iso)
    said = describe_failure(failure, report)
    cycle.update(last_failure=report)
    # the pods themselves, not the launchers' reports laid over them (a launcher that waits to
    # restart in place is alive: it gets the normal grace)
    real = {pod_name_of(p): p for p in runtime.pods_of(cycle.ns, cycle.name)}
    gang = [real.get(pod_name_of(p), p) for p in current]
    # what only a restart that keeps pods needs is read only when one may happen
    in_place = job.spec.restart_policy.in_place
    table = await running_table(cycle) if in_place else None
    t0 = time.perf_counter()
    plan = decide_recovery(
        Observed(
            cause=failure,
            job=job,
            status=cycle.status,
            generation=cycle.generation,
            members=gang,
            nodes=nodes,
            cluster_pods=runtime.all_bound_pods() if in_place else (),
            table=table,
            capable=capable_pods(cycle, gang),
            reported=current,
            said=said,
            refused=cycle.refused_nodes(),
            admitted=cycle.worker.kueue_topology,
            topology_cache=runtime.topology_cache,
            going=find_going_nodes(
                nodes, signals=runtime.settings.maintenance_signals, tolerations=job_tolerations(job)
            ),
        )
    )
    if isinstance(plan, RestartInPlace):
        runtime.metrics.placement.observe(time.perf_counter() - t0)
    if isinstance(plan, Fail):
        cycle.phase("Failed", plan.reason, plan.message)
        return None
    quarantined = await _quarantine(cycle, failure)
    match plan:
        case RestartInPlace():  # RepairGroups too
            return await begin_in_place(cycle, job, plan, gang, real, nodes, quarantined)
        case ShrinkAndWait():
            assert table is not None, "a shrink goes on from the running table"
            return await shrink_groups(cycle, job, plan, table, gang, real, nodes, quarantined)
        case FullRestart():
            return await restart_whole_gang(cycle, plan, said, gang, nodes, quarantined)
    raise AssertionError(f"{plan!r} is no plan after a failure")


async def _quarantine(cycle: Cycle, failure: Failure) -> list[QuarantinedNode]:
    """Quarantine the nodes the failure blames; the status's list with them."""
    quarantined = list(cycle.status.quarantined_nodes)
    for node in failure.nodes:
        if await cycle.io.quarantine_node(node, reason=failure.kind, job=f"{cycle.ns}/{cycle.name}", now=cycle.now):
            quarantined = [q for q in quarantined if q.node != node] + [
                QuarantinedNode(node=node, reason=failure.message, time=cycle.iso)
            ]
            cycle.event(
                "Warning",
                "NodeQuarantined",
                f"node {node} quarantined: {failure.message} "
                f"(release: label {QUARANTINE_KEY}- or annotate railyard.dev/release=true)",
            )
    return quarantined


async def restart_whole_gang(
    cycle: Cycle,
    plan: FullRestart,
    said: str,
    gang: Sequence[Mapping[str, Any]],
    nodes: Mapping[str, Mapping[str, Any]],
    quarantined: list[QuarantinedNode],
) -> float:
    """Delete every pod, count the restart, back off; the next attempt is created whole. The
    old launchers are told to stop; a fallback from in place gets its own Warning."""
    runtime, failure, budget = cycle.runtime, plan.failure, plan.budget
    await cycle.delete_pods(gang, nodes)
    backoff = budget.backoff_seconds
    attempt = cycle.status.attempt + 1
    cycle.record_restart(
        failure, attempt=attempt, backoff_s=backoff, quarantined=quarantined, in_place=False,
        gang_created_time=None, pods_since_attempt=None,
        last_restart=LastRestart(
            attempt=attempt, mode="Full", state="Pending", reason=plan.reason, message=plan.message
        ),
    )
    runtime.metrics.count_restart(failure.cls)
    runtime.control.publish(cycle.ns, cycle.name, attempt=attempt, members={}, open_=False, waiting="full restart")
    runtime.metrics.restart_modes.labels(mode="Full", reason=plan.reason).inc()
    if plan.notable:
        cycle.event("Warning", "FullRestart", plan.message)
    wait = f", next gang in {backoff:g}s" if backoff > 0 else ""
    full = f"; {plan.message}" if plan.notable else ""
    cycle.phase("Restarting", failure.kind, f"{said}; {budget.reason}{full}{wait}")
    return backoff if backoff > 0 else 0.2
