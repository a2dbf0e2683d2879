"""Per-kind rules for the built-in kinds: defaults, validation, update restrictions."""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from typing import TYPE_CHECKING, Any

from .errors import Cause, forbidden, invalid_value, required
from .registry import CRD_KEY

if TYPE_CHECKING:
    from .engine import Engine
    from .registry import ResourceType

JSON = dict[str, Any]

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")

_LABEL_NAMES = frozenset({"namespaces", "services", "serviceaccounts"})


def validate_meta(rt: ResourceType, obj: JSON, old: JSON | None) -> list[Cause]:
    causes: list[Cause] = []
    meta = obj["metadata"]
    name = meta.get("name", "")
    if old is None and not isinstance(name, str):
        causes.append(invalid_value("metadata.name", name, "must be a string"))
    elif old is None:
        if rt.key in _LABEL_NAMES:
            if len(name) > 63 or not _DNS1123_LABEL.match(name):
                causes.append(invalid_value("metadata.name", name,
                              "a lowercase RFC 1123 label must consist of lower case alphanumeric characters "
                              "or '-', and must start and end with an alphanumeric character"))
        elif rt.key in ("events",):
            pass
        elif len(name) > 253 or not _DNS1123_SUBDOMAIN.match(name):
            causes.append(invalid_value("metadata.name", name,
                          "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
                          "'-' or '.', and must start and end with an alphanumeric character"))
    labels = meta.get("labels")
    if labels is not None:
        if not isinstance(labels, dict):
            causes.append(invalid_value("metadata.labels", labels, "must be a map of strings"))
        else:
            for k, v in labels.items():
                key_name = k.rsplit("/", 1)[-1]
                if len(key_name) > 63 or not _LABEL_NAME.match(key_name):
                    causes.append(invalid_value("metadata.labels", k,
                                  "name part must consist of alphanumeric characters, '-', '_' or '.', and must "
                                  "start and end with an alphanumeric character"))
                if not isinstance(v, str) or len(v) > 63 or not _LABEL_VALUE.match(v):
                    causes.append(invalid_value("metadata.labels", v,
                                  "a valid label must be an empty string or consist of alphanumeric characters, "
                                  "'-', '_' or '.', and must start and end with an alphanumeric character"))
    ann = meta.get("annotations")
    if ann is not None and (not isinstance(ann, dict) or not all(isinstance(v, str) for v in ann.values())):
        causes.append(invalid_value("metadata.annotations", ann, "must be a map of strings"))
    fins = meta.get("finalizers")
    if fins is not None and (not isinstance(fins, list) or not all(isinstance(f, str) for f in fins)):
        causes.append(invalid_value("metadata.finalizers", fins, "must be a list of strings"))
    for i, ref in enumerate(meta.get("ownerReferences") or []):
        for f in ("apiVersion", "kind", "name", "uid"):
            if not isinstance(ref, dict) or not ref.get(f):
                causes.append(required(f"metadata.ownerReferences[{i}].{f}"))
    return causes


def _image_pull_policy(image: str) -> str:
    tail = image.rsplit("/", 1)[-1]
    if "@" in tail:
        return "IfNotPresent"
    if ":" not in tail or tail.endswith(":latest"):
        return "Always"
    return "IfNotPresent"


def _default_container(c: JSON) -> None:
    if not isinstance(c, dict):
        return
    c.setdefault("terminationMessagePath", "/dev/termination-log")
    c.setdefault("terminationMessagePolicy", "File")
    if isinstance(c.get("image"), str):
        c.setdefault("imagePullPolicy", _image_pull_policy(c["image"]))
    c.setdefault("resources", {})
    for p in c.get("ports") or []:
        if isinstance(p, dict):
            p.setdefault("protocol", "TCP")


def _qos(spec: JSON) -> str:
    reqs_all, lim_all, any_set = True, True, False
    for c in spec.get("containers") or []:
        res = c.get("resources") or {}
        req, lim = res.get("requests") or {}, res.get("limits") or {}
        if req or lim:
            any_set = True
        for r in ("cpu", "memory"):
            if r not in lim:
                lim_all = False
            elif req.get(r, lim[r]) != lim[r]:
                reqs_all = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if lim_all and reqs_all else "Burstable"


