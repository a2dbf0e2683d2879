"""Kueue admits the TrainingJob, not its pods: what Kueue's Workload says, and what the job does
about it before it has a gang (pure; handlers/kueue.py executes it).

A job with ``spec.gang.queueName`` (and no Volcano or scheduler-plugins scheduler, which use the
queue name themselves), or the label ``kueue.x-k8s.io/queue-name`` as Kueue's own integrations
accept it, gets one Workload (logic/manifests/kueue.py). Until Kueue admitted it the job has no
pod and its phase is ``Queued``, with Kueue's own words in its condition. What Kueue writes is
what a real Kueue v0.13.1 wrote (kube-golden/kueue-v0.13-workload): ``Admitted=True`` and
``status.admission`` once admitted (008); ``QuotaReserved=False`` with reason ``Pending`` or
``Inadmissible`` and the reason in its message while it waits (020, 027). Restarts stay inside the
admission: one Workload per job, not per attempt.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from railyard.api.trainingjob import Toleration, TrainingJobSpec
from railyard.logic.manifests.kueue import QUEUE_LABEL, WORKERS_POD_SET, workload_name
from railyard.logic.schedulers import Integration, decide_integration

#: How often a queued job reads its Workload again (Kueue decides in 0.04-0.7 s, record README).
QUEUED_RECHECK_S = 2.0
#: The job's reason while Kueue has not written a word on a new Workload yet.
WAITING_REASON = "WaitingForKueue"
#: The eviction reason of a Workload set ``spec.active: false`` (record 051): Kueue frees its
#: quota at once (052), so the job's pods stop at once (no save first).
DEACTIVATED = "Deactivated"


def kueue_queue(spec: TrainingJobSpec, labels: Mapping[str, str]) -> str | None:
    """The LocalQueue that admits the job, or None when Kueue does not."""
    if spec.gang.queue_name and decide_integration(spec) is Integration.KUEUE:
        return spec.gang.queue_name
    return labels.get(QUEUE_LABEL) or None


def _condition(workload: Mapping[str, Any], ctype: str) -> Mapping[str, Any] | None:
    for cond in (workload.get("status") or {}).get("conditions") or ():
        if cond.get("type") == ctype:
            return dict(cond)
    return None


def is_true(workload: Mapping[str, Any], ctype: str) -> bool:
    cond = _condition(workload, ctype)
    return cond is not None and cond.get("status") == "True"


@dataclass(frozen=True, slots=True)
class CreateWorkload:
    """No Workload yet: create it; the job is Queued meanwhile."""

    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class StayQueued:
    """Kueue has not admitted the Workload: no pod; the job says why, in Kueue's words."""

    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class Admitted:
    """Kueue admitted the Workload: the gang may be placed and created."""

    cluster_queue: str
    message: str


@dataclass(frozen=True, slots=True)
class Evict:
    """Kueue evicted the admitted Workload (``Evicted=True`` while it still reserves quota: record
    038 preemption, 051 ``spec.active: false``): stop the gang, then acknowledge."""

    reason: str
    message: str


Admission = CreateWorkload | StayQueued | Admitted | Evict


def decide_admission(workload: Mapping[str, Any] | None, *, job: str, queue: str) -> Admission:
    """What the job does about its Workload (``workload`` as read, None when there is none)."""
    name = workload_name(job)
    where = f"Workload {name} in LocalQueue {queue}"
    if workload is None:
        return CreateWorkload(WAITING_REASON, f"waiting for Kueue to admit {where} (created)")
    evicted = _condition(workload, "Evicted")
    if evicted is not None and evicted.get("status") == "True" and is_true(workload, "QuotaReserved"):
        return Evict(str(evicted.get("reason") or "Evicted"), str(evicted.get("message") or ""))
    if is_true(workload, "Admitted"):
        cluster_queue = str(((workload.get("status") or {}).get("admission") or {}).get("clusterQueue") or "")
        note = describe_topology_assignment(workload)
        said = f"Kueue admitted {where} in ClusterQueue {cluster_queue}"
        return Admitted(cluster_queue, f"{said}; {note}" if note else said)
    reserved = _condition(workload, "QuotaReserved")
    if reserved is not None and reserved.get("status") == "False":
        said = str(reserved.get("message") or "")
        return StayQueued(str(reserved.get("reason") or WAITING_REASON), f"waiting for Kueue to admit {where}: {said}")
    return StayQueued(WAITING_REASON, f"waiting for Kueue to admit {where}")


