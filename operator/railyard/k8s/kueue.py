"""The API calls of a job's Kueue Workload (railyard.logic.manifests.kueue builds what they send):
read it, create it, end it, delete it, and resolve the priority class value Kueue reads.
Idempotent as railyard.k8s.gang: AlreadyExists and NotFound are fine."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from railyard.k8s.client import ApiError, Kube, custom_path
from railyard.logic.manifests.kueue import (
    FIELD_MANAGER,
    KUEUE_FLAVOR_PLURAL,
    KUEUE_GROUP,
    KUEUE_PRIORITY_CLASS_PLURAL,
    KUEUE_VERSION,
    KUEUE_WORKLOAD_PLURAL,
)

log = logging.getLogger(__name__)

APPLY = "application/apply-patch+yaml"


async def read_kueue_workload(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    """The Workload as Kueue left it; None when it does not exist."""
    got = await kube.get(custom_path(KUEUE_GROUP, KUEUE_VERSION, KUEUE_WORKLOAD_PLURAL, namespace, name))
    return dict(got) if got is not None else None


async def create_kueue_workload(kube: Kube, workload: Mapping[str, Any]) -> bool:
    """Create the job's Workload; False when it existed already. A 404 (Kueue's CRD is not
    installed) raises for the caller to report."""
    namespace = workload["metadata"]["namespace"]
    return (
        await kube.create(custom_path(KUEUE_GROUP, KUEUE_VERSION, KUEUE_WORKLOAD_PLURAL, namespace), dict(workload))
        is not None
    )


async def finish_kueue_workload(kube: Kube, apply: Mapping[str, Any]) -> bool:
    """Server-side apply of the ``Finished`` condition on ``/status`` (record 031); False when
    the Workload is gone."""
    meta = apply["metadata"]
    path = custom_path(KUEUE_GROUP, KUEUE_VERSION, KUEUE_WORKLOAD_PLURAL, meta["namespace"], meta["name"], "status")
    try:
        await kube.request("PATCH", path, body=dict(apply), params={"fieldManager": FIELD_MANAGER, "force": "true"},
                           content_type=APPLY)
    except ApiError as exc:
        if exc.status == 404:
            return False
        raise
    return True


async def delete_kueue_workload(kube: Kube, namespace: str, name: str) -> bool:
    """Delete the job's Workload (the garbage collector does too, through its ownerReference;
    this frees the quota where none runs); NotFound and a missing CRD are fine."""
    try:
        return await kube.delete(custom_path(KUEUE_GROUP, KUEUE_VERSION, KUEUE_WORKLOAD_PLURAL, namespace, name))
    except ApiError as exc:
        log.warning("deleting Workload %s/%s: %s", namespace, name, exc)
        return False


async def read_priority_value(kube: Kube, name: str, *, workload_class: bool) -> int | None:
    """The value of PriorityClass ``name`` (``workload_class``: of Kueue's WorkloadPriorityClass);
    None when there is no such class."""
    if workload_class:
        got = await kube.get(custom_path(KUEUE_GROUP, KUEUE_VERSION, KUEUE_PRIORITY_CLASS_PLURAL, None, name))
    else:
        got = await kube.get(custom_path("scheduling.k8s.io", "v1", "priorityclasses", None, name))
    if got is None:
        return None
    value = got.get("value")
    return int(value) if isinstance(value, int) else None


async def read_resource_flavor(kube: Kube, name: str) -> dict[str, Any] | None:
    """ResourceFlavor ``name`` (its ``spec.nodeLabels`` and ``tolerations``); None when it is gone."""
    got = await kube.get(custom_path(KUEUE_GROUP, KUEUE_VERSION, KUEUE_FLAVOR_PLURAL, None, name))
    return dict(got) if got is not None else None


async def acknowledge_eviction(kube: Kube, namespace: str, name: str, patch: Mapping[str, Any]) -> bool:
    """The eviction's acknowledgement, a merge patch on ``/status`` conditional on the
    resourceVersion it carries (record 054); False when the Workload is gone or changed since
    it was read (the next cycle reads it again)."""
    path = custom_path(KUEUE_GROUP, KUEUE_VERSION, KUEUE_WORKLOAD_PLURAL, namespace, name, "status")
    try:
        return await kube.patch(path, dict(patch)) is not None
    except ApiError as exc:
        if exc.status == 409:
            return False
        raise
