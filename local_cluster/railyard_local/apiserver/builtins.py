"""Per-kind rules for the built-in kinds: defaults, validation, update restrictions."""

from __future__ import annotations

import base64
import binascii
import copy
import datetime
import hashlib
import re
from typing import TYPE_CHECKING, Any

from railyard.api.corev1 import compute_pod_qos_class

from . import dra, workloads
from .errors import Cause, bad_request, forbidden, invalid_value, required
from .names import DNS1123_SUBDOMAIN, LABEL_NAME, qualified_name
from .registry import CRD_KEY

if TYPE_CHECKING:
    from .engine import Engine
    from .registry import ResourceType

JSON = dict[str, Any]

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")

LABEL_NAMES = frozenset({"namespaces", "services", "serviceaccounts"})


def validate_meta(rt: ResourceType, obj: JSON, old: JSON | None) -> list[Cause]:
    causes: list[Cause] = []
    meta = obj["metadata"]
    name = meta.get("name", "")
    if old is None and not isinstance(name, str):
        causes.append(invalid_value("metadata.name", name, "must be a string"))
    elif old is None:
        if rt.key in LABEL_NAMES:
            if len(name) > 63 or not _DNS1123_LABEL.match(name):
                causes.append(invalid_value("metadata.name", name,
                              "a lowercase RFC 1123 label must consist of lower case alphanumeric characters "
                              "or '-', and must start and end with an alphanumeric character"))
        elif rt.key in ("events",):
            pass
        elif len(name) > 253 or not DNS1123_SUBDOMAIN.match(name):
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
                if len(key_name) > 63 or not LABEL_NAME.match(key_name):
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
    res = c.setdefault("resources", {})
    if isinstance(res, dict) and isinstance(res.get("limits"), dict) and res["limits"]:
        # a limit without a request requests the limit (SetDefaults_Pod)
        req = res.setdefault("requests", {})
        if isinstance(req, dict):
            for name, value in res["limits"].items():
                req.setdefault(name, value)
    for p in c.get("ports") or []:
        if isinstance(p, dict):
            p.setdefault("protocol", "TCP")


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
        if spec.get("serviceAccount") and not spec.get("serviceAccountName"):
            spec["serviceAccountName"] = spec["serviceAccount"]
        for c in (spec.get("containers") or []) + (spec.get("initContainers") or []):
            _default_container(c)
        for v in spec.get("volumes") or []:
            if isinstance(v, dict) and len(v) == 1 and "name" in v:
                v["emptyDir"] = {}
        _null_condition_times(obj, ("lastProbeTime", "lastTransitionTime"))
        status = obj.get("status")
        if isinstance(status, dict):  # SetDefaults_PodStatus: podIPs from podIP (a v1.36 server leaves hostIPs)
            if status.get("podIP") and not status.get("podIPs"):
                status["podIPs"] = [{"ip": status["podIP"]}]
            for kind in ("containerStatuses", "initContainerStatuses"):
                for cs in status.get(kind) or []:
                    if isinstance(cs, dict):  # Go structs, serialised even when empty
                        cs.setdefault("lastState", {})
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
        if rt.group == "events.k8s.io":
            for k, v in (("regarding", {}), ("deprecatedSource", {}), ("deprecatedFirstTimestamp", None),
                         ("deprecatedLastTimestamp", None), ("eventTime", None)):
                obj.setdefault(k, v)
        else:
            for k, v in _CORE_EVENT_ZERO:
                obj.setdefault(k, copy.deepcopy(v))
    elif key == CRD_KEY:
        from .crd import default_crd

        default_crd(obj)
    elif key in (workloads.WORKLOADS_KEY, workloads.PODGROUPS_KEY):
        workloads.default(key, obj)
    elif key in dra.KEYS:
        dra.default(key, obj)
    elif key == "nodes":
        obj.setdefault("spec", {})
        status = obj.setdefault("status", {})
        if isinstance(status, dict):  # Go structs, serialised even when empty
            status.setdefault("daemonEndpoints", {"kubeletEndpoint": {"Port": 0}})
            info = status.setdefault("nodeInfo", {})
            if isinstance(info, dict):
                for f in _NODE_INFO:
                    info.setdefault(f, "")
        _null_condition_times(obj, ("lastHeartbeatTime", "lastTransitionTime"))
    elif key == "priorityclasses.scheduling.k8s.io":
        obj.setdefault("preemptionPolicy", "PreemptLowerPriority")


