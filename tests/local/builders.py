"""Chained builders for test pods and nodes (plain dicts, as the API returns them)."""

from __future__ import annotations

import copy
from typing import Any


class PodBuilder:
    def __init__(self, name: str = "p", namespace: str | None = None) -> None:
        meta: dict[str, Any] = {"name": name, "labels": {}}
        if namespace:
            meta["namespace"] = namespace
        self._obj: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": meta,
            "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "none", "command": ["true"]}]},
        }

    @property
    def spec(self) -> dict[str, Any]:
        return self._obj["spec"]

    @property
    def main(self) -> dict[str, Any]:
        return self.spec["containers"][0]

    def requests(self, **res: str) -> PodBuilder:
        self.main.setdefault("resources", {})["requests"] = {k.replace("_", "/").replace("gpu/", "nvidia.com/gpu"): v for k, v in res.items()}
        return self

    def gpus(self, n: int) -> PodBuilder:
        self.main.setdefault("resources", {}).setdefault("limits", {})["nvidia.com/gpu"] = str(n)
        return self

    def claim(self, template: str, name: str = "gpus") -> PodBuilder:
        """Claim devices by Dynamic Resource Allocation: one claim per pod from ``template``."""
        self.spec.setdefault("resourceClaims", []).append({"name": name, "resourceClaimTemplateName": template})
        self.main.setdefault("resources", {}).setdefault("claims", []).append({"name": name})
        return self

    def node_selector(self, **labels: str) -> PodBuilder:
        self.spec["nodeSelector"] = labels
        return self

    def affinity(self, *terms: dict[str, Any]) -> PodBuilder:
        self.spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}
        return self

    def toleration(self, **tol: str) -> PodBuilder:
        self.spec.setdefault("tolerations", []).append(tol)
        return self

    def gate(self, name: str = "railyard.dev/gang") -> PodBuilder:
        self.spec.setdefault("schedulingGates", []).append({"name": name})
        return self

    def group(self, name: str) -> PodBuilder:
        """Join the PodGroup ``name`` (scheduling.k8s.io/v1alpha2 gang scheduling)."""
        self.spec["schedulingGroup"] = {"podGroupName": name}
        return self

    def pin(self, node: str) -> PodBuilder:
        """Required node affinity to one node, as the operator pins a gang's pods."""
        return self.affinity({"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]})

    def command(self, *argv: str) -> PodBuilder:
        self.main["command"] = list(argv)
        return self

    def env(self, *items: dict[str, Any]) -> PodBuilder:
        self.main.setdefault("env", []).extend(items)
        return self

    def on_node(self, node: str) -> PodBuilder:
        self.spec["nodeName"] = node
        return self

    def obj(self) -> dict[str, Any]:
        return copy.deepcopy(self._obj)


def make_pod(name: str = "p", namespace: str | None = None) -> PodBuilder:
    return PodBuilder(name, namespace)


def make_node(name: str, *, cpu: str = "16", memory: str = "64Gi", gpus: int = 0, pods: int = 110,
              labels: dict[str, str] | None = None, taints: list[dict[str, str]] | None = None,
              ready: bool = True, unschedulable: bool = False) -> dict[str, Any]:
    alloc = {"cpu": cpu, "memory": memory, "pods": str(pods)}
    if gpus:
        alloc["nvidia.com/gpu"] = str(gpus)
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": {"taints": taints or [], "unschedulable": unschedulable},
        "status": {"allocatable": alloc, "capacity": alloc,
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }
