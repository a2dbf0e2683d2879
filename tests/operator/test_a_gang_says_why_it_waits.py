"""A gang the scheduler does not place says why, within the cycle that sees it, and its next
placement avoids the GPUs it could not see: in-process, the operator's reconcile cycle against
tests/operator/fake_cluster.py, the scheduler played by the test as kube-scheduler v1.36 writes
its verdicts (../shared/kube-golden/v1.36-workload 028, v1.36-dra 036-037)."""

from __future__ import annotations

from typing import Any

import pytest
from tests.operator.builders import make_node
from tests.operator.fake_cluster import Harness, make_job

from railyard.handlers import kopf_handlers
from railyard.logic.conditions import find_condition, format_time
from railyard.logic.manifests import CHANNEL_CLAIM, GPU_CLAIM
from railyard.logic.pending import CLAIM_GRACE_S

pytestmark = pytest.mark.asyncio

TIMEOUT_S = 60
#: A pod pinned to a node whose GPUs are all held: what kube-scheduler writes on it.
NO_GPUS = "0/4 nodes are available: 1 Insufficient nvidia.com/gpu, 3 node(s) didn't match Pod's node affinity/selector."
#: What every pod of a gang that fits nowhere reads under Kubernetes' gang scheduling.
GANG_WAITS = (
    "pod group is unschedulable, waiting for minCount pods from a gang to be scheduled, one or more plugins "
    "asked to wait and no plugin rejected pod"
)


def cluster() -> list[dict[str, Any]]:
    """Two leaves of two nodes, 2 GPUs each: a 2-node gang fits in either leaf, leaf-0 first."""
    return [make_node(f"node-{i}", gpus=2, leaf=f"leaf-{i // 2}") for i in range(4)]


def foreign_pod(name: str, node: str, *, namespace: str = "other-team", gpus: int = 2) -> dict[str, Any]:
    """Another namespace's Running pod holding ``gpus`` GPUs of ``node`` (not a Railyard pod)."""
    return {
        "metadata": {"name": name, "namespace": namespace, "labels": {}},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
        },
        "status": {"phase": "Running"},
    }


def harness() -> Harness:
    return Harness(cluster(), make_job(gang={"scheduleTimeoutSeconds": TIMEOUT_S}))


def refuse(h: Harness, index: int, message: str = NO_GPUS) -> None:
    """The scheduler leaves pod ``index`` of the current attempt unbound, and says why."""
    pod = h.cluster.pods_of(h.status.attempt)[index]
    pod["spec"].pop("nodeName", None)
    pod["status"] = {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": message,
                "lastProbeTime": None,
                "lastTransitionTime": format_time(h.now),
                "observedGeneration": 1,
            }
        ],
    }


async def test_a_gpu_held_by_a_pod_of_another_namespace_is_never_chosen() -> None:
    # without it the gang goes to the first leaf
    alone = harness()
    await alone.cycle()
    assert alone.pod_nodes() == ["node-0", "node-1"]
    # an operator watching every namespace has the other team's pods in its bound-pods index
    # (kopf_handlers.railyard_bound_pods has no namespace filter; the fake fills it the same way)
    held = foreign_pod("their-trainer", "node-1")
    assert await kopf_handlers.railyard_bound_pods(spec=held["spec"], body=held) == {
        "node-1": kopf_handlers.compact_pod(held)
    }
    h = harness()
    h.cluster.pods["their-trainer"] = held
    await h.cycle()
    assert h.status.phase == "Starting"
    assert h.pod_nodes() == ["node-2", "node-3"]
    # and for every attempt after: the gang times out, is placed again, never on node-1
    h.cluster.scheduler_binds = False
    for _ in range(3):
        attempt = h.status.attempt
        await h.cycle(TIMEOUT_S + 1)
        h.cluster.finish_deletions()
        for _ in range(8):
            if h.status.attempt > attempt and h.status.phase == "Starting":
                break
            await h.cycle(30)
        assert h.status.phase == "Starting", h.cluster.events
        assert "node-1" not in h.pod_nodes()


async def test_the_schedulers_reason_is_in_the_condition_within_one_cycle() -> None:
    h = harness()
    h.cluster.scheduler_binds = False
    await h.cycle()
    assert "released together" in h.status.message
    refuse(h, 0)
    refuse(h, 1, GANG_WAITS)
    await h.cycle(1.0)
    placed = find_condition(h.status.conditions, "Placed")
    assert h.status.phase == "Starting" and placed is not None and placed.reason == "Unschedulable"
    assert "1 Insufficient nvidia.com/gpu" in h.status.message and "pinned to node node-0" in h.status.message
    assert ("Warning", "Unschedulable") in [(kind, reason) for kind, reason, _ in h.cluster.events]
    # said once: the next cycles write nothing new
    events = len(h.cluster.events)
    await h.cycle(1.0)
    assert len(h.cluster.events) == events
    # scheduled after all: the usual message again
    for pod in h.cluster.pods_of(h.status.attempt):
        pod["status"] = {"phase": "Pending"}
    await h.cycle(1.0)
    placed = find_condition(h.status.conditions, "Placed")
    assert placed is not None and placed.reason == "GangStarting"
    assert "waiting for the rest" in h.status.message


