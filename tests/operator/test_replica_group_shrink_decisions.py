"""Replica groups that shrink and grow back (logic/shrink.py), table-driven and pure: when a lost group that
cannot be placed lets the others go on (shrink), when a waiting group comes back (grow back), how
many groups the status says train (Degraded, the gauge), when a job whose group finished the last
step Succeeds, and how the lifecycle and the gang assessment read waiting groups."""

from __future__ import annotations

from typing import Any

import pytest
from tests.operator.builders import make_node, make_pod

from railyard.api.trainingjob import LastRestart, PlacementStatus, RestartPolicy, TrainingJobStatus
from railyard.logic import lifecycle as lc
from railyard.logic.conditions import format_micro_time
from railyard.logic.failures import build_failure
from railyard.logic.gang import GangAssessment, assess_gang
from railyard.logic.inplace import (
    GROUP_REPAIR,
    RestartPlan,
    decide_group_repair,
    decide_restart_mode,
)
from railyard.logic.placement import Placement, Unplaceable
from railyard.logic.shrink import (
    GROUPS_FINISH_SETTLE_S,
    WAITING,
    GrowBack,
    KeepWaiting,
    count_training_groups,
    decide_groups_finished,
    decide_grow_back,
    decide_shrink,
    describe_groups,
    waiting_pods,
)
from railyard.logic.status import decide_degraded

NOW = 1_767_225_600.0
NODES = {f"n{i}": make_node(f"n{i}") for i in range(6)} | {"bad": make_node("bad", ready=False)}


def _repair(on: list[str], *, replicas: int, min_replicas: int, exited: tuple[int, ...] = (), leave: dict[str, str] | None = None) -> RestartPlan:
    members = [(make_pod(index=i, node=n).exited(1) if i in exited else make_pod(index=i, node=n)).obj() for i, n in enumerate(on)]
    plan = decide_restart_mode(enabled=True, spec_changed=False, members=members, expected=len(on), nodes=NODES, move_off={},
                               capable=frozenset(range(len(on))), leave=leave)
    return decide_group_repair(plan, expected=len(on), replicas=replicas, min_replicas=min_replicas)


@pytest.mark.parametrize(
    ("on", "replicas", "min_replicas", "exited", "leave", "shrink"),
    [
        pytest.param(["n0", "bad", "n2"], 3, 2, (), None, ((1,), (1,), (0, 2)), id="3x1-one-lost-two-train"),
        pytest.param(["n0", "bad", "n2"], 3, 1, (), None, ((1,), (1,), (0, 2)), id="3x1-min-1"),
        pytest.param(["n0", "n1", "n2", "bad"], 2, 1, (), None, ((1,), (3,), (0, 1)), id="2x2-its-partner-stays-and-waits"),
        pytest.param(["bad", "n1", "n2", "n3", "n4", "n5"], 3, 1, (5,), None, ((0, 2), (0, 5), (2, 3)), id="3x2-two-groups-wait"),
        pytest.param(["n0", "n1", "n2", "bad"], 2, 1, (), {"n2": "straggler"}, ((1,), (3,), (0, 1)), id="a-straggler-of-the-lost-group-is-not-deleted"),
        pytest.param(["n0", "bad", "n2"], 3, 3, (), None, None, id="below-min-replicas-no-shrink"),
        pytest.param(["bad", "n1", "n2", "n3", "n4", "n5"], 3, 2, (5,), None, None, id="two-lost-of-3-min-2-no-shrink"),
        pytest.param(["n0", "bad"], 1, 1, (), None, None, id="one-world-no-shrink"),
    ],
)
def test_a_lost_group_without_a_place_shrinks_the_job(on: list[str], replicas: int, min_replicas: int, exited: tuple[int, ...],
                                                       leave: dict[str, str] | None, shrink: tuple[tuple[int, ...], ...] | None) -> None:
    got = decide_shrink(_repair(on, replicas=replicas, min_replicas=min_replicas, exited=exited, leave=leave), "no spare",
                        replicas=replicas, min_replicas=min_replicas)
    if shrink is None:
        assert got is None
        return
    assert got is not None
    assert (got.waiting, got.delete, got.carry_on) == shrink
    assert got.group_size == len(on) // replicas
    assert got.message.endswith("(no spare)") and "wait" in got.message


