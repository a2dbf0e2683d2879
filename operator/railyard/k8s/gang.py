"""The API calls of a gang's life: create it whole, lift its gates, delete it, quarantine nodes,
write the job's status and Events. Idempotent: every create tolerates AlreadyExists (names are
deterministic), every delete tolerates NotFound, so a handler that runs twice, or an operator
killed half way and restarted, converges instead of duplicating.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from railyard import GROUP, VERSION
from railyard.api.trainingjob import API_VERSION, KIND, PLURAL
from railyard.k8s.client import STRATEGIC, ApiError, Kube, core_path, custom_path
from railyard.logic.conditions import format_time
from railyard.logic.manifests import (
    COMPUTE_DOMAIN_API_VERSION,
    COMPUTE_DOMAIN_PLURAL,
    CONFIG_FILE,
    RANK_TABLE_FILE,
    RESOURCE_API_VERSION,
    RESOURCE_CLAIM_TEMPLATE_PLURAL,
    build_gate_removal,
    configmap_name,
    disruption_budget_differs,
    secret_name,
)
from railyard.logic.quarantine import (
    JOB_ANNOTATION,
    QUARANTINE_KEY,
    REASON_ANNOTATION,
    RELEASE_ANNOTATION,
    TIME_ANNOTATION,
    build_quarantine_patch,
)
from railyard.logic.schedulers import (
    COSCHEDULING_API_VERSION,
    COSCHEDULING_GROUP,
    PODGROUP_PLURAL,
    SCHEDULING_API_VERSION,
    SCHEDULING_GROUP,
    SCHEDULING_VERSION,
    VOLCANO_API_VERSION,
    VOLCANO_GROUP,
    WORKLOAD_PLURAL,
)
from railyard.protocol.ranktable import RankTable

log = logging.getLogger(__name__)
T = TypeVar("T")

CONCURRENCY = 48


async def _bounded(calls: Iterable[Awaitable[T]], limit: int = CONCURRENCY) -> list[T]:
    sem = asyncio.Semaphore(limit)

    async def one(c: Awaitable[T]) -> T:
        async with sem:
            return await c

    return list(await asyncio.gather(*(one(c) for c in calls)))


# creation -------------------------------------------------------------------------------------


#: The job's objects outside the core group. A ComputeDomain is a CRD of NVIDIA's DRA driver:
#: where it is not installed its create is a 404 (the job waits, reason NotFound).
_GROUPED_KINDS = ("NetworkPolicy", "ResourceClaimTemplate", "ComputeDomain", "PodDisruptionBudget")
_RESOURCE_GROUP, _RESOURCE_VERSION = RESOURCE_API_VERSION.split("/")
_COMPUTE_DOMAIN_GROUP, _COMPUTE_DOMAIN_VERSION = COMPUTE_DOMAIN_API_VERSION.split("/")


async def create_object(kube: Kube, obj: Mapping[str, Any]) -> bool:
    """Create a namespaced core object (or a job's NetworkPolicy, ResourceClaimTemplate or
    ComputeDomain); False when it already existed. Each path is spelled out: the RBAC rules are
    read from these calls (railyard.k8s.rbac)."""
    meta = obj["metadata"]
    kind, namespace = obj["kind"], meta["namespace"]
    if kind == "NetworkPolicy":
        path = custom_path("networking.k8s.io", "v1", "networkpolicies", namespace)
    elif kind == "ResourceClaimTemplate":
        path = custom_path(_RESOURCE_GROUP, _RESOURCE_VERSION, RESOURCE_CLAIM_TEMPLATE_PLURAL, namespace)
    elif kind == "ComputeDomain":
        path = custom_path(_COMPUTE_DOMAIN_GROUP, _COMPUTE_DOMAIN_VERSION, COMPUTE_DOMAIN_PLURAL, namespace)
    else:
        path = core_path(
            {"Pod": "pods", "Service": "services", "ConfigMap": "configmaps", "Secret": "secrets"}[kind], namespace
        )
    # only whether it was created matters: the object echoed back is not decoded
    return await kube.create(path, dict(obj), answer=False) is not None



async def ensure_disruption_budget(kube: Kube, budget: Mapping[str, Any]) -> str:
    """The job's PodDisruptionBudget as ``budget`` says: "created", "kept" (already so), or
    "replaced" (another pod count: a new attempt of another size; deleted and created again,
    as budgets are not updated in place by this operator)."""
    meta = budget["metadata"]
    path = custom_path("policy", "v1", "poddisruptionbudgets", meta["namespace"])
    current = await kube.get(custom_path("policy", "v1", "poddisruptionbudgets", meta["namespace"], meta["name"]))
    if current is None:
        await kube.create(path, dict(budget))
        return "created"
    if not disruption_budget_differs(current, budget):
        return "kept"
    await kube.delete(custom_path("policy", "v1", "poddisruptionbudgets", meta["namespace"], meta["name"]))
    await kube.create(path, dict(budget))
    return "replaced"


async def create_podgroups(kube: Kube, objects: Sequence[Mapping[str, Any]]) -> int:
    """Create a gang scheduler's PodGroups (before the pods; for Kubernetes' own the Workload,
    then its PodGroup, in the order given); returns how many were new. AlreadyExists is fine
    (names are deterministic per attempt); a missing CRD or API raises ApiError 404."""
    created = 0
    for obj in objects:
        api_version = obj["apiVersion"]
        if api_version == SCHEDULING_API_VERSION:
            created += await _create_scheduling_object(kube, obj)
            continue
        group = {VOLCANO_API_VERSION: VOLCANO_GROUP, COSCHEDULING_API_VERSION: COSCHEDULING_GROUP}[api_version]
        version = api_version.split("/", 1)[1]
        path = custom_path(group, version, PODGROUP_PLURAL, obj["metadata"]["namespace"])
        created += await kube.create(path, dict(obj)) is not None
    return created


async def _create_scheduling_object(kube: Kube, obj: Mapping[str, Any]) -> bool:
    plural = {"Workload": WORKLOAD_PLURAL, "PodGroup": PODGROUP_PLURAL}[obj["kind"]]
    path = custom_path(SCHEDULING_GROUP, SCHEDULING_VERSION, plural, obj["metadata"]["namespace"])
    # only whether it was created matters: the object echoed back is not decoded
    return await kube.create(path, dict(obj), answer=False) is not None


async def serves_workload_api(kube: Kube) -> bool:
    """Whether the API server serves ``scheduling.k8s.io/v1alpha2`` Workloads and PodGroups
    (discovery, which every authenticated client may read: no RBAC rule). A 404 or 403 is
    "no"; other errors raise (ask again later)."""
    try:
        got = await kube.request("GET", f"/apis/{SCHEDULING_API_VERSION}")
    except ApiError as exc:
        if exc.status in (403, 404):
            return False
        raise
    served = {str(r.get("name")) for r in got.get("resources") or []}
    return {WORKLOAD_PLURAL, PODGROUP_PLURAL} <= served


async def read_podgroup_condition(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    """The ``PodGroupScheduled`` condition kube-scheduler wrote on Kubernetes' PodGroup ``name``
    (v1.36-workload 027: False/Unschedulable while the gang fits nowhere); None when it wrote
    none yet, the group is gone, or reading it failed (it only adds to what the pods say)."""
    try:
        group = await kube.get(custom_path(SCHEDULING_GROUP, SCHEDULING_VERSION, PODGROUP_PLURAL, namespace, name))
    except ApiError as exc:
        log.warning("reading PodGroup %s/%s: %s", namespace, name, exc)
        return None
    for cond in ((group or {}).get("status") or {}).get("conditions") or ():
        if cond.get("type") == "PodGroupScheduled":
            return dict(cond)
    return None


async def delete_podgroups(kube: Kube, namespace: str, api_version: str, names: Iterable[str]) -> int:
    """Delete earlier attempts' PodGroups (at most a few, one by one; for Kubernetes' own their
    Workloads too: deleting a Workload leaves its PodGroups); NotFound, and a CRD that is gone,
    are fine."""
    if api_version == SCHEDULING_API_VERSION:
        return await _delete_scheduling_objects(kube, namespace, names)
    group = {VOLCANO_API_VERSION: VOLCANO_GROUP, COSCHEDULING_API_VERSION: COSCHEDULING_GROUP}[api_version]
    version = api_version.split("/", 1)[1]
    deleted = 0
    for name in names:
        try:
            deleted += await kube.delete(custom_path(group, version, PODGROUP_PLURAL, namespace, name))
        except ApiError as exc:
            log.warning("deleting PodGroup %s/%s: %s", namespace, name, exc)
    return deleted


async def _delete_scheduling_objects(kube: Kube, namespace: str, names: Iterable[str]) -> int:
    deleted = 0
    for name in names:
        for plural in (PODGROUP_PLURAL, WORKLOAD_PLURAL):
            try:
                deleted += await kube.delete(custom_path(SCHEDULING_GROUP, SCHEDULING_VERSION, plural, namespace, name))
            except ApiError as exc:
                log.warning("deleting %s %s/%s: %s", plural, namespace, name, exc)
    return deleted


async def ensure_secret(kube: Kube, secret: Mapping[str, Any]) -> str:
    """Create the job's heartbeat Secret if missing; return the token it holds."""
    meta = secret["metadata"]
    got = await kube.create(core_path("secrets", meta["namespace"]), dict(secret))
    if got is None:  # it existed already: the token is the one it holds, not ours
        got = await kube.get(core_path("secrets", meta["namespace"], meta["name"]))
    data = (got or secret).get("data") or {}
    return base64.b64decode(data.get("token", "")).decode()


