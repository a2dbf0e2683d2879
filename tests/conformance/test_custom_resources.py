"""CRDs: schema validation (422 with causes), pruning, defaults, CEL rules, status subresource,
generation, and the patch types a custom resource accepts."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from tests.clusters import own_group
from tests.waiting import wait_until

from .conftest import CRD_GROUP, Cluster, widget


def _create(custom: client.CustomObjectsApi, ns: str, body: dict[str, Any]) -> dict[str, Any]:
    obj: dict[str, Any] = custom.create_namespaced_custom_object(CRD_GROUP, "v1", ns, "widgets", body)
    return obj


def _invalid(exc: ApiException) -> list[dict[str, str]]:
    assert exc.status == 422, exc.body
    body = json.loads(exc.body)
    assert body["kind"] == "Status" and body["reason"] == "Invalid"
    causes: list[dict[str, str]] = body["details"]["causes"]
    return causes


def test_defaults_are_applied(custom: client.CustomObjectsApi, widgets: dict[str, str], ns: str) -> None:
    obj = _create(custom, ns, widget("d", replicas=2))
    assert obj["spec"] == {"replicas": 2, "maxReplicas": 10, "mode": "fast"}
    assert obj["metadata"]["generation"] == 1


@pytest.mark.parametrize(("spec", "field"), [
    ({"replicas": 0}, "spec.replicas"),
    ({"replicas": "two"}, "spec.replicas"),
    ({"replicas": 1, "mode": "warp"}, "spec.mode"),
    ({"replicas": 1, "name": "UPPER"}, "spec.name"),
    ({"replicas": 1, "name": "waytoolongname"}, "spec.name"),
    ({"replicas": 1, "tags": ["a", "b", "c", "d"]}, "spec.tags"),
    ({"maxReplicas": 3}, "spec.replicas"),
])
def test_schema_violations_are_422_naming_the_field(custom: client.CustomObjectsApi, widgets: dict[str, str],
                                                   ns: str, spec: dict[str, Any], field: str) -> None:
    with pytest.raises(ApiException) as err:
        _create(custom, ns, {"apiVersion": f"{CRD_GROUP}/v1", "kind": "Widget", "metadata": {"name": "bad"},
                             "spec": spec})
    assert field in [c.get("field") for c in _invalid(err.value)]


def test_all_violations_are_reported_at_once(custom: client.CustomObjectsApi, widgets: dict[str, str], ns: str) -> None:
    with pytest.raises(ApiException) as err:
        _create(custom, ns, widget("many", replicas=0, mode="warp"))
    fields = {c.get("field") for c in _invalid(err.value)}
    assert {"spec.replicas", "spec.mode"} <= fields


def test_cel_rule_on_self_is_enforced_with_its_message(custom: client.CustomObjectsApi, widgets: dict[str, str],
                                                        ns: str) -> None:
    with pytest.raises(ApiException) as err:
        _create(custom, ns, widget("cel", replicas=5, maxReplicas=3))
    causes = _invalid(err.value)
    assert any(c.get("field") == "spec" and "replicas must not exceed maxReplicas" in c["message"] for c in causes)


def test_cel_transition_rule_uses_old_self_on_update(custom: client.CustomObjectsApi, widgets: dict[str, str],
                                                      ns: str) -> None:
    _create(custom, ns, widget("tr", replicas=1, maxReplicas=5))
    custom.patch_namespaced_custom_object(CRD_GROUP, "v1", ns, "widgets", "tr", {"spec": {"maxReplicas": 6}})
    with pytest.raises(ApiException) as err:
        custom.patch_namespaced_custom_object(CRD_GROUP, "v1", ns, "widgets", "tr", {"spec": {"maxReplicas": 4}})
    assert any("maxReplicas may not shrink" in c["message"] for c in _invalid(err.value))


def test_unknown_fields_are_pruned_unless_preserved(custom: client.CustomObjectsApi, widgets: dict[str, str],
                                                    ns: str) -> None:
    obj = _create(custom, ns, {**widget("prune", replicas=1, extra={"free": {"form": 1}}),
                               "unknownTop": 1, "spec": {"replicas": 1, "bogus": True, "extra": {"free": {"form": 1}}}})
    assert "unknownTop" not in obj and "bogus" not in obj["spec"]
    assert obj["spec"]["extra"] == {"free": {"form": 1}}


def test_strict_field_validation_rejects_unknown_fields(cluster: Cluster, widgets: dict[str, str], ns: str) -> None:
    body = widget("strict", replicas=1)
    body["spec"]["bogus"] = 1
    status, _, st = cluster.raw("POST", f"/apis/{CRD_GROUP}/v1/namespaces/{ns}/widgets", body,
                                query={"fieldValidation": "Strict"})
    assert status == 400 and st["kind"] == "Status" and "bogus" in st["message"]


def test_status_subresource_separates_spec_and_status(custom: client.CustomObjectsApi, widgets: dict[str, str],
                                                      ns: str) -> None:
    body = widget("st", replicas=1)
    body["status"] = {"phase": "Ignored"}
    obj = _create(custom, ns, body)
    assert "status" not in obj or obj["status"].get("phase") != "Ignored"
    st = custom.patch_namespaced_custom_object_status(CRD_GROUP, "v1", ns, "widgets", "st", {
        "spec": {"replicas": 7}, "status": {"phase": "Running"}, "metadata": {"labels": {"via": "status"}}})
    assert st["status"]["phase"] == "Running"
    assert st["spec"]["replicas"] == 1
    assert "via" not in (st["metadata"].get("labels") or {})
    main = custom.patch_namespaced_custom_object(CRD_GROUP, "v1", ns, "widgets", "st", {
        "spec": {"replicas": 2}, "status": {"phase": "Hacked"}})
    assert main["status"]["phase"] == "Running" and main["spec"]["replicas"] == 2


def test_generation_bumps_on_spec_changes_only(custom: client.CustomObjectsApi, widgets: dict[str, str],
                                               ns: str) -> None:
    obj = _create(custom, ns, widget("gen", replicas=1))
    assert obj["metadata"]["generation"] == 1
    obj = custom.patch_namespaced_custom_object(CRD_GROUP, "v1", ns, "widgets", "gen",
                                                {"metadata": {"annotations": {"a": "b"}}})
    assert obj["metadata"]["generation"] == 1
    obj = custom.patch_namespaced_custom_object_status(CRD_GROUP, "v1", ns, "widgets", "gen",
                                                       {"status": {"phase": "Running"}})
    assert obj["metadata"]["generation"] == 1
    obj = custom.patch_namespaced_custom_object(CRD_GROUP, "v1", ns, "widgets", "gen", {"spec": {"replicas": 3}})
    assert obj["metadata"]["generation"] == 2


def test_strategic_merge_patch_is_415_for_custom_resources(cluster: Cluster, custom: client.CustomObjectsApi,
                                                           widgets: dict[str, str], ns: str) -> None:
    _create(custom, ns, widget("smp", replicas=1))
    status, _, st = cluster.raw("PATCH", f"/apis/{CRD_GROUP}/v1/namespaces/{ns}/widgets/smp", {"spec": {"replicas": 2}},
                                content_type="application/strategic-merge-patch+json")
    assert status == 415 and st["reason"] == "UnsupportedMediaType"


def test_json_patch_and_merge_patch_on_custom_resources(cluster: Cluster, custom: client.CustomObjectsApi,
                                                        widgets: dict[str, str], ns: str) -> None:
    _create(custom, ns, widget("jp", replicas=1, tags=["a"]))
    status, _, obj = cluster.raw("PATCH", f"/apis/{CRD_GROUP}/v1/namespaces/{ns}/widgets/jp", [
        {"op": "test", "path": "/spec/replicas", "value": 1},
        {"op": "replace", "path": "/spec/replicas", "value": 4},
        {"op": "add", "path": "/spec/tags/-", "value": "b"},
    ], content_type="application/json-patch+json")
    assert status == 200 and obj["spec"]["replicas"] == 4 and obj["spec"]["tags"] == ["a", "b"]
    status, _, _ = cluster.raw("PATCH", f"/apis/{CRD_GROUP}/v1/namespaces/{ns}/widgets/jp", [
        {"op": "test", "path": "/spec/replicas", "value": 99}], content_type="application/json-patch+json")
    assert status == 422
    status, _, obj = cluster.raw("PATCH", f"/apis/{CRD_GROUP}/v1/namespaces/{ns}/widgets/jp",
                                 {"spec": {"tags": None, "mode": "slow"}}, content_type="application/merge-patch+json")
    assert status == 200 and "tags" not in obj["spec"] and obj["spec"]["mode"] == "slow"


def test_patch_with_stale_resource_version_is_409(custom: client.CustomObjectsApi, widgets: dict[str, str],
                                                   ns: str) -> None:
    obj = _create(custom, ns, widget("prv", replicas=1))
    custom.patch_namespaced_custom_object(CRD_GROUP, "v1", ns, "widgets", "prv", {"spec": {"replicas": 2}})
    with pytest.raises(ApiException) as err:
        custom.patch_namespaced_custom_object(CRD_GROUP, "v1", ns, "widgets", "prv", {
            "metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]}, "spec": {"replicas": 3}})
    assert err.value.status == 409


def test_invalid_crd_is_rejected(cluster: Cluster) -> None:
    ext = client.ApiextensionsV1Api(cluster.api)
    bad = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": "things.bad.railyard.io"},
           "spec": {"group": "bad.railyard.io", "scope": "Namespaced",
                    "names": {"plural": "things", "kind": "Thing"},
                    "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                        "type": "object", "x-kubernetes-validations": [{"rule": "self.(("}]}}}]}}
    with pytest.raises(ApiException) as err:
        ext.create_custom_resource_definition(bad)
    assert err.value.status == 422


def test_cluster_scoped_crd_and_deleting_a_crd_removes_its_objects(cluster: Cluster) -> None:
    ext = client.ApiextensionsV1Api(cluster.api)
    custom = client.CustomObjectsApi(cluster.api)
    group = own_group("scoped.railyard.io")
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": f"gadgets.{group}"},
           "spec": {"group": group, "scope": "Cluster", "names": {"plural": "gadgets", "kind": "Gadget"},
                    "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                        "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}}
    ext.create_custom_resource_definition(crd)
    def served() -> bool:
        return cluster.raw("GET", f"/apis/{group}/v1")[0] == 200

    wait_until(served, timeout=15, message="the Gadget CRD to be served", interval=0.05)

    def create() -> bool:
        try:
            custom.create_cluster_custom_object(group, "v1", "gadgets", {
                "apiVersion": f"{group}/v1", "kind": "Gadget", "metadata": {"name": "g1"}, "anything": {"goes": 1}})
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    wait_until(create, timeout=15, message="creating a Gadget", interval=0.05)
    got = custom.get_cluster_custom_object(group, "v1", "gadgets", "g1")
    assert got["anything"] == {"goes": 1} and "namespace" not in got["metadata"]
    ext.delete_custom_resource_definition(crd["metadata"]["name"])
    wait_until(lambda: cluster.raw("GET", f"/apis/{group}/v1")[0] == 404, timeout=30, message="the CRD to go away", interval=0.05)
