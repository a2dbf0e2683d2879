"""What the gang schedulers users already run expect from a gang, built as plain manifests.

When a TrainingJob names a queue or a scheduler (``spec.gang.queueName`` /
``spec.gang.schedulerName``), the operator keeps deciding placement (ranks, rails, node
affinity) but lets that scheduler admit and bind the gang all-or-nothing:

* **Kueue** (plain-pod groups): every pod carries ``kueue.x-k8s.io/queue-name`` and
  ``kueue.x-k8s.io/pod-group-name`` labels and a ``kueue.x-k8s.io/pod-group-total-count``
  annotation; Kueue gates the pods until the whole group is admitted by the LocalQueue.
* **Volcano**: a ``scheduling.volcano.sh/v1beta1`` PodGroup with ``minMember`` = gang size (and
  the queue), pods annotated ``scheduling.k8s.io/group-name`` and ``schedulerName: volcano``.
* **scheduler-plugins coscheduling**: a ``scheduling.x-k8s.io/v1alpha1`` PodGroup with
  ``minMember`` = gang size, pods labelled ``scheduling.x-k8s.io/pod-group``.

One group per attempt (``<job>-a<attempt>``): a restarted gang is a new group, so the scheduler
never mixes old and new pods. Pure: no I/O; the operator creates :attr:`GangSchedulingPlan.objects`
before the pods and passes its pods through :func:`apply_to_pods`.
"""

from __future__ import annotations

import copy
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from railyard.api.quantity import format_quantity, parse_quantity
from railyard.api.trainingjob import TrainingJobSpec

KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_TOTAL_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
VOLCANO_GROUP = "scheduling.volcano.sh"
VOLCANO_API_VERSION = f"{VOLCANO_GROUP}/v1beta1"
VOLCANO_SCHEDULER = "volcano"
COSCHEDULING_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
COSCHEDULING_GROUP = "scheduling.x-k8s.io"
COSCHEDULING_API_VERSION = f"{COSCHEDULING_GROUP}/v1alpha1"
PODGROUP_PLURAL = "podgroups"
#: Scheduler names scheduler-plugins installs under (its Helm chart and all-in-one manifests).
COSCHEDULING_SCHEDULERS = frozenset({"scheduler-plugins-scheduler", "scheduler-plugins", "coscheduling"})


class Integration(enum.StrEnum):
    DEFAULT = "default"  # kube-scheduler (or a scheduler we know nothing about): no group objects
    KUEUE = "kueue"
    VOLCANO = "volcano"
    COSCHEDULING = "coscheduling"


@dataclass(frozen=True)
class GangSchedulingPlan:
    integration: Integration
    group_name: str
    #: Objects to create before the pods (PodGroups), owned by the TrainingJob.
    objects: list[dict[str, Any]] = field(default_factory=list)
    pod_labels: dict[str, str] = field(default_factory=dict)
    pod_annotations: dict[str, str] = field(default_factory=dict)
    scheduler_name: str | None = None


def decide_integration(spec: TrainingJobSpec) -> Integration:
    """Which scheduler the job's ``spec.gang`` asks for."""
    scheduler = spec.gang.scheduler_name or ""
    if scheduler == VOLCANO_SCHEDULER:
        return Integration.VOLCANO
    if scheduler in COSCHEDULING_SCHEDULERS:
        return Integration.COSCHEDULING
    if spec.gang.queue_name:
        return Integration.KUEUE
    return Integration.DEFAULT


def group_name(job: str, attempt: int) -> str:
    """``<job>-a<attempt>``, kept a valid label value (<= 63 characters)."""
    suffix = f"-a{attempt}"
    return job[: 63 - len(suffix)].rstrip("-.") + suffix


def _quantity_sum(value: str, count: int) -> str:
    """``count`` x a Kubernetes quantity, exactly (``"500m" x 4 = "2"``, ``"1.5Gi" x 2 = "3Gi"``)."""
    return format_quantity(parse_quantity(value) * count, like=value)