_NODE_INFO = ("machineID", "systemUUID", "bootID", "kernelVersion", "osImage", "containerRuntimeVersion",
              "kubeletVersion", "kubeProxyVersion", "operatingSystem", "architecture")
_CORE_EVENT_ZERO: tuple[tuple[str, Any], ...] = (
    ("involvedObject", {}), ("source", {}), ("firstTimestamp", None), ("lastTimestamp", None), ("eventTime", None),
    ("reportingComponent", ""), ("reportingInstance", ""))


def _null_condition_times(obj: JSON, keys: tuple[str, ...]) -> None:
    """Condition times are non-pointer Go structs: a missing one serialises as null."""
    status = obj.get("status")
    if isinstance(status, dict) and isinstance(status.get("conditions"), list):
        for c in status["conditions"]:
            if isinstance(c, dict):
                for k in keys:
                    c.setdefault(k, None)


# ---- decoding: time formats ----------------------------------------------------------------------

#: MicroTime fields (RFC 3339 with exactly six fraction digits) per kind.
_MICRO_TIMES = {"events": (("eventTime",), ("series", "lastObservedTime")),
                "leases.coordination.k8s.io": (("spec", "acquireTime"), ("spec", "renewTime"))}
_TIMES = {"events": (("firstTimestamp",), ("lastTimestamp",), ("deprecatedFirstTimestamp",),
                     ("deprecatedLastTimestamp",))}

_GO_LAYOUT = [("2006", r"\d{4}"), ("-", "-"), ("01", r"\d{2}"), ("-", "-"), ("02", r"\d{2}"), ("T", "T"),
              ("15", r"\d{2}"), (":", ":"), ("04", r"\d{2}"), (":", ":"), ("05", r"\d{2}")]


def parse_go_time(value: str, micro: bool) -> str | None:
    """Go's ``time.Parse`` with RFC3339 (``micro``: RFC3339Micro, ``...05.000000Z07:00``), as
    metav1.Time/MicroTime unmarshal. Returns the error text (Go's words), or None when valid."""
    layout = "2006-01-02T15:04:05.000000Z07:00" if micro else "2006-01-02T15:04:05Z07:00"
    rest = value
    for elem, pattern in _GO_LAYOUT:
        m = re.match(pattern, rest)
        if m is None:
            return f'parsing time "{value}" as "{layout}": cannot parse "{rest}" as "{elem}"'
        rest = rest[m.end():]
    if micro:
        m = re.match(r"\.\d{6}(?!\d)", rest)
        if m is None:
            return f'parsing time "{value}" as "{layout}": cannot parse "{rest}" as ".000000"'
        rest = rest[m.end():]
    else:
        m = re.match(r"[.,]\d+", rest)
        if m is not None:
            rest = rest[m.end():]
    if rest == "Z" or re.fullmatch(r"[+-]\d{2}:\d{2}", rest):
        try:
            datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return f'parsing time "{value}": month out of range'
        return None
    return f'parsing time "{value}" as "{layout}": cannot parse "{rest}" as "Z07:00"'


