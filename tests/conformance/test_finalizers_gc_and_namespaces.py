"""Finalizers and deletionTimestamp, ownerReference garbage collection (background, foreground,
orphan) and namespace deletion."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from tests.waiting import wait_until

from .conftest import gone


def _owner_ref(obj: Any, block: bool = False) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "name": obj.metadata.name, "uid": obj.metadata.uid,
            "blockOwnerDeletion": block}


def test_delete_with_finalizer_sets_deletion_timestamp_until_finalizers_are_gone(core: client.CoreV1Api,
                                                                                  ns: str) -> None:
    core.create_namespaced_config_map(ns, {"metadata": {"name": "f", "finalizers": ["railyard.io/test"]}})
    core.delete_namespaced_config_map("f", ns)
    cm = core.read_namespaced_config_map("f", ns)
    assert cm.metadata.deletion_timestamp is not None
    with pytest.raises(ApiException) as err:
        core.patch_namespaced_config_map("f", ns, {"metadata": {"finalizers": ["railyard.io/test", "railyard.io/new"]}})
    assert err.value.status == 422
    core.patch_namespaced_config_map("f", ns, {"metadata": {"finalizers": None}})
    wait_until(lambda: gone(lambda: core.read_namespaced_config_map("f", ns)), timeout=15, message="the object to be removed", interval=0.05)


def test_background_deletion_collects_dependents(needs_controllers: None, core: client.CoreV1Api, ns: str) -> None:
    owner = core.create_namespaced_config_map(ns, {"metadata": {"name": "owner"}})
    core.create_namespaced_config_map(ns, {"metadata": {"name": "child", "ownerReferences": [_owner_ref(owner)]}})
    core.create_namespaced_secret(ns, {"metadata": {"name": "child2", "ownerReferences": [_owner_ref(owner)]}})
    core.delete_namespaced_config_map("owner", ns)
    wait_until(lambda: gone(lambda: core.read_namespaced_config_map("child", ns)), timeout=15, message="child to be collected", interval=0.05)
    wait_until(lambda: gone(lambda: core.read_namespaced_secret("child2", ns)), timeout=15, message="child2 to be collected", interval=0.05)


def test_dependent_with_a_living_second_owner_survives(needs_controllers: None, core: client.CoreV1Api,
                                                       ns: str) -> None:
    a = core.create_namespaced_config_map(ns, {"metadata": {"name": "oa"}})
    b = core.create_namespaced_config_map(ns, {"metadata": {"name": "ob"}})
    core.create_namespaced_config_map(ns, {"metadata": {"name": "shared",
                                                        "ownerReferences": [_owner_ref(a), _owner_ref(b)]}})
    core.delete_namespaced_config_map("oa", ns)

    def only_b_left() -> bool:
        refs = core.read_namespaced_config_map("shared", ns).metadata.owner_references or []
        return [r.name for r in refs] == ["ob"]

    wait_until(only_b_left, timeout=15, message="the dangling owner reference to be removed", interval=0.05)


def test_foreground_deletion_waits_for_blocking_dependents(needs_controllers: None, core: client.CoreV1Api,
                                                           ns: str) -> None:
    owner = core.create_namespaced_config_map(ns, {"metadata": {"name": "fg"}})
    core.create_namespaced_config_map(ns, {"metadata": {
        "name": "fg-child", "ownerReferences": [_owner_ref(owner, block=True)], "finalizers": ["railyard.io/hold"]}})
    core.delete_namespaced_config_map("fg", ns, propagation_policy="Foreground")
    o = core.read_namespaced_config_map("fg", ns)
    assert o.metadata.deletion_timestamp is not None and "foregroundDeletion" in (o.metadata.finalizers or [])
    wait_until(lambda: core.read_namespaced_config_map("fg-child", ns).metadata.deletion_timestamp,
               timeout=15,
               message="the dependent to be deleted",
               interval=0.05)
    assert core.read_namespaced_config_map("fg", ns).metadata.deletion_timestamp is not None
    core.patch_namespaced_config_map("fg-child", ns, {"metadata": {"finalizers": None}})
    wait_until(lambda: gone(lambda: core.read_namespaced_config_map("fg", ns)), timeout=15, message="the owner to go after its child", interval=0.05)


def test_orphan_deletion_keeps_dependents_and_drops_the_reference(needs_controllers: None, core: client.CoreV1Api,
                                                                  ns: str) -> None:
    owner = core.create_namespaced_config_map(ns, {"metadata": {"name": "orph"}})
    core.create_namespaced_config_map(ns, {"metadata": {"name": "orph-child", "ownerReferences": [_owner_ref(owner)]}})
    core.delete_namespaced_config_map("orph", ns, propagation_policy="Orphan")
    wait_until(lambda: gone(lambda: core.read_namespaced_config_map("orph", ns)), timeout=15, message="the owner to go", interval=0.05)
    child = core.read_namespaced_config_map("orph-child", ns)
    assert not child.metadata.owner_references


def test_deleting_a_namespace_deletes_its_objects(needs_controllers: None, core: client.CoreV1Api) -> None:
    import uuid

    name = f"conf-del-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": name}})
    core.create_namespaced_config_map(name, {"metadata": {"name": "x"}})
    core.create_namespaced_secret(name, {"metadata": {"name": "y"}})
    core.delete_namespace(name)
    try:
        n = core.read_namespace(name)
    except ApiException as exc:
        assert exc.status == 404  # already emptied and removed
    else:
        assert n.status.phase == "Terminating"
        with pytest.raises(ApiException) as err:
            core.create_namespaced_config_map(name, {"metadata": {"name": "late"}})
        assert err.value.status in (403, 404)
    wait_until(lambda: gone(lambda: core.read_namespace(name)), timeout=60, message="the namespace to be deleted", interval=0.05)
    assert gone(lambda: core.read_namespaced_config_map("x", name))


def test_every_namespace_gets_a_default_service_account(needs_controllers: None, core: client.CoreV1Api,
                                                        ns: str) -> None:
    wait_until(lambda: not gone(lambda: core.read_namespaced_service_account("default", ns)),
               timeout=15,
               message="the default ServiceAccount",
               interval=0.05)
