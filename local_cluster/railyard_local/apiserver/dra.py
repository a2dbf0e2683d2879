"""Dynamic Resource Allocation, ``resource.k8s.io/v1`` (GA since Kubernetes 1.34): DeviceClasses,
ResourceClaimTemplates, ResourceClaims and ResourceSlices, enough for pods that claim devices to
be scheduled and run on the local cluster.

What is checked is what our objects and the documented API rely on: a claim's (or a template's
claim's) ``spec.devices.requests`` each have a unique DNS label ``name`` and exactly one of
``exactly`` (a ``deviceClassName``, ``allocationMode`` ExactCount, defaulted, with ``count``,
defaulted to 1, or All) or ``firstAvailable``; a ResourceClaim's spec is immutable; a pod's
``spec.resourceClaims`` name exactly one of ``resourceClaimName`` or
``resourceClaimTemplateName``, and its containers claim only names the pod lists. A
DeviceClass's CEL selectors are compiled at creation (a syntax error, or an expression that is
not a bool, is 422); a ResourceSlice names exactly one of ``nodeName``, ``nodeSelector``,
``allNodes``, ``perDeviceNodeSelection``. Constraints, configs, admin access and device taints
are stored as sent, never evaluated. The rules and messages are those a real v1.36.2 server
answered (tests/golden/kube-v1.36-dra/, recorded).

:func:`claim_for_pod` is the resourceclaim controller's rule (kube-controller-manager): one
ResourceClaim per pod and claim from the template, ``generateName: <pod>-<claim>-``, owned by
the pod (controller, no blockOwnerDeletion), annotated ``resource.kubernetes.io/pod-claim-name``;
:mod:`.controllers` runs it and records the name in the pod's ``status.resourceClaimStatuses``.
The scheduler protects a claim it allocates with :data:`DELETE_PROTECTION`; the controller drops
gone pods from ``status.reservedFor`` and, once nobody is left, deallocates a deleted claim and
removes that finalizer (:func:`release_claim`).
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from . import cel
from .errors import Cause, duplicate, invalid_value, not_supported, required

JSON = dict[str, Any]

GROUP = "resource.k8s.io"
VERSION = "v1"
API_VERSION = f"{GROUP}/{VERSION}"
DEVICE_CLASSES_KEY = f"deviceclasses.{GROUP}"
TEMPLATES_KEY = f"resourceclaimtemplates.{GROUP}"
CLAIMS_KEY = f"resourceclaims.{GROUP}"
SLICES_KEY = f"resourceslices.{GROUP}"
KEYS = frozenset({DEVICE_CLASSES_KEY, TEMPLATES_KEY, CLAIMS_KEY, SLICES_KEY})
#: On a claim made from a pod's template: which of the pod's claims it is.
POD_CLAIM_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
ALLOCATION_MODES = ["All", "ExactCount"]
#: Put on a claim by kube-scheduler before it allocates it; removed by kcm once it is deallocated.
DELETE_PROTECTION = "resource.kubernetes.io/delete-protection"
_NODE_CHOICES = ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_MESSAGE = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
                  "and must start and end with an alphanumeric character")


def default(key: str, obj: JSON) -> None:
    if key == CLAIMS_KEY:
        _default_devices((obj.get("spec") or {}).get("devices"))
    elif key == TEMPLATES_KEY:
        spec = obj.get("spec")
        if isinstance(spec, dict):
            spec.setdefault("metadata", {})  # a struct, serialised even when empty
            _default_devices((spec.get("spec") or {}).get("devices"))


def prepare_create(key: str, obj: JSON) -> None:
    if key == CLAIMS_KEY:
        obj["status"] = {}  # the scheduler's (allocation) and the kubelet's, through /status


def _default_devices(devices: Any) -> None:
    if not isinstance(devices, dict):
        return
    for r in devices.get("requests") or []:
        exactly = r.get("exactly") if isinstance(r, dict) else None
        if isinstance(exactly, dict):
            exactly.setdefault("allocationMode", "ExactCount")
            if exactly["allocationMode"] == "ExactCount" and exactly.get("count") in (None, 0):
                exactly["count"] = 1  # 0 is the Go zero value: "unset"


def validate(key: str, obj: JSON, old: JSON | None) -> list[Cause]:
    spec = obj.get("spec")
    if key == CLAIMS_KEY:
        causes = _validate_devices((spec or {}).get("devices") if isinstance(spec, dict) else None, "spec.devices")
        if old is not None and spec != old.get("spec"):  # upstream prints the new spec as its Go struct
            causes.append(Cause("spec", "FieldValueInvalid",
                                f"Invalid value: {go_claim_spec(spec)}: field is immutable"))
        return causes
    if key == TEMPLATES_KEY:
        inner = (spec or {}).get("spec") if isinstance(spec, dict) else None
        if not isinstance(inner, dict):
            return [required("spec.spec")]
        return _validate_devices(inner.get("devices"), "spec.spec.devices")
    if key == SLICES_KEY:
        if not isinstance(spec, dict):
            return [required("spec")]
        causes = [required(f"spec.{f}") for f in ("driver", "pool") if not spec.get(f)]
        if sum(1 for f in _NODE_CHOICES if spec.get(f) not in (None, "", False)) != 1:
            causes.append(required("spec", "exactly one of " + ", ".join(f"`{f}`" for f in _NODE_CHOICES)
                                   + " is required"))
        seen: set[str] = set()
        for i, d in enumerate(spec.get("devices") or []):
            name = d.get("name") if isinstance(d, dict) else None
            if not isinstance(name, str) or not _DNS1123_LABEL.match(name):
                causes.append(invalid_value(f"spec.devices[{i}].name", name, _LABEL_MESSAGE))
            elif name in seen:
                causes.append(duplicate(f"spec.devices[{i}]", name))
            else:
                seen.add(name)
        return causes
    if key == DEVICE_CLASSES_KEY:
        selectors = spec.get("selectors") if isinstance(spec, dict) else None
        return _validate_selectors(selectors, "spec.selectors")
    return []


#: What a device selector's CEL sees: ``device`` (kube's DRA CEL environment).
_DEVICE = cel.CelType("object", fields={
    "driver": cel.CelType("string", max_size=63), "attributes": cel.CelType("map", elem=cel.DYN, max_size=32),
    "capacity": cel.CelType("map", elem=cel.DYN, max_size=32), "allowMultipleAllocations": cel.BOOL})


def _validate_selectors(selectors: Any, path: str) -> list[Cause]:
    causes: list[Cause] = []
    for i, sel in enumerate(selectors or [] if isinstance(selectors, list) else []):
        expression = ((sel or {}).get("cel") or {}).get("expression") if isinstance(sel, dict) else None
        if not isinstance(expression, str):
            continue
        where = f"{path}[{i}].cel.expression"
        try:
            kind = cel.check_expression(expression, {"device": _DEVICE})
        except cel.CompileError as exc:
            causes.append(invalid_value(where, expression, f"compilation failed: {exc.detail}"))
            continue
        if kind not in ("bool", "dyn"):
            causes.append(invalid_value(where, expression, f"must evaluate to bool or the unknown type, not {kind}"))
    return causes


def _validate_devices(devices: Any, path: str) -> list[Cause]:
    if devices is None:
        return []
    if not isinstance(devices, dict):
        return [invalid_value(path, devices, "must be an object")]
    causes: list[Cause] = []
    seen: set[str] = set()
    for i, r in enumerate(devices.get("requests") or []):
        where = f"{path}.requests[{i}]"
        if not isinstance(r, dict):
            causes.append(invalid_value(where, r, "must be an object"))
            continue
        name = r.get("name")
        if not name:
            causes.append(required(f"{where}.name"))
        elif not isinstance(name, str) or len(name) > 63 or not _DNS1123_LABEL.match(name):
            causes.append(invalid_value(f"{where}.name", name, _LABEL_MESSAGE))
        elif name in seen:
            causes.append(duplicate(f"{where}.name", name))
        else:
            seen.add(name)
        chosen = [k for k in ("exactly", "firstAvailable") if r.get(k) is not None]
        if not chosen:
            causes.append(required(where, "exactly one of `exactly` or `firstAvailable` is required"))
            continue
        if len(chosen) > 1:
            causes.append(
                invalid_value(
                    where, None, "exactly one of `exactly` or `firstAvailable` is required, but multiple fields are set"
                )
            )
            continue
        exactly = r.get("exactly")
        if not isinstance(exactly, dict):
            continue
        if not exactly.get("deviceClassName"):
            causes.append(required(f"{where}.exactly.deviceClassName"))
        mode = exactly.get("allocationMode")
        if mode not in ALLOCATION_MODES:
            causes.append(not_supported(f"{where}.exactly.allocationMode", mode, ALLOCATION_MODES))
        count = exactly.get("count")
        if mode == "ExactCount" and (not isinstance(count, int) or isinstance(count, bool) or count < 0):
            causes.append(invalid_value(f"{where}.exactly.count", count, "must be greater than zero"))
        elif mode == "All" and count not in (None, 0):
            causes.append(
                invalid_value(f"{where}.exactly.count", count, "must not be specified when allocationMode is 'All'")
            )
    return causes


def _go(value: Any, fields: tuple[tuple[str, str, Any], ...]) -> JSON | None:
    """``value`` as encoding/json prints the internal Go struct: every field, capitalised, in
    declaration order; ``fields`` is (json name, Go name, how to print the value)."""
    if not isinstance(value, dict):
        return None
    return {go: conv(value.get(name)) for name, go, conv in fields}


def _plain(value: Any) -> Any:
    return value


def _list_of(fields: tuple[tuple[str, str, Any], ...]) -> Any:
    return lambda items: [_go(i, fields) for i in items] if isinstance(items, list) else None


def _int(value: Any) -> Any:
    return value if value is not None else 0


def _str(value: Any) -> Any:
    return value if value is not None else ""


_SELECTOR = (("cel", "CEL", lambda c: _go(c, (("expression", "Expression", _str),))),)
_TOLERATION = (("key", "Key", _str), ("operator", "Operator", _str), ("value", "Value", _str),
               ("effect", "Effect", _str), ("tolerationSeconds", "TolerationSeconds", _plain))
_CAPACITY = (("requests", "Requests", _plain),)
_EXACT = (("deviceClassName", "DeviceClassName", _str), ("selectors", "Selectors", _list_of(_SELECTOR)),
          ("allocationMode", "AllocationMode", _str), ("count", "Count", _int), ("adminAccess", "AdminAccess", _plain),
          ("tolerations", "Tolerations", _list_of(_TOLERATION)),
          ("capacity", "Capacity", lambda c: _go(c, _CAPACITY)))
_SUBREQUEST = (("name", "Name", _str), ("deviceClassName", "DeviceClassName", _str),
               ("selectors", "Selectors", _list_of(_SELECTOR)), ("allocationMode", "AllocationMode", _str),
               ("count", "Count", _int), ("tolerations", "Tolerations", _list_of(_TOLERATION)),
               ("capacity", "Capacity", lambda c: _go(c, _CAPACITY)))
_REQUEST = (("name", "Name", _str), ("exactly", "Exactly", lambda e: _go(e, _EXACT)),
            ("firstAvailable", "FirstAvailable", _list_of(_SUBREQUEST)))
_CONSTRAINT = (("requests", "Requests", _plain), ("matchAttribute", "MatchAttribute", _plain),
               ("distinctAttribute", "DistinctAttribute", _plain))
_OPAQUE = (("driver", "Driver", _str), ("parameters", "Parameters", _plain))
_CONFIG = (("requests", "Requests", _plain), ("opaque", "Opaque", lambda o: _go(o, _OPAQUE)))
_DEVICES = (("requests", "Requests", _list_of(_REQUEST)), ("constraints", "Constraints", _list_of(_CONSTRAINT)),
            ("config", "Config", _list_of(_CONFIG)))


def go_claim_spec(spec: Any) -> str:
    """A ResourceClaim spec as kube-apiserver prints its internal struct in an error message."""
    devices = _go((spec or {}).get("devices") if isinstance(spec, dict) else None, _DEVICES)
    empty = {go: None for _, go, _ in _DEVICES}
    return json.dumps({"Devices": devices if devices is not None else empty}, separators=(",", ":"))


def validate_pod_claims(spec: JSON) -> list[Cause]:
    """A pod's ``spec.resourceClaims`` and its containers' ``resources.claims`` (immutable with
    the rest of the pod's spec)."""
    causes: list[Cause] = []
    names: set[str] = set()
    for i, c in enumerate(spec.get("resourceClaims") or []):
        where = f"spec.resourceClaims[{i}]"
        name = c.get("name") if isinstance(c, dict) else None
        if not name:
            causes.append(required(f"{where}.name"))
            continue
        if not isinstance(name, str) or not _DNS1123_LABEL.match(name):
            causes.append(invalid_value(f"{where}.name", name, _LABEL_MESSAGE))
        elif name in names:
            causes.append(duplicate(f"{where}.name", name))
        names.add(str(name))
        sources = [k for k in ("resourceClaimName", "resourceClaimTemplateName") if (c or {}).get(k)]
        if len(sources) != 1:  # upstream prints its internal struct as the value
            dump = json.dumps({"Name": name, "ResourceClaimName": c.get("resourceClaimName"),
                               "ResourceClaimTemplateName": c.get("resourceClaimTemplateName")}, separators=(",", ":"))
            detail = ("at most one of `resourceClaimName` or `resourceClaimTemplateName` may be specified" if sources
                      else "must specify one of: `resourceClaimName`, `resourceClaimTemplateName`")
            causes.append(Cause(where, "FieldValueInvalid", f"Invalid value: {dump}: {detail}"))
    for kind in ("containers", "initContainers"):
        for i, ctr in enumerate(spec.get(kind) or []):
            claims = ((ctr or {}).get("resources") or {}).get("claims") or [] if isinstance(ctr, dict) else []
            for j, claim in enumerate(claims):
                name = claim.get("name") if isinstance(claim, dict) else None
                if name not in names:  # upstream: a NotFound with an explanation
                    known = ": " + ", ".join(sorted(names)) if names else " which is empty"
                    causes.append(
                        Cause(
                            f"spec.{kind}[{i}].resources.claims[{j}]",
                            "FieldValueNotFound",
                            f"Not found: {json.dumps(name)}: must be one of the names in "
                            f"pod.spec.resourceClaims{known}",
                        )
                    )
    return causes


def pod_claims_from_templates(pod: JSON) -> list[tuple[str, str]]:
    """(claim name, template name) of each of a pod's claims made from a template."""
    out = []
    for c in (pod.get("spec") or {}).get("resourceClaims") or []:
        if isinstance(c, dict) and c.get("name") and c.get("resourceClaimTemplateName"):
            out.append((str(c["name"]), str(c["resourceClaimTemplateName"])))
    return out


def claim_for_pod(pod: JSON, claim_name: str, template: JSON) -> JSON:
    """The ResourceClaim the resourceclaim controller makes for one of a pod's claims (named by the
    server from ``generateName``)."""
    meta = pod["metadata"]
    tmeta = (template.get("spec") or {}).get("metadata") or {}
    annotations = {**(tmeta.get("annotations") or {}), POD_CLAIM_ANNOTATION: claim_name}
    claim: JSON = {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaim",
        "metadata": {
            "generateName": f"{meta['name'][:40]}-{claim_name[:12]}-".replace("--", "-"),
            "namespace": meta.get("namespace", "default"),
            "annotations": annotations,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"],
                                 "controller": True}],
        },
        "spec": copy.deepcopy((template.get("spec") or {}).get("spec") or {}),
    }
    if tmeta.get("labels"):
        claim["metadata"]["labels"] = dict(tmeta["labels"])
    return claim


