"""faultTolerance ReplicaGroups: a failure replaces only the replica groups it touches, and the
other groups' launchers are never told to restart (their pods and workers carry on); with
fewer than minReplicas groups left, the ordinary in-place restart of the whole gang."""

from __future__ import annotations

import pytest
from tests.operator.builders import make_node, make_pod

from railyard.api.trainingjob import LastRestart, PlacementStatus, TrainingJobStatus
from railyard.logic.inplace import (
    GROUP_REPAIR,
    GangControl,
    RestartPlan,
    decide_control_answer,
    decide_group_repair,
    decide_restart_mode,
    failed_pod_indices,
    plan_in_place_moves,
)
from railyard.logic.placement import Placement
from railyard.logic.status import decide_degraded
from railyard.protocol.control import Action, LauncherReport, LauncherState
from railyard.protocol.ranktable import PodEntry, RankTable

NODES = {f"n{i}": make_node(f"n{i}") for i in range(6)} | {"bad": make_node("bad", ready=False)}


def _plan(on: list[str], *, move_off: dict[str, str] | None = None, exited: tuple[int, ...] = ()) -> RestartPlan:
    members = []
    for i, n in enumerate(on):
        pod = make_pod(index=i, node=n)
        members.append((pod.exited(1) if i in exited else pod).obj())
    return decide_restart_mode(enabled=True, spec_changed=False, members=members, expected=len(on), nodes=NODES,
                               move_off=move_off or {}, capable=frozenset(range(len(on))))


@pytest.mark.parametrize(
    ("on", "exited", "failed", "replicas", "min_replicas", "replace", "carry_on", "repair"),
    [
        pytest.param(["n0", "n1", "bad"], (), (), 3, 1, (2,), (0, 1), True, id="3x1-lost-node"),
        pytest.param(["n0", "n1", "n2"], (1,), (), 3, 2, (1,), (0, 2), True, id="3x1-exited-pod-min-2"),
        pytest.param(["n0", "n1", "n2", "n3"], (), (3,), 2, 1, (), (0, 1), True, id="2x2-workers-failed-group-restarts-in-place"),
        pytest.param(["n0", "n1", "n2", "bad"], (), (), 2, 1, (3,), (0, 1), True, id="2x2-lost-node-its-group-partner-restarts"),
        pytest.param(["n0", "bad", "n2", "n3", "n4", "n5"], (4,), (), 3, 1, (1, 4), (2, 3), True, id="3x2-two-groups-lost"),
        pytest.param(["n0", "n1", "bad"], (), (), 3, 3, (2,), (), False, id="below-min-replicas-whole-gang"),
        pytest.param(["n0", "bad", "n2", "n3", "n4", "n5"], (4,), (), 3, 2, (1, 4), (), False, id="two-lost-of-3-min-2"),
        pytest.param(["n0", "n1", "bad"], (), (), 1, 1, (2,), (), False, id="one-world-unchanged"),
    ],
)
def test_only_the_lost_groups_restart(on: list[str], exited: tuple[int, ...], failed: tuple[int, ...], replicas: int,
                                      min_replicas: int, replace: tuple[int, ...], carry_on: tuple[int, ...], repair: bool) -> None:
    plan = decide_group_repair(_plan(on, exited=exited), expected=len(on), replicas=replicas, min_replicas=min_replicas,
                               failed=frozenset(failed))
    assert plan.mode == "InPlace"
    assert (plan.replace, plan.carry_on) == (replace, carry_on)
    assert plan.keep == tuple(i for i in range(len(on)) if i not in replace)
    assert (plan.reason == GROUP_REPAIR) is repair
    if repair:
        assert "carry on untouched" in plan.message


def test_a_full_plan_stays_full_and_stragglers_alone_restart_no_group() -> None:
    full = RestartPlan("Full", "InPlaceDisabled", "full restart")
    assert decide_group_repair(full, expected=3, replicas=3, min_replicas=1, failed=frozenset({0})) is full
    leave_only = RestartPlan("InPlace", replace=(1,), optional=(1,), keep=(0, 2), why={1: "straggler"})
    assert decide_group_repair(leave_only, expected=3, replicas=3, min_replicas=1) is leave_only


def test_launcher_reports_name_the_failed_pods() -> None:
    pods = [make_pod(index=0).obj(), make_pod(index=1).exited(70).obj(), make_pod(index=2).exited(0).obj()]
    assert failed_pod_indices(pods) == {1}


def _placement(nodes: tuple[str, ...], moved: tuple[int, ...] = ()) -> Placement:
    return Placement(nodes=nodes, spares=(), replica_peers=(-1,) * len(nodes), domains={}, rails_per_dp_group=1,
                     dp_leaf_spans=1, dp_leaf_minimum=1, moved=moved)


