"""``meta.k8s.io/v1`` Table output (what ``kubectl get`` asks for): CRD printer columns, evaluated
with a small JSONPath, and the usual columns of the built-in kinds."""

from __future__ import annotations

import datetime
import re
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aiohttp import web

    from .engine import Engine
    from .registry import ResourceType
    from .store import Entry

JSON = dict[str, Any]


def wants_table(request: web.Request) -> bool:
    return "as=Table" in request.headers.get("Accept", "")


def human_duration(seconds: float) -> str:
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    return f"{hours // 24 // 365}y"


def age(ts: str | None, now: float | None = None) -> str:
    if not ts:
        return "<unknown>"
    try:
        t = datetime.datetime.strptime(ts.replace("Z", "+0000")[:24], "%Y-%m-%dT%H:%M:%S%z").timestamp()
    except ValueError:
        return "<unknown>"
    return human_duration((now or time.time()) - t)


# ---- JSONPath (the subset printer columns use) ----------------------------------------------------

_STEP = re.compile(
    r"\.([A-Za-z0-9_\-/$]+)|\[(\d+|\*)\]"
    r"|\[\?\(@\.([A-Za-z0-9_.\-]+)\s*(==|!=)\s*['\"]?([^'\"\)]*)['\"]?\)\]"
    r"|\['([^']+)'\]"
)


def jsonpath(obj: Any, path: str) -> list[Any]:
    path = path.strip()
    if path.startswith("{") and path.endswith("}"):
        path = path[1:-1]
    if path.startswith("$"):
        path = path[1:]
    if path and not path.startswith((".", "[")):
        path = "." + path
    current = [obj]
    pos = 0
    while pos < len(path):
        m = _STEP.match(path, pos)
        if m is None:
            return []
        pos = m.end()
        nxt: list[Any] = []
        for c in current:
            if m.group(1) is not None or m.group(6) is not None:
                key = m.group(1) or m.group(6)
                if isinstance(c, dict) and key in c:
                    nxt.append(c[key])
            elif m.group(2) is not None:
                if isinstance(c, list):
                    if m.group(2) == "*":
                        nxt.extend(c)
                    elif int(m.group(2)) < len(c):
                        nxt.append(c[int(m.group(2))])
                elif isinstance(c, dict) and m.group(2) == "*":
                    nxt.extend(c.values())
            else:
                field, op, value = m.group(3), m.group(4), m.group(5)
                for item in c if isinstance(c, list) else []:
                    got = jsonpath(item, "." + field)
                    sval = str(got[0]).lower() if got and isinstance(got[0], bool) else (str(got[0]) if got else None)
                    if (sval == value) == (op == "=="):
                        nxt.append(item)
        current = nxt
    return current


def _cell(values: list[Any], ctype: str) -> Any:
    if not values:
        return None
    v = values[0] if len(values) == 1 else ",".join(str(x) for x in values)
    if ctype == "date" and isinstance(v, str):
        return age(v)
    if ctype == "integer" and isinstance(v, float) and v.is_integer():
        return int(v)
    if ctype == "string" and isinstance(v, dict | list):
        import json

        return json.dumps(v)
    return v


def _col(name: str, ctype: str = "string", fmt: str = "", desc: str = "", priority: int = 0) -> JSON:
    return {"name": name, "type": ctype, "format": fmt, "description": desc or name, "priority": priority}


_NAME_DESCRIPTION = (
                        "Name must be unique within a namespace. Is required when creating resources, although some "
                        "resources may allow a client to request the generation of an appropriate name automatically. "
                        "Name is primarily intended for creation idempotence and configuration definition. Cannot be "
                        "updated. More info: "
                        "https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names"
                    )
_AGE_DESCRIPTION = (
                       "CreationTimestamp is a timestamp representing the server time when this object was created. "
                       "It is "
                       "not guaranteed to be set in happens-before order across separate operations. Clients may not "
                       "set this value. It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. "
                       "Read-only. Null for lists. More info: "
                       "https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata"
                   )
_NAME = _col("Name", "string", "name", _NAME_DESCRIPTION)
_AGE = _col("Age", "string", "", _AGE_DESCRIPTION)


