"""Discovery documents: the legacy ``APIGroupList``/``APIResourceList`` and the aggregated
``apidiscovery.k8s.io/v2`` ``APIGroupDiscoveryList`` that kubectl (1.30+) asks for first.

Groups come in kube-apiserver's order (built-in groups by their priority, then custom resource
groups by name); resources of a version by name.
"""

from __future__ import annotations

from typing import Any

from .registry import Registry, ResourceType

JSON = dict[str, Any]

AGGREGATED_CT = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"

#: kube-apiserver's order of the built-in groups (their APIService priorities).
_GROUP_ORDER = [
    "apiregistration.k8s.io", "apps", "events.k8s.io", "authentication.k8s.io", "authorization.k8s.io", "autoscaling",
    "batch", "certificates.k8s.io", "networking.k8s.io", "policy", "rbac.authorization.k8s.io", "storage.k8s.io",
    "admissionregistration.k8s.io", "apiextensions.k8s.io", "scheduling.k8s.io", "coordination.k8s.io",
    "node.k8s.io", "discovery.k8s.io", "resource.k8s.io", "flowcontrol.apiserver.k8s.io",
]
_CUSTOM_VERBS = ["delete", "deletecollection", "get", "list", "patch", "create", "update", "watch"]
_SUB_VERBS = {"status": ["get", "patch", "update"], "binding": ["create"], "eviction": ["create"], "log": ["get"],
              "finalize": ["update"], "scale": ["get", "patch", "update"]}


def wants_aggregated(accept: str) -> bool:
    return "as=APIGroupDiscoveryList" in accept and "apidiscovery.k8s.io" in accept


def ordered_groups(registry: Registry) -> list[tuple[str, list[str]]]:
    groups = registry.groups()
    known = [g for g in _GROUP_ORDER if g in groups]
    custom = sorted(g for g in groups if g not in _GROUP_ORDER)
    return [(g, groups[g]) for g in known + custom]


def group_entry(group: str, versions: list[str]) -> JSON:
    vs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"name": group, "versions": vs, "preferredVersion": vs[0]}


def group_list(registry: Registry) -> JSON:
    return {"kind": "APIGroupList", "apiVersion": "v1",
            "groups": [group_entry(g, vs) for g, vs in ordered_groups(registry)]}


def storage_version_hash(rt: ResourceType) -> str:
    """apiserver's discovery.StorageVersionHash: the first 8 bytes of sha256("group/version/kind")
    of the version the kind is stored in, base64."""
    import base64
    import hashlib

    group, kind = rt.group, rt.kind
    if rt.storage_key == "events":  # events.k8s.io events are stored as core/v1 Events
        group = ""
    gvk = f"{group}/{rt.storage_version}/{kind}"
    return base64.b64encode(hashlib.sha256(gvk.encode()).digest()[:8]).decode()


def resource_list(registry: Registry, group: str, version: str) -> JSON:
    resources: list[JSON] = []
    for rt in sorted(registry.all(), key=lambda t: t.plural):
        if rt.group != group or version not in rt.versions:
            continue
        entry: JSON = {"name": rt.plural, "singularName": rt.singular, "namespaced": rt.namespaced,
                       "kind": rt.kind, "verbs": rt.verbs}
        if rt.short_names:
            entry["shortNames"] = rt.short_names
        if rt.categories:
            entry["categories"] = rt.categories
        if "get" in rt.verbs or "list" in rt.verbs:  # stored kinds (not the create-only reviews)
            entry["storageVersionHash"] = storage_version_hash(rt)
        resources.append(entry)
        for sub in sorted(rt.subresources):
            sub_kind = {"binding": "Binding", "eviction": "Eviction", "log": "Pod"}.get(sub, rt.kind)
            sub_entry: JSON = {"name": f"{rt.plural}/{sub}", "singularName": "", "namespaced": rt.namespaced,
                               "kind": sub_kind, "verbs": _SUB_VERBS[sub]}
            if sub == "eviction":
                sub_entry.update(group="policy", version="v1")
            resources.append(sub_entry)
    gv = version if not group else f"{group}/{version}"
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}


def _response_kind(rt: ResourceType, version: str, kind: str | None = None, group: str | None = None) -> JSON:
    if rt.is_custom:
        return {"group": rt.group, "kind": kind or rt.kind, "version": version}
    if group is not None:
        return {"group": group, "kind": kind or rt.kind, "version": "v1"}
    return {"group": "", "kind": kind or rt.kind, "version": ""}


def _aggregated_resource(rt: ResourceType, version: str) -> JSON:
    out: JSON = {"resource": rt.plural, "responseKind": _response_kind(rt, version),
                 "scope": "Namespaced" if rt.namespaced else "Cluster", "singularResource": rt.singular,
                 "verbs": _CUSTOM_VERBS if rt.is_custom and rt.verbs == sorted(_CUSTOM_VERBS) else rt.verbs}
    if rt.short_names:
        out["shortNames"] = rt.short_names
    if rt.categories:
        out["categories"] = rt.categories
    subs = []
    for sub in sorted(rt.subresources):
        if sub == "eviction":
            kind = _response_kind(rt, version, "Eviction", "policy")
        elif sub == "binding":
            kind = _response_kind(rt, version, "Binding")
        else:
            kind = _response_kind(rt, version)
        subs.append({"responseKind": kind, "subresource": sub, "verbs": _SUB_VERBS[sub]})
    if subs:
        out["subresources"] = subs
    return out


def aggregated(registry: Registry, core: bool) -> JSON:
    """``/api`` (core) or ``/apis`` as an APIGroupDiscoveryList."""
    items: list[JSON] = []
    groups = [("", ["v1"])] if core else ordered_groups(registry)
    for group, versions in groups:
        vs = []
        for v in versions:
            res = [_aggregated_resource(rt, v) for rt in sorted(registry.all(), key=lambda t: t.plural)
                   if rt.group == group and v in rt.versions]
            vs.append({"freshness": "Current", "resources": res, "version": v})
        items.append({"metadata": {"name": group} if group else {}, "versions": vs})
    return {"apiVersion": "apidiscovery.k8s.io/v2", "items": items, "kind": "APIGroupDiscoveryList", "metadata": {}}
