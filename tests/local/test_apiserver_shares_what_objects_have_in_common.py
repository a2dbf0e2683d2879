"""The embedded API server keeps one copy of each distinct managedFields in memory, and the
writes that share parts of the stored object (bind, status) never change a stored object:
what every object serialises to stays what it was written as."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from railyard_local.apiserver.engine import Ctx
from railyard_local.apiserver.server import APIServer
from railyard_local.apiserver.sharing import ManagedFieldsInterner


def pod(i: int) -> dict[str, Any]:
    return {"metadata": {"name": f"p-{i}", "labels": {"app": "gang", "rank": str(i)}},
            "spec": {"containers": [{"name": "main", "image": "i", "env": [{"name": "RANK", "value": str(i)}],
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


def test_the_interner_shares_equal_values_and_leaves_odd_ones_alone() -> None:
    interner = ManagedFieldsInterner()
    entry = {"manager": "m", "operation": "Update", "apiVersion": "v1", "time": "t", "fieldsType": "FieldsV1",
             "fieldsV1": {"f:spec": {"f:x": {}, ".": {}}}}
    a = interner.managed_fields([json.loads(json.dumps(entry))])
    b = interner.managed_fields([json.loads(json.dumps(entry))])
    assert a is b and a == [entry]
    other = dict(entry, fieldsV1={"f:spec": {".": {}, "f:x": {}}})  # same set, other key order
    c = interner.managed_fields([other])
    assert c is not a and json.dumps(c) == json.dumps([other]), "key order is kept"
    odd = [{"manager": "m", "fieldsV1": {"f:x": []}}]
    assert interner.managed_fields(odd) is odd
    for small in (ManagedFieldsInterner(limit=2), ManagedFieldsInterner(key_bytes=40)):
        for i in range(5):  # the table starts afresh, values stay right
            e = dict(entry, time=str(i), fieldsV1={"f:spec": {f"f:x{i}": {}}})
            assert small.managed_fields([json.loads(json.dumps(e))]) == [e]
        assert len(small._by_key) <= 3


async def test_stored_objects_share_managed_fields_and_stay_as_written(tmp_path: Path) -> None:
    srv = APIServer(tmp_path / "state", token="t", tls=False)
    await srv.start()
    try:
        eng, reg = srv.engine, srv.registry
        pods, nss = reg.lookup("", "v1", "pods"), reg.lookup("", "v1", "namespaces")
        assert pods is not None and nss is not None
        await eng.create(nss, "", {"metadata": {"name": "ns"}}, Ctx(manager="test"))
        entries = [await eng.create(pods, "ns", pod(i), Ctx(manager="test")) for i in range(3)]
        mfs = [e.obj["metadata"]["managedFields"] for e in entries]
        assert mfs[0] is mfs[1] is mfs[2], "one template: one managedFields object"
        written = {e.obj["metadata"]["name"]: e.raw for e in entries}
        await eng.bind("ns", "p-0", {"target": {"name": "node-a"}}, Ctx(manager="scheduler"))
        patch = {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
        await eng.patch(pods, "ns", "p-1", "application/merge-patch+json", json.dumps(patch).encode(),
                        Ctx(manager="agent"), "status")
        await eng.patch(pods, "ns", "p-2", "application/strategic-merge-patch+json",
                        json.dumps({"metadata": {"labels": {"extra": "x"}}}).encode(), Ctx(manager="kubectl"))
        # the objects the writes started from are unchanged, and every stored object is its bytes
        for e in entries:
            assert e.raw == written[e.obj["metadata"]["name"]]
            assert json.loads(e.raw) == e.obj
        for name in ("p-0", "p-1", "p-2"):
            cur = eng.get(pods, "ns", name)
            assert json.loads(cur.raw) == cur.obj
        assert eng.get(pods, "ns", "p-0").obj["spec"]["nodeName"] == "node-a"
        assert eng.get(pods, "ns", "p-1").obj["status"]["phase"] == "Running"
        managers = {m["manager"] for m in eng.get(pods, "ns", "p-2").obj["metadata"]["managedFields"]}
        assert managers == {"test", "kubectl"}
    finally:
        await srv.stop()
