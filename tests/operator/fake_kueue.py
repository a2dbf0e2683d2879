"""Kueue's part for in-process tests, as a real Kueue v0.13.1 played it in
kube-golden/kueue-v0.13-workload: one ClusterQueue ``railyard-cq`` with a GPU quota in flavor
``gpu-a100``, reached through LocalQueue ``team-a``. :meth:`FakeKueue.schedule` is one pass of
Kueue's scheduler: it admits, in priority order, what fits the unused quota and writes on the rest
the condition and message Kueue wrote (records 008, 020, 022, 027); a Finished Workload no longer
counts (031-033). Shared by the FakeClusters of several jobs (two jobs, one quota)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from railyard.api.quantity import format_quantity, parse_quantity

GPU = "nvidia.com/gpu"
#: Kueue v0.13.1's CRD schemas, vendored with their source and commit.
SCHEMAS = Path(__file__).resolve().parents[1] / "deployment" / "schemas"
SCHEMA = SCHEMAS / "kueue.x-k8s.io_v1beta1_Workload.json"
#: The kinds the record's cluster served, by their version there (kueue-v0.13-workload/README.md).
KUEUE_KINDS = {"Workload": "v1beta1", "ResourceFlavor": "v1beta1", "ClusterQueue": "v1beta1", "LocalQueue": "v1beta1",
               "WorkloadPriorityClass": "v1beta1", "Topology": "v1alpha1"}


def kueue_crd(kind: str) -> dict[str, Any]:
    """A vendored schema as a CustomResourceDefinition (names, scope, printer columns, subresources)."""
    version = KUEUE_KINDS[kind]
    vendored = json.loads((SCHEMAS / f"kueue.x-k8s.io_{version}_{kind}.json").read_text())
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{vendored['names']['plural']}.kueue.x-k8s.io"},
        "spec": {"group": "kueue.x-k8s.io", "scope": vendored.get("scope", "Namespaced"), "names": vendored["names"],
                 "versions": [{
                     "name": version, "served": True, "storage": True,
                     "schema": {"openAPIV3Schema": vendored["openAPIV3Schema"]},
                     "subresources": vendored["subresources"],
                     "additionalPrinterColumns": vendored["additionalPrinterColumns"]}]},
    }


def kueue_workload_crd() -> dict[str, Any]:
    return kueue_crd("Workload")


def _condition(ctype: str, status: str, reason: str, message: str) -> dict[str, Any]:
    return {"type": ctype, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1}


def _set(workload: dict[str, Any], cond: dict[str, Any]) -> None:
    conds = workload.setdefault("status", {}).setdefault("conditions", [])
    conds[:] = [c for c in conds if c["type"] != cond["type"]] + [cond]


def is_true(workload: dict[str, Any], ctype: str) -> bool:
    return any(c["type"] == ctype and c["status"] == "True" for c in (workload.get("status") or {}).get("conditions") or ())


class FakeKueue:
    def __init__(self, *, gpus: int = 4, local_queue: str = "team-a", cluster_queue: str = "railyard-cq",
                 flavor: str = "gpu-a100") -> None:
        self.gpus, self.local_queue, self.cluster_queue, self.flavor = gpus, local_queue, cluster_queue, flavor
        #: name -> ResourceFlavor (record 000/012 has nodeLabels and a toleration; tests add them)
        self.flavors: dict[str, dict[str, Any]] = {flavor: {"metadata": {"name": flavor}, "spec": {}}}
        #: (namespace, name) -> Workload, as stored (creation order kept)
        self.workloads: dict[tuple[str, str], dict[str, Any]] = {}

    def add(self, workload: dict[str, Any]) -> bool:
        key = (workload["metadata"]["namespace"], workload["metadata"]["name"])
        if key in self.workloads:
            return False
        stored = copy.deepcopy(workload)
        stored["spec"].setdefault("active", True)  # the only default Kueue adds (record 007)
        self.workloads[key] = stored
        return True

    @staticmethod
    def usage(workload: dict[str, Any]) -> dict[str, str]:
        """What the Workload's pod sets request together (``resourceUsage`` of record 008)."""
        total: dict[str, Any] = {}
        like: dict[str, str] = {}
        for pod_set in workload["spec"]["podSets"]:
            for container in pod_set["template"]["spec"]["containers"]:
                for res, value in ((container.get("resources") or {}).get("requests") or {}).items():
                    total[res] = total.get(res, 0) + parse_quantity(str(value)) * pod_set["count"]
                    like[res] = str(value)
        return {res: format_quantity(v, like=like[res]) for res, v in sorted(total.items())}

    def _gpus(self, workload: dict[str, Any]) -> int:
        return int(parse_quantity(self.usage(workload).get(GPU, "0")))

    def _holds_quota(self, workload: dict[str, Any]) -> bool:
        """Admitted and not Finished; a deactivated Workload leaves Kueue's cache at once (052),
        an evicted one holds its quota until its owner acknowledges (041)."""
        return is_true(workload, "QuotaReserved") and not is_true(workload, "Finished") and workload["spec"].get("active", True)

    def schedule(self) -> None:
        used = sum(self._gpus(w) for w in self.workloads.values() if self._holds_quota(w))
        waiting = [w for w in self.workloads.values()
                   if not is_true(w, "QuotaReserved") and not is_true(w, "Finished") and w["spec"].get("active", True)]
        waiting.sort(key=lambda w: -int(w["spec"].get("priority") or 0))  # stable: then in creation order
        for wl in waiting:
            if wl["spec"]["queueName"] != self.local_queue:
                _set(wl, _condition("QuotaReserved", "False", "Inadmissible",
                                    f"LocalQueue {wl['spec']['queueName']} doesn't exist"))
                continue
            need = self._gpus(wl)
            pod_set = wl["spec"]["podSets"][0]["name"]
            wl.setdefault("status", {})["resourceRequests"] = [{"name": ps["name"], "resources": self.usage({"spec": {"podSets": [ps]}})}
                                                for ps in wl["spec"]["podSets"]]
            if need > self.gpus:
                _set(wl, _condition("QuotaReserved", "False", "Pending",
                                    f"couldn't assign flavors to pod set {pod_set}: insufficient quota for {GPU} in flavor "
                                    f"{self.flavor}, request > maximum capacity ({need} > {self.gpus})"))
            elif used + need > self.gpus and self._preempt_for(wl, need - (self.gpus - used)):
                _set(wl, _condition("QuotaReserved", "False", "Pending",
                                    f"couldn't assign flavors to pod set {pod_set}: insufficient unused quota for {GPU} in "
                                    f"flavor {self.flavor}, {used + need - self.gpus} more needed. Pending the preemption "
                                    f"of {self._evicting()} workload(s)"))
            elif used + need > self.gpus:
                _set(wl, _condition("QuotaReserved", "False", "Pending",
                                    f"couldn't assign flavors to pod set {pod_set}: insufficient unused quota for {GPU} in "
                                    f"flavor {self.flavor}, {used + need - self.gpus} more needed"))
            else:
                self.admit(wl)
                used += need

    def _evicting(self) -> int:
        return sum(1 for w in self.workloads.values() if is_true(w, "Evicted") and is_true(w, "QuotaReserved"))

    def _preempt_for(self, preemptor: dict[str, Any], short: int) -> bool:
        """``preemption.withinClusterQueue: LowerPriority`` (record 001): evict admitted Workloads
        of lower priority, lowest first, until ``short`` GPUs would be free; True when that is
        possible (the evicted ones keep their quota until acknowledged, 038-041)."""
        mine = int(preemptor["spec"].get("priority") or 0)
        victims = sorted((w for w in self.workloads.values() if self._holds_quota(w)
                          and int(w["spec"].get("priority") or 0) < mine), key=lambda w: int(w["spec"].get("priority") or 0))
        freed, chosen = 0, []
        for victim in victims:
            if freed >= short:
                break
            chosen.append(victim)
            freed += self._gpus(victim)
        if freed < short:
            return False
        for victim in chosen:
            if not is_true(victim, "Evicted"):
                self._preempt(victim, preemptor)
        return True

    @staticmethod
    def _preempt(victim: dict[str, Any], preemptor: dict[str, Any]) -> None:
        """What Kueue writes on a preempted Workload (038): it keeps its quota until acknowledged."""
        said = (f"Preempted to accommodate a workload (UID: uid-{preemptor['metadata']['name']}, JobUID: "
                f"{preemptor['metadata'].get('labels', {}).get('kueue.x-k8s.io/job-uid', 'UNKNOWN')}) "
                "due to prioritization in the ClusterQueue")
        _set(victim, _condition("Evicted", "True", "Preempted", said))
        _set(victim, _condition("Preempted", "True", "InClusterQueue", said))

    def preempt(self, namespace: str, name: str, *, by: str) -> None:
        """Workload ``name`` preempted for a higher-priority one named ``by`` (as :meth:`schedule`
        does when that one arrives), without running the preemptor."""
        self._preempt(self.workloads[(namespace, name)], {"metadata": {"name": by}})

    def deactivate(self, namespace: str, name: str) -> None:
        """A person sets ``spec.active: false`` (050): Evicted=True reason Deactivated (051)."""
        workload = self.workloads[(namespace, name)]
        workload["spec"]["active"] = False
        _set(workload, _condition("Evicted", "True", "Deactivated", "The workload is deactivated"))

    def acknowledge(self, namespace: str, name: str, patch: dict[str, Any]) -> bool:
        """The owner's merge patch on /status (054): conditions replaced, ``status.admission``
        gone; refused (409, False) when the Workload changed since the owner read it."""
        workload = self.workloads.get((namespace, name))
        if workload is None:
            return False
        version = patch.get("metadata", {}).get("resourceVersion")
        if version is not None and version != workload["metadata"].get("resourceVersion"):
            return False
        workload["status"]["conditions"] = copy.deepcopy(patch["status"]["conditions"])
        workload["status"].pop("admission", None)
        return True

    def admit(self, workload: dict[str, Any]) -> None:
        """What Kueue writes on admission (record 008); an earlier eviction's Evicted and
        Preempted flip to False (046)."""
        for ctype in ("Evicted", "Preempted"):
            if is_true(workload, ctype):
                _set(workload, _condition(ctype, "False", "QuotaReserved", "Previously: evicted"))
        status = workload.setdefault("status", {})
        status.pop("resourceRequests", None)
        status["admission"] = {"clusterQueue": self.cluster_queue, "podSetAssignments": [
            {"name": ps["name"], "count": ps["count"],
             "flavors": {res: self.flavor for res in self.usage({"spec": {"podSets": [ps]}})},
             "resourceUsage": self.usage({"spec": {"podSets": [ps]}})}
            for ps in workload["spec"]["podSets"]]}
        _set(workload, _condition("QuotaReserved", "True", "QuotaReserved", f"Quota reserved in ClusterQueue {self.cluster_queue}"))
        _set(workload, _condition("Admitted", "True", "Admitted", "The workload is admitted"))

    def finish(self, namespace: str, name: str, conditions: list[dict[str, Any]]) -> bool:
        """The owner's server-side apply on /status (record 031): conditions merge by type."""
        workload = self.workloads.get((namespace, name))
        if workload is None:
            return False
        for cond in conditions:
            _set(workload, copy.deepcopy(cond))
        return True

    def used_gpus(self) -> int:
        return sum(self._gpus(w) for w in self.workloads.values() if self._holds_quota(w))
