"""A node of a running gang announced to go, in-process on the fake cluster (fake_cluster.py),
the launchers played by the test: the operator moves the node's pod ahead of time (MoveAhead)
as an in-place restart of class Planned: the pod on the node is replaced on the spare, the
others are the same pod objects, no restart budget is spent (the application budget here is 0:
a failure would fail the job), the move is counted apart (status.restarts.planned, the
railyard_planned_moves metric), and the Event and status say which node, why and what moved.
Without ReplicaGroups the move first waits for a just-in-time save to the memory tier (the
launchers told on the control channel, the save seen in the heartbeats) and restarts from it;
after the save's timeout it goes ahead from the newest checkpoint. With ReplicaGroups only the
group on the node restarts; its launcher alone is first told to leave the quorum at a step
boundary (the same order), and the move waits until it reports its workers left (or the
timeout); the others carry on untouched."""

from __future__ import annotations

from typing import Any

import pytest
from tests.operator.builders import make_node
from tests.operator.fake_cluster import Harness, make_job

from railyard.logic.jitsave import DEFAULT_TIMEOUT_S, LEAD_STEPS
from railyard.logic.planned import RAILYARD_MAINTENANCE
from railyard.protocol.control import Action
from railyard.protocol.heartbeat import CheckpointEvent, HeartbeatBatch, RankBeat


def cluster(n: int = 3) -> list[dict[str, Any]]:
    return [make_node(f"node-{i}", gpus=2, leaf=f"leaf-{i // 2}") for i in range(n)]


NO_BUDGET = {"application": {"limit": 0}, "infrastructure": {"limit": 0}}


async def running(h: Harness) -> None:
    await h.cycle()
    h.run_pods()
    for p in h.cluster.pods_of(spare=True):
        p["status"] = {"phase": "Running"}
    await h.cycle(1.0)
    assert all(o.action is Action.CONTINUE for o in h.all_report())
    await h.cycle(1.0)
    assert h.status.phase == "Running", h.cluster.events


def cordon(h: Harness, node: str) -> None:
    h.cluster.nodes[node]["spec"]["unschedulable"] = True


def beat(h: Harness, step: int, *, saved: int = -1) -> None:
    """Both pods' ranks (2 per pod) report ``step``; pod 0's rank 0 a committed memory save at ``saved``."""
    for pod, ranks in ((0, (0, 1)), (1, (2, 3))):
        done = (CheckpointEvent(step=saved, tier="memory", ok=True),) if saved >= 0 and pod == 0 else ()
        batch = HeartbeatBatch(job="j", attempt=h.status.attempt, pod_index=pod, node=h.pod_nodes()[pod], sent_at=h.now,
                               ranks=tuple(RankBeat(rank=r, step=step, step_time_s=1.0, compute_s=0.9, loss=2.5,
                                                    tokens_per_s=100.0) for r in ranks), checkpoints=done)
        h.runtime.store.ingest("ns", "j", batch, h.now)


async def saved_ahead(h: Harness, going: str, *, step: int = 7) -> int:
    """The gang at ``step`` when ``going`` is announced: the operator asks its launchers for a save
    and waits for it (the gang runs on); the memory tier reports it; returns the step saved."""
    assert h.status.step == step
    await h.cycle(1.0)
    st = h.status
    target = step + LEAD_STEPS
    assert st.phase == "Running" and st.restarts.planned == 0, (st.phase, st.message)
    assert any(r == "PlannedMoveSaving" and f"step {target}" in m and going in m for _, r, m in h.cluster.events), h.cluster.events
    orders = h.all_report()
    assert [(o.action, o.save_step, o.attempt) for o in orders] == [(Action.SAVE, target, 0)] * 2
    beat(h, target - 1)
    await h.cycle(1.0)
    assert h.status.phase == "Running" and h.status.restarts.planned == 0, "no move before the save is committed"
    beat(h, target, saved=target)
    await h.cycle(1.0)  # the heartbeat's save reaches the status
    await h.cycle(1.0)  # the move
    return target


def announce(h: Harness, node: str) -> None:
    h.cluster.nodes[node]["metadata"]["annotations"][RAILYARD_MAINTENANCE] = "kernel 6.12"


@pytest.mark.parametrize(("mark", "why"), [(cordon, "cordoned"), (announce, "maintenance announced")],
                         ids=["kubectl drain cordons", "maintenance announced"])
