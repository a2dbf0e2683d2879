"""Object metadata the server owns, optimistic concurrency, and errors as Status objects."""

from __future__ import annotations

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from .conftest import Cluster, pod


def test_create_fills_uid_resource_version_creation_timestamp(core: client.CoreV1Api, ns: str) -> None:
    cm = core.create_namespaced_config_map(ns, {"metadata": {"name": "a"}, "data": {"k": "v"}})
    assert cm.metadata.uid and cm.metadata.resource_version and cm.metadata.creation_timestamp
    assert cm.metadata.namespace == ns
    got = core.read_namespaced_config_map("a", ns)
    assert got.metadata.uid == cm.metadata.uid and got.data == {"k": "v"}


def test_generate_name_gives_unique_names(core: client.CoreV1Api, ns: str) -> None:
    names = {core.create_namespaced_config_map(ns, {"metadata": {"generateName": "gen-"}}).metadata.name
             for _ in range(5)}
    assert len(names) == 5 and all(n.startswith("gen-") and len(n) > 4 for n in names)


def test_resource_versions_increase_across_kinds(core: client.CoreV1Api, ns: str) -> None:
    a = core.create_namespaced_config_map(ns, {"metadata": {"name": "rv-a"}})
    b = core.create_namespaced_secret(ns, {"metadata": {"name": "rv-b"}})
    c = core.patch_namespaced_config_map("rv-a", ns, {"data": {"x": "1"}})
    assert int(a.metadata.resource_version) < int(b.metadata.resource_version) < int(c.metadata.resource_version)


def test_update_with_stale_resource_version_is_409_conflict(core: client.CoreV1Api, ns: str) -> None:
    cm = core.create_namespaced_config_map(ns, {"metadata": {"name": "occ"}, "data": {"n": "0"}})
    fresh = core.replace_namespaced_config_map("occ", ns, {"metadata": {
        "name": "occ", "resourceVersion": cm.metadata.resource_version}, "data": {"n": "1"}})
    assert fresh.data == {"n": "1"}
    with pytest.raises(ApiException) as err:
        core.replace_namespaced_config_map("occ", ns, {"metadata": {
            "name": "occ", "resourceVersion": cm.metadata.resource_version}, "data": {"n": "2"}})
    assert err.value.status == 409
    body = __import__("json").loads(err.value.body)
    assert body["reason"] == "Conflict" and body["kind"] == "Status"
    assert core.read_namespaced_config_map("occ", ns).data == {"n": "1"}


def test_update_without_change_keeps_the_resource_version(core: client.CoreV1Api, ns: str) -> None:
    cm = core.create_namespaced_config_map(ns, {"metadata": {"name": "same"}, "data": {"n": "0"}})
    again = core.replace_namespaced_config_map("same", ns, {"metadata": {"name": "same"}, "data": {"n": "0"}})
    assert again.metadata.resource_version == cm.metadata.resource_version


def test_errors_are_status_objects_with_codes(cluster: Cluster, core: client.CoreV1Api, ns: str) -> None:
    status, _, body = cluster.raw("GET", f"/api/v1/namespaces/{ns}/configmaps/missing")
    assert status == 404 and body["kind"] == "Status" and body["reason"] == "NotFound"
    assert body["details"]["name"] == "missing" and body["details"]["kind"] == "configmaps"
    core.create_namespaced_config_map(ns, {"metadata": {"name": "dup"}})
    status, _, body = cluster.raw("POST", f"/api/v1/namespaces/{ns}/configmaps", {"metadata": {"name": "dup"}})
    assert status == 409 and body["reason"] == "AlreadyExists"
    status, _, body = cluster.raw("POST", f"/api/v1/namespaces/{ns}/configmaps", {"metadata": {"name": "Bad_Name"}})
    assert status == 422 and body["reason"] == "Invalid"
    assert any(c["field"] == "metadata.name" for c in body["details"]["causes"])
    status, _, body = cluster.raw("PUT", f"/api/v1/namespaces/{ns}/configmaps", {"metadata": {"name": "x"}})
    assert status == 405 and body["reason"] == "MethodNotAllowed"
    status, _, body = cluster.raw("PATCH", f"/api/v1/namespaces/{ns}/configmaps/dup", b"{}",
                                  content_type="application/unknown-patch")
    assert status == 415 and body["reason"] == "UnsupportedMediaType"


