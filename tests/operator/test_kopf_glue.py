"""The kopf module is glue only: compact index copies, and events that wake the right worker."""

from __future__ import annotations

import kopf
import pytest
from prometheus_client import CollectorRegistry

from railyard.handlers import kopf_handlers
from railyard.handlers.runtime import JobWorker, OperatorSettings, Runtime


@pytest.fixture
def memo() -> kopf.Memo:
    return kopf_handlers.build_memo(OperatorSettings(metrics_port=0, registry=CollectorRegistry()))


def test_index_copies_keep_only_what_the_decisions_read() -> None:
    pod = {"metadata": {"name": "p", "namespace": "ns", "labels": {"a": "b"}, "managedFields": [{"x": 1}],
                        "annotations": {"railyard.dev/node": "n", "kubectl.kubernetes.io/last-applied-configuration": "{}"}},
           "spec": {"nodeName": "n", "containers": [{"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "2"}}}], "volumes": [{}]},
           "status": {"phase": "Running", "podIP": "1.2.3.4"}}
    small = kopf_handlers.compact_pod(pod)
    assert small == {"metadata": {"name": "p", "namespace": "ns", "labels": {"a": "b"}, "annotations": {"railyard.dev/node": "n"}},
                     "spec": {"nodeName": "n", "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]},
                     "status": {"phase": "Running"}}
    node = {"metadata": {"name": "n", "labels": {"x": "y"}, "annotations": {}, "managedFields": []},
            "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}], "podCIDR": "10.0.0.0/24"},
            "status": {"conditions": [{"type": "Ready", "status": "True"}], "allocatable": {"nvidia.com/gpu": "8"}, "images": [1]}}
    assert set(kopf_handlers.compact_node(node)["status"]) == {"conditions", "allocatable"}
    assert "podCIDR" not in kopf_handlers.compact_node(node)["spec"]


def test_index_copies_keep_the_pods_dra_claims_and_the_schedulers_verdict() -> None:
    # what logic/pending.py reads: the claims from templates, the claims made, PodScheduled
    scheduled = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/6 nodes"}
    made = [{"name": "gpus", "resourceClaimName": "p-gpus-x"}]
    claims = [{"name": "gpus", "resourceClaimTemplateName": "t"}, {"name": "c", "resourceClaimName": "shared"}]
    annotations = {"railyard.dev/claimed-gpus": "4", "x": "y"}
    pod = {"metadata": {"name": "p", "namespace": "ns", "labels": {}, "annotations": annotations},
           "spec": {"containers": [], "resourceClaims": claims},
           "status": {"phase": "Pending", "conditions": [scheduled], "resourceClaimStatuses": made,
                      "qosClass": "BestEffort"}}
    small = kopf_handlers.compact_pod(pod)
    assert small["spec"]["resourceClaims"] == claims[:1]
    assert small["metadata"]["annotations"] == {"railyard.dev/claimed-gpus": "4"}  # placement counts them
    assert small["status"] == {"phase": "Pending", "conditions": [scheduled], "resourceClaimStatuses": made}


async def test_a_pod_event_wakes_only_its_jobs_worker(memo: kopf.Memo) -> None:
    rt = kopf_handlers.runtime_of(memo)
    mine, other = JobWorker("ns", "j"), JobWorker("ns", "k")
    rt.workers[("ns", "j")], rt.workers[("ns", "k")] = mine, other
    await kopf_handlers.on_event_pod(namespace="ns", labels={"railyard.dev/job": "j"}, memo=memo, railyard_job_pods={})
    assert mine.wake.is_set() and not other.wake.is_set()
    assert rt.reconcile is not None and rt.job_pods == {}


def test_the_runtime_lives_in_kopfs_memo_not_in_the_module(memo: kopf.Memo) -> None:
    rt = kopf_handlers.runtime_of(memo)
    assert isinstance(rt, Runtime) and memo.runtime is rt and kopf_handlers.runtime_of(memo) is rt
    assert not any(isinstance(v, Runtime) for v in vars(kopf_handlers).values())
