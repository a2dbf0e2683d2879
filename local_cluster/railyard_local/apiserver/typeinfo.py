"""What field management needs to know about a kind's shape.

Server-side apply merges by type: a struct's fields one by one, a map's keys one by one, a list
either whole (atomic), by value (set) or by key (map), and some structs whole (atomic, like
``ObjectReference``). For custom resources this comes from the CRD's schema
(``x-kubernetes-list-type``, ``x-kubernetes-list-map-keys``, ``x-kubernetes-map-type``; lists
without a list type are atomic). For the built-in kinds it is the ``listType``/``listMapKey``/
``structType`` markers of k8s.io/api for the fields this server's clients use; any other field is
*deduced* as kube-apiserver deduces untyped data: objects field by field, lists atomic.

``zero_object`` is the object a kind's Go struct serialises to when empty: creates are compared
against it, which decides whether a new object field is owned as a whole (``"."``) or only its
children.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import Any

JSON = dict[str, Any]


@dataclass(eq=False)
class TypeNode:
    kind: str
    """struct | map | list | scalar | atomic | deduced."""
    fields: dict[str, TypeNode] = field(default_factory=dict)
    elem: TypeNode | None = None
    list_type: str = "atomic"
    keys: tuple[str, ...] = ()


_DEDUCED = TypeNode("deduced")
_SCALAR = TypeNode("scalar")
_ATOMIC = TypeNode("atomic")


def deduced() -> TypeNode:
    return _DEDUCED


def struct(fields: dict[str, TypeNode] | None = None) -> TypeNode:
    return TypeNode("struct", fields=fields or {})


def mapping(elem: TypeNode | None = None) -> TypeNode:
    return TypeNode("map", elem=elem or _SCALAR)


def keyed(*keys: str, elem: TypeNode | None = None) -> TypeNode:
    return TypeNode("list", elem=elem or struct(), list_type="map", keys=keys)


def set_list() -> TypeNode:
    return TypeNode("list", elem=_SCALAR, list_type="set")


OBJECT_META = struct({
    "labels": mapping(), "annotations": mapping(), "finalizers": set_list(),
    "ownerReferences": keyed("uid", elem=_ATOMIC), "managedFields": _ATOMIC,
})


# ---- custom resources ---------------------------------------------------------------------------


def from_schema(s: Any, root: bool = False) -> TypeNode:
    """The type of a structural schema node."""
    if not isinstance(s, dict):
        return _DEDUCED
    if s.get("x-kubernetes-int-or-string"):
        return _SCALAR
    t = s.get("type")
    if t == "array":
        lt = s.get("x-kubernetes-list-type") or "atomic"
        if lt == "atomic":
            return _ATOMIC
        elem = from_schema(s.get("items"), bool((s.get("items") or {}).get("x-kubernetes-embedded-resource")))
        if lt == "set":
            return TypeNode("list", elem=_SCALAR, list_type="set")
        return TypeNode("list", elem=elem, list_type="map", keys=tuple(s.get("x-kubernetes-list-map-keys") or ()))
    if t == "object" or root:
        if s.get("x-kubernetes-map-type") == "atomic":
            return _ATOMIC
        addl = s.get("additionalProperties")
        if isinstance(addl, dict):
            return mapping(from_schema(addl, bool(addl.get("x-kubernetes-embedded-resource"))))
        props = s.get("properties") or {}
        fields = {k: from_schema(v, bool(isinstance(v, dict) and v.get("x-kubernetes-embedded-resource")))
                  for k, v in props.items()}
        node = struct(fields)
        if root or s.get("x-kubernetes-embedded-resource"):
            node.fields.setdefault("metadata", OBJECT_META)
            if node.fields["metadata"].kind == "struct" and not node.fields["metadata"].fields:
                node.fields["metadata"] = OBJECT_META
        if s.get("x-kubernetes-preserve-unknown-fields"):
            node.elem = _DEDUCED
        return node
    if t in ("string", "integer", "number", "boolean"):
        return _SCALAR
    return _DEDUCED


# ---- built-in kinds ------------------------------------------------------------------------------


def _container() -> TypeNode:
    return struct(
        {
            "ports": keyed("containerPort", "protocol"),
            "env": keyed("name"),
            "volumeMounts": keyed("mountPath"),
            "volumeDevices": keyed("devicePath"),
            "command": _ATOMIC,
            "args": _ATOMIC,
            "envFrom": _ATOMIC,
            "resizePolicy": _ATOMIC,
            "resources": struct({"limits": mapping(), "requests": mapping(), "claims": keyed("name")}),
        }
    )


def _pod_spec() -> TypeNode:
    c = _container()
    return struct({
        "containers": keyed("name", elem=c), "initContainers": keyed("name", elem=c),
        "ephemeralContainers": keyed("name", elem=c), "volumes": keyed("name"), "tolerations": _ATOMIC,
        "schedulingGates": keyed("name"), "imagePullSecrets": keyed("name"), "hostAliases": keyed("ip"),
        "topologySpreadConstraints": keyed("topologyKey", "whenUnsatisfiable"), "readinessGates": _ATOMIC,
        "resourceClaims": keyed("name"), "nodeSelector": _ATOMIC, "overhead": mapping(),
    })


def _pod_template() -> TypeNode:
    return struct({"metadata": OBJECT_META, "spec": _pod_spec()})


def _conditions() -> TypeNode:
    return keyed("type")


def _kind_types() -> dict[str, TypeNode]:
    pod = struct({"metadata": OBJECT_META, "spec": _pod_spec(), "status": struct({
        "conditions": _conditions(), "containerStatuses": _ATOMIC, "initContainerStatuses": _ATOMIC,
        "ephemeralContainerStatuses": _ATOMIC, "podIPs": keyed("ip"), "hostIPs": keyed("ip"),
        "resourceClaimStatuses": keyed("name")})})
    workload = struct({"metadata": OBJECT_META, "spec": struct({"template": _pod_template(),
                                                                "selector": struct({"matchLabels": mapping()})}),
                       "status": struct({"conditions": _conditions()})})
    reference = _ATOMIC
    gang = {"schedulingPolicy": struct({"basic": struct(), "gang": struct()}),
            "schedulingConstraints": struct({"topology": _ATOMIC})}
    return {
        "workloads.scheduling.k8s.io": struct({"metadata": OBJECT_META, "spec": struct({
            "podGroupTemplates": keyed("name", elem=struct(gang))})}),
        "podgroups.scheduling.k8s.io": struct({"metadata": OBJECT_META, "spec": struct({
            **gang, "podGroupTemplateRef": struct({"workload": struct()})}),
            "status": struct({"conditions": _conditions()})}),
        "pods": pod,
        "nodes": struct({"metadata": OBJECT_META, "spec": struct({"taints": _ATOMIC, "podCIDRs": set_list()}),
                         "status": struct({"conditions": _conditions(), "addresses": keyed("type"),
                                           "capacity": mapping(), "allocatable": mapping(), "images": _ATOMIC})}),
        "namespaces": struct({"metadata": OBJECT_META, "spec": struct({"finalizers": _ATOMIC}),
                              "status": struct({"conditions": _conditions()})}),
        "services": struct({"metadata": OBJECT_META, "spec": struct({
            "ports": keyed("port", "protocol"), "selector": mapping(), "clusterIPs": _ATOMIC,
            "ipFamilies": _ATOMIC, "externalIPs": _ATOMIC})}),
        "configmaps": struct({"metadata": OBJECT_META, "data": mapping(), "binaryData": mapping()}),
        "secrets": struct({"metadata": OBJECT_META, "data": mapping(), "stringData": mapping()}),
        "serviceaccounts": struct({"metadata": OBJECT_META, "secrets": keyed("name"),
                                   "imagePullSecrets": _ATOMIC}),
        "events": struct({"metadata": OBJECT_META, "involvedObject": reference, "related": reference,
                          "regarding": reference, "series": struct()}),
        "leases.coordination.k8s.io": struct({"metadata": OBJECT_META}),
        "customresourcedefinitions.apiextensions.k8s.io": struct({"metadata": OBJECT_META, "spec": struct({
            "versions": _ATOMIC, "names": struct({"shortNames": _ATOMIC, "categories": _ATOMIC})}),
            "status": struct({"conditions": _conditions(), "storedVersions": _ATOMIC})}),
        "deployments.apps": workload, "statefulsets.apps": workload, "daemonsets.apps": workload,
        "jobs.batch": workload,
        "poddisruptionbudgets.policy": struct({"metadata": OBJECT_META, "spec": struct({"selector": _ATOMIC}),
                                               "status": struct({"conditions": _conditions(),
                                                                 "disruptedPods": mapping()})}),
        "resourceclaims.resource.k8s.io": struct({"metadata": OBJECT_META, "spec": struct({
            "devices": struct({"requests": _ATOMIC, "constraints": _ATOMIC, "config": _ATOMIC})}),
            "status": struct({"allocation": struct({"devices": struct({"results": _ATOMIC, "config": _ATOMIC}),
                                                    "nodeSelector": _ATOMIC}),
                              "reservedFor": keyed("uid"), "devices": keyed("driver", "device", "pool")})}),
        "roles.rbac.authorization.k8s.io": struct({"metadata": OBJECT_META, "rules": _ATOMIC}),
        "clusterroles.rbac.authorization.k8s.io": struct({"metadata": OBJECT_META, "rules": _ATOMIC}),
        "rolebindings.rbac.authorization.k8s.io": struct({"metadata": OBJECT_META, "subjects": _ATOMIC,
                                                          "roleRef": _ATOMIC}),
        "clusterrolebindings.rbac.authorization.k8s.io": struct({"metadata": OBJECT_META, "subjects": _ATOMIC,
                                                                 "roleRef": _ATOMIC}),
    }


_KINDS = _kind_types()
_GENERIC = struct({"metadata": OBJECT_META})


def builtin(rkey: str) -> TypeNode:
    return _KINDS.get(rkey, _GENERIC)


@cache
def _zero_objects() -> dict[str, JSON]:
    meta = {"creationTimestamp": None}
    return {
        "pods": {"metadata": meta, "spec": {"containers": None}, "status": {}},
        "nodes": {
            "metadata": meta,
            "spec": {},
            "status": {"daemonEndpoints": {"kubeletEndpoint": {"Port": 0}}, "nodeInfo": {}},
        },
        "namespaces": {"metadata": meta, "spec": {}, "status": {}},
        "services": {"metadata": meta, "spec": {}, "status": {"loadBalancer": {}}},
        "configmaps": {"metadata": meta},
        "secrets": {"metadata": meta},
        "serviceaccounts": {"metadata": meta},
        "events": {
            "metadata": meta,
            "involvedObject": {},
            "reason": "",
            "message": "",
            "source": {},
            "firstTimestamp": None,
            "lastTimestamp": None,
            "eventTime": None,
            "reportingComponent": "",
            "reportingInstance": "",
        },
        "events.k8s.io": {
            "metadata": meta,
            "eventTime": None,
            "regarding": {},
            "deprecatedSource": {},
            "deprecatedFirstTimestamp": None,
            "deprecatedLastTimestamp": None,
        },
        "leases.coordination.k8s.io": {"metadata": meta, "spec": {}},
        "customresourcedefinitions.apiextensions.k8s.io": {
            "metadata": meta,
            "spec": {"group": "", "names": {"plural": "", "kind": ""}, "scope": "", "versions": None},
            "status": {"conditions": None, "acceptedNames": {"plural": "", "kind": ""}, "storedVersions": None},
        },
        "deployments.apps": {
            "metadata": meta,
            "spec": {"selector": None, "template": {"metadata": meta, "spec": {"containers": None}}, "strategy": {}},
            "status": {},
        },
        "statefulsets.apps": {
            "metadata": meta,
            "spec": {
                "selector": None,
                "template": {"metadata": meta, "spec": {"containers": None}},
                "serviceName": "",
                "updateStrategy": {},
            },
            "status": {"replicas": 0, "availableReplicas": 0},
        },
        "daemonsets.apps": {
            "metadata": meta,
            "spec": {
                "selector": None,
                "template": {"metadata": meta, "spec": {"containers": None}},
                "updateStrategy": {},
            },
            "status": {
                "currentNumberScheduled": 0,
                "numberMisscheduled": 0,
                "desiredNumberScheduled": 0,
                "numberReady": 0,
            },
        },
        "jobs.batch": {
            "metadata": meta,
            "spec": {"template": {"metadata": meta, "spec": {"containers": None}}},
            "status": {},
        },
        "poddisruptionbudgets.policy": {
            "metadata": meta,
            "spec": {},
            "status": {"disruptionsAllowed": 0, "currentHealthy": 0, "desiredHealthy": 0, "expectedPods": 0},
        },
        "workloads.scheduling.k8s.io": {"metadata": meta, "spec": {"podGroupTemplates": None}},
        "podgroups.scheduling.k8s.io": {
            "metadata": meta,
            "spec": {"schedulingPolicy": {}, "podGroupTemplateRef": None, "disruptionMode": ""},
            "status": {},
        },
        "deviceclasses.resource.k8s.io": {"metadata": meta, "spec": {}},
        "resourceslices.resource.k8s.io": {
            "metadata": meta,
            "spec": {"driver": "", "pool": {"name": "", "generation": 0, "resourceSliceCount": 0}},
        },
        "resourceclaimtemplates.resource.k8s.io": {
            "metadata": meta,
            "spec": {"metadata": meta, "spec": {"devices": {}}},
        },
        "resourceclaims.resource.k8s.io": {"metadata": meta, "spec": {"devices": {}}, "status": {}},
        "roles.rbac.authorization.k8s.io": {"metadata": meta, "rules": None},
        "clusterroles.rbac.authorization.k8s.io": {"metadata": meta, "rules": None},
        "rolebindings.rbac.authorization.k8s.io": {
            "metadata": meta,
            "roleRef": {"apiGroup": "", "kind": "", "name": ""},
        },
        "clusterrolebindings.rbac.authorization.k8s.io": {
            "metadata": meta,
            "roleRef": {"apiGroup": "", "kind": "", "name": ""},
        },
    }


def zero_object(rkey: str, group: str = "") -> JSON:
    """The kind's empty serialised form (custom resources: ``{}``). Shared: do not mutate."""
    key = "events.k8s.io" if group == "events.k8s.io" else rkey
    return _zero_objects().get(key, _EMPTY)


_EMPTY: JSON = {}
