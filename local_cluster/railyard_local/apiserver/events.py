"""Events the embedded server's own controllers report, as kube-controller-manager's record them:
core/v1 Events named ``<object>.<16 hex>``, ``source.component`` and ``reportingComponent`` the
controller's name, one Event per (object, reason, message) whose ``count`` grows when repeated."""

from __future__ import annotations

import contextlib
import secrets
from typing import Any

from .engine import Ctx, Engine
from .errors import APIError

JSON = dict[str, Any]


async def record_event(engine: Engine, involved: JSON, *, reason: str, message: str, component: str,
                       kind: str = "Normal") -> None:
    """Report ``reason``/``message`` about ``involved`` (an object of the store)."""
    rt = engine.registry.lookup("", "v1", "events")
    if rt is None:
        return
    meta = involved.get("metadata") or {}
    ns = meta.get("namespace") or "default"
    for entry in engine.store.items(rt.key, ns):
        ev = entry.obj
        if (ev.get("involvedObject") or {}).get("uid") == meta.get("uid") and ev.get("reason") == reason \
                and ev.get("message") == message:
            obj = entry.clone()
            obj["count"] = int(obj.get("count") or 1) + 1
            obj["lastTimestamp"] = engine.now()
            await engine.write_raw(rt, obj)
            return
    now = engine.now()
    event: JSON = {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{meta.get('name')}.{secrets.token_hex(8)}", "namespace": ns},
        "involvedObject": {"apiVersion": involved.get("apiVersion", "v1"), "kind": involved.get("kind", ""),
                           "name": meta.get("name"), "namespace": ns, "uid": meta.get("uid"),
                           "resourceVersion": meta.get("resourceVersion")},
        "reason": reason, "message": message, "type": kind, "count": 1, "firstTimestamp": now, "lastTimestamp": now,
        "source": {"component": component}, "reportingComponent": component, "reportingInstance": "",
    }
    with contextlib.suppress(APIError):
        await engine.create(rt, ns, event, Ctx(manager="kube-controller-manager"))
