"""faultTolerance ReplicaGroups in the reconcile cycle, in-process on the fake cluster
(fake_cluster.py), the launchers played by the test on the control board: the job's Lighthouse
comes with the gang; a failure restarts only the replica group it touched (a lost node's pod
replaced on a spare, a crashed group's pod restarted in place) while the other group's pod stays
the same object and its launcher is never told to restart; the status says Degraded with the
group count until the gang runs whole again; below minReplicas it is the ordinary restart."""

from __future__ import annotations

from typing import Any

from tests.operator.builders import make_node
from tests.operator.fake_cluster import Harness, make_job

from railyard.logic.conditions import find_condition
from railyard.logic.inplace import GROUP_REPAIR
from railyard.logic.layout import build_replica_group_table
from railyard.logic.manifests import rendezvous_port
from railyard.protocol.control import Action, apply_rank_table_delta


def cluster(n: int = 4) -> list[dict[str, Any]]:
    return [make_node(f"node-{i}", gpus=2, leaf=f"leaf-{i // 2}") for i in range(n)]


def job(min_replicas: int = 1) -> dict[str, Any]:
    return make_job(parallelism={"dataReplicas": 2}, faultTolerance={"mode": "ReplicaGroups", "minReplicas": min_replicas},
                    gang={"hotSpares": 1}, restartPolicy={"application": {"limit": 3, "backoffSeconds": 0}})


async def running(h: Harness) -> None:
    await h.cycle()
    h.run_pods()
    for p in h.cluster.pods_of(spare=True):
        p["status"] = {"phase": "Running"}
    await h.cycle(1.0)
    assert all(o.action is Action.CONTINUE for o in h.all_report())
    await h.cycle(1.0)
    assert h.status.phase == "Running", h.cluster.events


def uids(h: Harness) -> dict[str, Any]:
    return {p["metadata"]["name"]: p["metadata"].get("uid") for p in h.members()}


def degraded(h: Harness) -> tuple[str, str]:
    c = find_condition(h.status.conditions, "Degraded")
    return (c.status, c.message) if c is not None else ("", "")


async def test_the_lighthouse_comes_with_the_gang() -> None:
    h = Harness(cluster(), job())
    await running(h)
    lighthouse = h.cluster.pods.get("j-lighthouse")
    assert lighthouse is not None, sorted(h.cluster.pods)
    assert lighthouse["spec"]["containers"][0]["command"][:4] == ["railyard-train", "lighthouse", "--min-replicas", "1"]
    assert [p["metadata"]["name"] for p in h.members()] == ["j-a0-0", "j-a0-1"], "the Lighthouse is no gang member"
    assert ("NetworkPolicy", "j-replica-groups") in h.cluster.objects, "reachable from the job's pods only"
    # a lost Lighthouse is created again
    h.cluster.pods["j-lighthouse"]["status"] = {"phase": "Failed"}
    await h.cycle(1.0)
    assert "LighthouseLost" in h.reasons()
    h.cluster.finish_deletions()
    await h.cycle(1.0)
    assert "j-lighthouse" in h.cluster.pods and h.cluster.pods["j-lighthouse"].get("status", {}).get("phase") != "Failed"
    assert h.status.phase == "Running", "the gang is not touched"
    # and deleted once the job is over
    for i in range(2):
        h.exit_pod(i, 0)
    await h.cycle(1.0)
    assert h.status.phase == "Succeeded"
    gone = h.cluster.pods.get("j-lighthouse")
    assert gone is None or gone["metadata"].get("deletionTimestamp"), "deleted when the job is over"


async def test_a_lost_node_replaces_only_its_group_and_the_other_carries_on() -> None:
    h = Harness(cluster(), job())
    await running(h)
    before = uids(h)
    h.node_down(h.pod_nodes()[1])
    await h.cycle(5.0)
    st = h.status
    lr = st.last_restart
    assert lr is not None and (lr.mode, lr.reason, lr.replaced, lr.carried_on) == ("InPlace", GROUP_REPAIR, [1], [0]), (lr, h.cluster.events)
    assert st.attempt == 1 and st.phase == "Starting"
    assert h.cluster.pods["j-a0-0"]["metadata"].get("uid") == before["j-a0-0"] and not h.cluster.pods["j-a0-0"]["metadata"].get("deletionTimestamp")
    assert "j-a1-1" in h.cluster.pods, "the lost group's pod is replaced"
    assert h.report(0, "running", attempt=0).action is Action.CONTINUE, "the carried-on launcher is never told to restart"
    assert degraded(h) == ("True", "1/2 replica groups training while 1 restart")
    assert any("carry on untouched" in m for _, _, m in h.cluster.events), h.cluster.events
    # the replacement starts (after the placeholder on its spare is gone) and runs
    h.cluster.finish_deletions()
    await h.cycle(0.5)
    h.run_pods()
    h.report(1, "running", attempt=1)
    await h.cycle(0.5)
    st = h.status
    assert st.phase == "Running" and st.last_restart is not None and st.last_restart.state == "Done", (st.phase, st.message)
    assert degraded(h)[0] == "False"
    assert uids(h)["j-a0-0"] == before["j-a0-0"]
    assert h.report(0, "running", attempt=0).action is Action.CONTINUE
    assert h.runtime.metrics.registry.get_sample_value("railyard_replica_group_restarts_total") == 1