def is_generated_for(claim: JSON, pod_uid: str) -> bool:
    """Whether ``claim`` was made from a template for the pod ``pod_uid``."""
    meta = claim.get("metadata") or {}
    return POD_CLAIM_ANNOTATION in (meta.get("annotations") or {}) and any(
        r.get("uid") == pod_uid and r.get("controller") for r in meta.get("ownerReferences") or [])



def reserved_pod_uids(claim: JSON) -> set[str]:
    return {str(r.get("uid")) for r in (claim.get("status") or {}).get("reservedFor") or []
            if isinstance(r, dict) and r.get("resource") == "pods"}


def release_claim(claim: JSON, live_pods: set[str]) -> tuple[JSON | None, bool]:
    """kcm's resourceclaim controller on one claim: pods that are gone (or done) leave
    ``reservedFor``; a claim nobody reserves any more is deallocated; a deleted one then loses
    the scheduler's delete-protection finalizer. Returns (the claim's new status, or None when it
    is unchanged; whether to drop the finalizer)."""
    status = claim.get("status") or {}
    reserved = [r for r in status.get("reservedFor") or []
                if not (isinstance(r, dict) and r.get("resource") == "pods") or str(r.get("uid")) in live_pods]
    new = dict(status)
    if reserved:
        new["reservedFor"] = reserved
    else:
        new.pop("reservedFor", None)
        new.pop("allocation", None)
    meta = claim.get("metadata") or {}
    unprotect = not reserved and bool(meta.get("deletionTimestamp")) \
        and DELETE_PROTECTION in (meta.get("finalizers") or [])
    return (new if new != status else None), unprotect


