"""What kube-controller-manager writes on a node as soon as it sees it (recorded in
tests/golden/kube-v1.36-disruption/): the TTL controller's ``node.alpha.kubernetes.io/ttl``
annotation (``0`` in a small cluster), the node lifecycle controller's ``beta.kubernetes.io/os``
and ``/arch`` labels copied from the GA ones, and its ``node.kubernetes.io/unschedulable:NoSchedule``
taint while the node is cordoned (``spec.unschedulable``; the apiserver itself adds no taint).

Only these keys are touched, so this composes with the lifecycle rule that adds and removes the
not-ready/unreachable taints of a node whose kubelet went quiet (nodelifecycle.py).
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from .engine import Ctx, Engine
from .errors import APIError
from .store import Entry

JSON = dict[str, Any]

TTL_ANNOTATION = "node.alpha.kubernetes.io/ttl"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
_BETA_LABELS = {"kubernetes.io/os": "beta.kubernetes.io/os", "kubernetes.io/arch": "beta.kubernetes.io/arch"}


def compute_node_patch(node: JSON, now: str) -> JSON | None:
    """The merge patch kcm's controllers write on ``node`` (None: nothing to change)."""
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    patch: JSON = {}
    if (meta.get("annotations") or {}).get(TTL_ANNOTATION) is None:
        patch.setdefault("metadata", {})["annotations"] = {TTL_ANNOTATION: "0"}
    beta = {b: labels[ga] for ga, b in _BETA_LABELS.items() if ga in labels and labels.get(b) != labels[ga]}
    if beta:
        patch.setdefault("metadata", {})["labels"] = beta
    spec = node.get("spec") or {}
    taints = list(spec.get("taints") or [])
    tainted = any(t.get("key") == UNSCHEDULABLE_TAINT and t.get("effect") == "NoSchedule" for t in taints)
    if spec.get("unschedulable") and not tainted:
        patch["spec"] = {"taints": [*taints, {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule", "timeAdded": now}]}
    elif not spec.get("unschedulable") and tainted:
        kept = [t for t in taints if t.get("key") != UNSCHEDULABLE_TAINT]
        patch["spec"] = {"taints": kept or None}
    return patch or None


class NodeCorrections:
    """Runs :func:`compute_node_patch` on every node write (from the controllers' loop)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.dirty: set[str] = set()

    def on_write(self, entry: Entry) -> bool:
        if compute_node_patch(entry.obj, "") is None:
            return False
        self.dirty.add(entry.obj["metadata"]["name"])
        return True

    async def process(self) -> None:
        rt = self.engine.registry.lookup("", "v1", "nodes")
        for name in list(self.dirty):
            self.dirty.discard(name)
            entry = self.engine.store.get("nodes", "", name)
            patch = compute_node_patch(entry.obj, self.engine.now()) if entry is not None else None
            if rt is None or entry is None or patch is None:
                continue
            patch.setdefault("metadata", {})["resourceVersion"] = entry.obj["metadata"].get("resourceVersion")
            with contextlib.suppress(APIError):  # a conflict: the write that caused it queues the node again
                await self.engine.patch(rt, "", name, "application/merge-patch+json", json.dumps(patch).encode(),
                                        Ctx(manager="kube-controller-manager"))
