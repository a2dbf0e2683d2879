"""Chained builders of Pod and Node dicts for the operator's pure unit tests."""

from __future__ import annotations

import copy
from typing import Any


class PodBuilder:
    def __init__(self, job: str = "j", attempt: int = 0, index: int = 0, node: str = "node-0") -> None:
        self._obj: dict[str, Any] = {
            "metadata": {
                "name": f"{job}-a{attempt}-{index}",
                "labels": {"railyard.dev/job": job, "railyard.dev/attempt": str(attempt), "railyard.dev/pod-index": str(index)},
            },
            "spec": {"nodeName": node},
            "status": {"phase": "Running"},
        }

    def phase(self, phase: str) -> PodBuilder:
        self._obj["status"]["phase"] = phase
        return self

    def gated(self) -> PodBuilder:
        self._obj["spec"]["schedulingGates"] = [{"name": "railyard.dev/gang"}]
        self._obj["spec"].pop("nodeName", None)
        self._obj["status"]["phase"] = "Pending"
        return self

    def unbound(self) -> PodBuilder:
        """Created and released, not yet bound: Pending, pinned to its node by the placement."""
        node = self._obj["spec"].pop("nodeName", "")
        self._obj["metadata"]["annotations"] = {"railyard.dev/node": node}
        self._obj["status"]["phase"] = "Pending"
        return self

    def exited(self, code: int, reason: str = "Error") -> PodBuilder:
        self._obj["status"]["phase"] = "Succeeded" if code == 0 else "Failed"
        self._obj["status"]["containerStatuses"] = [{"name": "trainer", "state": {"terminated": {"exitCode": code, "reason": reason}}}]
        return self

    def evicted(self) -> PodBuilder:
        self._obj["status"].update({"phase": "Failed", "reason": "Evicted", "message": "The node was low on memory."})
        return self

    def condition(self, ctype: str, message: str = "") -> PodBuilder:
        self._obj["status"].setdefault("conditions", []).append({"type": ctype, "status": "True", "message": message})
        return self

    def deleting(self, since: str = "2026-01-01T00:00:00Z") -> PodBuilder:
        self._obj["metadata"]["deletionTimestamp"] = since
        return self

    def obj(self) -> dict[str, Any]:
        return copy.deepcopy(self._obj)


def make_pod(job: str = "j", attempt: int = 0, index: int = 0, node: str = "node-0") -> PodBuilder:
    return PodBuilder(job, attempt, index, node)


def make_node(name: str, *, ready: bool = True, since: str = "2026-01-01T00:00:00Z", gpus: int = 8,
              leaf: str = "leaf-0", spine: str = "spine-0", labels: dict[str, str] | None = None,
              taints: list[dict[str, str]] | None = None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "railyard.dev/leaf": leaf, "railyard.dev/spine": spine, **(labels or {})},
            "annotations": dict(annotations or {}),
        },
        "spec": {"taints": list(taints or [])},
        "status": {
            "conditions": [{"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": since}],
            "allocatable": {"nvidia.com/gpu": str(gpus)},
        },
    }
