"""Why a gang that was created is still not running, as the cluster says it, and which nodes the
scheduler keeps refusing.

The operator places a gang on nodes it believes free and pins each pod there; the scheduler
(kube-scheduler, with or without Kubernetes' gang scheduling, or another one) has the last word.
When it disagrees the pods stay Pending and, without this, the job said "created and released
together" until ``spec.gang.scheduleTimeoutSeconds`` ran out, and then placed the gang on the
same nodes again. Two readings of the gang's pods make that visible:

* :func:`decide_pending_reason`: the reason to show while the job is Starting. What the
  scheduler writes on a pod it cannot place (recorded from kube-scheduler v1.36,
  ../shared/kube-golden/v1.36-workload 028 and v1.36-dra 021) is the ``PodScheduled`` condition
  ``status: "False"``, ``reason: Unschedulable`` and a message ("0/6 nodes are available: 1
  Insufficient nvidia.com/gpu, ...", or with gang scheduling "pod group is unschedulable,
  waiting for minCount pods ..."); a Kubernetes PodGroup carries ``PodGroupScheduled=False``,
  reason Unschedulable (v1.36-workload 027). A pod whose DRA claim kube-controller-manager
  could not create has no condition at all (the scheduler does not look at it before its claims
  exist; v1.36-dra 036-037: only a FailedResourceClaimCreation Event): that is read from the
  pod's ``spec.resourceClaims`` against its ``status.resourceClaimStatuses``. The channel claim
  of a ComputeDomain comes from a template only NVIDIA's DRA driver creates, so a missing
  channel claim names the driver to install.
* :func:`decide_refused_nodes`: the nodes on which a pod of ours was refused for lack of GPUs
  that the operator's own count says are free, held for :data:`REFUSED_NODE_HOLD_S`, so that the
  next placement leaves them out. GPUs held by pods the operator cannot see (another
  namespace's, when it watches only some namespaces; DRA devices other workloads claimed) show
  up this way.

Pure: the pods are the compact copies of the operator's index (handlers/kopf_handlers.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from railyard.logic.conditions import parse_time
from railyard.logic.gang import pod_name_of
from railyard.logic.manifests import CHANNEL_CLAIM, NODE_ANNOTATION
from railyard.logic.topology import pod_gpus

#: How long after its creation a pod may wait for kube-controller-manager to create its DRA
#: claims (it does so within ~0.1 s when it can, v1.36-dra 014) before the job says why not.
CLAIM_GRACE_S = 15.0
#: How long a node the scheduler refused our pod for lack of GPUs stays out of the placement
#: (from the last time a pod was seen refused there).
REFUSED_NODE_HOLD_S = 600.0
#: What the scheduler's message says when a node lacks the GPUs asked for: the device plugin's
#: extended resource, or DRA devices (v1.36-dra 021).
GPU_SHORTAGE = ("Insufficient nvidia.com/gpu", "cannot allocate all claims")
#: Condition reasons of a Starting job that say why its gang waits (any other is the usual one).
PENDING_REASONS = frozenset({"Unschedulable", "ComputeDomainDriverMissing", "ResourceClaimNotCreated"})
#: The NVIDIA DRA driver (ComputeDomains and their IMEX channels).
DRA_DRIVER = "the NVIDIA DRA driver for GPUs (https://github.com/NVIDIA/k8s-dra-driver-gpu) with ComputeDomains enabled"


@dataclass(frozen=True, slots=True)
class PendingReason:
    """What keeps a created gang from running: ``reason`` for the condition, ``message`` for people."""

    reason: str
    message: str



def _planned_node(pod: Mapping[str, Any]) -> str:
    return str(((pod.get("metadata") or {}).get("annotations") or {}).get(NODE_ANNOTATION) or "")


def _waiting(pods: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The pods the scheduler has not bound yet (and nobody is deleting)."""
    return [
        p
        for p in pods
        if not (p.get("spec") or {}).get("nodeName")
        and not (p.get("metadata") or {}).get("deletionTimestamp")
        and (p.get("status") or {}).get("phase", "Pending") == "Pending"
    ]


def unschedulable_message(pod: Mapping[str, Any]) -> str | None:
    """The scheduler's message when ``pod``'s PodScheduled condition is False/Unschedulable."""
    for cond in (pod.get("status") or {}).get("conditions") or ():
        if (cond.get("type"), cond.get("status"), cond.get("reason")) == ("PodScheduled", "False", "Unschedulable"):
            return str(cond.get("message") or "no message")
    return None


def _missing_claims(pod: Mapping[str, Any], now: float, grace_s: float) -> list[tuple[str, str]]:
    """(claim name, template) of ``pod``'s template claims not created ``grace_s`` after the pod."""
    claims = (pod.get("spec") or {}).get("resourceClaims")
    if not claims:  # the common case, and a cheap one: no DRA
        return []
    created = parse_time((pod.get("metadata") or {}).get("creationTimestamp"))
    if created is None or now - created < grace_s:
        return []
    status = pod.get("status") or {}
    made = {str(s.get("name")) for s in status.get("resourceClaimStatuses") or () if s.get("resourceClaimName")}
    return [
        (str(c.get("name")), str(c["resourceClaimTemplateName"]))
        for c in claims
        if c.get("resourceClaimTemplateName") and str(c.get("name")) not in made
    ]


