"""The embedded API server serves Kueue's Workload CRD (vendored from Kueue v0.13.1,
tests/deployment/schemas/kueue.x-k8s.io_v1beta1_Workload.json) and answers the requests an owner
makes in kueue-v0.13-workload as the real kube-apiserver did: the create (defaults), the
validation Kueue's schema carries (CEL, maxItems, list-map keys), and the owner's server-side
apply of ``Finished`` on ``/status`` that touches no other condition. Kueue's own decisions
(admission, eviction) need Kueue running: the operator's tests play them (tests/operator/fake_kueue.py)."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.operator.fake_kueue import kueue_workload_crd
from tests.waiting import wait_until

from railyard_local.apiserver.process import start_server_process

from .replay import WAIT_S, Client, normalise

HERE = Path(__file__).parent
CORPUS = HERE / "kueue-v0.13-workload"
NS = "kq-wl"
WORKLOADS = f"/apis/kueue.x-k8s.io/v1beta1/namespaces/{NS}/workloads"


def _case(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CORPUS / name).read_text())
    return data


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    state = tmp_path_factory.mktemp("kueue-apiserver")
    proc = start_server_process(state, token=secrets.token_hex(16))
    try:
        c = Client(proc.url, proc.token, proc.ca_file)
        status, body = c.json("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", kueue_workload_crd())
        assert status == 201, body
        wait_until(lambda: c.json("GET", WORKLOADS)[0] == 200, timeout=WAIT_S, interval=0.05, message="Workloads served")
        status, body = c.json("POST", "/api/v1/namespaces", {"metadata": {"name": NS}})
        assert status == 201, body
        yield c
    finally:
        proc.stop()


def _send(c: Client, case: dict[str, Any]) -> tuple[int, Any]:
    req = case["request"]
    body = req["body"]
    if isinstance(body, dict) and req["method"] == "POST":
        # the recorded owner (TrainingJob tj-a, 006, uid of that cluster) does not exist here: the
        # garbage collector would delete a Workload owned by it, as a real one does
        body = {**body, "metadata": {k: v for k, v in body["metadata"].items() if k != "ownerReferences"}}
    return c.json(req["method"], req["path"], body, query=req.get("query") or None, content_type=req.get("contentType"))


def _object(body: Any) -> Any:
    """The object without what only the recorder's clients and Kueue's webhooks wrote:
    managedFields, the owner (see _send), and the empty ``template.metadata`` Kueue's defaulting
    webhook returns (its Go round trip of a PodTemplateSpec writes ``metadata: {}``)."""
    out = normalise(body)
    out["metadata"].pop("managedFields", None)
    out["metadata"].pop("ownerReferences", None)
    for pod_set in out["spec"]["podSets"]:
        if pod_set["template"].get("metadata") == {}:
            del pod_set["template"]["metadata"]
    return out


def test_the_owners_workload_is_created_as_recorded(client: Client) -> None:
    case = _case("007-a01-workload-create.json")
    status, body = _send(client, case)
    assert status == case["response"]["status"] == 201
    assert _object(body) == _object(case["response"]["body"]), "spec.active defaulted, nothing else"


@pytest.mark.parametrize("name", ["014-a10-workload-class-without-priority.json", "015-a11-workload-nine-podsets.json"])
def test_what_kueues_schema_refuses_is_refused(client: Client, name: str) -> None:
    case = _case(name)
    status, body = _send(client, case)
    assert status == case["response"]["status"] == 422
    expected = case["response"]["body"]
    assert [c.get("field") for c in body["details"]["causes"]] == [c.get("field") for c in expected["details"]["causes"]]
    assert [c.get("message") for c in body["details"]["causes"]] == [c.get("message") for c in expected["details"]["causes"]]


def test_finished_by_server_side_apply_touches_no_other_condition(client: Client) -> None:
    """Kueue's conditions as it wrote them on admission (008), then the owner's apply (031)."""
    admitted = _case("008-a02-workload-admitted.json")["response"]["body"]["status"]
    conditions = [{**c, "lastTransitionTime": "2026-12-07T02:51:40Z"} for c in admitted["conditions"]]
    status, body = client.json("PATCH", f"{WORKLOADS}/tj-a/status", {"status": {**admitted, "conditions": conditions}},
                               content_type="application/merge-patch+json")
    assert status == 200, body
    case = _case("031-b06-finish-workload-ssa.json")
    status, body = _send(client, case)
    assert status == case["response"]["status"] == 200, body
    got = [(c["type"], c["status"], c["reason"]) for c in body["status"]["conditions"]]
    want = [(c["type"], c["status"], c["reason"]) for c in case["response"]["body"]["status"]["conditions"]]
    assert got == want
    assert body["status"]["admission"] == case["response"]["body"]["status"]["admission"]