async def test_a_crashed_group_restarts_in_place_and_the_other_carries_on() -> None:
    h = Harness(cluster(), job())
    await running(h)
    before = uids(h)
    h.report(1, "failed", code=1)  # the other group's workers did not fail: torchft
    await h.cycle(5.0)
    lr = h.status.last_restart
    assert lr is not None and (lr.reason, lr.replaced, lr.carried_on) == (GROUP_REPAIR, [], [0]), (lr, h.cluster.events)
    assert uids(h) == before, "no pod replaced"
    order = h.report(1, "failed", attempt=0, code=1)
    assert order.action is Action.RESTART and order.delta is not None
    # the launcher runs its group's table: the order's delta turns that into the group's new one
    prev = h.runtime.control.table("ns", "j", 0)
    assert prev is not None
    mine = build_replica_group_table(prev, group=1, replicas=2, master_port=rendezvous_port("j", "ns", 0, 1))
    new = apply_rank_table_delta(mine, order.delta)
    assert [p.pod_index for p in new.pods] == [1] and new.world_size == 2 and new.master_port == rendezvous_port("j", "ns", 1, 1)
    assert h.report(0, "running", attempt=0).action is Action.CONTINUE
    h.report(1, "running", attempt=1)
    await h.cycle(0.5)
    assert h.status.phase == "Running" and h.status.last_restart.state == "Done"  # type: ignore[union-attr]


async def test_below_min_replicas_the_whole_gang_restarts_in_place() -> None:
    h = Harness(cluster(), job(min_replicas=2))
    await running(h)
    h.report(1, "failed", code=1)
    await h.cycle(5.0)
    lr = h.status.last_restart
    assert lr is not None and lr.mode == "InPlace" and lr.reason == "" and lr.carried_on == [], lr
    assert h.report(0, "running", attempt=0).action is Action.RESTART


async def test_a_second_repair_restarts_only_its_group_while_the_other_still_runs_an_older_attempt() -> None:
    """After one group repair the carried-on group's launcher still runs (and reports) the older
    attempt: it speaks the control protocol all the same, so the next failure, in that group, is
    again a group repair (not a full restart for want of a control channel)."""
    h = Harness(cluster(), job())
    await running(h)
    h.report(1, "failed", code=1)
    await h.cycle(5.0)
    assert h.report(1, "failed", attempt=0, code=1).action is Action.RESTART
    h.report(1, "running", attempt=1)
    await h.cycle(0.5)
    assert h.status.phase == "Running" and h.status.attempt == 1
    before = uids(h)
    h.report(0, "failed", attempt=0, code=1)  # group 0 still runs attempt 0
    await h.cycle(5.0)
    lr = h.status.last_restart
    assert lr is not None and (lr.mode, lr.reason, lr.replaced, lr.carried_on) == ("InPlace", GROUP_REPAIR, [], [1]), (lr, h.cluster.events)
    assert h.status.attempt == 2 and uids(h) == before
    assert h.report(0, "failed", attempt=0, code=1).action is Action.RESTART
    assert h.report(1, "running", attempt=1).action is Action.CONTINUE, "group 1 carries on with attempt 1"


async def test_an_open_count_of_groups_is_chosen_once_and_kept_in_the_status() -> None:
    """``parallelism.dataReplicas: 0``: the operator chooses the groups (logic/groups.py) from the
    nodes it sees, says so in an Event, keeps the number in ``status.replicaGroups`` and runs the
    job as if the spec had named it (the Lighthouse, one group per pod)."""
    h = Harness(cluster(), make_job(parallelism={"dataReplicas": 0}, faultTolerance={"mode": "ReplicaGroups"},
                                    gang={"hotSpares": 1}))
    await running(h)
    assert h.status.replica_groups == 2, h.status
    assert "ReplicaGroupsChosen" in h.reasons()
    assert "j-lighthouse" in h.cluster.pods, "a replica-group job: its Lighthouse comes with the gang"
    envs = [{e["name"]: e.get("value") for e in p["spec"]["containers"][0].get("env", [])} for p in h.members()]
    assert sorted(env.get("RAILYARD_REPLICA_GROUP") for env in envs) == ["0", "1"], envs
    chosen = h.reasons().count("ReplicaGroupsChosen")
    await h.cycle(1.0)
    assert h.status.replica_groups == 2 and h.reasons().count("ReplicaGroupsChosen") == chosen, "chosen once"