# ---- NVIDIA's DRA driver, as far as a ComputeDomain goes ----------------------------------------

#: A ComputeDomain (resource.nvidia.com, a CRD of NVIDIA's DRA driver, installed by whoever
#: wants them: tests and demos install a minimal one) is stored like any custom resource; the
#: driver's controller part that matters to pods is played here: it creates the domain's channel
#: ResourceClaimTemplate, whose claims ask for one IMEX channel of the node
#: (railyard_local.devices publishes ``channel-0`` per node).
COMPUTE_DOMAINS_KEY = "computedomains.resource.nvidia.com"
CHANNEL_DEVICE_CLASS = "compute-domain-default-channel.nvidia.com"


def channel_template_for(domain: JSON) -> JSON | None:
    """The channel ResourceClaimTemplate NVIDIA's driver makes for a ComputeDomain (owned by it),
    or None when the domain names none."""
    meta = domain.get("metadata") or {}
    name = (((domain.get("spec") or {}).get("channel") or {}).get("resourceClaimTemplate") or {}).get("name")
    if not isinstance(name, str) or not name:
        return None
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": name,
            "namespace": meta.get("namespace", "default"),
            "ownerReferences": [
                {
                    "apiVersion": str(domain.get("apiVersion")),
                    "kind": "ComputeDomain",
                    "name": meta.get("name"),
                    "uid": meta.get("uid"),
                    "controller": True,
                }
            ],
        },
        "spec": {
            "spec": {
                "devices": {"requests": [{"name": "channel", "exactly": {"deviceClassName": CHANNEL_DEVICE_CLASS}}]}
            }
        },
    }


def compute_domain_crd() -> JSON:
    """A minimal ComputeDomain CRD (the fields Railyard writes; the rest preserved unknown), for
    tests and demos on the local cluster: NVIDIA's chart installs the real one."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": COMPUTE_DOMAINS_KEY},
        "spec": {
            "group": "resource.nvidia.com",
            "scope": "Namespaced",
            "names": {
                "plural": "computedomains",
                "singular": "computedomain",
                "kind": "ComputeDomain",
                "listKind": "ComputeDomainList",
            },
            "versions": [
                {
                    "name": "v1beta1",
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "x-kubernetes-preserve-unknown-fields": True,
                                    "properties": {
                                        "numNodes": {"type": "integer"},
                                        "channel": {
                                            "type": "object",
                                            "properties": {
                                                "resourceClaimTemplate": {
                                                    "type": "object",
                                                    "properties": {"name": {"type": "string"}},
                                                }
                                            },
                                        },
                                    },
                                },
                                "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                            },
                        }
                    },
                }
            ],
        },
    }