async def test_a_cordoned_node_moves_its_pod_ahead_without_spending_budget(mark: Any, why: str) -> None:
    h = Harness(cluster(), make_job(gang={"hotSpares": 1}, restartPolicy=NO_BUDGET))
    await running(h)
    kept_uid = h.cluster.pods["j-a0-0"]["metadata"].get("uid")
    going = h.pod_nodes()[1]
    beat(h, 7, saved=5)  # the gang trains at step 7; the newest periodic memory save is at 5
    await h.cycle(1.0)
    mark(h, going)
    target = await saved_ahead(h, going)
    st = h.status
    assert st.phase == "Starting", (st.phase, st.message)
    assert st.restarts.planned == 1 and st.restarts.total == 0 and st.restarts.application == 0
    lr = st.last_restart
    assert lr is not None and (lr.mode, lr.reason, lr.replaced, lr.kept) == ("InPlace", "PlannedMove", [1], 1)
    assert lr.message.startswith(f"moving ahead of {going} ({why}") and "replaced pod 1" in lr.message
    assert st.quarantined_nodes == [], "a planned move blames no node"
    # the node's pod goes (the operator's own deletion, which the PodDisruptionBudget never blocks)
    assert h.cluster.pods["j-a0-1"]["metadata"].get("deletionTimestamp")
    assert "j-a0-0" in h.cluster.pods and h.cluster.pods["j-a0-0"]["metadata"].get("uid") == kept_uid
    assert not h.cluster.pods["j-a0-0"]["metadata"].get("deletionTimestamp"), "the other pod is kept"
    replacement = h.cluster.pods["j-a1-1"]
    assert replacement["metadata"]["annotations"]["railyard.dev/node"] != going
    # the Event says which node, why and what moved; the metric counts the move, not a restart
    assert any(t == "Normal" and r == "PlannedMove" and going in m and why in m
               and f"resumed from the just-in-time save at step {target}" in m for t, r, m in h.cluster.events), h.cluster.events
    reg = h.runtime.metrics.registry
    assert reg.get_sample_value("railyard_planned_moves_total") == 1
    assert reg.get_sample_value("railyard_restarts_total", {"class": "Planned"}) is None
    # the kept launcher restarts into the new attempt, the gang runs again: one move, not two
    h.cluster.finish_deletions()
    await h.cycle(0.5)
    h.run_pods()
    order = h.report(0, "running", attempt=0)
    assert order.action is Action.RESTART
    assert order.restore is not None and (order.restore["tier"], order.restore["step"]) == ("memory", target), order.restore
    h.report(0, "running", attempt=1)
    h.report(1, "running", attempt=1)
    await h.cycle(0.5)
    await h.cycle(0.5)
    st = h.status
    assert st.phase == "Running" and st.attempt == 1 and st.restarts.planned == 1, (st.phase, st.message)
    assert going not in h.pod_nodes(), "nothing of the gang is left on the going node"


async def test_without_a_spare_the_whole_gang_moves_and_still_spends_nothing() -> None:
    h = Harness(cluster(2), make_job(restartPolicy=NO_BUDGET))
    await running(h)
    beat(h, 7, saved=5)
    await h.cycle(1.0)
    cordon(h, "node-1")
    await h.cycle(1.0)
    assert h.status.phase == "Running" and "PlannedMoveSaving" in h.reasons()
    # no save arrives (the ranks never all heard): after the timeout the move goes ahead anyway,
    # from the newest save there is, and says so
    step, asked = 8, h.now
    while h.status.phase == "Running" and h.now < 1_767_225_600.0 + 3 * DEFAULT_TIMEOUT_S:
        beat(h, step)
        step += 1
        await h.cycle(5.0)
    assert any(r == "PlannedMove" and "was not committed within" in m for _, r, m in h.cluster.events), h.cluster.events
    assert DEFAULT_TIMEOUT_S <= h.now - asked <= DEFAULT_TIMEOUT_S + 10.0, h.now - asked
    st = h.status
    assert st.phase == "Restarting" and st.restarts.planned == 1 and st.restarts.total == 0, (st.phase, st.message)
    assert st.last_restart is not None and (st.last_restart.mode, st.last_restart.reason) == ("Full", "NotPlaceable")
    # the next gang is not placed back on the cordoned node: it waits for room
    h.cluster.finish_deletions()
    await h.cycle(1.0)
    assert h.status.phase == "Placing", (h.status.phase, h.status.message)


