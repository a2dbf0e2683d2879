"""Pod subresources (binding, eviction, status, log), scheduling gates, graceful deletion, and
strategic merge patch on the built-in kinds."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from tests.waiting import wait_until

from .conftest import ABSENT_NODE, Cluster, gone, pod, wait_for_default_service_account


def _bind(core: client.CoreV1Api, ns: str, name: str, node: str) -> None:
    core.create_namespaced_pod_binding(name, ns, {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                                                  "target": {"apiVersion": "v1", "kind": "Node", "name": node}},
                                       _preload_content=False)


def test_binding_sets_node_name_once(core: client.CoreV1Api, ns: str) -> None:
    core.create_namespaced_pod(ns, pod("b"))
    _bind(core, ns, "b", ABSENT_NODE)
    p = core.read_namespaced_pod("b", ns)
    assert p.spec.node_name == ABSENT_NODE
    assert any(c.type == "PodScheduled" and c.status == "True" for c in p.status.conditions or [])
    with pytest.raises(ApiException) as err:
        _bind(core, ns, "b", f"{ABSENT_NODE}-b")
    assert err.value.status == 409
    assert core.read_namespaced_pod("b", ns).spec.node_name == ABSENT_NODE


def test_scheduling_gates_block_binding_and_may_only_be_removed(core: client.CoreV1Api, ns: str) -> None:
    core.create_namespaced_pod(ns, pod("g", schedulingGates=[{"name": "railyard.io/gang"}]))
    with pytest.raises(ApiException) as err:
        _bind(core, ns, "g", ABSENT_NODE)
    assert err.value.status >= 400
    assert core.read_namespaced_pod("g", ns).spec.node_name is None
    with pytest.raises(ApiException) as err:
        core.patch_namespaced_pod("g", ns, {"spec": {"schedulingGates": [
            {"name": "railyard.io/gang"}, {"name": "railyard.io/other"}]}})
    assert err.value.status == 422
    p = core.patch_namespaced_pod("g", ns, [{"op": "remove", "path": "/spec/schedulingGates"}])
    assert not p.spec.scheduling_gates
    _bind(core, ns, "g", ABSENT_NODE)
    assert core.read_namespaced_pod("g", ns).spec.node_name == ABSENT_NODE


def test_lifting_our_gate_keeps_a_gate_a_webhook_added(cluster: Cluster, core: client.CoreV1Api, ns: str) -> None:
    """The operator lifts its gate from the pod as it built it (our gate only) while the server
    holds what a mutating webhook made of it (Kueue's pod webhook adds its admission gate): only
    ours goes, the webhook's stays and still keeps the pod from being bound (issue 48)."""
    from railyard.k8s.client import Kube
    from railyard.k8s.gang import lift_gates
    from railyard.logic.manifests import GANG_GATE

    foreign = "kueue.x-k8s.io/admission"
    as_built = pod("kg", schedulingGates=[{"name": GANG_GATE}])
    as_built["metadata"]["namespace"] = ns
    core.create_namespaced_pod(ns, pod("kg", schedulingGates=[{"name": GANG_GATE}, {"name": foreign}]))

    async def lift() -> int:
        kube = Kube.from_config(str(cluster.kubeconfig))
        try:
            return await lift_gates(kube, [as_built])
        finally:
            await kube.close()

    assert asyncio.run(lift()) == 1
    assert [g.name for g in core.read_namespaced_pod("kg", ns).spec.scheduling_gates] == [foreign]
    asyncio.run(lift())  # again, from the same stale copy (a handler that runs twice): nothing else goes
    assert [g.name for g in core.read_namespaced_pod("kg", ns).spec.scheduling_gates] == [foreign]
    with pytest.raises(ApiException) as err:
        _bind(core, ns, "kg", "node-a")
    assert err.value.status >= 400, "the webhook's gate still holds the pod"
    assert core.read_namespaced_pod("kg", ns).spec.node_name is None


def test_pod_spec_is_immutable_apart_from_the_allowed_fields(core: client.CoreV1Api, ns: str) -> None:
    core.create_namespaced_pod(ns, pod("imm"))
    with pytest.raises(ApiException) as err:
        core.patch_namespaced_pod("imm", ns, {"spec": {"restartPolicy": "Never"}})
    assert err.value.status == 422
    p = core.patch_namespaced_pod("imm", ns, {"spec": {"containers": [{"name": "main", "image": "busybox:1.37"}]}})
    assert p.spec.containers[0].image == "busybox:1.37"


def test_status_writes_go_through_the_status_subresource(core: client.CoreV1Api, ns: str) -> None:
    core.create_namespaced_pod(ns, pod("s"))
    p = core.patch_namespaced_pod("s", ns, {"status": {"phase": "Running"}})
    assert p.status.phase == "Pending"
    p = core.patch_namespaced_pod_status("s", ns, {"status": {"phase": "Running", "podIP": "127.0.0.2"}})
    assert p.status.phase == "Running" and p.status.pod_ip == "127.0.0.2"


def test_qos_class_is_the_servers_and_a_status_write_may_not_change_it(core: client.CoreV1Api, ns: str) -> None:
    """cpu and memory only, init containers included; a node agent that computes it otherwise
    (nvidia.com/gpu counted) is refused, so it must not send it at all."""
    gpu = [{"name": "main", "image": "busybox:1.36", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    init = [{"name": "init", "image": "busybox:1.36", "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]
    assert core.create_namespaced_pod(ns, pod("qos-gpu", containers=gpu)).status.qos_class == "BestEffort"
    made = core.create_namespaced_pod(ns, pod("qos-init", containers=gpu, initContainers=init))
    assert made.status.qos_class == "Burstable"
    with pytest.raises(ApiException) as err:
        core.patch_namespaced_pod_status("qos-gpu", ns, {"status": {"qosClass": "Burstable"}})
    assert err.value.status == 422
    assert "status.qosClass" in err.value.body and "field is immutable" in err.value.body
    p = core.patch_namespaced_pod_status("qos-init", ns, {"status": {"phase": "Running", "qosClass": "Burstable"}})
    assert p.status.phase == "Running" and p.status.qos_class == "Burstable"
    p = core.patch_namespaced_pod_status("qos-gpu", ns, {"status": {"phase": "Running"}})
    assert p.status.phase == "Running" and p.status.qos_class == "BestEffort"


def test_unbound_pod_is_deleted_at_once(core: client.CoreV1Api, ns: str) -> None:
    core.create_namespaced_pod(ns, pod("u"))
    core.delete_namespaced_pod("u", ns)
    assert gone(lambda: core.read_namespaced_pod("u", ns))


def test_bound_pod_waits_for_the_node_to_confirm_deletion(core: client.CoreV1Api, ns: str) -> None:
    core.create_namespaced_pod(ns, pod("gr", nodeName=ABSENT_NODE))
    core.delete_namespaced_pod("gr", ns, grace_period_seconds=30)
    p = core.read_namespaced_pod("gr", ns)
    assert p.metadata.deletion_timestamp is not None and p.metadata.deletion_grace_period_seconds == 30
    core.delete_namespaced_pod("gr", ns, grace_period_seconds=0)
    wait_until(lambda: gone(lambda: core.read_namespaced_pod("gr", ns)), timeout=15, message="the pod to be removed", interval=0.05)


def test_eviction_deletes_the_pod(core: client.CoreV1Api, ns: str) -> None:
    core.create_namespaced_pod(ns, pod("ev"))
    core.create_namespaced_pod_eviction("ev", ns, {"apiVersion": "policy/v1", "kind": "Eviction",
                                                   "metadata": {"name": "ev", "namespace": ns}})
    wait_until(lambda: gone(lambda: core.read_namespaced_pod("ev", ns)), timeout=15, message="the evicted pod to go", interval=0.05)


def test_strategic_merge_patch_merges_lists_by_merge_key(cluster: Cluster, core: client.CoreV1Api, ns: str) -> None:
    body = pod("smp")
    body["spec"]["containers"][0]["env"] = [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]
    body["spec"]["containers"].append({"name": "side", "image": "busybox:1.36"})
    core.create_namespaced_pod(ns, body)
    status, _, p = cluster.raw("PATCH", f"/api/v1/namespaces/{ns}/pods/smp/status", {"status": {"conditions": [
        {"type": "Ready", "status": "False"}, {"type": "Initialized", "status": "True"}]}},
        content_type="application/strategic-merge-patch+json")
    assert status == 200
    status, _, p = cluster.raw("PATCH", f"/api/v1/namespaces/{ns}/pods/smp/status", {"status": {"conditions": [
        {"type": "Ready", "status": "True"}]}}, content_type="application/strategic-merge-patch+json")
    assert status == 200
    conds = {c["type"]: c["status"] for c in p["status"]["conditions"]}
    assert conds["Ready"] == "True" and conds["Initialized"] == "True"
    status, _, p = cluster.raw("PATCH", f"/api/v1/namespaces/{ns}/pods/smp", {"spec": {"containers": [
        {"name": "main", "image": "busybox:1.37"}]}}, content_type="application/strategic-merge-patch+json")
    assert status == 200, p
    assert [c["name"] for c in p["spec"]["containers"]] == ["main", "side"]
    assert p["spec"]["containers"][0]["image"] == "busybox:1.37"
    assert [e["name"] for e in p["spec"]["containers"][0]["env"]] == ["A", "B"]


def test_strategic_merge_patch_delete_directive_and_maps(cluster: Cluster, core: client.CoreV1Api, ns: str) -> None:
    core.create_namespaced_config_map(ns, {"metadata": {"name": "cm", "labels": {"a": "1", "b": "2"},
                                                        "finalizers": ["x.io/one"]}, "data": {"k": "v"}})
    status, _, cm = cluster.raw("PATCH", f"/api/v1/namespaces/{ns}/configmaps/cm", {
        "metadata": {"labels": {"a": None, "c": "3"}, "finalizers": ["x.io/two"]}, "data": {"k2": "v2"}},
        content_type="application/strategic-merge-patch+json")
    assert status == 200
    assert cm["metadata"]["labels"] == {"b": "2", "c": "3"}
    # the patch's items first, then the server's (apimachinery's normalizeElementOrder; corpus case 043)
    assert cm["metadata"]["finalizers"] == ["x.io/two", "x.io/one"]
    assert cm["data"] == {"k": "v", "k2": "v2"}
    status, _, cm = cluster.raw("PATCH", f"/api/v1/namespaces/{ns}/configmaps/cm", {
        "metadata": {"$deleteFromPrimitiveList/finalizers": ["x.io/one", "x.io/two"]}},
        content_type="application/strategic-merge-patch+json")
    assert status == 200 and not cm["metadata"].get("finalizers")
    node = {"metadata": {"name": f"smp-node-{ns}"}, "status": {"conditions": [
        {"type": "Ready", "status": "True"}, {"type": "MemoryPressure", "status": "False"}]}}
    core.create_node(node)
    try:
        status, _, n = cluster.raw("PATCH", f"/api/v1/nodes/smp-node-{ns}/status", {"status": {"conditions": [
            {"type": "MemoryPressure", "$patch": "delete"}]}}, content_type="application/strategic-merge-patch+json")
        assert status == 200
        assert [c["type"] for c in n["status"]["conditions"]] == ["Ready"]
    finally:
        core.delete_node(f"smp-node-{ns}")


def test_pod_log_is_served_from_the_log_provider(cluster: Cluster, embedded_only: None, core: client.CoreV1Api,
                                                 ns: str) -> None:
    """Contract with the node agent: it writes <state-dir>/pods/<ns>/<pod>/<container>.log."""
    assert cluster.process is not None
    core.create_namespaced_pod(ns, pod("logs", nodeName=ABSENT_NODE))
    path = Path(cluster.process.state_dir) / "pods" / ns / "logs" / "main.log"
    path.parent.mkdir(parents=True)
    path.write_text("line 1\nline 2\nline 3\n")
    assert core.read_namespaced_pod_log("logs", ns) == "line 1\nline 2\nline 3\n"
    assert core.read_namespaced_pod_log("logs", ns, tail_lines=1) == "line 3\n"
    with pytest.raises(ApiException) as err:
        core.read_namespaced_pod_log("logs", ns, container="nope")
    assert err.value.status == 400
    status, _, _ = cluster.raw("GET", f"/api/v1/namespaces/{ns}/pods/logs/log", query={"container": "main"},
                               accept="*/*")
    assert status == 200


def test_confirmed_pod_deletion_still_waits_for_finalizers(core: client.CoreV1Api, ns: str) -> None:
    body = pod("fin", nodeName=ABSENT_NODE)
    body["metadata"]["finalizers"] = ["railyard.io/hold"]
    core.create_namespaced_pod(ns, body)
    core.delete_namespaced_pod("fin", ns, grace_period_seconds=30)
    core.delete_namespaced_pod("fin", ns, grace_period_seconds=0)
    p = core.read_namespaced_pod("fin", ns)
    assert p.metadata.deletion_timestamp is not None and p.metadata.deletion_grace_period_seconds == 0
    core.patch_namespaced_pod("fin", ns, {"metadata": {"finalizers": None}})
    wait_until(lambda: gone(lambda: core.read_namespaced_pod("fin", ns)), timeout=15, message="the pod to go with its finalizer", interval=0.05)


def test_terminating_pod_on_a_missing_node_goes_after_its_grace_period(embedded_only: None,
                                                                       core: client.CoreV1Api, ns: str) -> None:
    """Nobody can confirm for a node that does not exist (PodGC's job on a real cluster, after ~40 s)."""
    core.create_namespaced_pod(ns, pod("orphan", nodeName="no-such-node"))
    core.delete_namespaced_pod("orphan", ns, grace_period_seconds=1)
    assert core.read_namespaced_pod("orphan", ns).metadata.deletion_timestamp is not None
    wait_until(lambda: gone(lambda: core.read_namespaced_pod("orphan", ns)),
               timeout=10,
               message="the orphaned terminating pod to be removed",
               interval=0.05)


def test_admission_adds_the_token_volume_and_default_tolerations(cluster: Cluster, core: client.CoreV1Api,
                                                                  ns: str) -> None:
    """ServiceAccount admission projects the token, CA bundle and namespace; DefaultTolerationSeconds
    tolerates not-ready/unreachable nodes for 300 s; automountServiceAccountToken: false opts out."""
    wait_for_default_service_account(cluster, core, ns)
    p = core.create_namespaced_pod(ns, pod("sa"))
    tolerations = {(t.key, t.effect, t.toleration_seconds) for t in p.spec.tolerations or []}
    assert {("node.kubernetes.io/not-ready", "NoExecute", 300),
            ("node.kubernetes.io/unreachable", "NoExecute", 300)} <= tolerations
    if cluster.mode == "envtest":
        pytest.skip("envtest runs kube-apiserver without the ServiceAccount admission plugin")
    assert p.spec.service_account_name == "default"
    vols = [v for v in p.spec.volumes or [] if v.name.startswith("kube-api-access-")]
    assert len(vols) == 1 and vols[0].projected is not None
    sources = vols[0].projected.sources
    assert sources[0].service_account_token.path == "token"
    assert sources[1].config_map.name == "kube-root-ca.crt"
    assert sources[2].downward_api.items[0].field_ref.field_path == "metadata.namespace"
    mounts = [m for m in p.spec.containers[0].volume_mounts or [] if m.name == vols[0].name]
    assert mounts and mounts[0].mount_path == "/var/run/secrets/kubernetes.io/serviceaccount" and mounts[0].read_only
    plain = core.create_namespaced_pod(ns, pod("no-token", automountServiceAccountToken=False))
    assert not [v for v in plain.spec.volumes or [] if v.name.startswith("kube-api-access-")]


def test_gates_and_node_name_may_not_come_together(cluster: Cluster, ns: str) -> None:
    status, _, body = cluster.raw("POST", f"/api/v1/namespaces/{ns}/pods",
                                  pod("gn", nodeName="n1", schedulingGates=[{"name": "x"}]))
    assert status == 422
    assert body["details"]["causes"] == [{"reason": "FieldValueForbidden", "field": "spec.nodeName",
                                          "message": "Forbidden: cannot be set until all schedulingGates have been cleared"}]


@pytest.fixture
def labelled_namespace(cluster: Cluster, core: client.CoreV1Api, ns: str) -> Iterator[Callable[[dict[str, str]], str]]:
    made: list[str] = []

    def make(labels: dict[str, str]) -> str:
        name = f"{ns}-psa{len(made)}"
        core.create_namespace({"metadata": {"name": name, "labels": labels}})
        made.append(name)
        wait_for_default_service_account(cluster, core, name)
        return name

    yield make
    for name in made:
        with contextlib.suppress(ApiException):
            core.delete_namespace(name)


def test_pod_security_enforce_label_refuses_what_the_level_forbids(cluster: Cluster, core: client.CoreV1Api,
                                                                   labelled_namespace: Any) -> None:
    baseline = labelled_namespace({"pod-security.kubernetes.io/enforce": "baseline"})
    body = pod("hp")
    body["spec"]["volumes"] = [{"name": "y", "hostPath": {"path": "/var/tmp"}}]
    status, _, st = cluster.raw("POST", f"/api/v1/namespaces/{baseline}/pods", body)
    assert status == 403 and st["reason"] == "Forbidden"
    assert st["message"] == 'pods "hp" is forbidden: violates PodSecurity "baseline:latest": hostPath volumes (volume "y")'
    assert core.create_namespaced_pod(baseline, pod("plain")).metadata.name == "plain"  # baseline allows it
    open_ns = labelled_namespace({"pod-security.kubernetes.io/enforce": "privileged"})
    status, _, _ = cluster.raw("POST", f"/api/v1/namespaces/{open_ns}/pods", body)
    assert status == 201


def test_pod_security_warn_label_warns_and_admits(cluster: Cluster, labelled_namespace: Any) -> None:
    warned = labelled_namespace({"pod-security.kubernetes.io/warn": "restricted"})
    status, headers, _ = cluster.raw("POST", f"/api/v1/namespaces/{warned}/pods", pod("w"))
    assert status == 201
    warning = headers.get("Warning", "")
    assert 'would violate PodSecurity \\"restricted:latest\\"' in warning
    assert "allowPrivilegeEscalation != false" in warning


def test_a_deleted_podgroup_stays_until_no_running_pod_names_it(embedded_only: None, custom: client.CustomObjectsApi,
                                                                core: client.CoreV1Api, ns: str) -> None:
    """The podgroup-protection finalizer (kube-controller-manager's, here the server's): the
    scheduler may still need a group its pods name; once they are gone, so is the group."""
    api = ("scheduling.k8s.io", "v1alpha2")
    custom.create_namespaced_custom_object(*api, ns, "podgroups", {
        "apiVersion": "scheduling.k8s.io/v1alpha2", "kind": "PodGroup", "metadata": {"name": "g"},
        "spec": {"schedulingPolicy": {"gang": {"minCount": 1}}}})
    core.create_namespaced_pod(ns, pod("member", schedulingGroup={"podGroupName": "g"}))
    custom.delete_namespaced_custom_object(*api, ns, "podgroups", "g")
    left = custom.get_namespaced_custom_object(*api, ns, "podgroups", "g")
    assert left["metadata"]["deletionTimestamp"]
    assert left["metadata"]["finalizers"] == ["scheduling.k8s.io/podgroup-protection"]
    core.delete_namespaced_pod("member", ns)
    wait_until(lambda: gone(lambda: custom.get_namespaced_custom_object(*api, ns, "podgroups", "g")),
               timeout=15,
               message="the PodGroup to go with its last pod",
               interval=0.05)
