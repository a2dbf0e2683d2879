"""kube-controller-manager's taint-based eviction (the "taint-eviction-controller"): a pod bound to
a node with a ``NoExecute`` taint it does not tolerate is deleted at once; one it tolerates for
``tolerationSeconds`` is deleted that long after the taint's ``timeAdded``; one it tolerates
without a limit stays. Before the deletion the pod gets ``DisruptionTarget=True`` (reason
``DeletionByTaintManager``) and a ``TaintManagerEviction`` event (recorded in
tests/golden/kube-v1.36-disruption/, cases 047-051).

Who taints the node does not matter here: an admin, or the node lifecycle rule that taints a
node whose kubelet went quiet ``node.kubernetes.io/unreachable:NoExecute`` (nodelifecycle.py):
admission gives every pod 300 s tolerations of it unless the pod has its own.
"""

from __future__ import annotations

import contextlib
import datetime
import json
from typing import Any

from railyard.api.corev1 import Toleration

from .engine import Ctx, DeleteOptions, Engine
from .errors import APIError
from .events import record_event
from .store import Entry, ObjKey  # ObjKey: a (node, namespace, name) triple here

JSON = dict[str, Any]
REASON = "DeletionByTaintManager"
MESSAGE = "Taint manager: deleting due to NoExecute taint"


def _time(ts: Any) -> float | None:
    try:
        return datetime.datetime.fromisoformat(str(ts).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def compute_eviction_time(pod: JSON, taints: list[JSON], now: float) -> float | None:
    """When the pod must go because of the node's NoExecute ``taints`` (``now``: at once), or
    None while it tolerates them all without a limit."""
    deadline: float | None = None
    tolerations = [t for t in (pod.get("spec") or {}).get("tolerations") or [] if isinstance(t, dict)]
    for taint in taints:
        if taint.get("effect") != "NoExecute":
            continue
        matching = [t for t in tolerations if Toleration.from_dict(t).tolerates(taint)]
        if not matching:
            return now
        limits = [t["tolerationSeconds"] for t in matching if isinstance(t.get("tolerationSeconds"), int)]
        if len(limits) < len(matching):
            continue  # one toleration without a limit: tolerated for ever
        added = _time(taint.get("timeAdded")) or now
        at = added + max(0, min(limits))
        deadline = at if deadline is None else min(deadline, at)
    return deadline


class TaintManager:
    """Runs :func:`compute_eviction_time` for the pods of nodes with NoExecute taints."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.dirty: set[str] = set()  # nodes
        self.deadlines: dict[ObjKey, float] = {}  # (node, namespace, pod) -> when the pod goes

    def on_write(self, rkey: str, entry: Entry) -> bool:
        obj = entry.obj
        if rkey == "nodes":
            name = obj["metadata"]["name"]
            if any(t.get("effect") == "NoExecute" for t in (obj.get("spec") or {}).get("taints") or []) \
                    or any(k[0] == name for k in self.deadlines):  # a taint gone: its deadlines go
                self.dirty.add(name)
        elif rkey == "pods":
            node = (obj.get("spec") or {}).get("nodeName")
            entry_node = self.engine.store.get("nodes", "", node) if node else None
            if entry_node is not None and any(t.get("effect") == "NoExecute"
                                              for t in (entry_node.obj.get("spec") or {}).get("taints") or []):
                self.dirty.add(str(node))
        return bool(self.dirty)

    def next_deadline(self) -> float | None:
        return min(self.deadlines.values()) if self.deadlines else None

    async def process(self) -> None:
        now = self.engine.clock()
        for node in list(self.dirty):
            self.dirty.discard(node)
            for key in [k for k in self.deadlines if k[0] == node]:
                del self.deadlines[key]
            entry = self.engine.store.get("nodes", "", node)
            taints = list(((entry.obj.get("spec") or {}).get("taints") or []) if entry is not None else [])
            for pod in self.engine.store.items("pods"):
                meta = pod.obj["metadata"]
                if (pod.obj.get("spec") or {}).get("nodeName") != node or meta.get("deletionTimestamp"):
                    continue
                at = compute_eviction_time(pod.obj, taints, now)
                if at is not None:
                    self.deadlines[(node, meta.get("namespace", ""), meta["name"])] = at
        for key, at in sorted(self.deadlines.items(), key=lambda kv: kv[1]):
            if at > now:
                break
            del self.deadlines[key]
            with contextlib.suppress(APIError):
                await self._evict(key[1], key[2])

    async def _evict(self, ns: str, name: str) -> None:
        rt = self.engine.registry.lookup("", "v1", "pods")
        entry = self.engine.store.get("pods", ns, name)
        if rt is None or entry is None or entry.obj["metadata"].get("deletionTimestamp"):
            return
        pod = entry.obj
        await record_event(self.engine, {"apiVersion": "v1", "kind": "Pod", **pod}, reason="TaintManagerEviction",
                           message=f"Marking for deletion Pod {ns}/{name}", component="taint-eviction-controller")
        conditions = [c for c in (pod.get("status") or {}).get("conditions") or []
                      if c.get("type") != "DisruptionTarget"]
        conditions.append({"type": "DisruptionTarget", "status": "True", "lastProbeTime": None,
                           "lastTransitionTime": self.engine.now(), "reason": REASON, "message": MESSAGE,
                           "observedGeneration": pod["metadata"].get("generation", 1)})
        patch = {"metadata": {"resourceVersion": pod["metadata"].get("resourceVersion")},
                 "status": {"conditions": conditions}}
        await self.engine.patch(rt, ns, name, "application/merge-patch+json", json.dumps(patch).encode(),
                                Ctx(manager="kube-controller-manager"), "status")
        await self.engine.delete(rt, ns, name, DeleteOptions(), Ctx())
