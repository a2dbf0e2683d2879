"""What the gang schedulers users already run expect from a gang, built as plain manifests.

When a TrainingJob names a queue or a scheduler (``spec.gang.queueName`` /
``spec.gang.schedulerName``), the operator keeps deciding placement (ranks, rails, node
affinity) but lets that scheduler admit and bind the gang all-or-nothing:

* **Kueue**: nothing on the pods. Kueue admits the TrainingJob through one Workload the operator
  creates before any pod (logic/kueue.py, logic/manifests/kueue.py); its plain-pod groups do not
  fit a job whose controller replaces pods and pins them (issue 48).
* **Volcano**: a ``scheduling.volcano.sh/v1beta1`` PodGroup with ``minMember`` = gang size (and
  the queue), pods annotated ``scheduling.k8s.io/group-name`` and ``schedulerName: volcano``.
* **scheduler-plugins coscheduling**: a ``scheduling.x-k8s.io/v1alpha1`` PodGroup with
  ``minMember`` = gang size, pods labelled ``scheduling.x-k8s.io/pod-group``.
* **Kubernetes itself** (``spec.gang.scheduler``: kubernetes, or auto where the API server serves
  ``scheduling.k8s.io/v1alpha2``): a Workload with one gang template (``minCount`` = gang size, a
  topology constraint at the narrowest level that holds every node of the gang, see
  :func:`decide_topology_key`) and a PodGroup made from it; pods name the group in
  ``spec.schedulingGroup.podGroupName`` and kube-scheduler binds all of them or none.

One group per attempt (``<job>-a<attempt>``): a restarted gang is a new group, so the scheduler
never mixes old and new pods. For Kubernetes that is also one Workload per attempt: a Workload's
templates are immutable (and at most 8), so a job's later attempts cannot be added to one. The
pods an in-place restart replaces form the new attempt's group on their own (``minCount`` = the
pods replaced): a pod's ``schedulingGroup`` is immutable, and whether a scheduled gang takes a
late member inside its topology constraint is nothing the recorded v1.36 server shows.

Pure: no I/O; the operator creates :attr:`GangSchedulingPlan.objects` before the pods and passes
its pods through :func:`apply_to_pods`.
"""

from __future__ import annotations

import copy
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from railyard.api.quantity import format_quantity, parse_quantity
from railyard.api.trainingjob import COSCHEDULING_SCHEDULERS as _COSCHEDULING
from railyard.api.trainingjob import VOLCANO_SCHEDULER, TrainingJobSpec
from railyard.logic.topology import resolve_level_keys

#: Kueue's plain-pod labels: Railyard's pods must not carry them (its pod webhook would gate them).
KUEUE_POD_LABELS = ("kueue.x-k8s.io/queue-name", "kueue.x-k8s.io/pod-group-name")
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
VOLCANO_GROUP = "scheduling.volcano.sh"
VOLCANO_API_VERSION = f"{VOLCANO_GROUP}/v1beta1"
COSCHEDULING_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
COSCHEDULING_GROUP = "scheduling.x-k8s.io"
COSCHEDULING_API_VERSION = f"{COSCHEDULING_GROUP}/v1alpha1"
PODGROUP_PLURAL = "podgroups"
#: Scheduler names scheduler-plugins installs under (its Helm chart and all-in-one manifests).
COSCHEDULING_SCHEDULERS = frozenset(_COSCHEDULING)
#: Kubernetes' own gang scheduling (kube-apiserver v1.36, GenericWorkload and GangScheduling gates).
SCHEDULING_GROUP = "scheduling.k8s.io"
SCHEDULING_VERSION = "v1alpha2"
SCHEDULING_API_VERSION = f"{SCHEDULING_GROUP}/{SCHEDULING_VERSION}"
WORKLOAD_PLURAL = "workloads"
#: The one PodGroup template of each attempt's Workload.
GANG_TEMPLATE = "gang"
#: ``schedulerName`` values that are kube-scheduler (auto picks Kubernetes' gang scheduling only
#: for these, or none).
KUBE_SCHEDULERS = frozenset({"", "default-scheduler"})


class Integration(enum.StrEnum):
    DEFAULT = "default"  # kube-scheduler (or a scheduler we know nothing about): no group objects
    KUEUE = "kueue"
    VOLCANO = "volcano"
    COSCHEDULING = "coscheduling"
    KUBERNETES = "kubernetes"


@dataclass(frozen=True)
class GangSchedulingPlan:
    integration: Integration
    group_name: str
    #: Objects to create before the pods (PodGroups; for Kubernetes the Workload, then its
    #: PodGroup), owned by the TrainingJob.
    objects: list[dict[str, Any]] = field(default_factory=list)
    pod_labels: dict[str, str] = field(default_factory=dict)
    pod_annotations: dict[str, str] = field(default_factory=dict)
    scheduler_name: str | None = None
    #: ``spec.schedulingGroup.podGroupName`` of every pod (Kubernetes' gang scheduling).
    pod_group: str | None = None
    #: The node label key of the group's topology constraint (None: no constraint).
    topology_key: str | None = None
    #: Chosen by ``spec.gang.scheduler: auto`` from what the API server serves (not asked for).
    detected: bool = False