def _claims_reason(waiting: Sequence[Mapping[str, Any]], now: float, grace_s: float) -> PendingReason | None:
    for pod in waiting:
        missing = _missing_claims(pod, now, grace_s)
        if not missing:
            continue
        more = sum(1 for p in waiting if _missing_claims(p, now, grace_s)) - 1
        others = f" (and {more} more pods)" if more else ""
        claim, template = missing[0]
        if claim == CHANNEL_CLAIM:
            return PendingReason("ComputeDomainDriverMissing", (
                "the NVIDIA DRA driver's ComputeDomain controller is not running: nobody created "
                f"ResourceClaimTemplate {template} (the IMEX channel of spec.gpuClaim.computeDomain), so "
                f"kube-controller-manager cannot create claim {claim!r} of pod {pod_name_of(pod)}{others} "
                f"(FailedResourceClaimCreation) and the pods stay Pending; install {DRA_DRIVER}, "
                "or remove spec.gpuClaim.computeDomain"))
        return PendingReason("ResourceClaimNotCreated", (
            f"claim {claim!r} of pod {pod_name_of(pod)}{others} (from ResourceClaimTemplate {template}) was not "
            f"created {grace_s:g}s after the pod: kube-controller-manager's resourceclaim controller has not "
            "made it (see the pod's FailedResourceClaimCreation Events; is kube-controller-manager running with DRA?)"))
    return None


def _most_telling(messages: Sequence[tuple[Mapping[str, Any], str]]) -> tuple[Mapping[str, Any], str]:
    """The message that names nodes ("0/6 nodes are available: ...") over a gang's "waiting
    for minCount pods", which every pod of a waiting gang carries."""
    return next((m for m in messages if "nodes are available" in m[1]), messages[0])


def decide_pending_reason(
    pods: Sequence[Mapping[str, Any]],
    *,
    now: float,
    group_condition: Mapping[str, Any] | None = None,
    group: str = "",
    claim_grace_s: float = CLAIM_GRACE_S,
) -> PendingReason | None:
    """Why the gang ``pods`` (one attempt's, some unbound) is not running, as the cluster says
    it; None when nothing says (the pods are only slow, or bound and starting).
    ``group_condition``: the ``PodGroupScheduled`` condition of the gang's Kubernetes PodGroup
    ``group``, where one is used and was read."""
    waiting = _waiting(pods)
    if not waiting:
        return None
    claims = _claims_reason(waiting, now, claim_grace_s)
    if claims is not None:
        return claims
    refused = [(p, m) for p in waiting if (m := unschedulable_message(p)) is not None]
    group_says = ""
    if group_condition is not None and group_condition.get("status") == "False":
        reason = group_condition.get("reason") or "Unschedulable"
        group_says = f"PodGroup {group or '?'} {reason}: {group_condition.get('message') or ''}"
    if not refused and not group_says:
        return None
    parts = []
    if refused:
        pod, message = _most_telling(refused)
        node = _planned_node(pod)
        where = f"pod {pod_name_of(pod)}" + (f", pinned to node {node}" if node else "")
        parts.append(f"the scheduler left {len(refused)}/{len(pods)} pods unscheduled: {message.rstrip('.')} ({where})")
    if group_says:
        parts.append(group_says.rstrip(". "))
    return PendingReason("Unschedulable", "; ".join(parts))


def find_gpu_shortages(pods: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Planned node -> GPUs asked for, of every unbound pod the scheduler reports Unschedulable
    for lack of GPUs (:data:`GPU_SHORTAGE`). Our pods are pinned to one node each, so a GPU
    shortage in their message is that node's."""
    out: dict[str, int] = {}
    for pod in _waiting(pods):
        message = unschedulable_message(pod)
        node = _planned_node(pod)
        if node and message is not None and any(s in message for s in GPU_SHORTAGE):
            out[node] = max(out.get(node, 0), pod_gpus(pod))
    return out


def decide_refused_nodes(
    shortages: Mapping[str, int],
    *,
    now: float,
    held: Mapping[str, float],
    seen_free: Mapping[str, int],
    hold_s: float = REFUSED_NODE_HOLD_S,
) -> dict[str, float]:
    """The nodes to leave out of the next placement, each with the time until which it is left
    out: those of ``held`` whose time has not passed, and each node of ``shortages``
    (:func:`find_gpu_shortages`) whose refusal the operator's own count does not explain, held
    ``hold_s`` from ``now``: its free GPUs as the operator sees them (``seen_free``: the node's
    GPUs less those of every bound pod it sees, this job's too) cover what the pod asks for, so
    pods it cannot see hold them. A refusal it can explain (the job's own pod of an earlier
    attempt still terminating there, a pod bound after the placement) is left to that count: the
    node is free again once the pod is gone."""
    out = {node: until for node, until in held.items() if until > now}
    for node, need in shortages.items():
        if seen_free.get(node, 0) >= need:
            out[node] = now + hold_s
    return out