def test_a_full_plan_never_shrinks() -> None:
    assert decide_shrink(RestartPlan("Full", "InPlaceDisabled", "full"), "x", replicas=3, min_replicas=1) is None
    plain = RestartPlan("InPlace", replace=(1,), keep=(0, 2))
    assert decide_shrink(plain, "x", replicas=3, min_replicas=1) is None, "an ordinary in-place restart is no group repair"


def _placement(nodes: tuple[str, ...], moved: tuple[int, ...] = ()) -> Placement:
    return Placement(nodes=nodes, spares=(), replica_peers=(-1,) * len(nodes), domains={}, rails_per_dp_group=1,
                     dp_leaf_spans=1, dp_leaf_minimum=1, moved=moved)


UNPLACEABLE = Unplaceable("capacity", "needs 3 nodes with 2 free GPUs, 2 usable", short=1)


@pytest.mark.parametrize(
    ("result", "waiting", "size", "present", "carry_on", "grow"),
    [
        pytest.param(UNPLACEABLE, (1,), 1, {0, 2}, (0, 2), None, id="no-node-yet"),
        pytest.param(_placement(("n0", "bad", "n2")), (1,), 1, {0, 2}, (0, 2), ({1}, (0, 2)), id="its-old-node-is-back"),
        pytest.param(_placement(("n0", "n9", "n2"), moved=(1,)), (1,), 1, {0, 2}, (0, 2), ({1}, (0, 2)), id="a-new-node"),
        pytest.param(_placement(("n0", "n1", "n2", "n9"), moved=(3,)), (1,), 2, {0, 1, 2}, (0, 1), ({3}, (0, 1, 2)), id="2x2-kept-partner-restarts-in-place"),
        pytest.param(_placement(("n0", "n1", "n7", "n9"), moved=(2, 3)), (1,), 2, {0, 1, 2}, (0, 1), ({2, 3}, (0, 1)), id="2x2-partner-moved-too"),
        pytest.param(_placement(("n8", "n9", "n2"), moved=(0, 1)), (1,), 1, {0, 2}, (0, 2), None, id="would-move-a-training-group"),
        pytest.param(_placement(("n7", "n1", "n2", "n3", "n9", "n5"), moved=(0, 4)), (0, 2), 2, {1, 2, 3, 5}, (2, 3),
                     ({0, 4}, (1, 2, 3, 5)), id="two-groups-come-back-together"),
    ],
)
def test_waiting_groups_come_back_when_they_fit_around_the_training_ones(
    result: Placement | Unplaceable, waiting: tuple[int, ...], size: int, present: set[int], carry_on: tuple[int, ...],
    grow: tuple[set[int], tuple[int, ...]] | None,
) -> None:
    got = decide_grow_back(result, waiting=waiting, group_size=size, present=frozenset(present), carry_on=carry_on)
    if grow is None:
        assert isinstance(got, KeepWaiting) and got.message
        return
    assert isinstance(got, GrowBack)
    assert (set(got.replace), got.keep, got.carry_on) == (grow[0], grow[1], carry_on)
    assert "heal from a live peer" in got.message


def _status(phase: str, *, state: str = "Started", reason: str = GROUP_REPAIR, attempt: int = 5, lr_attempt: int = 5,
            waiting: tuple[int, ...] = (), carried: tuple[int, ...] = (0, 1, 2, 3)) -> TrainingJobStatus:
    return TrainingJobStatus(
        phase=phase, attempt=attempt, placement=PlacementStatus(node_count=6),  # type: ignore[arg-type]
        last_restart=LastRestart(attempt=lr_attempt, mode="InPlace", state=state, reason=reason, kept=5, replaced=[4],  # type: ignore[arg-type]
                                 carried_on=list(carried), waiting_groups=list(waiting)),
    )


