"""Replica groups that shrink and grow back, in the reconcile cycle, in-process on the fake cluster (fake_cluster.py),
the launchers played by the test on the control board: three groups of one pod on exactly three
nodes and no spare. A lost node's group cannot be placed: the job goes on with two groups (Running,
Degraded with the count, the groups gauge at 2), the survivors' pods the same objects and their
launchers never told to restart; a new node brings the group back as a group repair of the next
attempt; and once the survivors finished the last step the job Succeeds although the late group
never did (it could no longer heal from them)."""

from __future__ import annotations

from typing import Any

from tests.operator.builders import make_node
from tests.operator.fake_cluster import Harness, make_job

from railyard.logic.conditions import find_condition, format_time
from railyard.logic.inplace import GROUP_REPAIR
from railyard.logic.shrink import GROUPS_FINISH_SETTLE_S, WAITING
from railyard.protocol.control import Action


def cluster(n: int = 3) -> list[dict[str, Any]]:
    return [make_node(f"node-{i}", gpus=2, leaf=f"leaf-{i // 2}") for i in range(n)]


def job(min_replicas: int = 2) -> dict[str, Any]:
    return make_job(nodes=3, parallelism={"dataReplicas": 3, "tensor": 2},
                    faultTolerance={"mode": "ReplicaGroups", "minReplicas": min_replicas},
                    restartPolicy={"infrastructure": {"limit": 3, "backoffSeconds": 0}, "application": {"limit": 3, "backoffSeconds": 0}})


async def running(h: Harness) -> None:
    await h.cycle()
    h.run_pods()
    await h.cycle(1.0)
    assert all(o.action is Action.CONTINUE for o in h.all_report())
    await h.cycle(1.0)
    assert h.status.phase == "Running", h.cluster.events


def degraded(h: Harness) -> tuple[str, str]:
    c = find_condition(h.status.conditions, "Degraded")
    return (c.status, c.message) if c is not None else ("", "")


def training(h: Harness) -> float | None:
    return h.runtime.metrics.registry.get_sample_value("railyard_replica_groups", {"namespace": "ns", "job": "j", "state": "training"})


