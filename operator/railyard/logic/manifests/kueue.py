"""The Kueue Workload a TrainingJob is admitted by, and the status writes its owner makes.

Kueue's plain-pod integration does not fit a job whose controller owns its pods' lifecycle (one
group per attempt, pods pinned by our placement, in-place replacement; issue 48). So Railyard does
what NVIDIA's Grove does: it creates one ``kueue.x-k8s.io/v1beta1`` Workload per TrainingJob,
owned by it, and creates no training pod before Kueue admitted it. The shapes follow what a real
Kueue v0.13.1 accepted and wrote (kube-golden/kueue-v0.13-workload: 007 the create, 031 the
Finished condition).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from railyard.api.trainingjob import TrainingJobSpec
from railyard.logic.manifests.pod import CONTAINER_NAME, container_resources

KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta1"
KUEUE_API_VERSION = f"{KUEUE_GROUP}/{KUEUE_VERSION}"
KUEUE_WORKLOAD_PLURAL = "workloads"
KUEUE_PRIORITY_CLASS_PLURAL = "workloadpriorityclasses"
KUEUE_FLAVOR_PLURAL = "resourceflavors"
#: The label Kueue's own integrations read the LocalQueue from (accepted on a TrainingJob too).
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
#: The label Kueue's own integrations read a WorkloadPriorityClass from.
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
#: What Kueue names the owner by in preemption messages (record 038: "JobUID").
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
WORKERS_POD_SET = "workers"
SPARES_POD_SET = "spares"
#: ``spec.priorityClassSource`` values (Kueue reads ``spec.priority`` only; the owner resolves it).
KUBE_PRIORITY_SOURCE = "scheduling.k8s.io/priorityclass"
KUEUE_PRIORITY_SOURCE = "kueue.x-k8s.io/workloadpriorityclass"
#: The field manager of our server-side applies on a Workload's status.
FIELD_MANAGER = "railyard-operator"


def workload_name(job: str) -> str:
    """One Workload per job, named as the job (restarts stay inside its admission)."""
    return job


def _template(spec: TrainingJobSpec) -> dict[str, Any]:
    """What Kueue counts of one pod: the trainer container's requests and what selects nodes.
    Not our per-pod node affinity (the placement decides nodes after the admission) and no
    Kueue label: Kueue sizes the quota from this, it never sees our pods."""
    pod_spec: dict[str, Any] = {
        "containers": [{"name": CONTAINER_NAME, "image": spec.image, "resources": container_resources(spec)}],
        "restartPolicy": "Never",
    }
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod_spec["tolerations"] = [t.model_dump(by_alias=True, exclude_none=True) for t in spec.tolerations]
    return {"spec": pod_spec}


def build_kueue_workload(
    spec: TrainingJobSpec,
    *,
    job: str,
    namespace: str,
    owner: Mapping[str, Any],
    queue: str,
    priority: int | None = None,
    priority_class: str | None = None,
    priority_source: str = KUBE_PRIORITY_SOURCE,
) -> dict[str, Any]:
    """The job's Workload (record 007): pod set ``workers`` of ``spec.nodes`` pods and, with hot
    spares, a pod set ``spares`` of ``gang.hotSpares`` pods: their placeholders hold GPUs on
    nodes as a gang pod does, so the quota must count them, and apart from the workers so the
    ClusterQueue's usage says which is which. ``priority`` is the class's value resolved by the
    caller: Kueue reads only ``spec.priority`` (a class name without it is refused, 014)."""
    pod_sets = [{"name": WORKERS_POD_SET, "count": spec.nodes, "template": _template(spec)}]
    if spec.gang.hot_spares:
        pod_sets.append({"name": SPARES_POD_SET, "count": spec.gang.hot_spares, "template": _template(spec)})
    wl_spec: dict[str, Any] = {"queueName": queue, "podSets": pod_sets}
    if priority_class and priority is not None:
        wl_spec.update(priority=priority, priorityClassName=priority_class, priorityClassSource=priority_source)
    return {
        "apiVersion": KUEUE_API_VERSION,
        "kind": "Workload",
        "metadata": {
            "name": workload_name(job),
            "namespace": namespace,
            "labels": {JOB_UID_LABEL: str(owner.get("uid") or "")},
            "ownerReferences": [dict(owner)],
        },
        "spec": wl_spec,
    }


def build_finished_apply(job: str, namespace: str, *, succeeded: bool, message: str, time: str) -> dict[str, Any]:
    """The server-side apply on the Workload's ``/status`` that ends it (record 031): one
    ``Finished=True`` condition (conditions are a list-map keyed by type, so nothing else is
    touched); Kueue then stops counting its quota."""
    return {
        "apiVersion": KUEUE_API_VERSION,
        "kind": "Workload",
        "metadata": {"name": workload_name(job), "namespace": namespace},
        "status": {"conditions": [{
            "type": "Finished", "status": "True", "reason": "Succeeded" if succeeded else "Failed",
            "message": message, "lastTransitionTime": time,
        }]},
    }


def build_eviction_ack(workload: Mapping[str, Any], *, time: str) -> dict[str, Any]:
    """The owner's acknowledgement of an eviction once its pods are gone, as a JSON merge patch
    on ``/status`` (record 054; Kueue's jobframework writes the same by server-side apply, 042):
    ``status.admission`` removed, and the whole conditions list with ``QuotaReserved=False``
    (Pending, the eviction's message), ``Admitted=False`` (NoReservation) and ``Requeued`` True
    (False for a deactivated Workload), the others as Kueue wrote them; the resourceVersion makes
    it conditional (409 when Kueue wrote since: read again, decide again). The quota is released
    and the Workload queued again."""
    meta = workload.get("metadata") or {}
    status = workload.get("status") or {}
    conditions = [dict(c) for c in status.get("conditions") or ()]
    evicted = next((c for c in conditions if c.get("type") == "Evicted"), {})
    reason, message = str(evicted.get("reason") or ""), str(evicted.get("message") or "")
    generation = meta.get("generation") or 1
    new: dict[str, dict[str, Any]] = {
        "QuotaReserved": {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": message},
        "Admitted": {
            "type": "Admitted",
            "status": "False",
            "reason": "NoReservation",
            "message": "The workload has no reservation",
        },
        "Requeued": {
            "type": "Requeued",
            "status": "False" if reason == "Deactivated" else "True",
            "reason": reason,
            "message": message,
        },
    }
    for cond in new.values():
        cond.update(lastTransitionTime=time, observedGeneration=generation)
    out = [new.pop(str(c.get("type")), c) for c in conditions]
    out += list(new.values())
    patch: dict[str, Any] = {"status": {"admission": None, "conditions": out}}
    if meta.get("resourceVersion"):
        patch["metadata"] = {"resourceVersion": meta["resourceVersion"]}
    return patch
