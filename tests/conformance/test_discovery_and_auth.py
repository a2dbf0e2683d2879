"""Discovery, version, OpenAPI and bearer-token auth."""

from __future__ import annotations

from .conftest import CRD_GROUP, Cluster


def test_requests_without_or_with_a_wrong_token_get_401_status(cluster: Cluster) -> None:
    # no credentials at all: with a client-certificate kubeconfig the certificate stays home too
    status, _, body = cluster.raw("GET", "/api/v1/namespaces", auth=False)
    # a given cluster may allow anonymous requests (then RBAC forbids them: 403)
    allowed = (401, 403) if cluster.mode == "kubeconfig" else (401,)
    assert status in allowed and body["kind"] == "Status" and body["code"] == status
    status, _, body = cluster.raw("GET", "/api/v1/namespaces", auth="not-the-token")
    assert status == 401 and body["kind"] == "Status" and body["code"] == 401


def test_core_discovery_lists_the_kinds_we_use_with_subresources(cluster: Cluster) -> None:
    status, _, versions = cluster.raw("GET", "/api")
    assert status == 200 and versions["kind"] == "APIVersions" and "v1" in versions["versions"]
    status, _, res = cluster.raw("GET", "/api/v1")
    assert status == 200 and res["kind"] == "APIResourceList" and res["groupVersion"] == "v1"
    names = {r["name"]: r for r in res["resources"]}
    for plural in ("namespaces", "nodes", "pods", "services", "configmaps", "secrets", "events",
                   "serviceaccounts", "pods/status", "pods/binding", "pods/eviction", "pods/log", "nodes/status"):
        assert plural in names, plural
    assert names["pods"]["namespaced"] is True and names["nodes"]["namespaced"] is False
    assert names["pods"]["kind"] == "Pod" and "watch" in names["pods"]["verbs"]
    assert "po" in names["pods"].get("shortNames", [])


def test_group_discovery_lists_leases_events_and_crds(cluster: Cluster, widgets: dict[str, str]) -> None:
    status, _, groups = cluster.raw("GET", "/apis")
    assert status == 200 and groups["kind"] == "APIGroupList"
    by_name = {g["name"]: g for g in groups["groups"]}
    for g in ("coordination.k8s.io", "events.k8s.io", "apiextensions.k8s.io", CRD_GROUP):
        assert g in by_name, g
    assert by_name[CRD_GROUP]["preferredVersion"]["version"] == "v1"
    status, _, group = cluster.raw("GET", f"/apis/{CRD_GROUP}")
    assert status == 200 and group["kind"] == "APIGroup" and group["name"] == CRD_GROUP
    status, _, res = cluster.raw("GET", f"/apis/{CRD_GROUP}/v1")
    names = {r["name"]: r for r in res["resources"]}
    assert names["widgets"]["kind"] == "Widget" and names["widgets"]["namespaced"] is True
    assert "widgets/status" in names
    assert "wdg" in names["widgets"].get("shortNames", [])
    status, _, res = cluster.raw("GET", "/apis/coordination.k8s.io/v1")
    assert "leases" in {r["name"] for r in res["resources"]}


def test_version_reports_major_and_minor(cluster: Cluster) -> None:
    status, _, v = cluster.raw("GET", "/version")
    assert status == 200 and v["major"] == "1" and int(v["minor"].rstrip("+")) >= 20 and v["gitVersion"]


def test_openapi_v3_serves_the_crd_schema_with_its_gvk(cluster: Cluster, widgets: dict[str, str]) -> None:
    status, _, root = cluster.raw("GET", "/openapi/v3")
    assert status == 200
    key = f"apis/{CRD_GROUP}/v1"
    assert key in root["paths"] and "api/v1" in root["paths"]
    url = root["paths"][key]["serverRelativeURL"]
    status, _, doc = cluster.raw("GET", url)
    assert status == 200 and doc["openapi"].startswith("3.")
    schemas = doc["components"]["schemas"]
    found = [s for s in schemas.values()
             if {"group": CRD_GROUP, "version": "v1", "kind": "Widget"} in s.get("x-kubernetes-group-version-kind", [])]
    assert len(found) == 1
    spec = found[0]["properties"]["spec"]
    assert spec["description"] == "Desired widget."
    assert spec["properties"]["replicas"]["type"] == "integer"


def test_openapi_v2_is_served_as_json(cluster: Cluster) -> None:
    status, _, doc = cluster.raw("GET", "/openapi/v2")
    assert status == 200 and doc["swagger"] == "2.0" and doc["definitions"]


def test_unknown_paths_and_resources_are_404(cluster: Cluster) -> None:
    status, _, body = cluster.raw("GET", "/api/v1/nosuchthings")
    assert status == 404 and body["kind"] == "Status" and body["reason"] == "NotFound"
    status, _, _ = cluster.raw("GET", "/apis/no.such.group/v1")
    assert status == 404