async def test_a_namespaced_operator_leaves_out_the_nodes_the_scheduler_refuses() -> None:
    # the other team's pod on node-0 is in a namespace this operator does not watch: not in
    # its index, so the first placement chooses node-0; the scheduler refuses the pod there
    h = harness()
    h.cluster.scheduler_binds = False
    await h.cycle()
    assert h.pod_nodes() == ["node-0", "node-1"]
    refuse(h, 0)
    await h.cycle(1.0)
    assert "Insufficient nvidia.com/gpu" in h.status.message
    await h.cycle(TIMEOUT_S)
    assert h.status.phase in ("Placing", "Restarting") and "GangTimeout" in h.reasons()
    h.cluster.finish_deletions()
    for _ in range(8):
        if h.status.phase == "Starting":
            break
        await h.cycle(30)
    assert h.status.phase == "Starting", h.cluster.events
    assert "node-0" not in h.pod_nodes(), h.pod_nodes()


async def test_a_compute_domain_without_the_nvidia_dra_driver_says_what_to_install() -> None:
    h = Harness(cluster(), make_job(gpuClaim={"computeDomain": True}, gang={"scheduleTimeoutSeconds": TIMEOUT_S}))
    h.cluster.scheduler_binds = False
    await h.cycle()
    assert h.status.phase == "Starting"
    pods = h.cluster.pods_of(h.status.attempt)
    assert [c["name"] for c in pods[0]["spec"]["resourceClaims"]] == [GPU_CLAIM, CHANNEL_CLAIM]
    for pod in pods:
        # kube-controller-manager made the GPU claim from the operator's template; the channel's
        # template is the driver's to make, and no driver runs: no claim, no scheduling
        pod["metadata"]["creationTimestamp"] = format_time(h.now)
        pod["status"] = {
            "phase": "Pending",
            "resourceClaimStatuses": [
                {"name": GPU_CLAIM, "resourceClaimName": f"{pod['metadata']['name']}-gpus-x7k2p"}
            ],
        }
    await h.cycle(1.0)
    early = find_condition(h.status.conditions, "Placed")
    assert early is not None and early.reason != "ComputeDomainDriverMissing"
    await h.cycle(CLAIM_GRACE_S)
    placed = find_condition(h.status.conditions, "Placed")
    assert placed is not None and placed.reason == "ComputeDomainDriverMissing", h.status.message
    assert "NVIDIA DRA driver for GPUs" in h.status.message and "-channel" in h.status.message


async def test_with_kubernetes_gang_scheduling_the_podgroup_says_it_too() -> None:
    h = Harness(cluster(), make_job(gang={"scheduler": "kubernetes", "scheduleTimeoutSeconds": TIMEOUT_S}))
    h.cluster.scheduler_binds = False
    await h.cycle()
    group = next(name for kind, name in h.cluster.objects if kind == "PodGroup")
    await h.cycle(1.0)
    assert ("read", f"PodGroup/{group}") not in h.cluster.calls  # nothing refused: nothing to read
    # v1.36-workload 027-028: every pod of a gang that fits in no leaf, and its group
    for index in range(2):
        refuse(h, index, GANG_WAITS)
    unschedulable = {"type": "PodGroupScheduled", "status": "False", "reason": "Unschedulable",
                     "message": "0/2 placements are available, first placement status: pod group is unschedulable"}
    h.cluster.objects[("PodGroup", group)]["status"] = {"conditions": [unschedulable]}
    await h.cycle(1.0)
    placed = find_condition(h.status.conditions, "Placed")
    assert placed is not None and placed.reason == "Unschedulable"
    assert f"PodGroup {group} Unschedulable: 0/2 placements are available" in h.status.message
    assert "waiting for minCount pods" in h.status.message


async def test_gpus_a_dra_claim_holds_on_a_node_count_too() -> None:
    # a Railyard gang of another namespace with spec.gpuClaim: no nvidia.com/gpu request, the
    # claimed GPUs in an annotation that the operator's pod index must keep
    h = harness()
    held = foreign_pod("their-a0-0", "node-1", gpus=0)
    held["metadata"]["annotations"] = {"railyard.dev/claimed-gpus": "2", "railyard.dev/node": "node-1"}
    h.cluster.pods["their-a0-0"] = held
    await h.cycle()
    assert h.status.phase == "Starting"
    assert h.pod_nodes() == ["node-2", "node-3"]


async def test_a_refusal_the_operator_can_explain_does_not_hold_the_node() -> None:
    # a pod the operator sees was bound to node-0 after the placement: the scheduler's refusal is
    # what the operator counts too, so node-0 is free for the job again once that pod is gone
    h = harness()
    h.cluster.scheduler_binds = False
    await h.cycle()
    assert h.pod_nodes() == ["node-0", "node-1"]
    h.cluster.pods["late"] = foreign_pod("late", "node-0", namespace="ns")
    refuse(h, 0)
    await h.cycle(1.0)
    assert "Insufficient nvidia.com/gpu" in h.status.message
    assert h.worker.refused_nodes == {}
    # unseen: held
    del h.cluster.pods["late"]
    await h.cycle(1.0)
    assert set(h.worker.refused_nodes) == {"node-0"}