async def read_token(kube: Kube, namespace: str, job: str) -> str | None:
    got = await kube.get(core_path("secrets", namespace, secret_name(job)))
    if got is None:
        return None
    raw = (got.get("data") or {}).get("token")
    return base64.b64decode(raw).decode() if raw else None


def new_token() -> str:
    return secrets.token_urlsafe(32)


async def create_pods(kube: Kube, pods: Sequence[Mapping[str, Any]]) -> int:
    """Create all pods concurrently; returns how many were new. When the API server refuses
    some, every create is still waited for, then the first refusal is raised: no create is in
    flight behind the caller's roll-back."""
    results = await _bounded(_settled(create_object(kube, p)) for p in pods)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        raise errors[0]
    return sum(1 for r in results if r is True)


async def _settled(call: Awaitable[T]) -> T | Exception:
    try:
        return await call
    except Exception as exc:
        return exc


async def lift_gates(kube: Kube, pods: Sequence[Mapping[str, Any]]) -> int:
    """Remove our scheduling gate, and only ours, from every pod that still has it (all at once):
    a strategic-merge delete by the gate's name, applied by the server to the pod as it is now."""
    calls = []
    for p in pods:
        patch = build_gate_removal(p)
        if patch is not None:
            meta = p["metadata"]
            path = core_path("pods", meta["namespace"], meta["name"])
            calls.append(kube.patch(path, patch, content_type=STRATEGIC, answer=False))
    await _bounded(calls)
    return len(calls)


