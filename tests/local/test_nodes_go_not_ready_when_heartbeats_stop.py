"""The embedded API server applies kube-controller-manager's node lifecycle rule
(apiserver/nodelifecycle.py): a node whose Lease and status go unrenewed for the grace period
turns Ready=Unknown with the ``node.kubernetes.io/unreachable`` taints, its pods Ready=False,
as the real one recorded in kube-golden/v1.36-disruption 047-052; a node that keeps renewing
stays Ready, and one whose heartbeats come back loses the taints.

The controller's clock is injected: the grace period passes without waiting for it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from railyard_local.apiserver.engine import Ctx, Engine
from railyard_local.apiserver.nodelifecycle import (
    NOT_READY_TAINT,
    UNREACHABLE_TAINT,
    NodeLifecycleSettings,
    decide_conditions_unknown,
    decide_pod_not_ready,
    decide_taints,
    overdue,
)
from railyard_local.apiserver.server import APIServer
from railyard_local.nodes import LEASE_NS, build_node, build_node_status, now_iso, now_micro
from railyard_local.topology import NodeSpec

NOW = "2026-12-07T05:00:00Z"
BEAT = "2026-12-07T04:59:00Z"


def ready_node(status: str = "True", taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    conditions = [{"type": kind, "status": "False", "reason": "Fine", "message": "fine",
                   "lastHeartbeatTime": BEAT, "lastTransitionTime": BEAT}
                  for kind in ("MemoryPressure", "DiskPressure", "PIDPressure")]
    conditions.append({"type": "Ready", "status": status, "reason": "KubeletReady", "message": "ready",
                       "lastHeartbeatTime": BEAT, "lastTransitionTime": BEAT})
    return {"metadata": {"name": "n", "creationTimestamp": BEAT}, "spec": {"taints": list(taints or [])},
            "status": {"conditions": conditions}}


def test_overdue_conditions_turn_unknown_as_the_real_controller_writes_them() -> None:
    conditions = decide_conditions_unknown(ready_node(), NOW)
    assert conditions is not None and len(conditions) == 4
    for cond in conditions:
        assert (cond["status"], cond["reason"], cond["message"]) == (
            "Unknown", "NodeStatusUnknown", "Kubelet stopped posting node status.")
        assert cond["lastHeartbeatTime"] == BEAT and cond["lastTransitionTime"] == NOW
    unknown = ready_node()
    unknown["status"]["conditions"] = conditions
    assert decide_conditions_unknown(unknown, "later") is None, "already Unknown: nothing to write"
    never = {"metadata": {"name": "n", "creationTimestamp": BEAT}, "status": {}}
    made = decide_conditions_unknown(never, NOW)
    assert made is not None and [c["type"] for c in made] == ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure"]
    assert {(c["reason"], c["message"], c["lastHeartbeatTime"]) for c in made} == {
        ("NodeStatusNeverUpdated", "Kubelet never posted node status.", BEAT)}


OTHER = {"key": "railyard.dev/quarantined", "effect": "NoSchedule"}


@pytest.mark.parametrize(("ready", "taints", "want"), [
    ("True", [], None),
    ("True", [OTHER], None),
    ("Unknown", [OTHER], [OTHER["key"], f"{UNREACHABLE_TAINT}:NoSchedule", f"{UNREACHABLE_TAINT}:NoExecute"]),
    ("False", [], [f"{NOT_READY_TAINT}:NoSchedule", f"{NOT_READY_TAINT}:NoExecute"]),
    ("True", [{"key": UNREACHABLE_TAINT, "effect": "NoSchedule"}, {"key": UNREACHABLE_TAINT, "effect": "NoExecute"},
              OTHER], [OTHER["key"]]),
    ("False", [{"key": UNREACHABLE_TAINT, "effect": "NoSchedule", "timeAdded": BEAT},
               {"key": UNREACHABLE_TAINT, "effect": "NoExecute", "timeAdded": BEAT}],
     [f"{NOT_READY_TAINT}:NoSchedule", f"{NOT_READY_TAINT}:NoExecute"]),
    ("Unknown", [{"key": UNREACHABLE_TAINT, "effect": "NoSchedule", "timeAdded": BEAT},
                 {"key": UNREACHABLE_TAINT, "effect": "NoExecute", "timeAdded": BEAT}], None),
])
def test_taints_follow_the_ready_condition(ready: str, taints: list[dict[str, str]], want: list[str] | None) -> None:
    got = decide_taints(ready_node(ready, taints), NOW)
    if want is None:
        assert got is None
        return
    assert got is not None
    assert [t["key"] if t is OTHER else f"{t['key']}:{t['effect']}" for t in got] == want
    assert all(t.get("timeAdded") == NOW for t in got if t is not OTHER)


def test_pods_of_a_lost_node_turn_not_ready_once() -> None:
    pod = {"status": {"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": BEAT},
                                     {"type": "ContainersReady", "status": "True"}]}}
    conditions = decide_pod_not_ready(pod, NOW)
    assert conditions == [{"type": "Ready", "status": "False", "lastTransitionTime": NOW},
                          {"type": "ContainersReady", "status": "True"}]
    assert decide_pod_not_ready({"status": {"conditions": conditions}}, "later") is None
    assert decide_pod_not_ready({"status": {}}, NOW) is None


def test_overdue_is_strictly_past_the_grace_period() -> None:
    assert overdue({"a": 0.0, "b": 10.0, "c": 1.0}, 50.0, 50.0) == []
    assert overdue({"a": 0.0, "b": 10.0, "c": 1.0}, 51.5, 50.0) == ["a", "c"]


def test_settings_refuse_a_period_that_is_not_positive() -> None:
    with pytest.raises(ValueError, match="must be positive"):
        NodeLifecycleSettings(grace_period_s=0)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _patch(engine: Engine, resource: str, ns: str, name: str, body: dict[str, Any],
                 subresource: str | None = None) -> None:
    rt = engine.registry.by_key(resource)
    assert rt is not None
    await engine.patch(rt, ns, name, "application/merge-patch+json", json.dumps(body).encode(), Ctx(manager="agent"),
                       subresource)


async def _renew(engine: Engine, name: str) -> None:
    await _patch(engine, "leases.coordination.k8s.io", LEASE_NS, name, {"spec": {"renewTime": now_micro()}})


async def test_a_node_whose_lease_stops_goes_unknown_and_tainted_and_comes_back(tmp_path: Path) -> None:
    clock = Clock()
    # a monitor period longer than the test: only the passes the test runs (and kicks) happen
    srv = APIServer(tmp_path / "state", token="t", tls=False,
                    node_lifecycle=NodeLifecycleSettings(grace_period_s=50, monitor_period_s=3600))
    assert srv.node_lifecycle is not None
    lifecycle = srv.node_lifecycle
    lifecycle.clock = clock
    await srv.start()
    try:
        eng, reg = srv.engine, srv.registry
        nodes, leases, pods = (reg.by_key(k) for k in ("nodes", "leases.coordination.k8s.io", "pods"))
        assert nodes is not None and leases is not None and pods is not None
        specs = [NodeSpec(name=name, ip=f"127.0.0.{i + 10}", labels={}, gpus=0) for i, name in enumerate(["fresh", "stale"])]
        for spec in specs:
            await eng.create(nodes, "", build_node(spec), Ctx(manager="agent"))
            await eng.create(leases, LEASE_NS, {"metadata": {"name": spec.name},
                                                "spec": {"holderIdentity": spec.name, "renewTime": now_micro()}},
                             Ctx(manager="agent"))
        pod = {"metadata": {"name": "p"}, "spec": {"nodeName": "stale", "containers": [{"name": "c", "image": "i"}]}}
        await eng.create(pods, "default", pod, Ctx(manager="test"))
        await _patch(eng, "pods", "default", "p", {"status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True"}]}}, "status")

        clock.now += 30
        await _renew(eng, "fresh")
        clock.now += 10
        assert await lifecycle.monitor_pass() == [], "40 s without a heartbeat is within the grace period"
        clock.now += 11  # 51 s after the stale node's last heartbeat, 21 s after the fresh one's
        assert await lifecycle.monitor_pass() == ["stale"]
        assert await lifecycle.monitor_pass() == [], "marked once"

        fresh, stale = (eng.get(nodes, "", n).obj for n in ("fresh", "stale"))
        assert {c["type"]: c["status"] for c in fresh["status"]["conditions"]}["Ready"] == "True"
        assert not fresh["spec"].get("taints")
        ready = next(c for c in stale["status"]["conditions"] if c["type"] == "Ready")
        assert (ready["status"], ready["reason"], ready["message"]) == (
            "Unknown", "NodeStatusUnknown", "Kubelet stopped posting node status.")
        assert {c["status"] for c in stale["status"]["conditions"]} == {"Unknown"}
        assert [(t["key"], t["effect"]) for t in stale["spec"]["taints"]] == [
            (UNREACHABLE_TAINT, "NoSchedule"), (UNREACHABLE_TAINT, "NoExecute")]
        assert all(t["timeAdded"] for t in stale["spec"]["taints"])
        assert "kube-controller-manager" in {m["manager"] for m in stale["metadata"]["managedFields"]}
        pod_ready = next(c for c in eng.get(pods, "default", "p").obj["status"]["conditions"] if c["type"] == "Ready")
        assert pod_ready["status"] == "False"
        events = [e.obj for e in eng.store.items("events", "default")
                  if e.obj["involvedObject"]["name"] == "stale"]
        assert [(e["reason"], e["message"], e["source"]["component"]) for e in events] == [
            ("NodeNotReady", "Node stale status is now: NodeNotReady", "node-controller")]

        # heartbeats back: the agent posts Ready, the taints go at the next pass
        spec = specs[1]
        await _renew(eng, "stale")
        await _patch(eng, "nodes", "", "stale", {"status": build_node_status(spec, ready=True, since=now_iso())},
                     "status")
        await lifecycle.monitor_pass()
        back = eng.get(nodes, "", "stale").obj
        assert {c["type"]: c["status"] for c in back["status"]["conditions"]}["Ready"] == "True"
        assert not back["spec"].get("taints")

        # a node that says it failed (Ready=False, heartbeats going on) gets the not-ready taints
        await _patch(eng, "nodes", "", "fresh", {"status": build_node_status(specs[0], ready=False, since=now_iso())},
                     "status")
        await lifecycle.monitor_pass()
        assert [(t["key"], t["effect"]) for t in eng.get(nodes, "", "fresh").obj["spec"]["taints"]] == [
            (NOT_READY_TAINT, "NoSchedule"), (NOT_READY_TAINT, "NoExecute")]
    finally:
        await srv.stop()


async def test_the_rule_can_be_turned_off(tmp_path: Path) -> None:
    srv = APIServer(tmp_path / "state", token="t", tls=False, node_lifecycle=None)
    assert srv.node_lifecycle is None