def decide_integration(spec: TrainingJobSpec, *, workload_api: bool = False) -> Integration:
    """Which scheduler the job's ``spec.gang`` asks for; ``workload_api``: the API server serves
    ``scheduling.k8s.io/v1alpha2`` Workloads and PodGroups (what ``scheduler: auto`` looks for)."""
    scheduler = spec.gang.scheduler_name or ""
    if scheduler == VOLCANO_SCHEDULER:
        return Integration.VOLCANO
    if scheduler in COSCHEDULING_SCHEDULERS:
        return Integration.COSCHEDULING
    if spec.gang.queue_name:
        return Integration.KUEUE
    if spec.gang.scheduler == "kubernetes" or (
        spec.gang.scheduler == "auto" and workload_api and scheduler in KUBE_SCHEDULERS
    ):
        return Integration.KUBERNETES
    return Integration.DEFAULT


def needs_workload_api(spec: TrainingJobSpec) -> bool:
    """Whether the integration hangs on what the API server serves (``scheduler: auto`` with
    nothing else named): only then is discovery worth a call."""
    return spec.gang.scheduler == "auto" and decide_integration(spec, workload_api=True) is Integration.KUBERNETES


def pod_group_of(pod: Mapping[str, Any]) -> str | None:
    """The PodGroup a pod names (``spec.schedulingGroup.podGroupName``), if any."""
    return ((pod.get("spec") or {}).get("schedulingGroup") or {}).get("podGroupName")


def decide_resumed_workload_api(begun: Sequence[Mapping[str, Any]], group: str) -> bool:
    """For ``scheduler: auto``, resuming an attempt whose creation an operator began: use
    Kubernetes' gang scheduling as that operator did, whatever discovery says now (pods of one
    group created without it would wait for a minCount that never comes; the group's pods
    without their group would be bound one by one). A pod's group is immutable, so its pods say."""
    return any(pod_group_of(p) == group for p in begun)


def decide_topology_key(levels: Sequence[str], nodes: Sequence[Mapping[str, Any]]) -> str | None:
    """The narrowest level (of ``levels``, broadest first) whose label every one of ``nodes``
    carries with one and the same value: the domain the placement put the whole group in, which
    the group's topology constraint names. None when no level holds them all (or a node lacks
    the label: a constraint on it would leave that node's pod unschedulable)."""
    for key in reversed(levels):
        values = {((n.get("metadata") or {}).get("labels") or {}).get(key) for n in nodes}
        if len(values) == 1 and None not in values and "" not in values:
            return key
    return None


def topology_key_for(
    spec: TrainingJobSpec, gang_nodes: Sequence[str], nodes: Mapping[str, Mapping[str, Any]]
) -> str | None:
    """:func:`decide_topology_key` for the job's level keys (``spec.topology``) and the nodes of a
    placement (names; ``nodes`` the cluster's Node objects by name)."""
    levels = resolve_level_keys(spec.topology.preset, spec.topology.levels, list(nodes.values()))
    return decide_topology_key(levels, [nodes.get(n) or {} for n in gang_nodes])


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
    if spec.extended_gpus > 0:
        requests.setdefault("nvidia.com/gpu", str(spec.extended_gpus))
    return {k: _quantity_sum(str(v), gang_size) for k, v in sorted(requests.items())}


def plan_gang_scheduling(
    spec: TrainingJobSpec,
    *,
    job: str,
    namespace: str,
    attempt: int,
    owner: Mapping[str, Any],
    gang_size: int,
    workload_api: bool = False,
    topology_key: str | None = None,
) -> GangSchedulingPlan:
    """Everything the chosen gang scheduler expects for one attempt of ``gang_size`` pods
    (``workload_api`` and ``topology_key``: see :func:`decide_integration` and
    :func:`decide_topology_key`)."""
    if gang_size < 1:
        raise ValueError(f"gang_size={gang_size}: a gang has at least one pod")
    kind = decide_integration(spec, workload_api=workload_api)
    name = group_name(job, attempt)
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": {"railyard.dev/job": job, "railyard.dev/attempt": str(attempt)},
        "ownerReferences": [dict(owner)],
    }
    if kind is Integration.KUEUE:
        # Kueue admits the job through its Workload before any pod exists (logic/kueue.py): the
        # pods carry no Kueue label, so Kueue's pod webhook leaves them alone (record 013)
        return GangSchedulingPlan(kind, name, scheduler_name=spec.gang.scheduler_name)
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
    if kind is Integration.KUBERNETES:
        return GangSchedulingPlan(
            kind, name, objects=build_workload_objects(name, meta, gang_size=gang_size, topology_key=topology_key),
            scheduler_name=spec.gang.scheduler_name, pod_group=name, topology_key=topology_key,
            detected=spec.gang.scheduler == "auto",
        )
    return GangSchedulingPlan(kind, name, scheduler_name=spec.gang.scheduler_name)