@pytest.mark.parametrize(
    ("st", "groups", "training", "degraded"),
    [
        pytest.param(_status("Running", state=WAITING, waiting=(2,)), 3, 2, "2/3 replica groups training; group 2 waits for a node", id="one-waits"),
        pytest.param(_status("Running", state=WAITING, waiting=(0, 2), carried=(2, 3)), 3, 1,
                     "1/3 replica groups training; groups 0, 2 wait for a node", id="two-wait"),
        pytest.param(_status("Starting"), 3, 2, "2/3 replica groups training while 1 restart", id="a-group-restarts"),
        pytest.param(_status("Running", state="Done"), 3, 3, None, id="all-train"),
        pytest.param(_status("Running", state=WAITING, waiting=(2,), lr_attempt=4), 3, 3, None, id="an-older-restart"),
        pytest.param(_status("Succeeded", state=WAITING, waiting=(2,)), 3, 1, None, id="finished-not-degraded"),
        pytest.param(_status("Starting", reason=""), 3, 0, None, id="a-whole-restart"),
        pytest.param(_status("Running"), 1, 1, None, id="one-world"),
        pytest.param(_status("Starting", reason=""), 1, 0, None, id="one-world-restarting"),
    ],
)
def test_the_status_says_how_many_groups_train(st: TrainingJobStatus, groups: int, training: int, degraded: str | None) -> None:
    if st.phase != "Succeeded":
        assert count_training_groups(st, groups) == training
    got = decide_degraded(st, hot_spares=0, now="2026-01-01T00:00:00Z", replica_groups=groups)
    cond = next((c for c in got.conditions if c.type == "Degraded"), None)
    if degraded is None:
        assert cond is None or cond.status == "False"
    else:
        assert cond is not None and (cond.status, cond.message) == ("True", degraded)


def test_waiting_pods_are_the_waiting_groups_pods() -> None:
    assert waiting_pods(_status("Running", state=WAITING, waiting=(0, 2)), 3) == frozenset({0, 1, 4, 5})
    assert waiting_pods(_status("Running"), 3) == frozenset()
    assert describe_groups(2, 3) == "2/3 replica groups training"


def _done(index: int, at: float | None) -> dict[str, Any]:
    pod = make_pod(index=index).exited(0).obj()
    if at is not None:
        pod["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"] = format_micro_time(at)
    return pod


def _running(index: int) -> dict[str, Any]:
    return make_pod(index=index).obj()


@pytest.mark.parametrize(
    ("members", "replicas", "expected", "waiting", "finished"),
    [
        pytest.param([_running(0), _running(1)], 2, 2, frozenset(), None, id="nobody-finished"),
        pytest.param([_done(0, NOW), _running(1)], 2, 2, frozenset(), ((0,), (1,), GROUPS_FINISH_SETTLE_S), id="the-other-gets-the-settle-time"),
        pytest.param([_done(0, NOW - 10), _running(1)], 2, 2, frozenset(), ((0,), (1,), GROUPS_FINISH_SETTLE_S - 10), id="settle-counts-from-the-end"),
        pytest.param([_done(0, NOW - 40), _running(1)], 2, 2, frozenset(), ((0,), (1,), 0.0), id="settle-over-succeed"),
        pytest.param([_done(0, NOW), _done(1, NOW)], 2, 2, frozenset(), ((0, 1), (), 0.0), id="all-finished"),
        pytest.param([_done(0, None), _running(1)], 2, 2, frozenset(), ((0,), (1,), 0.0), id="end-unknown-succeed-now"),
        pytest.param([_done(0, NOW), _running(1), _done(2, NOW)], 3, 3, frozenset({1}), ((0, 2), (), 0.0), id="a-waiting-group-is-not-waited-for"),
        pytest.param([_done(0, NOW), _running(1), _running(2), _running(3)], 2, 4, frozenset(), None, id="half-a-group-is-no-group"),
        pytest.param([_done(0, NOW)], 2, 2, frozenset(), ((0,), (), 0.0), id="the-other-has-no-pod"),
        pytest.param([_done(0, NOW), _running(1)], 1, 2, frozenset(), None, id="one-world"),
    ],
)
def test_a_group_that_finished_the_last_step_ends_the_job(members: list[dict[str, Any]], replicas: int, expected: int, waiting: frozenset[int],
                                                           finished: tuple[tuple[int, ...], tuple[int, ...], float] | None) -> None:
    got = decide_groups_finished(members, replicas=replicas, expected=expected, now=NOW, waiting=waiting)
    if finished is None:
        assert got is None
        return
    assert got is not None
    assert (got.finished, got.unfinished, got.left_s) == finished
    assert "finished the last step" in got.message


