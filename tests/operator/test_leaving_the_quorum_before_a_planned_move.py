"""The clean leave before a planned move with ReplicaGroups (issue 47), as tables:
logic/groupleave.py's state machine (order the moved groups' pods to leave at step S -> wait
until their launchers report it -> move, or move after the timeout), which pods leave (every pod
of a group with a pod on a going node), and the control channel's part (the order answered only
to those pods' launchers, ``left_step`` reported back)."""

from __future__ import annotations

import pytest

from railyard.logic.groupleave import decide_group_leave, leave_message, leaving_pods
from railyard.logic.jitsave import (
    DEFAULT_TIMEOUT_S,
    LEAD_STEPS,
    RECHECK_S,
    AwaitSave,
    JitSavePlan,
    MoveNow,
    RequestSave,
    SaveOrder,
)
from railyard.observe.control import ControlBoard
from railyard.protocol.control import Action, LauncherReport, LauncherState, parse_report

T0 = 1000.0
GOING = {"node-3": "cordoned"}
ORDER = SaveOrder(attempt=2, step=42, requested_at=T0, nodes=("node-3",), pods=(2, 3))


def plan(*, pending: SaveOrder | None = ORDER, attempt: int = 2, pods: tuple[int, ...] = (2, 3),
         left: dict[int, int] | None = None, reported: int = 40, now: float = T0 + 5, in_place: bool = True) -> JitSavePlan:
    return decide_group_leave(pending=pending, attempt=attempt, going=GOING, pods=pods, left=left or {},
                              reported_step=reported, now=now, in_place=in_place)


ROWS: list[tuple[str, JitSavePlan, JitSavePlan]] = [
    ("nothing asked yet: the moved pods leave at the step reported + LEAD",
     plan(pending=None, now=T0), RequestSave(SaveOrder(2, 40 + LEAD_STEPS, T0, ("node-3",), pods=(2, 3)))),
    ("an order of an older attempt is not this one's: ask again",
     plan(pending=SaveOrder(1, 10, T0 - 500, ("node-3",), pods=(2, 3)), now=T0),
     RequestSave(SaveOrder(2, 40 + LEAD_STEPS, T0, ("node-3",), pods=(2, 3)))),
    ("another group is going too (a rolling drain): ask its pods as well",
     plan(pods=(0, 1, 2, 3), now=T0), RequestSave(SaveOrder(2, 40 + LEAD_STEPS, T0, ("node-3",), pods=(0, 1, 2, 3)))),
    ("asked, nobody left yet: wait", plan(), AwaitSave(ORDER, RECHECK_S)),
    ("one pod of the group left, the other not yet: wait", plan(left={2: 42, 3: -1}), AwaitSave(ORDER, RECHECK_S)),
    ("a pod of another group says nothing about this one", plan(left={0: 42, 2: 42}), AwaitSave(ORDER, RECHECK_S)),
    ("every moved pod left: move",
     plan(left={2: 43, 3: 43}),
     MoveNow(-1, "pods [2, 3] left the replica groups' quorum after step 43; the moved groups heal from a live peer")),
    ("the wait is bounded: the last recheck ends at the timeout",
     plan(now=T0 + DEFAULT_TIMEOUT_S - 0.25), AwaitSave(ORDER, 0.25)),
]


@pytest.mark.parametrize(("case", "got", "expected"), ROWS, ids=[r[0] for r in ROWS])
def test_the_leave_before_a_planned_move(case: str, got: JitSavePlan, expected: JitSavePlan) -> None:
    assert got == expected


@pytest.mark.parametrize(("got", "why"), [
    (plan(now=T0 + DEFAULT_TIMEOUT_S), "did not leave the replica groups' quorum within 60s"),
    (plan(pending=None, in_place=False), "in-place restarts are off"),
    (plan(pending=None, pods=()), "no pod of the gang is on the going nodes"),
], ids=["timed out", "no in-place restarts", "no pod on the node"])
def test_without_a_leave_the_move_goes_ahead_and_says_why(got: JitSavePlan, why: str) -> None:
    assert isinstance(got, MoveNow) and got.saved == -1 and why in got.note


@pytest.mark.parametrize(("moved", "pods", "replicas", "leaving"), [
    ([1], 2, 2, (1,)),              # a group of one pod
    ([5], 8, 2, (4, 5, 6, 7)),      # a group restarts whole: all its pods leave
    ([0, 5], 6, 3, (0, 1, 4, 5)),   # two groups touched
    ([], 4, 2, ()),
])
def test_every_pod_of_a_moved_group_leaves(moved: list[int], pods: int, replicas: int, leaving: tuple[int, ...]) -> None:
    assert leaving_pods(moved, pods=pods, replicas=replicas) == leaving


def test_the_event_says_which_pods_leave_and_when() -> None:
    assert leave_message(ORDER) == ("pods [2, 3] leave the replica groups' quorum at step 42 or the next step boundary "
                                    "after it before the planned move off node-3")


def report(index: int, *, save_step: int = -1, left_step: int = -1) -> LauncherReport:
    return LauncherReport("j", 2, index, f"j-a0-{index}", LauncherState.RUNNING, save_step=save_step, left_step=left_step)


def test_only_the_moved_pods_launchers_are_told_and_they_report_leaving() -> None:
    board = ControlBoard(clock=lambda: T0)
    board.publish("ns", "j", attempt=2, members={i: f"j-a0-{i}" for i in range(4)}, replica_groups=2)
    board.order_save("ns", "j", ORDER)
    actions = [board.answer("ns", "j", report(i))[1] for i in range(4)]
    assert actions == [Action.CONTINUE, Action.CONTINUE, Action.SAVE, Action.SAVE]
    assert board.answer("ns", "j", report(2, save_step=42))[1] is Action.CONTINUE, "answered once"
    got = parse_report(report(2, save_step=42, left_step=43).to_json())
    assert (got.save_step, got.left_step) == (42, 43)
    assert parse_report(report(2).to_json()).left_step == -1, "absent: not left"
