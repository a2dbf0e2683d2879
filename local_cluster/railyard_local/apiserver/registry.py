"""The resource types the server knows: built-in kinds and those registered by CRDs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .schema import Schema
    from .typeinfo import TypeNode

JSON = dict[str, Any]

CRD_KEY = "customresourcedefinitions.apiextensions.k8s.io"
LEASE_KEY = "leases.coordination.k8s.io"
_META_FIELDS = frozenset({"metadata.name", "metadata.namespace"})


@dataclass
class ResourceType:
    group: str
    versions: list[str]
    """Served versions, preferred (and storage) first for built-ins."""
    storage_version: str
    plural: str
    singular: str
    kind: str
    namespaced: bool
    short_names: list[str] = field(default_factory=list)
    categories: list[str] = field(default_factory=list)
    subresources: frozenset[str] = frozenset()
    field_selectors: frozenset[str] | None = _META_FIELDS
    verbs: list[str] = field(
        default_factory=lambda: ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
    )
    crd: JSON | None = None
    schemas: dict[str, Schema] = field(default_factory=dict)
    printer_columns: dict[str, list[JSON]] = field(default_factory=dict)
    storage_key: str | None = None
    """Store under another resource's key (events.k8s.io events share core events)."""
    types: dict[str, TypeNode] = field(default_factory=dict)
    """Server-side apply's view of each version's schema (custom resources), built on first use."""
    resets_status: bool = True
    """A write to the main resource leaves no field-manager ownership of status behind. v1alpha2
    PodGroups declare no reset fields upstream: the user's ignored status is still recorded in
    managedFields (tests/golden 013)."""
    return_deleted_object: bool = True
    """A deletion that removes the object at once answers with the object (pods, most kinds
    here) or, when False, with a ``Status`` of Success (upstream stores without
    ReturnDeletedObject)."""
    field_label_conversion: bool = False
    """The kind converts its own field labels (an unknown one: ``field label not supported: x``);
    otherwise only metadata.name/namespace and the generic message, as upstream."""

    @property
    def key(self) -> str:
        if self.storage_key:
            return self.storage_key
        return self.plural if not self.group else f"{self.plural}.{self.group}"

    @property
    def status_subresource(self) -> bool:
        return "status" in self.subresources

    def api_version(self, version: str | None = None) -> str:
        v = version or self.storage_version
        return v if not self.group else f"{self.group}/{v}"

    @property
    def is_custom(self) -> bool:
        return self.crd is not None


def _builtin(group: str, version: str, plural: str, kind: str, namespaced: bool, short: list[str] | None = None,
             subresources: tuple[str, ...] = (), fields: tuple[str, ...] = (), storage_key: str | None = None,
             verbs: list[str] | None = None) -> ResourceType:
    rt = ResourceType(
        group=group, versions=[version], storage_version=version, plural=plural, singular=kind.lower(),
        kind=kind, namespaced=namespaced, short_names=short or [], subresources=frozenset(subresources),
        field_selectors=_META_FIELDS | frozenset(fields), storage_key=storage_key, field_label_conversion=bool(fields),
    )
    if verbs is not None:
        rt.verbs = verbs
    return rt