def _utc(value: str, micro: bool) -> str:
    t = datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(datetime.UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ")


def decode(rt: ResourceType, obj: JSON, version: str) -> None:
    """Time fields parse as Go parses them; a value Go refuses is a 400, as upstream."""
    for paths, micro in ((_MICRO_TIMES.get(rt.key, ()), True), (_TIMES.get(rt.key, ()), False)):
        for path in paths:
            parent: Any = obj
            for p in path[:-1]:
                parent = parent.get(p) if isinstance(parent, dict) else None
            if not isinstance(parent, dict) or not isinstance(parent.get(path[-1]), str):
                continue
            err = parse_go_time(parent[path[-1]], micro)
            if err is not None:
                raise bad_request(f'{rt.kind} in version "{version}" cannot be handled as a {rt.kind}: {err}')
            parent[path[-1]] = _utc(parent[path[-1]], micro)


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
        if old is None and gates and spec.get("nodeName"):
            causes.append(forbidden("spec.nodeName", "cannot be set until all schedulingGates have been cleared"))
        causes.extend(_validate_scheduling_group(spec))
        causes.extend(dra.validate_pod_claims(spec))
        if old is not None:
            causes.extend(_validate_pod_update(obj, old))
            old_qos = (old.get("status") or {}).get("qosClass", "")
            new_qos = (obj.get("status") or {}).get("qosClass", "")
            if new_qos != old_qos:  # computed once, at creation (ValidatePodStatusUpdate)
                causes.append(invalid_value("status.qosClass", new_qos, "field is immutable"))
    elif key == "events":
        causes.extend(_validate_event(rt, obj, old))
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
    elif key in (workloads.WORKLOADS_KEY, workloads.PODGROUPS_KEY):
        causes.extend(workloads.validate(key, obj, old))
    elif key in dra.KEYS:
        causes.extend(dra.validate(key, obj, old))
    elif key == CRD_KEY:
        from .crd import validate_crd

        causes.extend(validate_crd(obj, old))
    return causes


def _validate_scheduling_group(spec: JSON) -> list[Cause]:
    """``spec.schedulingGroup`` (GenericWorkload): a one-of with ``podGroupName`` as its only
    member; the group need not exist (the scheduler waits for it)."""
    group = spec.get("schedulingGroup")
    if group is None:
        return []
    if not isinstance(group, dict) or not group.get("podGroupName"):
        return [invalid_value("spec.schedulingGroup.podGroupName", None, "must specify one of: `podGroupName`")]
    name = group["podGroupName"]
    if not isinstance(name, str) or len(name) > 253 or not DNS1123_SUBDOMAIN.match(name):
        return [invalid_value("spec.schedulingGroup.podGroupName", name,
                              "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
                              "'-' or '.', and must start and end with an alphanumeric character")]
    return []


_POD_MUTABLE = ("activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds", "schedulingGates")


def _validate_pod_update(new: JSON, old: JSON) -> list[Cause]:
    causes: list[Cause] = []
    ns, os_ = new.get("spec") or {}, old.get("spec") or {}
    old_gates = {g.get("name") for g in os_.get("schedulingGates") or []}
    for i, g in enumerate(ns.get("schedulingGates") or []):
        if g.get("name") not in old_gates:
            causes.append(forbidden(f"spec.schedulingGates[{i}].name",
                                    f"only deletion is allowed, but found new scheduling gate '{g.get('name')}'"))

    # a pod still gated may be given more node selector terms (upstream's scheduling readiness
    # mutations: Kueue's topology ungater writes the node of each rank, kueue-v0.13-workload 154)
    old_selector: JSON = os_.get("nodeSelector") or {}
    new_selector: JSON = ns.get("nodeSelector") or {}
    mutable: tuple[str, ...] = _POD_MUTABLE
    if old_gates and all(new_selector.get(k) == v for k, v in old_selector.items()):
        mutable = (*_POD_MUTABLE, "nodeSelector")

    def mask(spec: JSON) -> JSON:
        out = {k: v for k, v in spec.items() if k not in mutable}
        for ck in ("containers", "initContainers"):
            if isinstance(out.get(ck), list):
                out[ck] = [{k: v for k, v in c.items() if k != "image"} if isinstance(c, dict) else c
                           for c in out[ck]]
        return out

    # a status write carries the stored spec itself (engine._prepare_update): nothing to mask
    if ns is not os_ and mask(ns) != mask(os_):
        causes.append(forbidden(
            "spec", "pod updates may not change fields other than `spec.containers[*].image`,"
            "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to "
            "existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was "
            "previously negative)\n" + _spec_diff(mask(os_), mask(ns))))
    return causes


def _spec_diff(old: JSON, new: JSON) -> str:
    """A unified diff of the two specs, as upstream appends one (of its internal Go types)."""
    import difflib
    import json

    a = json.dumps(old, indent=1, sort_keys=True).splitlines(keepends=True)
    b = json.dumps(new, indent=1, sort_keys=True).splitlines(keepends=True)
    return "".join(list(difflib.unified_diff(a, b, n=3))[2:])


def prepare_create(rt: ResourceType, obj: JSON, eng: Engine) -> None:
    if rt.key == "pods":
        # a new pod's status is the server's, as upstream (PrepareForCreate)
        spec: JSON = obj["spec"] if isinstance(obj.get("spec"), dict) else {}
        status: JSON = {"phase": "Pending", "qosClass": compute_pod_qos_class(spec)}
        if spec.get("schedulingGates"):
            status["conditions"] = [{"type": "PodScheduled", "status": "False", "lastProbeTime": None,
                                     "lastTransitionTime": eng.now(), "reason": "SchedulingGated",
                                     "message": "Scheduling is blocked due to non-empty scheduling gates"}]
        obj["status"] = status
    if rt.key == "poddisruptionbudgets.policy":  # the disruption controller's, from zero
        obj["status"] = {"disruptionsAllowed": 0, "currentHealthy": 0, "desiredHealthy": 0, "expectedPods": 0}
    workloads.prepare_create(rt.key, obj)
    dra.prepare_create(rt.key, obj)
    if rt.key == CRD_KEY:
        from .crd import prepare_crd

        prepare_crd(obj, None)


def prepare_update(rt: ResourceType, new: JSON, old: JSON, subresource: str | None, eng: Engine) -> None:
    if rt.key == "namespaces" and subresource != "finalize" and "spec" in old:
        # spec.finalizers changes only through /finalize
        new["spec"] = dict(old["spec"])
    if rt.key == CRD_KEY and subresource != "status":
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


# ---- events ------------------------------------------------------------------------------------





def _validate_event(rt: ResourceType, ev: JSON, old: JSON | None) -> list[Cause]:
    """ValidateEventCreate/Update, on the stored (core/v1) form; events.k8s.io/v1 is strict."""
    causes: list[Cause] = []
    v1 = rt.group == "events.k8s.io"
    ns = ev["metadata"].get("namespace", "")
    inv = ev.get("involvedObject") or {}
    reporting_field = "reportingController" if v1 else "reportingComponent"
    regarding = "regarding" if v1 else "involvedObject"
    if not ev.get("eventTime"):
        if not inv.get("namespace"):
            if ns not in ("", "default"):
                causes.append(invalid_value(f"{regarding}.namespace", inv.get("namespace", ""),
                                            "does not match event.namespace"))
        elif ns != inv.get("namespace"):
            causes.append(
                invalid_value(f"{regarding}.namespace", inv.get("namespace"), "does not match event.namespace")
            )
    else:
        if not inv.get("namespace") and ns not in ("default", "kube-system"):
            causes.append(invalid_value(f"{regarding}.namespace", inv.get("namespace", ""),
                                        "does not match event.namespace"))
        controller = str(ev.get("reportingComponent") or "")
        if not controller:
            causes.append(required(reporting_field))
        causes.extend(qualified_name(controller, reporting_field))
        if not ev.get("reportingInstance"):
            causes.append(required("reportingInstance"))
        if len(str(ev.get("reportingInstance") or "")) > 128:
            causes.append(invalid_value("reportingInstance", "", "can have at most 128 characters"))
        if not ev.get("action"):
            causes.append(required("action"))
        if len(str(ev.get("action") or "")) > 128:
            causes.append(invalid_value("action", "", "can have at most 128 characters"))
        if not ev.get("reason"):
            causes.append(required("reason"))
        if len(str(ev.get("reason") or "")) > 128:
            causes.append(invalid_value("reason", "", "can have at most 128 characters"))
        if len(str(ev.get("message") or "")) > 1024:
            causes.append(invalid_value("note" if v1 else "message", "", "can have at most 1024 characters"))
    if v1 and old is None:
        if not ev.get("eventTime"):
            causes.append(required("eventTime"))
        if ev.get("type") not in ("Normal", "Warning"):
            causes.append(invalid_value("type", "", f"has invalid value: {ev.get('type', '')}"))
    return causes


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
    for k, v in _CORE_EVENT_ZERO:
        out.setdefault(k, copy.deepcopy(v))
    out["apiVersion"] = "v1"
    return out


def event_to_events_v1(obj: JSON) -> JSON:
    out = dict(obj)
    for new, core in _EV_RENAMES:
        if core in out:
            out[new] = out.pop(core)
    # events.k8s.io/v1 serialises these only when set
    for k in ("reportingController", "reportingInstance", "note", "deprecatedCount", "action", "reason", "type"):
        if out.get(k) in ("", 0, None):
            out.pop(k, None)
    out.setdefault("deprecatedSource", {})
    out.setdefault("deprecatedFirstTimestamp", None)
    out.setdefault("deprecatedLastTimestamp", None)
    out.setdefault("eventTime", None)
    out["apiVersion"] = "events.k8s.io/v1"
    return out