def describe_topology_assignment(workload: Mapping[str, Any], pod_set: str = WORKERS_POD_SET) -> str | None:
    """What the job says of an admission with Topology-Aware Scheduling (record 107:
    ``podSetAssignments[].topologyAssignment``, the pods per domain of the lowest level), which it
    does not honour: Railyard's placement puts one pod on each node it chooses, rail-aware, on the
    flavor's nodes, while TAS may assign several pods to one node; and Kueue then counts the
    unlabelled pods on top of its assignment (record 111-114). None without an assignment."""
    for assignment in ((workload.get("status") or {}).get("admission") or {}).get("podSetAssignments") or ():
        topology = assignment.get("topologyAssignment") if assignment.get("name") == pod_set else None
        if not topology:
            continue
        domains = ", ".join(f"{'/'.join(str(v) for v in d.get('values') or ())} x{d.get('count')}"
                            for d in topology.get("domains") or ())
        levels = " > ".join(str(level) for level in topology.get("levels") or ())
        return (f"its Topology-Aware Scheduling assignment ({levels}: {domains}) is not honoured: the gang is "
                "placed by Railyard's placement on the flavor's nodes (docs/deploy.md, Kueue limits)")
    return None


def describe_end(phase: str, message: str, job: str) -> tuple[bool, str]:
    """(succeeded, message) of the Finished condition the job's end writes on its Workload."""
    return (
        phase == "Succeeded",
        f"TrainingJob {job} {phase.lower()}: {message}" if message else f"TrainingJob {job} {phase.lower()}",
    )


def admitted_flavors(workload: Mapping[str, Any], pod_set: str = WORKERS_POD_SET) -> list[str]:
    """The ResourceFlavors Kueue assigned to ``pod_set`` (record 008: one per resource), each once."""
    for assignment in ((workload.get("status") or {}).get("admission") or {}).get("podSetAssignments") or ():
        if assignment.get("name") == pod_set:
            return sorted(set((assignment.get("flavors") or {}).values()))
    return []


@dataclass(frozen=True, slots=True)
class FlavorPlacement:
    """What the admitted flavors ask of the job's nodes: Kueue writes no nodeSelector into the
    admission (record 008), the flavor's ``nodeLabels`` and ``tolerations`` are the owner's to
    apply (012)."""

    node_labels: Mapping[str, str]
    tolerations: tuple[Mapping[str, Any], ...] = ()


def merge_flavors(flavors: Sequence[Mapping[str, Any]]) -> FlavorPlacement:
    """The union of the ResourceFlavors' ``spec.nodeLabels`` and ``spec.tolerations``."""
    labels: dict[str, str] = {}
    tolerations: list[Mapping[str, Any]] = []
    for flavor in flavors:
        spec = flavor.get("spec") or {}
        labels.update({str(k): str(v) for k, v in (spec.get("nodeLabels") or {}).items()})
        tolerations.extend(t for t in spec.get("tolerations") or () if t not in tolerations)
    return FlavorPlacement(labels, tuple(tolerations))


def apply_flavor(spec: TrainingJobSpec, flavor: FlavorPlacement) -> TrainingJobSpec:
    """The job's spec as its placement and pods must see it on the admitted flavor: the flavor's
    node labels joined to ``spec.nodeSelector`` (the job's own win on a shared key: an explicit
    choice), its tolerations added (once: applying it again changes nothing)."""
    if not flavor.node_labels and not flavor.tolerations:
        return spec
    tolerations = list(spec.tolerations)
    tolerations += [t for t in (Toleration.model_validate(t) for t in flavor.tolerations) if t not in tolerations]
    return spec.model_copy(
        update={"node_selector": {**flavor.node_labels, **spec.node_selector}, "tolerations": tolerations}
    )