def build_workload_objects(
    name: str, meta: Mapping[str, Any], *, gang_size: int, topology_key: str | None
) -> list[dict[str, Any]]:
    """The Workload ``name`` (one gang template) and the PodGroup ``name`` made from it, as the
    recorded v1.36 server takes them (tests/golden: the PodGroup repeats the template's policy
    and constraints next to its ``podGroupTemplateRef``)."""
    group: dict[str, Any] = {"schedulingPolicy": {"gang": {"minCount": gang_size}}}
    if topology_key:
        group["schedulingConstraints"] = {"topology": [{"key": topology_key}]}
    workload = {
        "apiVersion": SCHEDULING_API_VERSION, "kind": "Workload", "metadata": copy.deepcopy(dict(meta)),
        "spec": {"podGroupTemplates": [{"name": GANG_TEMPLATE, **copy.deepcopy(group)}]},
    }
    podgroup = {
        "apiVersion": SCHEDULING_API_VERSION,
        "kind": "PodGroup",
        "metadata": copy.deepcopy(dict(meta)),
        "spec": {
            "podGroupTemplateRef": {"workload": {"workloadName": name, "podGroupTemplateName": GANG_TEMPLATE}},
            **group,
        },
    }
    return [workload, podgroup]


def describe_unavailable(plan: GangSchedulingPlan, status: int, *, retry_s: float) -> str:
    """Why the plan's group objects could not be created (``status`` 404: the kind is not
    served; 403: the operator may not create it) and the fix, for the job's condition."""
    api = plan.objects[0]["apiVersion"]
    kinds = " and ".join(sorted({str(o["kind"]) for o in plan.objects}, reverse=True))
    if plan.integration is Integration.KUBERNETES:
        why = (
            (
                f"the API server does not serve {api} (kube-apiserver v1.36 with --feature-gates=GenericWorkload=true,"
                f"GangScheduling=true and --runtime-config={api}=true)"
            )
            if status == 404
            else (
                f"{api} workloads and podgroups are not granted to the operator (RBAC: create and delete; the chart "
                "grants them)"
            )
        )
        if plan.detected:
            fix = f"this operator no longer uses it: the gang is created without it in {retry_s:g}s"
        else:
            fix = f"enable it, or set spec.gang.scheduler to auto or none (retrying every {retry_s:g}s)"
        return (
                   f"spec.gang.scheduler={'auto' if plan.detected else 'kubernetes'}: creating {kinds} {api} "
                   f"{plan.group_name} failed ({status}): {why}; {fix}"
               )
    why = "is not installed (no PodGroup CRD)" if status == 404 else "is not granted to the operator (RBAC)"
    return (
        f"spec.gang.schedulerName={plan.scheduler_name}: creating PodGroup {api} {plan.group_name} failed ({status}): "
        f"{api} {why}; install that scheduler's CRDs or remove spec.gang.schedulerName (retrying every {retry_s:g}s)"
    )


def apply_to_pods(pods: Sequence[Mapping[str, Any]], plan: GangSchedulingPlan) -> list[dict[str, Any]]:
    """Copies of ``pods`` carrying the plan's labels, annotations and scheduler (idempotent).

    Our own scheduling gate, node affinity and everything else stay as built: the scheduler
    admits and binds the group, our placement still decides which node each rank lands on.

    Only the dicts on the way to what changes are copied (the pod, its metadata and spec; labels
    and annotations are new dicts): the rest is shared with ``pods``, which neither side
    mutates. A deep copy of each pod of a 1,000-pod gang was ~5% of the operator's CPU while the
    gang started (py-spy, issue 46).
    """
    out: list[dict[str, Any]] = []
    for pod in pods:
        p = dict(pod)
        meta = p["metadata"] = dict(p.get("metadata") or {})
        if plan.scheduler_name or plan.pod_group:
            p["spec"] = dict(p.get("spec") or {})
        if plan.pod_labels:
            meta["labels"] = {**(meta.get("labels") or {}), **plan.pod_labels}
        if plan.pod_annotations:
            meta["annotations"] = {**(meta.get("annotations") or {}), **plan.pod_annotations}
        if plan.scheduler_name:
            p["spec"]["schedulerName"] = plan.scheduler_name
        if plan.pod_group:
            p["spec"]["schedulingGroup"] = {"podGroupName": plan.pod_group}
        out.append(p)
    return out