def _pod_row(o: JSON) -> list[Any]:
    spec, status = o.get("spec") or {}, o.get("status") or {}
    containers = spec.get("containers") or []
    statuses = status.get("containerStatuses") or []
    ready = sum(1 for s in statuses if s.get("ready"))
    restarts = sum(int(s.get("restartCount") or 0) for s in statuses)
    reason = status.get("reason") or status.get("phase") or "Pending"
    for s in statuses:
        st = s.get("state") or {}
        if "waiting" in st and st["waiting"].get("reason"):
            reason = st["waiting"]["reason"]
        elif "terminated" in st and status.get("phase") not in ("Succeeded",):
            reason = st["terminated"].get("reason") or reason
    if spec.get("schedulingGates") and not spec.get("nodeName"):
        reason = "SchedulingGated"
    if o["metadata"].get("deletionTimestamp"):
        reason = "Terminating"
    return [o["metadata"]["name"], f"{ready}/{len(containers)}", reason, str(restarts),
            age(o["metadata"].get("creationTimestamp")), status.get("podIP") or "<none>",
            spec.get("nodeName") or "<none>", status.get("nominatedNodeName") or "<none>", "<none>"]


def _node_row(o: JSON) -> list[Any]:
    status = o.get("status") or {}
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    st = "Ready" if ready and ready.get("status") == "True" else ("NotReady" if ready else "Unknown")
    if (o.get("spec") or {}).get("unschedulable"):
        st += ",SchedulingDisabled"
    labels = o["metadata"].get("labels") or {}
    roles = sorted(k.split("/", 1)[1] for k in labels if k.startswith("node-role.kubernetes.io/")) or ["<none>"]
    addrs = {a.get("type"): a.get("address") for a in status.get("addresses") or []}
    info = status.get("nodeInfo") or {}
    return [o["metadata"]["name"], st, ",".join(roles), age(o["metadata"].get("creationTimestamp")),
            info.get("kubeletVersion", ""), addrs.get("InternalIP", "<none>"), addrs.get("ExternalIP", "<none>"),
            info.get("osImage", "<unknown>"), info.get("kernelVersion", "<unknown>"),
            info.get("containerRuntimeVersion", "<unknown>")]


def _svc_row(o: JSON) -> list[Any]:
    spec = o.get("spec") or {}
    ports = ",".join(f"{p.get('port')}/{p.get('protocol', 'TCP')}" for p in spec.get("ports") or []) or "<none>"
    sel = ",".join(f"{k}={v}" for k, v in (spec.get("selector") or {}).items()) or "<none>"
    return [o["metadata"]["name"], spec.get("type", "ClusterIP"), spec.get("clusterIP", "<none>"), "<none>", ports,
            age(o["metadata"].get("creationTimestamp")), sel]


def _event_row(o: JSON) -> list[Any]:
    inv = o.get("involvedObject") or o.get("regarding") or {}
    last = o.get("lastTimestamp") or o.get("eventTime") or o["metadata"].get("creationTimestamp")
    return [
        age(last),
        o.get("type", ""),
        o.get("reason", ""),
        f"{str(inv.get('kind', '')).lower()}/{inv.get('name', '')}",
        o.get("message") or o.get("note") or "",
    ]


