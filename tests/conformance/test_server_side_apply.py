"""Server-side apply (what Helm 4 and ``kubectl apply --server-side`` use): field managers own
what they apply, a change to another manager's field is a 409 naming each field, ``force=true``
takes the field, and re-applying without a field gives it up unless someone else owns it."""

from __future__ import annotations

from typing import Any

from .conftest import Cluster

APPLY = "application/apply-patch+yaml"


def _apply(cluster: Cluster, ns: str, name: str, manager: str | None, data: dict[str, str],
           force: bool = False) -> tuple[int, Any]:
    body = (f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n"
            + "".join(f"  {k}: \"{v}\"\n" for k, v in data.items()))
    query = {"fieldManager": manager} if manager else {}
    if force:
        query["force"] = "true"
    status, _, out = cluster.raw("PATCH", f"/api/v1/namespaces/{ns}/configmaps/{name}", body.encode(),
                                 content_type=APPLY, query=query)
    return status, out


def _owners(cm: dict[str, Any]) -> dict[str, set[str]]:
    return {e["manager"]: {k[2:] for k in (e.get("fieldsV1") or {}).get("f:data", {}) if k.startswith("f:")}
            for e in cm["metadata"].get("managedFields") or [] if e["operation"] == "Apply"}


def test_apply_creates_then_conflicts_then_force_takes_the_field(cluster: Cluster, ns: str) -> None:
    status, cm = _apply(cluster, ns, "ssa", "alice", {"a": "1", "keep": "x"})
    assert status == 201, cm
    assert _owners(cm) == {"alice": {"a", "keep"}}

    status, st = _apply(cluster, ns, "ssa", "bob", {"a": "2"})
    assert status == 409 and st["reason"] == "Conflict"
    assert st["details"]["causes"] == [{"reason": "FieldManagerConflict", "message": 'conflict with "alice"',
                                        "field": ".data.a"}]
    assert st["message"] == 'Apply failed with 1 conflict: conflict with "alice": .data.a'

    status, cm = _apply(cluster, ns, "ssa", "bob", {"a": "2"}, force=True)
    assert status == 200 and cm["data"] == {"a": "2", "keep": "x"}
    assert _owners(cm) == {"alice": {"keep"}, "bob": {"a"}}


def test_a_manager_that_stops_applying_a_field_removes_it_unless_shared(cluster: Cluster, ns: str) -> None:
    assert _apply(cluster, ns, "drop", "alice", {"a": "1", "b": "1"})[0] == 201
    assert _apply(cluster, ns, "drop", "bob", {"b": "1"})[0] == 200  # same value: shared, no conflict
    status, cm = _apply(cluster, ns, "drop", "alice", {"c": "1"})
    assert status == 200
    assert cm["data"] == {"b": "1", "c": "1"}, "a was only alice's: gone; b is still bob's"


def test_apply_needs_a_field_manager(cluster: Cluster, ns: str) -> None:
    status, st = _apply(cluster, ns, "nomgr", None, {"a": "1"})
    assert status == 422 and st["details"]["causes"][0]["field"] == "fieldManager", st