async def get_configmap(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    return await kube.get(core_path("configmaps", namespace, name))


async def read_rank_table(kube: Kube, namespace: str, job: str, attempt: int) -> RankTable | None:
    """The rank table an attempt's ConfigMap holds; None when the ConfigMap is gone or unreadable."""
    cm = await get_configmap(kube, namespace, configmap_name(job, attempt))
    if cm is None:
        return None
    try:
        return RankTable.from_json((cm.get("data") or {}).get(RANK_TABLE_FILE, ""))
    except ValueError:
        return None


async def read_attempt_config(kube: Kube, namespace: str, job: str, attempt: int) -> dict[str, Any] | None:
    """The config.json an attempt's ConfigMap holds (its restore hint); None when gone or unreadable."""
    cm = await get_configmap(kube, namespace, configmap_name(job, attempt))
    if cm is None:
        return None
    try:
        raw = json.loads((cm.get("data") or {}).get(CONFIG_FILE, ""))
    except ValueError:
        return None
    return raw if isinstance(raw, dict) else None


async def delete_configmaps(kube: Kube, namespace: str, names: Iterable[str]) -> None:
    await _bounded(kube.delete(core_path("configmaps", namespace, n)) for n in names)


# deletion -------------------------------------------------------------------------------------


async def delete_pods(kube: Kube, namespace: str, names: Iterable[str], *, grace_seconds: int | None = None) -> int:
    """Delete pods (``grace_seconds=0`` force-deletes, for pods on dead nodes)."""
    results = await _bounded(kube.delete(core_path("pods", namespace, n), grace_seconds=grace_seconds) for n in names)
    return sum(results)


async def delete_owned(kube: Kube, namespace: str, job: str) -> None:
    """Remove everything a job owns (what ownerReference GC would do, for API servers without it)."""
    selector = f"{GROUP}/job={job}"
    for plural in ("pods", "configmaps", "services", "secrets"):
        try:
            items = await kube.list(core_path(plural, namespace), labelSelector=selector)
        except ApiError as exc:
            log.warning("listing %s of %s/%s: %s", plural, namespace, job, exc)
            continue
        await _bounded(
            kube.delete(
                core_path(plural, namespace, i["metadata"]["name"]), grace_seconds=0 if plural == "pods" else None
            )
            for i in items
        )
    for kind in _GROUPED_KINDS:
        if kind == "NetworkPolicy":
            listing = custom_path("networking.k8s.io", "v1", "networkpolicies", namespace)
        elif kind == "ResourceClaimTemplate":
            listing = custom_path(_RESOURCE_GROUP, _RESOURCE_VERSION, RESOURCE_CLAIM_TEMPLATE_PLURAL, namespace)
        elif kind == "PodDisruptionBudget":
            listing = custom_path("policy", "v1", "poddisruptionbudgets", namespace)
        else:
            listing = custom_path(_COMPUTE_DOMAIN_GROUP, _COMPUTE_DOMAIN_VERSION, COMPUTE_DOMAIN_PLURAL, namespace)
        try:
            items = await kube.list(listing, labelSelector=selector)
        except ApiError as exc:  # a ComputeDomain CRD that is not installed: nothing to delete
            if exc.status != 404:
                log.warning("listing %s of %s/%s: %s", kind, namespace, job, exc)
            continue
        await _bounded(_delete_grouped(kube, kind, namespace, i["metadata"]["name"]) for i in items)


async def _delete_grouped(kube: Kube, kind: str, namespace: str, name: str) -> bool:
    if kind == "NetworkPolicy":
        path = custom_path("networking.k8s.io", "v1", "networkpolicies", namespace, name)
    elif kind == "ResourceClaimTemplate":
        path = custom_path(_RESOURCE_GROUP, _RESOURCE_VERSION, RESOURCE_CLAIM_TEMPLATE_PLURAL, namespace, name)
    elif kind == "PodDisruptionBudget":
        path = custom_path("policy", "v1", "poddisruptionbudgets", namespace, name)
    else:
        path = custom_path(_COMPUTE_DOMAIN_GROUP, _COMPUTE_DOMAIN_VERSION, COMPUTE_DOMAIN_PLURAL, namespace, name)
    return await kube.delete(path)


# the job --------------------------------------------------------------------------------------


async def patch_job_status(
    kube: Kube, namespace: str, name: str, status_patch: Mapping[str, Any]
) -> dict[str, Any] | None:
    """One merge patch of ``status``; returns the object (None when the job is gone)."""
    path = custom_path(GROUP, VERSION, PLURAL, namespace, name, "status")
    return await kube.patch(path, {"status": dict(status_patch)})


async def create_event(
    kube: Kube,
    job: Mapping[str, Any],
    *,
    type_: str,
    reason: str,
    message: str,
    now: float | None = None,
) -> None:
    """An Event on the TrainingJob; failures are logged, never raised (events are best effort)."""
    meta = job.get("metadata") or {}
    ns = meta.get("namespace") or "default"
    t = now if now is not None else time.time()
    stamp = format_time(t)
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{meta.get('name')}.{int(t * 1e6):x}{secrets.token_hex(2)}", "namespace": ns},
        "involvedObject": {
            "apiVersion": API_VERSION, "kind": KIND, "name": meta.get("name"),
            "namespace": ns, "uid": meta.get("uid"), "resourceVersion": meta.get("resourceVersion"),
        },
        "reason": reason,
        "message": message[:1024],
        "type": type_,
        "source": {"component": "railyard-operator"},
        "reportingComponent": "railyard.dev/operator",
        "reportingInstance": "railyard-operator",
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
    try:
        await kube.create(core_path("events", ns), event)
    except ApiError as exc:
        log.warning("event %s on %s/%s not recorded: %s", reason, ns, meta.get("name"), exc)


# nodes ----------------------------------------------------------------------------------------


def _without_ours(taints: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [dict(t) for t in taints if t.get("key") != QUARANTINE_KEY]


async def quarantine_node(kube: Kube, node: str, *, reason: str, job: str, now: float) -> bool:
    """Taint, label and annotate ``node`` (one patch, optimistic concurrency, 409 re-read)."""

    def build(obj: dict[str, Any]) -> dict[str, Any]:
        return build_quarantine_patch(obj, reason=reason, job=job, time=format_time(now))

    return await _patch_node(kube, node, build)


async def release_node(kube: Kube, node: str) -> bool:
    """Remove our taint, label and annotations from ``node``."""

    def build(obj: dict[str, Any]) -> dict[str, Any]:
        taints = _without_ours((obj.get("spec") or {}).get("taints") or [])
        return {
            "metadata": {
                "labels": {QUARANTINE_KEY: None},
                "annotations": {
                    REASON_ANNOTATION: None,
                    TIME_ANNOTATION: None,
                    JOB_ANNOTATION: None,
                    RELEASE_ANNOTATION: None,
                },
            },
            "spec": {"taints": taints or None},
        }

    return await _patch_node(kube, node, build)


async def _patch_node(kube: Kube, node: str, build: Callable[[dict[str, Any]], dict[str, Any]]) -> bool:
    """Patch ``node`` with ``build(node object)`` at the resourceVersion read; a 409 re-reads and
    rebuilds (8 tries). False when the node is gone or the conflicts outlast the tries."""
    path = core_path("nodes", None, node)
    for _ in range(8):
        obj = await kube.get(path)
        if obj is None:
            return False
        patch = build(obj)
        patch["metadata"]["resourceVersion"] = obj["metadata"].get("resourceVersion")
        try:
            await kube.patch(path, patch)
            return True
        except ApiError as exc:
            if exc.status != 409:
                raise
    return False


async def patch_job_finalizers(
    kube: Kube, namespace: str, name: str, finalizers: Sequence[str], resource_version: str | None
) -> bool:
    """Set the job's finalizers (optimistic concurrency: False on a 409, retry next cycle)."""
    path = custom_path(GROUP, VERSION, PLURAL, namespace, name)
    meta: dict[str, Any] = {"finalizers": list(finalizers) or None}
    if resource_version:
        meta["resourceVersion"] = resource_version
    try:
        return await kube.patch(path, {"metadata": meta}) is not None
    except ApiError as exc:
        if exc.status == 409:
            return False
        raise