_BUILTIN: dict[str, tuple[list[JSON], Any]] = {
    "pods": (
        [
            _NAME,
            _col("Ready", desc="The aggregate readiness state of this pod for accepting traffic."),
            _col("Status", desc="The aggregate status of the containers in this pod."),
            _col(
                "Restarts",
                "string",
                desc="The number of times the containers in this pod have been restarted and when the last container "
                     "in this pod has restarted.",
            ),
            _AGE,
            _col(
                "IP",
                priority=1,
                desc="podIP address allocated to the pod. Routable at least within the cluster. Empty if not yet "
                     "allocated.",
            ),
            _col(
                "Node",
                priority=1,
                desc="NodeName indicates in which node this pod is scheduled. If empty, this pod is a candidate for "
                     "scheduling by the scheduler defined in schedulerName. Once this field is set, the kubelet for "
                     "this node becomes responsible for the lifecycle of this pod. This field should not be used to "
                     "express a desire for the pod to be scheduled on a specific node. "
                     "https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/#nodename",
            ),
            _col(
                "Nominated Node",
                priority=1,
                desc="nominatedNodeName is set only when this pod preempts other pods on the node, but it cannot be "
                     "scheduled right away as preemption victims receive their graceful termination periods. This "
                     "field does not guarantee that the pod will be scheduled on this node. Scheduler may decide to "
                     "place the pod elsewhere if other nodes become available sooner. Scheduler may also decide to "
                     "give the resources on this node to a higher priority pod that is created after preemption. As a "
                     "result, this field may be different than PodSpec.nodeName when the pod is scheduled.",
            ),
            _col(
                "Readiness Gates",
                priority=1,
                desc='If specified, all readiness gates will be evaluated for pod readiness. A pod is ready when all '
                     'its containers are ready AND all conditions specified in the readiness gates have status equal '
                     'to "True" More info: https://git.k8s.io/enhancements/keps/sig-network/580-pod-readiness-gates',
            ),
        ],
        _pod_row,
    ),
    "nodes": (
        [
            _NAME,
            _col("Status"),
            _col("Roles"),
            _AGE,
            _col("Version"),
            _col("Internal-IP", priority=1),
            _col("External-IP", priority=1),
            _col("OS-Image", priority=1),
            _col("Kernel-Version", priority=1),
            _col("Container-Runtime", priority=1),
        ],
        _node_row,
    ),
    "namespaces": (
        [_NAME, _col("Status"), _AGE],
        lambda o: [
            o["metadata"]["name"],
            (o.get("status") or {}).get("phase", "Active"),
            age(o["metadata"].get("creationTimestamp")),
        ],
    ),
    "configmaps": (
        [_NAME, _col("Data", "integer"), _AGE],
        lambda o: [
            o["metadata"]["name"],
            len(o.get("data") or {}) + len(o.get("binaryData") or {}),
            age(o["metadata"].get("creationTimestamp")),
        ],
    ),
    "secrets": (
        [_NAME, _col("Type"), _col("Data", "integer"), _AGE],
        lambda o: [
            o["metadata"]["name"],
            o.get("type", "Opaque"),
            len(o.get("data") or {}),
            age(o["metadata"].get("creationTimestamp")),
        ],
    ),
    "services": (
        [
            _NAME,
            _col("Type"),
            _col("Cluster-IP"),
            _col("External-IP"),
            _col("Port(s)"),
            _AGE,
            _col("Selector", priority=1),
        ],
        _svc_row,
    ),
    "serviceaccounts": (
        [_NAME, _col("Secrets", "integer"), _AGE],
        lambda o: [o["metadata"]["name"], len(o.get("secrets") or []), age(o["metadata"].get("creationTimestamp"))],
    ),
    "events": ([_col("Last Seen"), _col("Type"), _col("Reason"), _col("Object"), _col("Message")], _event_row),
    "leases.coordination.k8s.io": (
        [_NAME, _col("Holder"), _AGE],
        lambda o: [
            o["metadata"]["name"],
            (o.get("spec") or {}).get("holderIdentity", ""),
            age(o["metadata"].get("creationTimestamp")),
        ],
    ),
    "customresourcedefinitions.apiextensions.k8s.io": (
        [_NAME, _col("Created At", "date")],
        lambda o: [o["metadata"]["name"], o["metadata"].get("creationTimestamp")],
    ),
}


def columns_and_rows(rt: ResourceType, version: str, objs: list[JSON]) -> tuple[list[JSON], list[list[Any]]]:
    if rt.is_custom:
        cols = rt.printer_columns.get(version) or rt.printer_columns.get(rt.storage_version) or []
        if not cols:
            return [_NAME, _AGE], [[o["metadata"]["name"], age(o["metadata"].get("creationTimestamp"))] for o in objs]
        defs = [_NAME] + [_col(c["name"], c.get("type", "string"), c.get("format", ""), c.get("description") or
                               f"Custom resource definition column (in JSONPath format): {c['jsonPath']}",
                               c.get("priority", 0)) for c in cols]
        rows = [[o["metadata"]["name"]] + [_cell(jsonpath(o, c["jsonPath"]), c.get("type", "string")) for c in cols]
                for o in objs]
        return defs, rows
    if rt.key in _BUILTIN:
        defs, fn = _BUILTIN[rt.key]
        return defs, [fn(o) for o in objs]
    return [_NAME, _AGE], [[o["metadata"]["name"], age(o["metadata"].get("creationTimestamp"))] for o in objs]


def render(engine: Engine, rt: ResourceType, entries: list[Entry], rv: int, request: web.Request,
           list_meta: JSON | None = None) -> JSON:
    import json

    version = next((v for v in rt.versions if f"/{v}/" in request.path + "/"), rt.storage_version)
    objs = [json.loads(engine.from_storage(rt, e, version)) for e in entries]
    defs, rows = columns_and_rows(rt, version, objs)
    include = request.query.get("includeObject", "Metadata")
    out_rows = []
    for o, cells in zip(objs, rows, strict=True):
        row: JSON = {"cells": cells}
        if include == "Object":
            row["object"] = o
        elif include != "None":
            row["object"] = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                             "metadata": o["metadata"]}
        out_rows.append(row)
    meta = dict(list_meta or {"resourceVersion": str(rv)})
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": meta, "columnDefinitions": defs,
            "rows": out_rows}
