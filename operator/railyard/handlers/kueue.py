"""Kueue admits the TrainingJob (logic/kueue.py decides, logic/manifests/kueue.py builds): before
a job without pods gets a gang, its Workload must be admitted; the job's end is written on the
Workload; deleting the job deletes it. Thin: read, decide, execute."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from railyard.api.trainingjob import TrainingJob, TrainingJobSpec
from railyard.handlers.cycle import Cycle, GangIO
from railyard.handlers.stopping import save_before_stop
from railyard.k8s.client import ApiError
from railyard.logic.conditions import find_condition, set_condition
from railyard.logic.jitsave import StopNow
from railyard.logic.kueue import (
    DEACTIVATED,
    QUEUED_RECHECK_S,
    Admitted,
    CreateWorkload,
    Evict,
    StayQueued,
    admitted_flavors,
    apply_flavor,
    decide_admission,
    describe_end,
    is_true,
    kueue_queue,
    merge_flavors,
)
from railyard.logic.manifests import owner_reference
from railyard.logic.manifests.kueue import (
    KUBE_PRIORITY_SOURCE,
    KUEUE_API_VERSION,
    KUEUE_PRIORITY_SOURCE,
    PRIORITY_CLASS_LABEL,
    build_eviction_ack,
    build_finished_apply,
    build_kueue_workload,
    workload_name,
)

log = logging.getLogger(__name__)

#: How often an admitted job reads its Workload again (is it evicted?).
KUEUE_WATCH_S = 2.0


def queue_of(cycle: Cycle, spec: TrainingJobSpec) -> str | None:
    return kueue_queue(spec, cycle.meta.get("labels") or {})


async def await_admission(cycle: Cycle, job: TrainingJob, queue: str, *, pods: Sequence[Mapping[str, Any]],
                          nodes: Mapping[str, Mapping[str, Any]]) -> float | None:
    """None when the job may go on: Kueue admitted its Workload (the flavor is then known, see
    :func:`flavored`), or its gang exists already under an admission an earlier operator read;
    else the job is Queued (waiting, or stopping because Kueue evicted it) and this says when to
    look again. While admitted the Workload is read again every :data:`KUEUE_WATCH_S` at most."""
    has_pods = bool(pods)
    if cycle.worker.kueue_flavor is not None and cycle.now - cycle.worker.kueue_read_at < KUEUE_WATCH_S:
        return None
    cycle.worker.kueue_read_at = cycle.now
    name = workload_name(cycle.name)
    try:
        workload = await cycle.io.read_kueue_workload(cycle.ns, name)
        decision = decide_admission(workload, job=cycle.name, queue=queue)
        if isinstance(decision, CreateWorkload) and not has_pods:
            await cycle.io.create_kueue_workload(await _build(cycle, job, queue))
        if isinstance(decision, Admitted) and workload is not None and cycle.worker.kueue_flavor is None:
            flavors = [await cycle.io.read_resource_flavor(f) for f in admitted_flavors(workload)]
            cycle.worker.kueue_flavor = merge_flavors([f for f in flavors if f is not None])
    except ApiError as exc:
        if exc.status not in (403, 404):
            raise
        why = "the API server does not serve them (install Kueue v0.13+)" if exc.status == 404 else \
            "the operator's ClusterRole does not grant them (helm/railyard/rbac-rules.yaml)"
        if not has_pods:
            _queued(
                cycle,
                "KueueUnavailable",
                f"spec.gang.queueName {queue}: cannot use {KUEUE_API_VERSION} Workloads: {why}",
            )
        return None if has_pods else QUEUED_RECHECK_S * 5
    if isinstance(decision, Evict) and workload is not None:
        return await _evicted(cycle, job, decision, workload, pods, nodes)
    if isinstance(decision, Admitted):
        _admitted(cycle, decision)
        return None
    if has_pods:
        return None  # a gang created under an admission this process did not read: it goes on
    assert isinstance(decision, CreateWorkload | StayQueued)
    _queued(cycle, decision.reason, decision.message)
    return QUEUED_RECHECK_S


def _admitted(cycle: Cycle, decision: Admitted) -> None:
    said = find_condition(cycle.status.conditions, "Admitted")
    if said is not None and said.status == "True":
        return
    cycle.update(conditions=set_condition(cycle.status.conditions, "Admitted", "True", reason="Admitted",
                                          message=decision.message, now=cycle.iso,
                                          generation=cycle.status.observed_generation or None))
    cycle.event("Normal", "Admitted", decision.message)
    if cycle.status.phase == "Queued" and cycle.status.placement is not None:
        # admitted again after an eviction: the next attempt, placed again (as a resumed job)
        cycle.update(attempt=cycle.status.attempt + 1, placement=None, gang_created_time=None, next_attempt_time=None)
        cycle.phase("Placing", "Readmitted", f"{decision.message}: placing the gang again")


async def _evicted(cycle: Cycle, job: TrainingJob, decision: Evict, workload: Mapping[str, Any],
                   pods: Sequence[Mapping[str, Any]], nodes: Mapping[str, Mapping[str, Any]]) -> float:
    """Kueue evicted the job: it stops as a suspended job does (handlers/stopping.py: a running
    gang saves at a step boundary first, while Kueue still holds the quota; not after a
    deactivation, which released the quota at once, record 052), its pods go, checkpoints kept;
    once they are gone the eviction is acknowledged (Kueue holds the quota until then, record
    041), and the job waits Queued to be admitted again."""
    said = f"evicted by Kueue ({decision.reason}): {decision.message}"
    if pods:
        stop = save_before_stop(cycle, job, pods, purpose=f"Kueue's eviction ({decision.reason})",
                                quota_released=decision.reason == DEACTIVATED)
        if not isinstance(stop, StopNow):
            # the gang trains on until its save is committed (or the wait timed out); the
            # Workload is read again at every look (a readmission, a deactivation meanwhile)
            cycle.worker.kueue_read_at = float("-inf")
            return stop
        cycle.worker.kueue_flavor = None
        await cycle.delete_pods(pods, nodes)
        if cycle.status.phase != "Queued":
            cycle.update(gang_created_time=None, next_attempt_time=None,
                         conditions=set_condition(cycle.status.conditions, "Admitted", "False", reason=decision.reason,
                                                  message=said, now=cycle.iso,
                                                  generation=cycle.status.observed_generation or None))
            cycle.phase("Queued", decision.reason,
                        f"{said}; the gang's pods are deleted, checkpoints kept; {stop.note}")
        return 1.0
    cycle.worker.kueue_flavor = None
    if not await cycle.io.acknowledge_eviction(
        cycle.ns, workload_name(cycle.name), build_eviction_ack(workload, time=cycle.iso)
    ):
        cycle.worker.kueue_read_at = float("-inf")  # changed since read: read it again next cycle
    _queued(cycle, decision.reason, f"{said}; the gang stopped, waiting to be admitted again")
    return QUEUED_RECHECK_S


def flavored(cycle: Cycle, job: TrainingJob) -> TrainingJob:
    """The job as its placement and pods see it on the admitted flavor (logic/kueue.apply_flavor)."""
    flavor = cycle.worker.kueue_flavor
    if flavor is None:
        return job
    return job.model_copy(update={"spec": apply_flavor(job.spec, flavor)})


def _queued(cycle: Cycle, reason: str, message: str) -> None:
    if (cycle.status.phase, cycle.status.message) != ("Queued", message):
        cycle.phase("Queued", reason, message)


async def _build(cycle: Cycle, job: TrainingJob, queue: str) -> dict[str, Any]:
    """The Workload, with the priority Kueue reads (``spec.priority``) resolved from the job's
    WorkloadPriorityClass label, else its ``spec.gang.priorityClassName``."""
    labels: Mapping[str, str] = cycle.meta.get("labels") or {}
    kueue_class = labels.get(PRIORITY_CLASS_LABEL)
    kube_class = job.spec.gang.priority_class_name
    value: int | None = None
    if kueue_class:
        value = await cycle.io.read_priority_value(kueue_class, workload_class=True)
    elif kube_class:
        value = await cycle.io.read_priority_value(kube_class, workload_class=False)
    if (kueue_class or kube_class) and value is None:
        log.warning(
            "%s/%s: priority class %s not found: the Workload has priority 0",
            cycle.ns,
            cycle.name,
            kueue_class or kube_class,
        )
    return build_kueue_workload(
        job.spec, job=cycle.name, namespace=cycle.ns, owner=owner_reference(cycle.body), queue=queue,
        priority=value, priority_class=kueue_class or kube_class,
        priority_source=KUEUE_PRIORITY_SOURCE if kueue_class else KUBE_PRIORITY_SOURCE,
    )


async def finish_workload(cycle: Cycle) -> None:
    """Write the job's end on its Workload once (Kueue stops counting its quota, record 031-033)."""
    if cycle.worker.kueue_finished:
        return
    workload = await cycle.io.read_kueue_workload(cycle.ns, workload_name(cycle.name))
    if workload is not None and not is_true(workload, "Finished"):
        succeeded, message = describe_end(cycle.status.phase, cycle.status.message, cycle.name)
        await cycle.io.finish_kueue_workload(
            build_finished_apply(cycle.name, cycle.ns, succeeded=succeeded, message=message, time=cycle.iso)
        )
    cycle.worker.kueue_finished = True


async def delete_workload(io: GangIO, body: Mapping[str, Any], namespace: str, name: str) -> None:
    """A deleted job's Workload goes at once (its quota with it), where no garbage collector
    runs too; nothing for a job Kueue does not admit."""
    try:
        spec = TrainingJobSpec.model_validate(body.get("spec") or {})
    except ValidationError:
        return
    if kueue_queue(spec, (body.get("metadata") or {}).get("labels") or {}) is not None:
        await io.delete_kueue_workload(namespace, workload_name(name))