def builtin_types(*, workload_api: bool = True) -> list[ResourceType]:
    """``workload_api``: serve scheduling.k8s.io/v1alpha2 (as kube-apiserver v1.36 with the
    GenericWorkload and GangScheduling gates and that runtime-config); off, as one without."""
    types = [
        _builtin("", "v1", "namespaces", "Namespace", False, ["ns"], ("status", "finalize"), ("status.phase",)),
        _builtin("", "v1", "nodes", "Node", False, ["no"], ("status",), ("spec.unschedulable",)),
        _builtin("", "v1", "pods", "Pod", True, ["po"], ("status", "binding", "eviction", "log"),
                 ("spec.nodeName", "status.phase", "spec.restartPolicy", "spec.schedulerName",
                  "spec.serviceAccountName", "spec.hostNetwork", "status.podIP", "status.podIPs",
                  "status.nominatedNodeName")),
        _builtin("", "v1", "services", "Service", True, ["svc"], ("status",)),
        _builtin("", "v1", "configmaps", "ConfigMap", True, ["cm"]),
        _builtin("", "v1", "secrets", "Secret", True, [], (), ("type",)),
        _builtin("", "v1", "serviceaccounts", "ServiceAccount", True, ["sa"]),
        _builtin("", "v1", "events", "Event", True, ["ev"], (),
                 ("involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
                  "involvedObject.uid", "involvedObject.apiVersion", "involvedObject.resourceVersion",
                  "involvedObject.fieldPath", "reason", "reportingComponent", "source", "type")),
        _builtin("events.k8s.io", "v1", "events", "Event", True, ["ev"], (),
                 ("regarding.kind", "regarding.namespace", "regarding.name", "regarding.uid",
                  "reason", "type", "reportingController"), storage_key="events"),
        _builtin("coordination.k8s.io", "v1", "leases", "Lease", True),
        _builtin("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False,
                 ["crd", "crds"], ("status",)),
    ]
    for plural, kind in (("selfsubjectaccessreviews", "SelfSubjectAccessReview"),
                         ("selfsubjectrulesreviews", "SelfSubjectRulesReview")):
        types.append(_builtin("authorization.k8s.io", "v1", plural, kind, False, verbs=["create"]))
    # Stored and served, but no controller acts on them (as in envtest): enough for Helm charts
    # and manifests that ship a Deployment, RBAC, a PodDisruptionBudget or a NetworkPolicy.
    types += [
        _builtin("apps", "v1", "deployments", "Deployment", True, ["deploy"], ("status",)),
        _builtin("apps", "v1", "statefulsets", "StatefulSet", True, ["sts"], ("status",)),
        _builtin("apps", "v1", "daemonsets", "DaemonSet", True, ["ds"], ("status",)),
        _builtin("batch", "v1", "jobs", "Job", True, [], ("status",)),
        _builtin("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True, ["pdb"], ("status",)),
        _builtin("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", True, ["netpol"]),
        _builtin("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", False, ["pc"]),
        _builtin("rbac.authorization.k8s.io", "v1", "roles", "Role", True),
        _builtin("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True),
        _builtin("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False),
        _builtin("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False),
    ]
    # Dynamic Resource Allocation (GA in 1.34, served by default): see dra.py
    types += [
        _builtin("resource.k8s.io", "v1", "deviceclasses", "DeviceClass", False),
        _builtin("resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate", True),
        _builtin("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", True, [], ("status",)),
        _builtin("resource.k8s.io", "v1", "resourceslices", "ResourceSlice", False, [], (),
                 ("spec.nodeName", "spec.driver")),
    ]
    if workload_api:  # Kubernetes' own gang scheduling: see workloads.py
        types += [
            _builtin("scheduling.k8s.io", "v1alpha2", "workloads", "Workload", True),
            _builtin("scheduling.k8s.io", "v1alpha2", "podgroups", "PodGroup", True, [], ("status",)),
        ]
    for t in types:
        if t.group == "scheduling.k8s.io" and t.versions == ["v1alpha2"]:
            t.return_deleted_object = False
            t.resets_status = False
        if t.key == "poddisruptionbudgets.policy":
            t.return_deleted_object = False
        if t.key in ("pods", "services", "deployments.apps", "statefulsets.apps", "daemonsets.apps", "jobs.batch"):
            t.categories = ["all"]
        if t.key == CRD_KEY:
            t.categories = ["api-extensions"]
    return types


class Registry:
    """Lookup of resource types by group/version/plural, kind and short name."""

    def __init__(self, *, workload_api: bool = True) -> None:
        self._types: list[ResourceType] = []
        for rt in builtin_types(workload_api=workload_api):
            self.add(rt)

    def add(self, rt: ResourceType) -> None:
        self._types = [t for t in self._types if not (t.group == rt.group and t.plural == rt.plural)]
        self._types.append(rt)

    def remove(self, group: str, plural: str) -> None:
        self._types = [t for t in self._types if not (t.group == group and t.plural == plural)]

    def all(self) -> list[ResourceType]:
        return list(self._types)

    def lookup(self, group: str, version: str, plural: str) -> ResourceType | None:
        for t in self._types:
            if t.group == group and t.plural == plural and version in t.versions:
                return t
        return None

    def by_key(self, key: str) -> ResourceType | None:
        for t in self._types:
            if t.key == key and t.storage_key is None:
                return t
        return None

    def by_group_kind(self, group: str, kind: str) -> ResourceType | None:
        for t in self._types:
            if t.group == group and t.kind == kind:
                return t
        return None

    def groups(self) -> dict[str, list[str]]:
        """Group name -> served versions (preferred first), core group excluded."""
        out: dict[str, list[str]] = {}
        for t in self._types:
            if not t.group:
                continue
            versions = out.setdefault(t.group, [])
            for v in t.versions:
                if v not in versions:
                    versions.append(v)
        return out
