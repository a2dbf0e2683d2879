"""The node agent (railyard_local.nodes.NodeManager) keeps its nodes Ready on a server that
applies kube-controller-manager's node lifecycle rule, and the rule sees a node whose agent
stopped: with a short grace period, the node served by a running agent stays Ready while the
one whose agent stopped turns Unknown and tainted, then Ready again once its agent runs.

And the agent's pace does not depend on the number of nodes (issue 46: it used to stretch the
renewals with it, past the grace period): every Lease is renewed once per interval, in even
slices of concurrent requests."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from tests.waiting import wait_until_async

from railyard_local.apiserver.nodelifecycle import UNREACHABLE_TAINT, NodeLifecycleSettings
from railyard_local.apiserver.server import APIServer
from railyard_local.kube import Informer, KubeClient
from railyard_local.nodes import (
    FAIL_ANNOTATION,
    LEASE_RENEW_INTERVAL_S,
    STATUS_REPORT_INTERVAL_S,
    LeaseSchedule,
    NodeManager,
)
from railyard_local.topology import NodeSpec

GRACE_S = 4.0
#: Only catches a hang: how long a cancelled agent or informer may take to stop.
STOP_BOUND_S = 20.0


def spec(name: str, index: int) -> NodeSpec:
    return NodeSpec(name=name, ip=f"127.0.1.{index + 1}", labels={"kubernetes.io/hostname": name})


async def stop(task: asyncio.Task[None], what: str) -> None:
    """Cancel ``task`` and wait for it, bounded: a cancellation the task loses fails the test naming it (the
    informer's watch once lost one to Python 3.11's asyncio.wait_for and this test hung)."""
    task.cancel()
    await asyncio.wait({task}, timeout=STOP_BOUND_S)
    assert task.done(), f"{what}: still running {STOP_BOUND_S:g} s after it was cancelled"
    with contextlib.suppress(asyncio.CancelledError):
        await task


@contextlib.asynccontextmanager
async def running(manager: NodeManager) -> AsyncIterator[None]:
    task = asyncio.get_running_loop().create_task(manager.run())
    try:
        yield
    finally:
        await stop(task, f"the node agent of {', '.join(manager.specs)}")


@contextlib.asynccontextmanager
async def watching(informer: Informer) -> AsyncIterator[None]:
    task = asyncio.get_running_loop().create_task(informer.run())
    try:
        yield
    finally:
        await stop(task, f"the {informer.name} informer")


def ready_and_taints(srv: APIServer, name: str) -> tuple[str, list[str]]:
    node = srv.store.get("nodes", "", name)
    assert node is not None
    ready = next(c["status"] for c in node.obj["status"]["conditions"] if c["type"] == "Ready")
    return ready, [f"{t['key']}:{t['effect']}" for t in node.obj.get("spec", {}).get("taints") or []]


# only catches a hang: above the sum of the test's own bounds (two waits of 60 s, three stops), which name what hung
@pytest.mark.timeout(240)
async def test_a_running_agent_keeps_its_node_ready_and_a_stopped_one_loses_it(tmp_path: Path) -> None:
    srv = APIServer(tmp_path / "state", token="t", tls=False,
                    node_lifecycle=NodeLifecycleSettings(grace_period_s=GRACE_S, monitor_period_s=0.25))
    url = await srv.start()
    client = KubeClient(url, token="t")
    # heartbeats 16 times within the grace period: a starved event loop still renews in time
    alive = NodeManager(client, [spec("alive", 0)], lease_interval=GRACE_S / 16, status_update_interval=0.5)
    stopped = NodeManager(client, [spec("stopped", 1)], lease_interval=GRACE_S / 16, status_update_interval=0.5)
    try:
        await alive.register()
        await stopped.register()
        # the agent learns what the control plane did to its nodes from the runtime's node watch
        nodes = Informer(client, "/api/v1/nodes", "nodes")
        nodes.add_handler(alive.on_node_event)
        nodes.add_handler(stopped.on_node_event)
        async with running(alive), watching(nodes):
            unreachable = [f"{UNREACHABLE_TAINT}:NoSchedule", f"{UNREACHABLE_TAINT}:NoExecute"]
            await wait_until_async(lambda: ready_and_taints(srv, "stopped") == ("Unknown", unreachable),
                                   timeout=60, message="the stopped agent's node Unknown and unreachable")
            assert ready_and_taints(srv, "alive") == ("True", []), "renewed every quarter second: Ready"
            assert alive.stats.lease_renewals > 16
            async with running(stopped):
                # its Lease renewed, the agent sees the node Unknown and posts Ready again; the taints go
                await wait_until_async(lambda: ready_and_taints(srv, "stopped") == ("True", []), timeout=60,
                                       message="the node back: Ready, untainted")
            assert ready_and_taints(srv, "alive") == ("True", [])
    finally:
        await client.close()
        await srv.stop()


class RecordingClient:
    """Answers every request at once (every node already there) and records the Lease renewals
    (node name per request); a node named in ``held`` is not answered until ``release``."""

    def __init__(self, held: frozenset[str] = frozenset()) -> None:
        self.renewed: list[str] = []
        self.said: list[str] = []
        """What the control plane heard, in order: node statuses (and, in a test, pods' ends)."""
        self.held = held
        self.release = asyncio.Event()

    async def get(self, path: str, **params: Any) -> dict[str, Any]:
        if path.rsplit("/", 1)[1] in self.held:
            await self.release.wait()
        return {"metadata": {"uid": "uid"}}

    async def create(self, path: str, body: Any) -> dict[str, Any]:
        return {}

    async def patch(self, path: str, body: Any, content_type: str = "") -> dict[str, Any]:
        if "/leases/" in path:
            self.renewed.append(path.rsplit("/", 1)[1])
        if path.endswith("/status"):
            self.said.append(f"{path.split('/')[-2]} Ready={body['status']['conditions'][-1]['status']}")
        return {}


@pytest.mark.parametrize("count", [3, 2048])
async def test_every_lease_is_renewed_once_per_interval_whatever_the_node_count(count: int) -> None:
    assert LEASE_RENEW_INTERVAL_S == 10 and STATUS_REPORT_INTERVAL_S == 300, "the kubelet's defaults"
    client = RecordingClient()
    # 10 s in slices of 0.5 s, scaled down to a test's time: 20 slices
    specs = [spec(f"n{i}", i) for i in range(count)]
    manager = NodeManager(client, specs, lease_interval=1.0, spread_slice_s=0.05)  # type: ignore[arg-type]
    slices = manager.lease_slices()
    assert slices == min(count, 20)
    await manager.register()
    client.renewed.clear()  # registration renews each Lease once; the schedule's renewals follow
    async with running(manager):
        await wait_until_async(lambda: manager.stats.rounds >= 2, timeout=60, message="two rounds of renewals")
    renewals = Counter(client.renewed[: 2 * count])
    assert set(renewals.values()) == {2} and len(renewals) == count, "each node once per round"
    # a round is sliced: the first slice renews every slices-th node, and nothing else
    first_slice = client.renewed[: math.ceil(count / slices)]
    assert first_slice == [s.name for s in specs[::slices]]


async def test_a_node_is_renewed_from_its_registration_on_while_others_still_register() -> None:
    """Issue 46: registering 2,048 nodes beside a CPU hog took 74 s, more than the grace period;
    renewals that began only after the last registration left the first nodes to go Unknown."""
    client = RecordingClient(held=frozenset({"n2"}))
    specs = [spec(f"n{i}", i) for i in range(3)]
    manager = NodeManager(client, specs, lease_interval=0.3, spread_slice_s=0.1)  # type: ignore[arg-type]
    async with running(manager):
        # once at its registration, then on the schedule: n2 is still registering all along
        await wait_until_async(lambda: client.renewed.count("n0") >= 2 and client.renewed.count("n1") >= 2,
                               timeout=60, message="n0 and n1 renewed on the schedule")
        assert not manager.registered.is_set() and "n2" not in client.renewed, "n2 is not registered yet"
        client.release.set()
        await wait_until_async(lambda: manager.registered.is_set() and client.renewed.count("n2") >= 2,
                               timeout=60, message="n2 registered, then renewed on the schedule")


async def test_a_failed_node_says_it_is_not_ready_before_its_pods_are_reported_dead() -> None:
    """Issue 46: at 2,048 pods the pods' ends reached the operator first; it restarted in place on the
    same node (a crash, by all it knew), then again when the node's NotReady came: 2 pods replaced."""
    client = RecordingClient()
    manager = NodeManager(client, [spec("n0", 0)],  # type: ignore[arg-type]
                          on_control=lambda name, before, after: client.said.append(f"{name} pods killed"))
    await manager.register()
    client.said.clear()
    manager.on_node_event("MODIFIED", {"metadata": {"name": "n0", "annotations": {FAIL_ANNOTATION: "true"}}}, None)
    await wait_until_async(lambda: "n0 pods killed" in client.said, timeout=60, message="the pods killed")
    assert client.said == ["n0 Ready=False", "n0 pods killed"]


def test_a_slow_answer_holds_back_only_its_own_nodes() -> None:
    schedule = LeaseSchedule([f"n{i}" for i in range(6)], slices=3)
    assert schedule.start_slice(0, 0.0, lambda n: True) == (0, ["n0", "n3"])
    assert schedule.start_slice(1, 1.0, lambda n: n != "n4") == (0, ["n1"]), "a failed node renews nothing"
    assert schedule.start_slice(2, 2.0, lambda n: True) == (0, ["n2", "n5"])
    assert schedule.answered(0, ["n1"], 2.5) is None
    assert schedule.answered(0, ["n2", "n5"], 2.6) is None
    # the next round starts on the clock; n0 and n3 are still waiting for their answer: they skip it
    assert schedule.start_slice(3, 3.0, lambda n: True) == (1, [])
    assert schedule.answered(0, ["n0", "n3"], 3.5) == 3.5, "round 0 answered 3.5 s after it began"
    assert schedule.start_slice(4, 4.0, lambda n: True) == (1, ["n1", "n4"])