def default(rt: ResourceType, obj: JSON, eng: Engine) -> None:
    key = rt.key
    if key == "pods":
        spec = obj.setdefault("spec", {})
        if not isinstance(spec, dict):
            return
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("dnsPolicy", "ClusterFirst")
        spec.setdefault("schedulerName", "default-scheduler")
        spec.setdefault("terminationGracePeriodSeconds", 30)
        spec.setdefault("securityContext", {})
        spec.setdefault("enableServiceLinks", True)
        spec.setdefault("priority", 0)
        spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
        if not spec.get("serviceAccountName"):
            spec["serviceAccountName"] = spec.get("serviceAccount") or "default"
        spec.setdefault("serviceAccount", spec["serviceAccountName"])
        for c in (spec.get("containers") or []) + (spec.get("initContainers") or []):
            _default_container(c)
        for v in spec.get("volumes") or []:
            if isinstance(v, dict) and len(v) == 1 and "name" in v:
                v["emptyDir"] = {}
        status = obj.setdefault("status", {})
        if isinstance(status, dict):
            status.setdefault("phase", "Pending")
            status.setdefault("qosClass", _qos(spec))
    elif key == "namespaces":
        spec = obj.setdefault("spec", {})
        if not obj["metadata"].get("deletionTimestamp"):
            spec.setdefault("finalizers", ["kubernetes"])
        obj.setdefault("status", {}).setdefault("phase", "Active")
        obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = obj["metadata"]["name"]
    elif key == "services":
        spec = obj.setdefault("spec", {})
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        if not spec.get("clusterIP"):
            h = hashlib.sha256(obj["metadata"].get("uid", obj["metadata"]["name"]).encode()).digest()
            spec["clusterIP"] = f"10.96.{h[0]}.{max(1, h[1] % 255)}"
        spec.setdefault("clusterIPs", [spec["clusterIP"]])
        for p in spec.get("ports") or []:
            if isinstance(p, dict):
                p.setdefault("protocol", "TCP")
                if "port" in p:
                    p.setdefault("targetPort", p["port"])
        obj.setdefault("status", {}).setdefault("loadBalancer", {})
    elif key == "secrets":
        if not obj.get("type"):
            obj["type"] = "Opaque"
        string_data = obj.pop("stringData", None)
        if isinstance(string_data, dict):
            data = obj.setdefault("data", {})
            for k, v in string_data.items():
                data[k] = base64.b64encode(str(v).encode()).decode()
    elif key == "events":
        obj.setdefault("involvedObject", {})
        obj.setdefault("type", "Normal")
    elif key == "nodes":
        obj.setdefault("spec", {})
        obj.setdefault("status", {})


def validate(rt: ResourceType, obj: JSON, old: JSON | None, eng: Engine) -> list[Cause]:
    key = rt.key
    causes: list[Cause] = []
    if key == "pods":
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            return [required("spec")]
        containers = spec.get("containers")
        if not containers or not isinstance(containers, list):
            causes.append(required("spec.containers"))
        else:
            seen: set[str] = set()
            for i, c in enumerate(containers):
                if not isinstance(c, dict):
                    causes.append(invalid_value(f"spec.containers[{i}]", c, "must be an object"))
                    continue
                n = c.get("name")
                if not n:
                    causes.append(required(f"spec.containers[{i}].name"))
                elif not isinstance(n, str) or not _DNS1123_LABEL.match(n):
                    causes.append(invalid_value(f"spec.containers[{i}].name", n, "must be a DNS-1123 label"))
                elif n in seen:
                    causes.append(Cause(f"spec.containers[{i}].name", "FieldValueDuplicate",
                                        f'Duplicate value: "{n}"'))
                else:
                    seen.add(n)
                if not c.get("image"):
                    causes.append(required(f"spec.containers[{i}].image"))
        gates = spec.get("schedulingGates") or []
        names = [g.get("name") for g in gates if isinstance(g, dict)]
        for i, g in enumerate(names):
            if not g:
                causes.append(required(f"spec.schedulingGates[{i}].name"))
        if old is not None:
            causes.extend(_validate_pod_update(obj, old))
    elif key == "secrets":
        for k, v in (obj.get("data") or {}).items():
            try:
                base64.b64decode(v, validate=True)
            except (binascii.Error, TypeError, ValueError):
                causes.append(invalid_value(f"data[{k}]", "<value>", "must be base64-encoded"))
    elif key == "services" and old is not None:
        old_ip = (old.get("spec") or {}).get("clusterIP")
        if old_ip and (obj.get("spec") or {}).get("clusterIP") not in (old_ip, None):
            causes.append(invalid_value("spec.clusterIP", obj["spec"]["clusterIP"], "field is immutable"))
    elif key == "configmaps":
        for f in ("data", "binaryData"):
            d = obj.get(f)
            if d is not None and (not isinstance(d, dict) or not all(isinstance(v, str) for v in d.values())):
                causes.append(invalid_value(f, d, "must be a map of strings"))
    elif key == CRD_KEY:
        from .crd import validate_crd

        causes.extend(validate_crd(obj, old))
    return causes


