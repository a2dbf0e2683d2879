"""The gang's PodDisruptionBudget: an eviction of a training pod (``kubectl drain``, the
eviction API, a cluster autoscaler) is refused with 429 while the operator moves the pod itself
at a step boundary (docs/disruptions.md). The operator's own deletions are not evictions: a
PodDisruptionBudget never stops the operator.

What the real API server recorded (../shared/kube-golden/v1.36-disruption): a budget with
``maxUnavailable`` (or any percentage) over pods whose controller has no ``/scale`` subresource
(a TrainingJob has none) allows no disruption ever and raises ``UnmanagedPods``; an integer
``minAvailable`` is counted from the pods alone. So the budget is ``minAvailable`` = the gang's
pod count: no training pod may be evicted while the gang is whole. Only the training pods are
selected (they carry a pod index): the hot spares' placeholders and the Lighthouse may go.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from railyard.logic.manifests.names import JOB_LABEL, POD_INDEX_LABEL, job_labels, object_meta

PDB_API_VERSION = "policy/v1"


def disruption_budget_name(job: str) -> str:
    """One budget per job, kept across attempts (its selector names no attempt)."""
    return job


def build_disruption_budget(job: str, namespace: str, owner: Mapping[str, Any], *, pods: int) -> dict[str, Any]:
    """The job's PodDisruptionBudget over its ``pods`` training pods (``minAvailable: pods``)."""
    if pods < 1:
        raise ValueError(f"a PodDisruptionBudget covers at least one pod, got pods={pods}")
    return {
        "apiVersion": PDB_API_VERSION,
        "kind": "PodDisruptionBudget",
        "metadata": object_meta(disruption_budget_name(job), namespace, job_labels(job), owner),
        "spec": {
            "minAvailable": pods,
            "selector": {
                "matchLabels": {JOB_LABEL: job},
                # training pods only: placeholders and the Lighthouse carry no pod index
                "matchExpressions": [{"key": POD_INDEX_LABEL, "operator": "Exists"}],
            },
        },
    }


def disruption_budget_differs(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Whether an existing budget must be replaced by ``wanted`` (a new attempt with another pod
    count). Replaced rather than patched: the operator's RBAC grants no update of budgets."""
    have, want = current.get("spec") or {}, wanted.get("spec") or {}
    return have.get("minAvailable") != want.get("minAvailable") or have.get("selector") != want.get("selector")