async def test_with_replica_groups_only_the_group_on_the_node_moves() -> None:
    job = make_job(parallelism={"dataReplicas": 2}, faultTolerance={"mode": "ReplicaGroups", "minReplicas": 1},
                   gang={"hotSpares": 1}, restartPolicy=NO_BUDGET)
    h = Harness(cluster(4), job)
    await running(h)
    going = h.pod_nodes()[1]
    carried = h.cluster.pods["j-a0-0"]["metadata"].get("uid")
    cordon(h, going)
    await h.cycle(1.0)
    target = h.status.step + LEAD_STEPS
    assert any(r == "PlannedMoveLeaving" and m.startswith(f"pods [1] leave the replica groups' quorum at step {target}")
               for _, r, m in h.cluster.events), h.cluster.events
    # only the moved group's launcher is told; it passes the order on, its workers have not left yet
    assert (h.report(0).action, h.report(1).action, h.report(1).save_step) == (Action.CONTINUE, Action.SAVE, target)
    assert h.report(1, save_step=target).action is Action.CONTINUE, "answered once"
    await h.cycle(1.0)
    assert h.status.restarts.planned == 0, "no move before the group left the quorum"
    h.report(1, save_step=target, left_step=target)
    await h.cycle(1.0)
    st = h.status
    assert st.restarts.planned == 1 and st.restarts.total == 0
    assert st.last_restart is not None and st.last_restart.reason == "ReplicaGroupReplaced" and st.last_restart.carried_on == [0]
    assert any(r == "PlannedMove" and f"pods [1] left the replica groups' quorum after step {target}" in m
               for _, r, m in h.cluster.events), h.cluster.events
    assert st.last_restart.message.startswith(f"moving ahead of {going} (cordoned): replica groups 1 restart")
    assert h.cluster.pods["j-a0-0"]["metadata"].get("uid") == carried
    assert not h.cluster.pods["j-a0-0"]["metadata"].get("deletionTimestamp")
    assert h.cluster.pods["j-a0-1"]["metadata"].get("deletionTimestamp")
    # the carried-on group's launcher is never told to restart
    assert h.report(0, "running", attempt=0).action is Action.CONTINUE
    assert h.runtime.metrics.registry.get_sample_value("railyard_replica_group_restarts_total") == 1


async def test_a_failure_wins_over_an_announcement_in_the_same_cycle() -> None:
    h = Harness(cluster(), make_job(gang={"hotSpares": 1}, restartPolicy={"application": {"limit": 3, "backoffSeconds": 0}}))
    await running(h)
    cordon(h, h.pod_nodes()[1])
    h.exit_pod(0, 1)
    await h.cycle(1.0)
    st = h.status
    assert st.restarts.application == 1 and st.restarts.planned == 0, (st.phase, st.message)
    assert h.status.last_restart is not None and h.status.last_restart.reason != "PlannedMove"


async def test_an_announcement_taken_back_before_the_save_withdraws_the_order() -> None:
    h = Harness(cluster(), make_job(gang={"hotSpares": 1}, restartPolicy=NO_BUDGET))
    await running(h)
    beat(h, 7, saved=5)
    await h.cycle(1.0)
    going = h.pod_nodes()[1]
    cordon(h, going)
    await h.cycle(1.0)
    assert [o.action for o in h.all_report()] == [Action.SAVE] * 2
    h.cluster.nodes[going]["spec"]["unschedulable"] = False  # kubectl uncordon
    beat(h, 8)
    await h.cycle(1.0)
    assert [o.action for o in h.all_report()] == [Action.CONTINUE] * 2, "no launcher is asked to save any more"
    # announced again later: a save of its own, past what was reported since
    cordon(h, going)
    beat(h, 20)
    await h.cycle(1.0)
    await h.cycle(1.0)
    assert [(o.action, o.save_step) for o in h.all_report()] == [(Action.SAVE, 20 + LEAD_STEPS)] * 2
    assert h.status.phase == "Running" and h.status.restarts.planned == 0


async def test_with_planned_moves_off_a_cordon_moves_nothing_and_no_budget_holds_a_drain() -> None:
    """``--no-planned-moves``: the behaviour before issue 47, kept to measure against
    (bench/drain.py): no PodDisruptionBudget is made and a cordoned node's pod stays where it is
    (the drain's eviction then deletes it, a failure)."""
    h = Harness(cluster(), make_job(gang={"hotSpares": 1}, restartPolicy=NO_BUDGET), planned_moves=False)
    await running(h)
    assert ("PodDisruptionBudget", "j") not in h.cluster.objects
    going = h.pod_nodes()[1]
    beat(h, 7, saved=5)
    await h.cycle(1.0)
    cordon(h, going)
    for _ in range(3):
        await h.cycle(1.0)
    st = h.status
    assert st.phase == "Running" and st.attempt == 0 and st.restarts.planned == 0, (st.phase, st.message)
    assert not any(r.startswith("PlannedMove") for _, r, _ in h.cluster.events), h.cluster.events
    assert all(o.action is Action.CONTINUE for o in h.all_report()), "no save is asked for"
    assert going in h.pod_nodes()