def test_create_in_a_missing_namespace_is_404(cluster: Cluster) -> None:
    status, _, body = cluster.raw("POST", "/api/v1/namespaces/no-such-ns-xyz/configmaps", {"metadata": {"name": "a"}})
    assert status == 404 and body["reason"] == "NotFound"


def test_namespace_in_body_must_match_the_url(cluster: Cluster, ns: str) -> None:
    status, _, body = cluster.raw("POST", f"/api/v1/namespaces/{ns}/configmaps",
                                  {"metadata": {"name": "a", "namespace": "other"}})
    assert status == 400 and body["reason"] == "BadRequest"


def test_dry_run_does_not_persist(core: client.CoreV1Api, ns: str) -> None:
    core.create_namespaced_config_map(ns, {"metadata": {"name": "dry"}}, dry_run="All")
    with pytest.raises(ApiException) as err:
        core.read_namespaced_config_map("dry", ns)
    assert err.value.status == 404


def test_pod_requires_containers_with_images(cluster: Cluster, ns: str) -> None:
    body = pod("bad")
    del body["spec"]["containers"][0]["image"]
    status, _, st = cluster.raw("POST", f"/api/v1/namespaces/{ns}/pods", body)
    assert status == 422
    assert any(c["field"] == "spec.containers[0].image" for c in st["details"]["causes"])


def test_secret_string_data_is_stored_base64(core: client.CoreV1Api, ns: str) -> None:
    s = core.create_namespaced_secret(ns, {"metadata": {"name": "s"}, "stringData": {"password": "hunter2"}})
    assert s.data == {"password": "aHVudGVyMg=="} and s.type == "Opaque"


def test_delete_precondition_on_uid_is_409(core: client.CoreV1Api, ns: str) -> None:
    core.create_namespaced_config_map(ns, {"metadata": {"name": "pre"}})
    with pytest.raises(ApiException) as err:
        core.delete_namespaced_config_map("pre", ns, body={"preconditions": {"uid": "not-the-uid"}})
    assert err.value.status == 409
    core.delete_namespaced_config_map("pre", ns)


def test_service_gets_a_cluster_ip_and_defaults(core: client.CoreV1Api, ns: str) -> None:
    svc = core.create_namespaced_service(ns, {"metadata": {"name": "web"}, "spec": {
        "selector": {"app": "web"}, "ports": [{"port": 80}]}})
    assert svc.spec.cluster_ip and svc.spec.type == "ClusterIP"
    assert svc.spec.ports[0].protocol == "TCP" and svc.spec.ports[0].target_port == 80


@pytest.mark.parametrize(("method", "suffix", "body", "ctype"), [
    ("POST", "", b"[]", "application/json"),
    ("POST", "", b"{not json", "application/json"),
    ("POST", "", b'{"metadata": "x"}', "application/json"),
    ("POST", "", b'{"metadata": {"name": "a"}, "data": {"k": 1}}', "application/json"),
    ("GET", "?limit=abc", None, "application/json"),
    ("GET", "?watch=1&timeoutSeconds=x", None, "application/json"),
    ("GET", "?labelSelector=a+in+x", None, "application/json"),
    ("PATCH", "/target", b'"x"', "application/merge-patch+json"),
    ("PATCH", "/target", b'[{"op": "remove", "path": "/nope"}]', "application/json-patch+json"),
    ("PATCH", "/target", b'[{"op": "bogus", "path": "/x"}]', "application/json-patch+json"),
    ("PATCH", "/target", b'{"metadata": {"finalizers": "x"}}', "application/strategic-merge-patch+json"),
    ("DELETE", "/target?gracePeriodSeconds=x", None, "application/json"),
])
def test_malformed_requests_get_a_4xx_status(cluster: Cluster, core: client.CoreV1Api, ns: str, method: str,
                                              suffix: str, body: bytes | None, ctype: str) -> None:
    core.create_namespaced_config_map(ns, {"metadata": {"name": "target"}, "data": {"k": "v"}})
    status, _, st = cluster.raw(method, f"/api/v1/namespaces/{ns}/configmaps{suffix}", body, content_type=ctype)
    assert 400 <= status < 500, (status, st)
    assert isinstance(st, dict) and st.get("kind") == "Status"
    assert core.read_namespaced_config_map("target", ns).data == {"k": "v"}