_POD_MUTABLE = ("activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds", "schedulingGates")


def _validate_pod_update(new: JSON, old: JSON) -> list[Cause]:
    causes: list[Cause] = []
    ns, os_ = new.get("spec") or {}, old.get("spec") or {}
    old_gates = {g.get("name") for g in os_.get("schedulingGates") or []}
    for g in ns.get("schedulingGates") or []:
        if g.get("name") not in old_gates:
            causes.append(forbidden("spec.schedulingGates",
                                    f"only deletion is allowed, but found new scheduling gate '{g.get('name')}'"))

    def mask(spec: JSON) -> JSON:
        out = {k: v for k, v in spec.items() if k not in _POD_MUTABLE}
        for ck in ("containers", "initContainers"):
            if isinstance(out.get(ck), list):
                out[ck] = [{k: v for k, v in c.items() if k != "image"} if isinstance(c, dict) else c
                           for c in out[ck]]
        return out

    if mask(ns) != mask(os_):
        causes.append(forbidden(
            "spec", "pod updates may not change fields other than `spec.containers[*].image`,"
            "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to "
            "existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was "
            "previously negative),`spec.schedulingGates` (only deletion)"))
    return causes


def prepare_create(rt: ResourceType, obj: JSON, eng: Engine) -> None:
    if rt.key == "pods":
        obj["status"] = {}  # a new pod's status is the server's (Pending), as upstream
    if rt.key == CRD_KEY:
        from .crd import prepare_crd

        prepare_crd(obj, None)
        fins = obj["metadata"].setdefault("finalizers", [])
        if "customresourcecleanup.apiextensions.k8s.io" not in fins:
            fins.append("customresourcecleanup.apiextensions.k8s.io")


def prepare_update(rt: ResourceType, new: JSON, old: JSON, subresource: str | None, eng: Engine) -> None:
    if rt.key == "namespaces" and subresource != "finalize" and "spec" in old:
        # spec.finalizers changes only through /finalize
        new["spec"] = dict(old["spec"])
    if rt.key == CRD_KEY:
        from .crd import prepare_crd

        prepare_crd(new, old)


def grace_period(rt: ResourceType, obj: JSON, requested: int | None) -> int | None:
    """Seconds a deletion waits for the node agent, or None for immediate deletion."""
    if rt.key != "pods":
        return None
    spec = obj.get("spec") or {}
    phase = (obj.get("status") or {}).get("phase")
    if not spec.get("nodeName") or phase in ("Succeeded", "Failed"):
        return None
    grace = requested if requested is not None else spec.get("terminationGracePeriodSeconds", 30)
    if grace is None or grace < 0:
        grace = 30
    return int(grace) if grace > 0 else None


# ---- events.k8s.io/v1 <-> core/v1 Event -----------------------------------------------------------

_EV_RENAMES = [
    ("regarding", "involvedObject"), ("note", "message"), ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"), ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"), ("reportingController", "reportingComponent"),
]


def event_from_events_v1(obj: JSON) -> JSON:
    out = dict(obj)
    for new, core in _EV_RENAMES:
        if new in out:
            out[core] = out.pop(new)
    out["apiVersion"] = "v1"
    return out


def event_to_events_v1(obj: JSON) -> JSON:
    out = dict(obj)
    for new, core in _EV_RENAMES:
        if core in out:
            out[new] = out.pop(core)
    out["apiVersion"] = "events.k8s.io/v1"
    return out
