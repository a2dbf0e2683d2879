"""Why a created gang waits, read from its pods as the real scheduler and kube-controller-manager
leave them (logic/pending.py), and which nodes the scheduler keeps refusing. The conditions and
messages below are those recorded from kube-scheduler v1.36 (../shared/kube-golden/v1.36-workload
027-029, v1.36-dra 020-023 and 036-037)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from railyard.handlers.kopf_handlers import compact_pod
from railyard.logic.conditions import format_time
from railyard.logic.pending import (
    CLAIM_GRACE_S,
    REFUSED_NODE_HOLD_S,
    PendingReason,
    decide_pending_reason,
    decide_refused_nodes,
    find_gpu_shortages,
)

NOW = 1_767_225_600.0
#: v1.36-workload 028: every pod of a gang that fits in no leaf
GANG_WAITS = (
    "pod group is unschedulable, waiting for minCount pods from a gang to be scheduled, one or more plugins asked to "
    "wait and no plugin rejected pod"
)
#: v1.36-workload 029 (the Event) and what a pod pinned to a full node reads
NO_GPUS = "0/6 nodes are available: 1 Insufficient nvidia.com/gpu, 5 node(s) didn't match Pod's node affinity/selector."
#: v1.36-dra 021
NO_DEVICES = (
    "0/6 nodes are available: 6 cannot allocate all claims. still not schedulable, preemption: "
    "0/6 nodes are available: 6 Preemption is not helpful for scheduling."
)
#: v1.36 (a cordoned node)
CORDONED = (
    "0/6 nodes are available: 1 node(s) were unschedulable, 5 node(s) didn't match Pod's node affinity/selector. "
    "no new claims to deallocate, preemption: 0/6 nodes are available: 6 Preemption is not helpful for scheduling."
)
#: v1.36-workload 027
GROUP_WAITS = {
    "type": "PodGroupScheduled",
    "status": "False",
    "reason": "Unschedulable",
    "message": "0/2 placements are available, first placement status: pod group is unschedulable",
}


def pod(
    name: str,
    node: str,
    *,
    scheduled: str | None = None,
    bound: bool = False,
    age: float = 30.0,
    claims: tuple[tuple[str, str], ...] = (),
    made: tuple[str, ...] = (),
    phase: str = "Pending",
    gpus: int = 8,
) -> dict[str, Any]:
    """A compact gang pod pinned to ``node`` asking for ``gpus``; ``scheduled``: the
    scheduler's Unschedulable message."""
    status: dict[str, Any] = {"phase": phase}
    if scheduled is not None:
        status["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": scheduled,
                "lastProbeTime": None,
                "observedGeneration": 1,
            }
        ]
    if made:
        status["resourceClaimStatuses"] = [{"name": c, "resourceClaimName": f"{name}-{c}-x7k2p"} for c in made]
    spec: dict[str, Any] = {"containers": [{"name": "trainer", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}
    if bound:
        spec["nodeName"] = node
    if claims:
        spec["resourceClaims"] = [{"name": c, "resourceClaimTemplateName": t} for c, t in claims]
    return {
        "metadata": {
            "name": name,
            "creationTimestamp": format_time(NOW - age),
            "annotations": {"railyard.dev/node": node},
        },
        "spec": spec,
        "status": status,
    }


GPU_AND_CHANNEL = (("gpus", "j-gpus-0a1b2c3d"), ("channel", "j-nvlink-2-channel"))

REASONS: list[tuple[str, list[dict[str, Any]], dict[str, Any], PendingReason | None]] = [
    ("nothing said yet", [pod("j-a0-0", "n1"), pod("j-a0-1", "n2")], {}, None),
    ("bound and starting", [pod("j-a0-0", "n1", bound=True), pod("j-a0-1", "n2", bound=True)], {}, None),
    (
        "a full node",
        [pod("j-a0-0", "n1", scheduled=NO_GPUS), pod("j-a0-1", "n2", bound=True)],
        {},
        PendingReason(
            "Unschedulable",
            "the scheduler left 1/2 pods unscheduled: " + NO_GPUS.rstrip(".") + " (pod j-a0-0, pinned to node n1)",
        ),
    ),
    (
        "a gang that fits in no leaf, the node's reason preferred",
        [pod("j-a0-0", "n1", scheduled=GANG_WAITS), pod("j-a0-1", "n2", scheduled=NO_GPUS)],
        {},
        PendingReason(
            "Unschedulable",
            "the scheduler left 2/2 pods unscheduled: " + NO_GPUS.rstrip(".") + " (pod j-a0-1, pinned to node n2)",
        ),
    ),
    (
        "a gang that fits in no leaf, with its PodGroup",
        [pod("j-a0-0", "n1", scheduled=GANG_WAITS), pod("j-a0-1", "n2", scheduled=GANG_WAITS)],
        {"group_condition": GROUP_WAITS, "group": "j-a0"},
        PendingReason(
            "Unschedulable",
            f"the scheduler left 2/2 pods unscheduled: {GANG_WAITS} (pod j-a0-0, pinned to node n1); "
            f"PodGroup j-a0 Unschedulable: {GROUP_WAITS['message']}",
        ),
    ),
    (
        "the PodGroup alone",
        [pod("j-a0-0", "n1")],
        {"group_condition": GROUP_WAITS, "group": "j-a0"},
        PendingReason("Unschedulable", f"PodGroup j-a0 Unschedulable: {GROUP_WAITS['message']}"),
    ),
    (
        "a scheduled PodGroup says nothing",
        [pod("j-a0-0", "n1")],
        {"group_condition": {"type": "PodGroupScheduled", "status": "True", "reason": "Scheduled"}},
        None,
    ),
    (
        "a pod being deleted says nothing",
        [
            {
                **pod("j-a0-0", "n1", scheduled=NO_GPUS),
                "metadata": {"name": "j-a0-0", "deletionTimestamp": "2026-01-01T00:00:00Z"},
            }
        ],
        {},
        None,
    ),
    ("claims made in time", [pod("j-a0-0", "n1", claims=GPU_AND_CHANNEL, made=("gpus", "channel"))], {}, None),
    (
        "claims still within the grace",
        [pod("j-a0-0", "n1", claims=GPU_AND_CHANNEL, made=("gpus",), age=CLAIM_GRACE_S - 1)],
        {},
        None,
    ),
]


@pytest.mark.parametrize(("pods", "kw", "expected"), [r[1:] for r in REASONS], ids=[r[0] for r in REASONS])
def test_the_reason_a_gang_waits(
    pods: list[dict[str, Any]], kw: dict[str, Any], expected: PendingReason | None
) -> None:
    assert decide_pending_reason(pods, now=NOW, **kw) == expected


def test_a_compute_domain_without_the_nvidia_driver_names_the_driver_to_install() -> None:
    # kcm made the GPU claim from our template, but the channel's template is the driver's to make
    pods = [
        pod("j-a0-0", "n1", claims=GPU_AND_CHANNEL, made=("gpus",)),
        pod("j-a0-1", "n2", claims=GPU_AND_CHANNEL, made=("gpus",)),
    ]
    got = decide_pending_reason(pods, now=NOW)
    assert got is not None and got.reason == "ComputeDomainDriverMissing"
    for words in (
        "ComputeDomain controller is not running",
        "j-nvlink-2-channel",
        "FailedResourceClaimCreation",
        "NVIDIA DRA driver for GPUs",
        "k8s-dra-driver-gpu",
        "or remove spec.gpuClaim.computeDomain",
        "1 more pods",
    ):
        assert words in got.message, words
    # the driver's missing claim outweighs the scheduler, which never looked at these pods
    assert decide_pending_reason(
        [{**pods[0], "status": {**pods[0]["status"], **pod("x", "n1", scheduled=NO_GPUS)["status"]}}], now=NOW
    ) == decide_pending_reason(pods[:1], now=NOW)


def test_a_claim_kube_controller_manager_never_made_says_so() -> None:
    got = decide_pending_reason([pod("j-a0-0", "n1", claims=GPU_AND_CHANNEL)], now=NOW)
    assert got is not None and got.reason == "ResourceClaimNotCreated"
    assert "'gpus'" in got.message and "j-gpus-0a1b2c3d" in got.message and "kube-controller-manager" in got.message


HOLD = NOW + REFUSED_NODE_HOLD_S
#: What the operator counts free on each node (its GPUs less those of the bound pods it sees).
ALL_FREE = {"n1": 8, "n2": 8, "n3": 8}

REFUSALS: list[tuple[str, list[dict[str, Any]], dict[str, float], dict[str, int], dict[str, float]]] = [
    ("no GPUs on a pinned node", [pod("j-a0-0", "n1", scheduled=NO_GPUS), pod("j-a0-1", "n2", bound=True)], {},
     ALL_FREE, {"n1": HOLD}),
    ("no DRA devices", [pod("j-a0-0", "n1", scheduled=NO_DEVICES)], {}, ALL_FREE, {"n1": HOLD}),
    ("a cordon is not a GPU shortage (the stale placement handles it)", [pod("j-a0-0", "n1", scheduled=CORDONED)], {},
     ALL_FREE, {}),
    ("the gang's own wait names no node", [pod("j-a0-0", "n1", scheduled=GANG_WAITS)], {}, ALL_FREE, {}),
    # the operator sees why (its own earlier pod still terminating there): its count covers it
    ("a shortage the operator sees", [pod("j-a0-0", "n1", scheduled=NO_GPUS)], {}, {"n1": 0}, {}),
    ("a shortage the operator half sees", [pod("j-a0-0", "n1", scheduled=NO_GPUS, gpus=4)], {}, {"n1": 3}, {}),
    ("enough for this pod as the operator counts", [pod("j-a0-0", "n1", scheduled=NO_GPUS, gpus=4)], {}, {"n1": 4},
     {"n1": HOLD}),
    ("a node the operator does not know", [pod("j-a0-0", "n9", scheduled=NO_GPUS)], {}, ALL_FREE, {}),
    ("held nodes stay until their time", [pod("j-a0-0", "n1")], {"n3": NOW + 5, "n4": NOW - 1}, ALL_FREE,
     {"n3": NOW + 5}),
    ("refused again: held longer", [pod("j-a0-0", "n3", scheduled=NO_GPUS)], {"n3": NOW + 5}, ALL_FREE, {"n3": HOLD}),
]


@pytest.mark.parametrize(("pods", "held", "seen_free", "expected"), [r[1:] for r in REFUSALS],
                         ids=[r[0] for r in REFUSALS])
def test_the_nodes_the_scheduler_refuses(
    pods: list[dict[str, Any]], held: dict[str, float], seen_free: dict[str, int], expected: dict[str, float]
) -> None:
    shortages = find_gpu_shortages(pods)
    assert decide_refused_nodes(shortages, now=NOW, held=held, seen_free=seen_free) == expected


GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "kube-v1.36-workload"


def _recorded(name: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads((GOLDEN / name).read_text())["response"]["body"]
    return body


def test_the_recorded_gang_that_fits_in_no_leaf_says_why() -> None:
    # the bodies kube-apiserver v1.36 served for a gang of 4 that fits in no leaf, as the
    # operator's pod index holds them
    pod = compact_pod(_recorded("028-w46-gang-pod-pending.json"))
    group = _recorded("027-w45-podgroup-unschedulable-status.json")
    condition = next(c for c in group["status"]["conditions"] if c["type"] == "PodGroupScheduled")
    got = decide_pending_reason([pod], now=NOW, group_condition=condition, group=group["metadata"]["name"])
    assert got is not None and got.reason == "Unschedulable"
    said = "the scheduler left 1/1 pods unscheduled: pod group is unschedulable, waiting for minCount pods"
    assert said in got.message
    assert "PodGroup job-b-a0 Unschedulable: 0/2 placements are available" in got.message
    # not a GPU shortage of the pod's node: nothing to hold (the gang's own wait names none)
    assert find_gpu_shortages([pod]) == {}
