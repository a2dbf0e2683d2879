"""Table output for kubectl get, Events in both API groups, and Leases."""

from __future__ import annotations

import datetime

from kubernetes import client

from .conftest import CRD_GROUP, Cluster, pod, widget

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"


def test_table_for_custom_resources_uses_printer_columns(cluster: Cluster, custom: client.CustomObjectsApi,
                                                         widgets: dict[str, str], ns: str) -> None:
    custom.create_namespaced_custom_object(CRD_GROUP, "v1", ns, "widgets", widget("t1", replicas=3))
    custom.patch_namespaced_custom_object_status(CRD_GROUP, "v1", ns, "widgets", "t1", {"status": {
        "phase": "Running", "conditions": [{"type": "Progressing", "status": "False"},
                                           {"type": "Ready", "status": "True"}]}})
    status, _, table = cluster.raw("GET", f"/apis/{CRD_GROUP}/v1/namespaces/{ns}/widgets", accept=TABLE)
    assert status == 200 and table["kind"] == "Table"
    names = [c["name"] for c in table["columnDefinitions"]]
    assert names[:4] == ["Name", "Replicas", "Phase", "Ready"]
    row = next(r for r in table["rows"] if r["cells"][0] == "t1")
    assert row["cells"][1:4] == [3, "Running", "True"]
    assert row["object"]["metadata"]["name"] == "t1"


def test_table_for_pods_has_the_usual_columns(cluster: Cluster, core: client.CoreV1Api, ns: str) -> None:
    core.create_namespaced_pod(ns, pod("tp"))
    status, _, table = cluster.raw("GET", f"/api/v1/namespaces/{ns}/pods", accept=TABLE)
    assert status == 200 and table["kind"] == "Table"
    names = [c["name"] for c in table["columnDefinitions"]]
    assert names[:5] == ["Name", "Ready", "Status", "Restarts", "Age"]
    row = table["rows"][0]
    assert row["cells"][0] == "tp" and row["cells"][1] == "0/1" and row["cells"][2] == "Pending"


def test_core_events_are_visible_through_events_k8s_io(cluster: Cluster, core: client.CoreV1Api, ns: str) -> None:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    core.create_namespaced_event(ns, {
        "metadata": {"name": "e1"}, "involvedObject": {"kind": "Pod", "name": "p", "namespace": ns},
        "reason": "Started", "message": "it started", "type": "Normal", "firstTimestamp": now, "lastTimestamp": now,
        "count": 1, "source": {"component": "conformance"}})
    status, _, ev = cluster.raw("GET", f"/apis/events.k8s.io/v1/namespaces/{ns}/events/e1")
    assert status == 200 and ev["apiVersion"] == "events.k8s.io/v1"
    assert ev["regarding"]["name"] == "p" and ev["note"] == "it started" and ev["reason"] == "Started"
    assert ev["deprecatedCount"] == 1
    assert [e.metadata.name for e in core.list_namespaced_event(ns, field_selector="involvedObject.name=p").items] == ["e1"]


def test_events_k8s_io_events_are_visible_as_core_events(cluster: Cluster, core: client.CoreV1Api, ns: str) -> None:
    # Raw JSON: the Python client re-serialises eventTime with isoformat(), which drops zero
    # microseconds and writes +00:00, and a real server refuses anything but a MicroTime.
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    status, _, body = cluster.raw("POST", f"/apis/events.k8s.io/v1/namespaces/{ns}/events", {
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "e2"}, "regarding": {"kind": "Pod", "name": "q", "namespace": ns},
        "reason": "Killing", "note": "stopping", "type": "Normal", "eventTime": now,
        "action": "Kill", "reportingController": "railyard.io/agent", "reportingInstance": "agent-1"})
    assert status == 201, body
    ev = core.read_namespaced_event("e2", ns)
    assert ev.involved_object.name == "q" and ev.message == "stopping"


def test_events_k8s_io_refuses_what_a_real_server_refuses(cluster: Cluster, ns: str) -> None:
    """eventTime must be a MicroTime (six fraction digits); reportingController is required."""
    body = {"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "bad"},
            "regarding": {"kind": "Pod", "name": "q", "namespace": ns}, "reason": "R", "note": "n",
            "type": "Normal", "action": "A", "reportingController": "railyard.io/agent", "reportingInstance": "i"}
    path = f"/apis/events.k8s.io/v1/namespaces/{ns}/events"
    status, _, st = cluster.raw("POST", path, {**body, "eventTime": "2026-12-01T08:00:00Z"})
    assert status == 400 and "cannot parse" in st["message"], st
    missing = {k: v for k, v in body.items() if k != "reportingController"}
    status, _, st = cluster.raw("POST", path, {**missing, "eventTime": "2026-12-01T08:00:00.000000Z"})
    assert status == 422 and st["details"]["causes"][0] == {
        "reason": "FieldValueRequired", "message": "Required value", "field": "reportingController"}, st


def test_leases_create_renew_and_conflict(cluster: Cluster, ns: str) -> None:
    coord = client.CoordinationV1Api(cluster.api)
    lease = coord.create_namespaced_lease(ns, {"metadata": {"name": "node-1"}, "spec": {
        "holderIdentity": "node-1", "leaseDurationSeconds": 40}})
    renewed = coord.patch_namespaced_lease("node-1", ns, {"spec": {
        "renewTime": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")}})
    assert renewed.spec.holder_identity == "node-1" and renewed.spec.renew_time is not None
    assert int(renewed.metadata.resource_version) > int(lease.metadata.resource_version)
    try:
        coord.replace_namespaced_lease("node-1", ns, {"metadata": {
            "name": "node-1", "resourceVersion": lease.metadata.resource_version}, "spec": {"holderIdentity": "x"}})
        raise AssertionError("a stale lease update must conflict")
    except client.ApiException as exc:
        assert exc.status == 409
