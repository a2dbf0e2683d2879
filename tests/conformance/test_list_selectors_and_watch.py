"""List with label/field selectors and paging; watch from a resourceVersion, bookmarks, timeouts, 410."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException
from tests.waiting import wait_until

from .conftest import ABSENT_NODE, Cluster, pod


def _names(items: list[Any]) -> set[str]:
    return {i.metadata.name for i in items}


@pytest.fixture
def labelled(core: client.CoreV1Api, ns: str) -> str:
    """Four ConfigMaps carrying the test's own ``set`` label: a real cluster adds others to every
    namespace (kube-root-ca.crt), so every selector below also selects on ``set``."""
    for name, labels in [("a", {"app": "web", "tier": "front"}), ("b", {"app": "web", "tier": "back"}),
                         ("c", {"app": "db"}), ("d", {})]:
        core.create_namespaced_config_map(ns, {"metadata": {"name": name, "labels": {**labels, "set": ns}}})
    return ns


@pytest.mark.parametrize(("selector", "expected"), [
    ("app=web", {"a", "b"}),
    ("app==web", {"a", "b"}),
    ("app!=web", {"c", "d"}),
    ("app in (web,db)", {"a", "b", "c"}),
    ("app notin (web)", {"c", "d"}),
    ("tier", {"a", "b"}),
    ("!tier", {"c", "d"}),
    ("app=web,tier=back", {"b"}),
])
def test_label_selectors(core: client.CoreV1Api, labelled: str, selector: str, expected: set[str]) -> None:
    got = core.list_namespaced_config_map(labelled, label_selector=f"{selector},set={labelled}").items
    assert _names(got) == expected


def test_a_new_namespace_holds_what_the_controllers_add(needs_controllers: None, core: client.CoreV1Api, ns: str) -> None:
    """Every namespace gets the root CA bundle and a default ServiceAccount (kube-controller-manager)."""
    cm = wait_until(lambda: _maybe(lambda: core.read_namespaced_config_map("kube-root-ca.crt", ns)),
                    timeout=15,
                    message="kube-root-ca.crt in the new namespace",
                    interval=0.05)
    assert cm.data["ca.crt"].startswith("-----BEGIN CERTIFICATE-----")
    wait_until(lambda: _maybe(lambda: core.read_namespaced_service_account("default", ns)),
               timeout=15,
               message="the default ServiceAccount",
               interval=0.05)


def _maybe(fn: Any) -> Any:
    try:
        return fn()
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def test_field_selectors_on_name_and_namespace(core: client.CoreV1Api, labelled: str) -> None:
    assert _names(core.list_namespaced_config_map(labelled, field_selector="metadata.name=c").items) == {"c"}
    assert _names(core.list_namespaced_config_map(labelled, field_selector="metadata.name!=c").items) >= {"a", "b", "d"}
    every = core.list_config_map_for_all_namespaces(field_selector=f"metadata.namespace={labelled}").items
    assert _names(every) >= {"a", "b", "c", "d"} and {i.metadata.namespace for i in every} == {labelled}


def test_field_selectors_on_pod_node_name_and_phase(core: client.CoreV1Api, ns: str) -> None:
    core.create_namespaced_pod(ns, pod("on-n1", nodeName=ABSENT_NODE))
    core.create_namespaced_pod(ns, pod("unbound"))
    core.patch_namespaced_pod_status("on-n1", ns, {"status": {"phase": "Running"}})
    assert _names(core.list_namespaced_pod(ns, field_selector=f"spec.nodeName={ABSENT_NODE}").items) == {"on-n1"}
    assert _names(core.list_namespaced_pod(ns, field_selector="spec.nodeName=").items) == {"unbound"}
    assert _names(core.list_namespaced_pod(ns, field_selector="status.phase=Running").items) == {"on-n1"}
    assert _names(core.list_namespaced_pod(ns, field_selector="status.phase!=Running").items) == {"unbound"}


def test_unsupported_field_selector_is_400(cluster: Cluster, ns: str) -> None:
    status, _, body = cluster.raw("GET", f"/api/v1/namespaces/{ns}/configmaps",
                                  query={"fieldSelector": "data.foo=bar"})
    assert status == 400 and body["kind"] == "Status"


def test_limit_and_continue_page_through_a_list(core: client.CoreV1Api, ns: str) -> None:
    for i in range(7):
        core.create_namespaced_config_map(ns, {"metadata": {"name": f"page-{i}"}})
    seen: list[str] = []
    token = None
    pages = 0
    while True:
        page = core.list_namespaced_config_map(ns, limit=3, _continue=token)
        pages += 1
        seen.extend(i.metadata.name for i in page.items)
        token = page.metadata._continue
        if not token:
            break
    assert pages >= 3
    assert sorted(n for n in seen if n.startswith("page-")) == [f"page-{i}" for i in range(7)]


def _collect(core: client.CoreV1Api, ns: str, rv: str, stop_after: int, timeout: int = 10, *,
             names: set[str], **kw: Any) -> list[tuple[str, str]]:
    """Watch events for ``names`` only: the namespace's controllers may add their own objects
    (kube-root-ca.crt) at any time on a real cluster."""
    w = watch.Watch()
    out: list[tuple[str, str]] = []
    for ev in w.stream(core.list_namespaced_config_map, ns, resource_version=rv, timeout_seconds=timeout, **kw):
        if ev["object"].metadata.name not in names:
            continue
        out.append((ev["type"], ev["object"].metadata.name))
        if len(out) >= stop_after:
            w.stop()
    return out


def test_watch_from_a_resource_version_sees_added_modified_deleted_in_order(core: client.CoreV1Api, ns: str) -> None:
    rv = core.list_namespaced_config_map(ns).metadata.resource_version
    core.create_namespaced_config_map(ns, {"metadata": {"name": "w"}})
    core.patch_namespaced_config_map("w", ns, {"data": {"a": "1"}})
    core.delete_namespaced_config_map("w", ns)
    assert _collect(core, ns, rv, 3, names={"w"}) == [("ADDED", "w"), ("MODIFIED", "w"), ("DELETED", "w")]


def test_watch_with_label_selector_turns_label_changes_into_added_and_deleted(core: client.CoreV1Api, ns: str) -> None:
    rv = core.list_namespaced_config_map(ns).metadata.resource_version
    core.create_namespaced_config_map(ns, {"metadata": {"name": "x", "labels": {"sel": "no"}}})
    core.patch_namespaced_config_map("x", ns, {"metadata": {"labels": {"sel": "yes"}}})
    core.patch_namespaced_config_map("x", ns, {"data": {"k": "v"}})
    core.patch_namespaced_config_map("x", ns, {"metadata": {"labels": {"sel": "no"}}})
    got = _collect(core, ns, rv, 3, names={"x"}, label_selector="sel=yes")
    assert got == [("ADDED", "x"), ("MODIFIED", "x"), ("DELETED", "x")]


def test_watch_receives_live_events(core: client.CoreV1Api, ns: str) -> None:
    rv = core.list_namespaced_config_map(ns).metadata.resource_version
    result: list[tuple[str, str]] = []
    t = threading.Thread(target=lambda: result.extend(_collect(core, ns, rv, 1, names={"live"})))
    t.start()
    core.create_namespaced_config_map(ns, {"metadata": {"name": "live"}})
    t.join(15)
    assert result == [("ADDED", "live")]


def test_watch_ends_after_timeout_seconds(cluster: Cluster, core: client.CoreV1Api, ns: str) -> None:
    rv = core.list_namespaced_config_map(ns).metadata.resource_version
    start = time.monotonic()
    status, _, resp = cluster.raw("GET", f"/api/v1/namespaces/{ns}/configmaps",
                                  query={"watch": "1", "resourceVersion": rv, "timeoutSeconds": "1"}, preload=False)
    assert status == 200
    resp.read()
    assert time.monotonic() - start < 10


def test_watch_bookmarks_carry_a_resource_version(cluster: Cluster, core: client.CoreV1Api, ns: str) -> None:
    """With sendInitialEvents the server ends the initial state with a bookmark (k8s >= 1.27 WatchList)."""
    core.create_namespaced_config_map(ns, {"metadata": {"name": "bm"}})
    status, _, resp = cluster.raw("GET", f"/api/v1/namespaces/{ns}/configmaps", query={
        "watch": "1", "allowWatchBookmarks": "true", "sendInitialEvents": "true",
        "resourceVersionMatch": "NotOlderThan", "timeoutSeconds": "2"}, preload=False)
    if status in (400, 422, 403):
        pytest.skip("this server does not support sendInitialEvents (WatchList)")
    events = [json.loads(line) for line in resp.read().splitlines() if line.strip()]
    if events and events[0]["type"] == "ERROR":
        # e.g. an etcd without watch-progress support: the server says it cannot do WatchList
        pytest.skip(f"this server refused the WatchList stream: {events[0]['object'].get('message')}")
    added = [e["object"]["metadata"]["name"] for e in events if e["type"] == "ADDED"]
    assert "bm" in added, events
    bookmarks = [e for e in events if e["type"] == "BOOKMARK"]
    assert bookmarks, events
    assert int(bookmarks[0]["object"]["metadata"]["resourceVersion"]) > 0
    assert bookmarks[0]["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"] == "true"


def test_watch_from_a_version_older_than_the_window_is_410(embedded_only: None, tmp_path: Any) -> None:
    """Real servers answer 410 once etcd compacted the version (minutes); the embedded server once
    its event window has moved past it, which a small window makes quick to test."""
    from railyard_local.apiserver.process import start_server_process

    from .conftest import _api_client

    proc = start_server_process(tmp_path, extra_args=["--event-window", "20"])
    try:
        api = client.CoreV1Api(_api_client(proc.write_kubeconfig(tmp_path / "kc")))
        old = api.create_namespaced_config_map("default", {"metadata": {"name": "old"}}).metadata.resource_version
        for i in range(30):
            api.create_namespaced_config_map("default", {"metadata": {"name": f"n{i}"}})
        with pytest.raises(ApiException) as err:
            for _ in watch.Watch().stream(api.list_namespaced_config_map, "default", resource_version=old,
                                          timeout_seconds=5):
                pass
        assert err.value.status == 410
    finally:
        proc.stop()