def finished(h: Harness, pod: str) -> None:
    """The pod's trainer exited 0 (it trained the last step)."""
    h.cluster.pods[pod]["status"] = {"phase": "Succeeded", "containerStatuses": [
        {"name": "trainer", "state": {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": format_time(h.now)}}}]}


def uids(h: Harness) -> dict[str, Any]:
    return {p["metadata"]["name"]: p["metadata"].get("uid") for p in h.members()}


async def test_no_node_for_a_lost_group_the_others_go_on_and_it_grows_back_on_a_new_node() -> None:
    h = Harness(cluster(), job())
    await running(h)
    assert training(h) == 3
    before = uids(h)
    lost = h.pod_nodes()[1]
    h.node_down(lost)
    await h.cycle(5.0)
    st = h.status
    lr = st.last_restart
    assert lr is not None and (lr.state, lr.reason, lr.waiting_groups, lr.carried_on, lr.replaced) == (WAITING, GROUP_REPAIR, [1], [0, 2], [1]), (lr, h.cluster.events)
    assert st.phase == "Running" and st.attempt == 1 and st.restarts.total == 1, (st.phase, st.message)
    assert degraded(h) == ("True", "2/3 replica groups training; group 1 waits for a node")
    assert "ReplicaGroupsWaiting" in h.reasons() and "FullRestart" not in h.reasons(), h.cluster.events
    assert training(h) == 2
    assert "j-a0-1" not in h.cluster.pods or h.cluster.pods["j-a0-1"]["metadata"].get("deletionTimestamp"), "the lost pod goes"
    assert {n: u for n, u in uids(h).items()} == {n: before[n] for n in ("j-a0-0", "j-a0-2")}, "the survivors are the same objects"
    for i in (0, 2):
        assert h.report(i, "running", attempt=0).action is Action.CONTINUE, "the survivors' launchers are never told to restart"

    # nothing usable yet: still waiting, nothing restarted, no failure handled again
    h.cluster.finish_deletions()
    await h.cycle(1.0)
    await h.cycle(10.0)
    st = h.status
    assert st.phase == "Running" and st.attempt == 1 and st.restarts.total == 1 and st.last_restart.state == WAITING  # type: ignore[union-attr]
    assert not [p for p in h.cluster.pods if p.startswith("j-a1-") or p.startswith("j-a2-")]

    # a node appears: the group is placed again (the next attempt, a group repair)
    h.cluster.nodes["node-9"] = make_node("node-9", gpus=2, leaf="leaf-1")
    await h.cycle(1.0)
    st = h.status
    lr = st.last_restart
    assert lr is not None and (lr.reason, lr.replaced, lr.carried_on, lr.waiting_groups) == (GROUP_REPAIR, [1], [0, 2], []), lr
    assert st.attempt == 2 and st.phase == "Starting" and st.restarts.total == 1, "no budget spent on the grow back"
    assert "ReplicaGroupsPlaced" in h.reasons()
    assert h.pod_nodes(2) == ["node-9"], "the new node"
    assert degraded(h) == ("True", "2/3 replica groups training while 1 restart")
    assert uids(h)["j-a0-0"] == before["j-a0-0"] and uids(h)["j-a0-2"] == before["j-a0-2"]
    assert h.report(0, "running", attempt=0).action is Action.CONTINUE
    h.run_pods(2)
    h.report(1, "running", attempt=2)
    await h.cycle(0.5)
    st = h.status
    assert st.phase == "Running" and st.last_restart is not None and st.last_restart.state == "Done", (st.phase, st.message)
    assert degraded(h)[0] == "False" and training(h) == 3
    assert h.runtime.metrics.registry.get_sample_value("railyard_replica_group_restarts_total") == 1

    # the survivors finish the last step, the late group does not: it is given a settle time, then
    # the job Succeeds without it
    for name in ("j-a0-0", "j-a0-2"):
        finished(h, name)
    await h.cycle(1.0)
    assert h.status.phase == "Running", "the others may still be in the last step"
    await h.cycle(GROUPS_FINISH_SETTLE_S)
    st = h.status
    assert st.phase == "Succeeded", (st.phase, st.message)
    assert "groups 0, 2 finished the last step (2/3)" in st.message and "group 1 had not finished" in st.message, st.message


async def test_a_group_that_restarts_too_late_does_not_fail_the_job() -> None:
    """The bench's finding: the survivors finish while a replaced group starts; its failure then
    (no quorum, its watchdog) is moot."""
    h = Harness(cluster(4), job(min_replicas=1))
    await running(h)
    h.node_down(h.pod_nodes()[1])
    await h.cycle(5.0)
    lr = h.status.last_restart
    assert lr is not None and lr.reason == GROUP_REPAIR and lr.state != WAITING, "a spare node: an ordinary group repair"
    h.cluster.finish_deletions()
    await h.cycle(0.5)
    h.run_pods(1)
    for name in ("j-a0-0", "j-a0-2"):
        finished(h, name)
    await h.cycle(1.0)
    # the late group's workers fail (a hang exit while it waited for a quorum nobody joins)
    h.report(1, "failed", attempt=1, code=76)
    await h.cycle(1.0)
    st = h.status
    assert st.phase == "Succeeded" and st.restarts.total == 1, (st.phase, st.message, h.cluster.events)


async def test_below_min_replicas_a_lost_group_without_a_node_is_a_restart_as_before() -> None:
    h = Harness(cluster(), job(min_replicas=3))
    await running(h)
    h.node_down(h.pod_nodes()[1])
    await h.cycle(5.0)
    lr = h.status.last_restart
    assert lr is not None and lr.state != WAITING and lr.mode == "Full", lr
    assert h.status.phase == "Restarting"


async def test_a_survivor_that_fails_while_a_group_waits_waits_too() -> None:
    """Three groups, minReplicas 1: group 1's node is lost (no node: it waits), then group 2's
    workers fail (its launcher reports the attempt it carries on with): group 2 waits as well,
    its pod kept with its launcher told to wait, and group 0 trains alone; one new node brings
    both back, group 2's pod restarting in place."""
    h = Harness(cluster(), job(min_replicas=1))
    await running(h)
    h.node_down(h.pod_nodes()[1])
    await h.cycle(5.0)
    assert h.status.last_restart.waiting_groups == [1]  # type: ignore[union-attr]
    h.cluster.finish_deletions()
    h.report(2, "failed", attempt=0, code=1)
    await h.cycle(1.0)
    st = h.status
    lr = st.last_restart
    assert lr is not None and (lr.state, lr.waiting_groups, lr.carried_on, lr.replaced) == (WAITING, [1, 2], [0], [1]), (lr, h.cluster.events)
    assert st.phase == "Running" and st.attempt == 2 and st.restarts.total == 2
    assert degraded(h) == ("True", "1/3 replica groups training; groups 1, 2 wait for a node")
    assert "j-a0-2" in h.cluster.pods, "a waiting group's pod that need not move stays"
    assert h.report(2, "failed", attempt=0, code=1).action is Action.CONTINUE, "told to wait"
    assert h.report(0, "running", attempt=0).action is Action.CONTINUE
    h.cluster.nodes["node-9"] = make_node("node-9", gpus=2, leaf="leaf-1")
    await h.cycle(1.0)
    lr = h.status.last_restart
    assert lr is not None and (lr.replaced, lr.carried_on, lr.kept) == ([1], [0], 2), lr
    assert h.report(2, "failed", attempt=0, code=1).action is Action.RESTART, "its workers restart in place"
    assert h.report(0, "running", attempt=0).action is Action.CONTINUE
