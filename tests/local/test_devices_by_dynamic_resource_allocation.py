"""Dynamic Resource Allocation on the local cluster (resource.k8s.io/v1): the simulated nodes
publish their GPUs as ResourceSlices, a pod's claim is made from its template (the API server's
resourceclaim controller), and the local scheduler binds the pod only with devices of the chosen
node allocated to its claim and reserved for it; a claim's devices are free again once its pod is
gone. The pure allocation rules are tabled at the end."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client as k8s
from tests.local.builders import make_pod
from tests.waiting import wait_until

from railyard_local.devices import (
    CHANNEL_DRIVER,
    GPU_DRIVER,
    build_allocation,
    build_device_classes,
    build_slices,
    claim_needs,
    class_driver,
    node_devices,
)

RESOURCE = ("resource.k8s.io", "v1")


@pytest.fixture
def resources(api_client: k8s.ApiClient) -> k8s.CustomObjectsApi:
    try:
        found = k8s.ApisApi(api_client).get_api_versions()
    except k8s.ApiException:
        pytest.skip("no API group discovery")
    if not any(g.name == RESOURCE[0] and any(v.version == RESOURCE[1] for v in g.versions) for g in found.groups):
        pytest.skip("the API server does not serve resource.k8s.io/v1")
    return k8s.CustomObjectsApi(api_client)


def _template(api: k8s.CustomObjectsApi, ns: str, name: str, count: int) -> None:
    api.create_namespaced_custom_object(*RESOURCE, ns, "resourceclaimtemplates", {
        "apiVersion": "/".join(RESOURCE), "kind": "ResourceClaimTemplate", "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": count}}]}}}})


def _claim_of(core: k8s.CoreV1Api, api: k8s.CustomObjectsApi, ns: str, pod: str) -> dict[str, Any] | None:
    statuses = core.read_namespaced_pod(pod, ns).status.resource_claim_statuses or []
    if not statuses:
        return None
    return dict(api.get_namespaced_custom_object(*RESOURCE, ns, "resourceclaims", statuses[0].resource_claim_name))


def test_a_pod_gets_devices_of_its_node_and_gives_them_back(core: k8s.CoreV1Api, resources: k8s.CustomObjectsApi,
                                                            namespace: str, node_names: list[str]) -> None:
    first = node_names[0]
    slices = resources.list_cluster_custom_object(*RESOURCE, "resourceslices")["items"]
    assert {(s["spec"]["nodeName"], s["spec"]["driver"]) for s in slices} >= {(first, GPU_DRIVER), (first, CHANNEL_DRIVER)}
    _template(resources, namespace, "two", 2)
    _template(resources, namespace, "one", 1)
    core.create_namespaced_pod(namespace, make_pod("a").pin(first).claim("two").command("sleep", "60").obj())
    node = wait_until(lambda: core.read_namespaced_pod("a", namespace).spec.node_name, timeout=60, message="a bound")
    claim = _claim_of(core, resources, namespace, "a")
    assert claim is not None and claim["metadata"]["name"].startswith("a-gpus-")
    assert claim["metadata"]["ownerReferences"][0]["name"] == "a"
    results = claim["status"]["allocation"]["devices"]["results"]
    assert sorted(r["device"] for r in results) == ["gpu-0", "gpu-1"] and {r["pool"] for r in results} == {node}
    assert [r["name"] for r in claim["status"]["reservedFor"]] == ["a"]
    # the first node has no free GPU left: a pod pinned there waits, then gets one when a is gone
    core.create_namespaced_pod(namespace, make_pod("b").pin(first).claim("one").command("sleep", "60").obj())
    # (first it waits for its claim to be made, then for devices)
    wait_until(lambda: any(c.type == "PodScheduled" and c.status == "False" and "cannot allocate all claims" in (c.message or "")
                         for c in core.read_namespaced_pod("b", namespace).status.conditions or []),
               timeout=60,
               message="b unschedulable")
    assert core.read_namespaced_pod("b", namespace).spec.node_name is None
    core.delete_namespaced_pod("a", namespace, grace_period_seconds=0)
    assert wait_until(lambda: core.read_namespaced_pod("b", namespace).spec.node_name, timeout=60, message="b bound") == first


def test_the_allocation_rules() -> None:
    classes = {c["metadata"]["name"]: c for c in build_device_classes()}
    assert class_driver(classes["gpu.nvidia.com"]) == GPU_DRIVER
    assert class_driver({"spec": {"selectors": [{"cel": {"expression": "device.attributes['x'].y"}}]}}) is None
    devices = node_devices(build_slices("n", "uid", 4))["n"]
    assert devices == {GPU_DRIVER: ["gpu-0", "gpu-1", "gpu-2", "gpu-3"], CHANNEL_DRIVER: ["channel-0"]}
    claim = {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 3}}]}}}
    assert claim_needs(claim, classes) == ({f"devices/{GPU_DRIVER}": 3000}, None)
    assert claim_needs(claim, {})[1] == "device class gpu.nvidia.com does not exist or selects no driver"
    alloc = build_allocation(claim, "n", classes, devices, {(GPU_DRIVER, "n", "gpu-0")})
    assert alloc is not None and [r["device"] for r in alloc["devices"]["results"]] == ["gpu-1", "gpu-2", "gpu-3"]
    assert build_allocation(claim, "n", classes, devices, {(GPU_DRIVER, "n", "gpu-0"), (GPU_DRIVER, "n", "gpu-3")}) is None
    assert build_slices("n", "uid", 0) == []
