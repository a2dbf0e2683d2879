"""spec.gpuClaim: the gang's GPUs by Dynamic Resource Allocation (resource.k8s.io/v1) instead of
the extended resource, optionally with NVIDIA's ComputeDomain. Pure builders, as tables; the
GPU count is written once (spec.gpus) and placement counts the claimed GPUs as it counts
nvidia.com/gpu requests."""

from __future__ import annotations

from typing import Any

import pytest
from tests.operator.builders import make_node
from tests.operator.fake_cluster import Harness, make_job
from tests.operator.test_restarting_in_place import running

from railyard.api.trainingjob import TrainingJobSpec
from railyard.logic.manifests import (
    build_compute_domain,
    build_dra_objects,
    build_gang_pods,
    build_gpu_claim_template,
    build_spare_pod,
    channel_claim_template_name,
    container_resources,
    gpu_claim_template_name,
)
from railyard.logic.schedulers import gang_min_resources
from railyard.logic.topology import compute_used_gpus, node_gpus

OWNER = {"apiVersion": "railyard.dev/v1alpha1", "kind": "TrainingJob", "name": "llm", "uid": "u-1", "controller": True}
HEARTBEAT = "http://op:8080/v1/heartbeats/ml/llm"


def _spec(**kw: Any) -> TrainingJobSpec:
    return TrainingJobSpec.model_validate({"nodes": 2, "procsPerNode": 4, "trainer": {"batchSize": 8}, **kw})


def _pod(spec: TrainingJobSpec) -> dict[str, Any]:
    return build_gang_pods(spec, job="llm", namespace="ml", owner=OWNER, attempt=0, nodes=["n-a", "n-b"], heartbeat_url=HEARTBEAT)[1]


@pytest.mark.parametrize(
    ("spec", "limits", "pod_claims", "container_claims"),
    [
        # the extended resource, as before
        ({}, {"nvidia.com/gpu": "4"}, None, None),
        ({"gpusPerPod": 8}, {"nvidia.com/gpu": "8"}, None, None),
        # by claim: no nvidia.com/gpu, one claim from the job's template
        ({"gpuClaim": {}}, None, [{"name": "gpus", "resourceClaimTemplateName": "GPUS"}], [{"name": "gpus"}]),
        ({"gpuClaim": {}, "resources": {"limits": {"cpu": "8"}}}, {"cpu": "8"},
         [{"name": "gpus", "resourceClaimTemplateName": "GPUS"}], [{"name": "gpus"}]),
        # with a ComputeDomain: also its IMEX channel
        ({"gpuClaim": {"computeDomain": True}}, None,
         [{"name": "gpus", "resourceClaimTemplateName": "GPUS"}, {"name": "channel", "resourceClaimTemplateName": "CHANNEL"}],
         [{"name": "gpus"}, {"name": "channel"}]),
    ],
)
def test_pods_ask_for_gpus_one_way(spec: dict[str, Any], limits: dict[str, str] | None, pod_claims: list[dict[str, str]] | None,
                                   container_claims: list[dict[str, str]] | None) -> None:
    built = _spec(**spec)
    pod = _pod(built)
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources.get("limits") == limits
    names = {"GPUS": gpu_claim_template_name(built, "llm"), "CHANNEL": channel_claim_template_name(built, "llm")}
    want = [{**c, "resourceClaimTemplateName": names[c["resourceClaimTemplateName"]]} for c in pod_claims] if pod_claims else None
    assert pod["spec"].get("resourceClaims") == want
    assert resources.get("claims") == container_claims
    assert ("railyard.dev/claimed-gpus" in pod["metadata"]["annotations"]) == (pod_claims is not None)