# --------------------------------------------------------------------------- the lifecycle reads it


def _gang(state: str, failure: Any = None) -> GangAssessment:
    return GangAssessment(state, expected=3, present=2, missing=(), gated=(), running=2, succeeded=0, failure=failure)


def _observed(gang: GangAssessment, *, phase: str = "Running", in_place: str | None = None, **kw: Any) -> lc.Observed:
    return lc.Observed(status=TrainingJobStatus(phase=phase, attempt=1), generation=1, now=NOW, gang=gang,  # type: ignore[arg-type]
                       schedule_timeout_s=300, heartbeat_interval_s=5.0, restart_policy=RestartPolicy(), in_place=in_place, **kw)


CRASH = build_failure("ApplicationExitCode", "1", pod="j-a1-0")
LATE = decide_groups_finished([_done(0, NOW), _running(1)], replicas=2, expected=2, now=NOW)
OVER = decide_groups_finished([_done(0, NOW - 60), _running(1)], replicas=2, expected=2, now=NOW)


@pytest.mark.parametrize(
    ("observed", "steps"),
    [
        pytest.param(_observed(_gang("Running"), in_place=WAITING), ["MarkRunning", "CheckHealth", "GrowBack", "Wait"], id="waiting-asks-the-placement"),
        pytest.param(_observed(_gang("Failed", CRASH), in_place=WAITING), ["HandleFailure"], id="a-survivor-fails-while-waiting"),
        pytest.param(_observed(_gang("Starting"), in_place=WAITING), ["CheckHealth", "Wait"], id="a-survivor-pod-lost-not-yet-classified"),
        pytest.param(_observed(_gang("Running"), groups_finished=LATE), ["Wait"], id="a-group-finished-the-others-settle"),
        pytest.param(_observed(_gang("Running"), groups_finished=OVER), ["CheckHealth", "Succeed"], id="settle-over"),
        pytest.param(_observed(_gang("Failed", CRASH), groups_finished=LATE), ["CheckHealth", "Succeed"], id="a-late-groups-failure-is-moot"),
        pytest.param(_observed(_gang("Running"), in_place="Started", groups_finished=OVER), ["CheckHealth", "Succeed"], id="even-while-it-restarts"),
    ],
)
def test_the_lifecycle_reads_waiting_and_finished_groups(observed: lc.Observed, steps: list[str]) -> None:
    assert list(lc.describe_steps(lc.decide_lifecycle(observed))) == steps


def test_the_gang_runs_without_its_waiting_groups() -> None:
    pods = [make_pod(index=0, node="n0").obj(), make_pod(index=2, node="n2").obj(), make_pod(index=3, node="bad").obj()]
    nodes = NODES
    got = assess_gang(pods, nodes, attempt=0, expected=4, now=NOW)
    assert got.state == "Failed", "without waiting: pod 1 lost, pod 3's node NotReady"
    got = assess_gang(pods, nodes, attempt=0, expected=4, now=NOW, waiting=frozenset({2, 3}))
    assert got.state == "Failed" and got.failure is not None and got.failure.kind == "PodLost", "pod 1 is no waiting pod"
    got = assess_gang(pods, nodes, attempt=0, expected=4, now=NOW, waiting=frozenset({1, 3}))
    assert (got.state, got.missing, got.running) == ("Running", (), 2), "pods of waiting groups: absent or idle by plan"
    done = [make_pod(index=0).exited(0).obj(), make_pod(index=2).exited(0).obj()]
    assert assess_gang(done, nodes, attempt=0, expected=4, now=NOW, waiting=frozenset({1, 3})).state == "Succeeded"