def gang_min_resources(spec: TrainingJobSpec, gang_size: int) -> dict[str, str]:
    """The whole gang's requests (what the scheduler must find before binding any pod)."""
    requests = dict(spec.resources.requests)
    if spec.gpus > 0:
        requests.setdefault("nvidia.com/gpu", str(spec.gpus))
    return {k: _quantity_sum(str(v), gang_size) for k, v in sorted(requests.items())}


def plan_gang_scheduling(
    spec: TrainingJobSpec,
    *,
    job: str,
    namespace: str,
    attempt: int,
    owner: Mapping[str, Any],
    gang_size: int,
) -> GangSchedulingPlan:
    """Everything the chosen gang scheduler expects for one attempt of ``gang_size`` pods."""
    if gang_size < 1:
        raise ValueError(f"gang_size={gang_size}: a gang has at least one pod")
    kind = decide_integration(spec)
    name = group_name(job, attempt)
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": {"railyard.dev/job": job, "railyard.dev/attempt": str(attempt)},
        "ownerReferences": [dict(owner)],
    }
    if kind is Integration.KUEUE:
        assert spec.gang.queue_name is not None
        return GangSchedulingPlan(
            kind, name,
            pod_labels={KUEUE_QUEUE_LABEL: spec.gang.queue_name, KUEUE_GROUP_LABEL: name},
            pod_annotations={KUEUE_TOTAL_ANNOTATION: str(gang_size)},
            scheduler_name=spec.gang.scheduler_name,
        )
    if kind is Integration.VOLCANO:
        pg_spec: dict[str, Any] = {"minMember": gang_size, "minResources": gang_min_resources(spec, gang_size)}
        if spec.gang.queue_name:
            pg_spec["queue"] = spec.gang.queue_name
        if spec.gang.priority_class_name:
            pg_spec["priorityClassName"] = spec.gang.priority_class_name
        podgroup = {"apiVersion": VOLCANO_API_VERSION, "kind": "PodGroup", "metadata": meta, "spec": pg_spec}
        return GangSchedulingPlan(
            kind, name, objects=[podgroup],
            pod_annotations={VOLCANO_GROUP_ANNOTATION: name},
            scheduler_name=VOLCANO_SCHEDULER,
        )
    if kind is Integration.COSCHEDULING:
        podgroup = {
            "apiVersion": COSCHEDULING_API_VERSION, "kind": "PodGroup", "metadata": meta,
            "spec": {
                "minMember": gang_size,
                "minResources": gang_min_resources(spec, gang_size),
                "scheduleTimeoutSeconds": spec.gang.schedule_timeout_seconds,
            },
        }
        return GangSchedulingPlan(
            kind, name, objects=[podgroup],
            pod_labels={COSCHEDULING_GROUP_LABEL: name},
            scheduler_name=spec.gang.scheduler_name,
        )
    return GangSchedulingPlan(kind, name, scheduler_name=spec.gang.scheduler_name)


def apply_to_pods(pods: Sequence[Mapping[str, Any]], plan: GangSchedulingPlan) -> list[dict[str, Any]]:
    """Copies of ``pods`` carrying the plan's labels, annotations and scheduler (idempotent).

    Our own scheduling gate, node affinity and everything else stay as built: the scheduler
    admits and binds the group, our placement still decides which node each rank lands on.
    """
    out: list[dict[str, Any]] = []
    for pod in pods:
        p = copy.deepcopy(dict(pod))
        meta = p.setdefault("metadata", {})
        if plan.pod_labels:
            meta["labels"] = {**(meta.get("labels") or {}), **plan.pod_labels}
        if plan.pod_annotations:
            meta["annotations"] = {**(meta.get("annotations") or {}), **plan.pod_annotations}
        if plan.scheduler_name:
            p.setdefault("spec", {})["schedulerName"] = plan.scheduler_name
        out.append(p)
    return out