@pytest.mark.parametrize(
    ("spec", "device_class", "count"),
    [
        ({"gpuClaim": {}}, "gpu.nvidia.com", 4),
        ({"gpusPerPod": 8, "gpuClaim": {"deviceClassName": "h200.example.com"}}, "h200.example.com", 8),
    ],
)
def test_the_claim_template_asks_each_pod_for_its_gpus(spec: dict[str, Any], device_class: str, count: int) -> None:
    tmpl = build_gpu_claim_template(_spec(**spec), job="llm", namespace="ml", owner=OWNER)
    assert tmpl is not None
    assert (tmpl["apiVersion"], tmpl["kind"]) == ("resource.k8s.io/v1", "ResourceClaimTemplate")
    assert tmpl["metadata"]["name"].startswith("llm-gpus-") and tmpl["metadata"]["ownerReferences"] == [OWNER]
    assert tmpl["metadata"]["labels"]["railyard.dev/job"] == "llm"
    assert tmpl["spec"]["spec"]["devices"]["requests"] == [
        {"name": "gpus", "exactly": {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": count}}
    ]


@pytest.mark.parametrize(
    ("spec", "kinds"),
    [
        ({}, []),
        ({"gpuClaim": {}}, ["ResourceClaimTemplate"]),
        ({"gpuClaim": {"computeDomain": True}}, ["ResourceClaimTemplate", "ComputeDomain"]),
        ({"gpuClaim": {"computeDomain": False}}, ["ResourceClaimTemplate"]),
    ],
)
def test_the_job_gets_its_dra_objects_before_the_pods(spec: dict[str, Any], kinds: list[str]) -> None:
    assert [o["kind"] for o in build_dra_objects(_spec(**spec), job="llm", namespace="ml", owner=OWNER)] == kinds


def test_a_spec_edit_of_the_count_or_class_names_a_new_template_and_domain() -> None:
    """Templates are immutable: the new pods of an edited spec must name a new one (the count and
    class are in the name); the ComputeDomain's name carries its numNodes."""
    base = _spec(gpuClaim={})
    assert gpu_claim_template_name(base, "llm") == gpu_claim_template_name(_spec(gpuClaim={}), "llm"), "deterministic"
    assert gpu_claim_template_name(base, "llm") != gpu_claim_template_name(_spec(gpusPerPod=8, gpuClaim={}), "llm")
    assert gpu_claim_template_name(base, "llm") != gpu_claim_template_name(_spec(gpuClaim={"deviceClassName": "b200.example.com"}), "llm")
    two = _spec(gpuClaim={"computeDomain": True})
    four = _spec(nodes=4, trainer={"batchSize": 16}, gpuClaim={"computeDomain": True})
    assert channel_claim_template_name(two, "llm") != channel_claim_template_name(four, "llm")


def test_the_compute_domain_spans_the_gang_and_names_the_channel_the_pods_claim() -> None:
    spec = _spec(nodes=4, trainer={"batchSize": 16}, gpuClaim={"computeDomain": True})
    cd = build_compute_domain(spec, job="llm", namespace="ml", owner=OWNER)
    assert cd is not None
    assert (cd["apiVersion"], cd["kind"], cd["metadata"]["name"]) == ("resource.nvidia.com/v1beta1", "ComputeDomain", "llm-nvlink-4")
    assert cd["metadata"]["ownerReferences"] == [OWNER], "deleted with the job"
    assert cd["spec"] == {"numNodes": 4, "channel": {"resourceClaimTemplate": {"name": "llm-nvlink-4-channel"}}}
    channel = [c for c in _pod(spec)["spec"]["resourceClaims"] if c["name"] == "channel"]
    assert channel == [{"name": "channel", "resourceClaimTemplateName": cd["spec"]["channel"]["resourceClaimTemplate"]["name"]}]


def test_a_spare_placeholder_claims_what_a_gang_pod_claims() -> None:
    spec = _spec(gpuClaim={"computeDomain": True})
    spare = build_spare_pod(spec, job="llm", namespace="ml", owner=OWNER, node="n-c")
    pod = _pod(spec)
    assert spare["spec"]["resourceClaims"] == pod["spec"]["resourceClaims"]
    assert spare["spec"]["containers"][0]["resources"] == container_resources(spec) == pod["spec"]["containers"][0]["resources"]


@pytest.mark.parametrize("gpu_claim", [None, {}])
def test_placement_counts_claimed_gpus_as_it_counts_the_extended_resource(gpu_claim: dict[str, Any] | None) -> None:
    spec = _spec(**({} if gpu_claim is None else {"gpuClaim": gpu_claim}))
    pods = build_gang_pods(spec, job="llm", namespace="ml", owner=OWNER, attempt=0, nodes=["n-a", "n-b"], heartbeat_url=HEARTBEAT)
    for p in pods:
        p["spec"]["nodeName"] = p["metadata"]["annotations"]["railyard.dev/node"]
    assert compute_used_gpus(pods) == {"n-a": 4, "n-b": 4}
    assert compute_used_gpus(pods, ignore_job="llm") == {}


def test_the_gang_scheduler_asks_for_nvidia_gpus_only_without_a_claim() -> None:
    assert gang_min_resources(_spec(), 2) == {"nvidia.com/gpu": "8"}
    assert gang_min_resources(_spec(gpuClaim={}), 2) == {}


@pytest.mark.parametrize(
    ("node", "gpus"),
    [
        ({"status": {"allocatable": {"nvidia.com/gpu": "8"}}}, 8),
        # NVIDIA's DRA driver: no extended resource, GPU feature discovery's count label
        ({"metadata": {"labels": {"nvidia.com/gpu.count": "4"}}, "status": {"allocatable": {"cpu": "72"}}}, 4),
        ({"metadata": {"labels": {"nvidia.com/gpu.count": "4"}}, "status": {"allocatable": {"nvidia.com/gpu": "0"}}}, 0),
        ({}, 0),
    ],
)
def test_a_nodes_gpus_come_from_the_device_plugin_or_the_count_label(node: dict[str, Any], gpus: int) -> None:
    assert node_gpus(node) == gpus


# in the reconcile cycle, on the fake cluster (fake_cluster.py) --------------------------------


def _dra_cluster(gpus_label_only: bool) -> list[dict[str, Any]]:
    """Four nodes of 2 GPUs: advertised as nvidia.com/gpu, or (as under NVIDIA's DRA driver) only
    by GPU feature discovery's count label."""
    nodes = [make_node(f"node-{i}", gpus=2, leaf=f"leaf-{i // 2}") for i in range(4)]
    if gpus_label_only:
        for n in nodes:
            n["status"]["allocatable"].pop("nvidia.com/gpu", None)
            n["status"].get("capacity", {}).pop("nvidia.com/gpu", None)
            n["metadata"]["labels"]["nvidia.com/gpu.count"] = "2"
    return nodes


@pytest.mark.parametrize("gpus_label_only", [False, True], ids=["device-plugin-nodes", "dra-only-nodes"])
async def test_a_dra_gang_goes_through_a_node_loss_like_any_other(gpus_label_only: bool) -> None:
    job = make_job(gpuClaim={"computeDomain": True}, gang={"hotSpares": 1},
                   restartPolicy={"application": {"limit": 3, "backoffSeconds": 0}})
    h = Harness(_dra_cluster(gpus_label_only), job)
    await running(h)
    templates = [name for kind, name in h.cluster.objects if kind == "ResourceClaimTemplate"]
    assert len(templates) == 1 and templates[0].startswith("j-gpus-")
    assert ("ComputeDomain", "j-nvlink-2") in h.cluster.objects
    assert h.cluster.objects[("ComputeDomain", "j-nvlink-2")]["spec"]["numNodes"] == 2
    spares = h.cluster.pods_of(spare=True)
    assert len(spares) == 1 and spares[0]["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] == templates[0]
    spare_node = spares[0]["metadata"]["annotations"]["railyard.dev/node"]
    lost = h.pod_nodes()[1]
    h.node_down(lost)
    await h.cycle(5.0)
    st = h.status
    assert st.last_restart is not None and (st.last_restart.mode, st.last_restart.replaced) == ("InPlace", [1]), h.cluster.events
    assert [q.node for q in st.quarantined_nodes] == [lost]
    new = h.cluster.pods["j-a1-1"]
    assert new["metadata"]["annotations"]["railyard.dev/node"] == spare_node, "the replacement takes the spare"
    assert [c["name"] for c in new["spec"]["resourceClaims"]] == ["gpus", "channel"]
    assert "nvidia.com/gpu" not in (new["spec"]["containers"][0]["resources"].get("limits") or {})
