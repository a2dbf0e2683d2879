"""What the replays cannot show yet, on a running embedded server: taint-based eviction of the pods
of a node tainted ``NoExecute`` (the recorded lost node needs the node lifecycle rule, another
module; here the test taints the node itself, as that rule or an admin would), and a drain's
evictions waiting on a PodDisruptionBudget with an integer ``minAvailable`` until a pod is
gone (what issue 47's operator relies on)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.waiting import wait_until

from railyard_local.apiserver.process import start_server_process

from .replay import Client

NS = "golden-taints"
PODS = f"/api/v1/namespaces/{NS}/pods"
UNREACHABLE = "node.kubernetes.io/unreachable"


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    state: Path = tmp_path_factory.mktemp("golden-taints-apiserver")
    proc = start_server_process(state, token=secrets.token_hex(16))
    try:
        c = Client(proc.url, proc.token, proc.ca_file)
        assert c.json("POST", "/api/v1/namespaces", {"metadata": {"name": NS}})[0] == 201
        for node in ("t-0", "t-1"):
            assert c.json("POST", "/api/v1/nodes", {"metadata": {"name": node}})[0] == 201
        yield c
    finally:
        proc.stop()


def _running_pod(c: Client, name: str, node: str, labels: dict[str, str] | None = None,
                 tolerations: list[dict[str, Any]] | None = None) -> None:
    spec: dict[str, Any] = {"nodeName": node, "containers": [{"name": "c", "image": "x"}]}
    if tolerations is not None:
        spec["tolerations"] = tolerations
    status, body = c.json("POST", PODS, {"metadata": {"name": name, "labels": labels or {}}, "spec": spec})
    assert status == 201, body
    status, body = c.json("PATCH", f"{PODS}/{name}/status", {"status": {
        "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}},
        content_type="application/merge-patch+json")
    assert status == 200, body


def _pod(c: Client, name: str) -> dict[str, Any]:
    status, body = c.json("GET", f"{PODS}/{name}")
    return body if status == 200 and isinstance(body, dict) else {}


def _target(pod: dict[str, Any]) -> dict[str, Any] | None:
    return next((x for x in (pod.get("status") or {}).get("conditions") or [] if x.get("type") == "DisruptionTarget"),
                None)


def test_a_noexecute_taint_evicts_what_it_does_not_tolerate(client: Client) -> None:
    c = client
    _running_pod(c, "short", "t-0", tolerations=[{"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute",
                                                  "tolerationSeconds": 1}])
    _running_pod(c, "patient", "t-0")  # admission: 300 s
    _running_pod(c, "elsewhere", "t-1", tolerations=[])
    status, body = c.json("PATCH", "/api/v1/nodes/t-0", {"spec": {"taints": [
        {"key": UNREACHABLE, "effect": "NoExecute"}, {"key": UNREACHABLE, "effect": "NoSchedule"}]}},
        content_type="application/merge-patch+json")
    assert status == 200, body
    gone = wait_until(lambda: _pod(c, "short") if _pod(c, "short").get("metadata", {}).get("deletionTimestamp")
                      else None, timeout=30, message="the 1 s pod to be deleted by the taint manager")
    target = _target(gone)
    assert target is not None and target["reason"] == "DeletionByTaintManager", gone["status"]
    assert target["message"] == "Taint manager: deleting due to NoExecute taint"

    def evicted_event() -> bool:
        _, events = c.json("GET", f"/api/v1/namespaces/{NS}/events",
                           query={"fieldSelector": "involvedObject.name=short"})
        return any(e.get("reason") == "TaintManagerEviction" for e in (events or {}).get("items") or [])
    wait_until(evicted_event, timeout=30, message="the TaintManagerEviction event")
    for name in ("patient", "elsewhere"):
        pod = _pod(c, name)
        assert not pod["metadata"].get("deletionTimestamp") and _target(pod) is None, name


def test_a_budget_holds_evictions_until_a_pod_is_gone(client: Client) -> None:
    c = client
    for i in range(3):
        _running_pod(c, f"w-{i}", "t-1", labels={"app": "w"})
    pdbs = f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets"
    status, body = c.json("POST", pdbs, {"metadata": {"name": "w"},
                                         "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "w"}}}})
    assert status == 201, body
    wait_until(lambda: (c.json("GET", f"{pdbs}/w")[1].get("status") or {}).get("disruptionsAllowed") == 1,
               timeout=30, message="one disruption allowed")
    evict = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "w-0"}}
    assert c.json("POST", f"{PODS}/w-0/eviction", evict)[0] == 201
    refused, body = c.json("POST", f"{PODS}/w-1/eviction", {**evict, "metadata": {"name": "w-1"}})
    assert refused == 429, body
    assert body["details"]["causes"][0]["reason"] == "DisruptionBudget"
    # the node agent confirms w-0's end: the budget is healthy again only with a replacement
    c.json("DELETE", f"{PODS}/w-0", {"gracePeriodSeconds": 0})
    _running_pod(c, "w-3", "t-1", labels={"app": "w"})
    wait_until(lambda: (c.json("GET", f"{pdbs}/w")[1].get("status") or {}).get("disruptionsAllowed") == 1,
               timeout=30, message="the replacement to free one disruption again")
    assert c.json("POST", f"{PODS}/w-1/eviction", {**evict, "metadata": {"name": "w-1"}})[0] == 201