def _table(nodes: tuple[str, ...]) -> RankTable:
    from railyard.logic.layout import build_rank_table
    from railyard.protocol.mesh import MeshShape

    shape = MeshShape(len(nodes), 1, dp=len(nodes), replicas=2)
    t = build_rank_table(job="j", attempt=0, shape=shape, pod_nodes=nodes, pod_rail_offset=[0] * len(nodes), pod_gpus=[1] * len(nodes))
    return RankTable(job=t.job, attempt=t.attempt, pp=t.pp, dp=t.dp, tp=t.tp, procs_per_node=t.procs_per_node,
                     pods=tuple(PodEntry(p.pod_index, p.node) for p in t.pods), ranks=t.ranks)


def test_a_group_the_placement_moves_a_pod_of_restarts_too() -> None:
    def plan() -> RestartPlan:
        return RestartPlan("InPlace", reason=GROUP_REPAIR, replace=(0,), keep=(1, 2, 3), why={0: "node bad NotReady"},
                           group_size=2, carry_on=(2, 3))

    prev = _table(("bad", "n1", "n2", "n3"))
    moves = plan_in_place_moves(plan(), prev, {}, {"bad"}, lambda avoid: _placement(("n4", "n1", "n2", "n3"), moved=(0,)))
    assert not isinstance(moves, RestartPlan)
    assert (sorted(moves.replace), moves.keep, moves.carry_on) == ([0], (1, 2, 3), (2, 3))
    assert "carry on untouched" in moves.message
    # the placement also moves pod 2: its group restarts too, nothing carries on (an ordinary in-place restart)
    moves = plan_in_place_moves(plan(), prev, {}, {"bad"}, lambda avoid: _placement(("n4", "n1", "n5", "n3"), moved=(0, 2)))
    assert not isinstance(moves, RestartPlan)
    assert (sorted(moves.replace), moves.carry_on) == ([0, 2], ())


def _report(index: int, attempt: int, state: LauncherState = LauncherState.RUNNING) -> LauncherReport:
    return LauncherReport("j", attempt, index, f"j-a{attempt}-{index}", state)


@pytest.mark.parametrize(
    ("report", "action"),
    [
        pytest.param(_report(0, 4), Action.CONTINUE, id="carried-on-group-is-not-restarted"),
        pytest.param(_report(1, 4), Action.CONTINUE, id="its-other-pod-too"),
        pytest.param(_report(2, 5), Action.CONTINUE, id="the-new-group-runs-the-new-attempt"),
        pytest.param(_report(2, 4, LauncherState.FAILED), Action.STOP, id="the-replaced-pod-is-stopped"),
    ],
)
def test_carried_on_launchers_are_told_to_continue(report: LauncherReport, action: Action) -> None:
    gang = GangControl(attempt=5, members={0: "j-a4-0", 1: "j-a4-1", 2: "j-a5-2", 3: "j-a5-3"}, carry_on=frozenset({0, 1}))
    got, _ = decide_control_answer(gang, report)
    assert got is action


@pytest.mark.parametrize(
    ("phase", "reason", "attempt", "groups", "degraded"),
    [
        pytest.param("Starting", GROUP_REPAIR, 5, 3, "2/3 replica groups training while 1 restart", id="while-a-group-restarts"),
        pytest.param("Restarting", GROUP_REPAIR, 5, 3, "2/3 replica groups training while 1 restart", id="during-the-backoff"),
        pytest.param("Running", GROUP_REPAIR, 5, 3, None, id="all-pods-run-again"),
        pytest.param("Starting", GROUP_REPAIR, 6, 3, None, id="an-older-repair"),
        pytest.param("Starting", "", 5, 3, None, id="an-ordinary-in-place-restart"),
        pytest.param("Starting", GROUP_REPAIR, 5, 1, None, id="one-world"),
    ],
)
def test_degraded_says_how_many_groups_train(phase: str, reason: str, attempt: int, groups: int, degraded: str | None) -> None:
    status = TrainingJobStatus(
        phase=phase, attempt=attempt, placement=PlacementStatus(node_count=6),
        last_restart=LastRestart(attempt=5, mode="InPlace", state="Started", reason=reason, kept=5, replaced=[4], carried_on=[0, 1, 2, 3]),
    )
    got = decide_degraded(status, hot_spares=0, now="2026-01-01T00:00:00Z", replica_groups=groups)
    cond = next((c for c in got.conditions if c.type == "Degraded"), None)
    if degraded is None:
        assert cond is None or cond.status == "False"
    else:
        assert cond is not None and cond.status == "True" and cond.message == degraded
