"""The just-in-time save before a planned move (issue 47), as tables: logic/jitsave.py's state
machine (request at step S -> wait -> move, or move at once, or after the timeout) and the
control channel's save order (answered once to each launcher of the order's attempt). The same
save before a stop on purpose (``spec.suspend``, Kueue's eviction; issues 47 and 48): save first,
or delete the pods now and say why."""

from __future__ import annotations

import pytest

from railyard.logic.jitsave import (
    DEFAULT_TIMEOUT_S,
    LEAD_STEPS,
    RECHECK_S,
    AwaitSave,
    JitSavePlan,
    MoveNow,
    RequestSave,
    SaveOrder,
    StopNow,
    StopPlan,
    decide_jit_save,
    decide_stop_save,
)
from railyard.observe.control import ControlBoard
from railyard.protocol.control import (
    Action,
    ControlOrder,
    LauncherReport,
    LauncherState,
    decide_launcher_step,
    parse_order,
    parse_report,
)

T0 = 1000.0
ORDER = SaveOrder(attempt=3, step=42, requested_at=T0, nodes=("node-1",))
GOING = {"node-1": "cordoned"}


def plan(*, pending: SaveOrder | None = ORDER, attempt: int = 3, reported: int = 40, saved: int = 35, now: float = T0 + 5,
         groups: int = 1, in_place: bool = True, memory: bool = True) -> JitSavePlan:
    return decide_jit_save(pending=pending, attempt=attempt, going=GOING, reported_step=reported, memory_saved_step=saved,
                           now=now, replica_groups=groups, in_place=in_place, memory_tier=memory)


ROWS: list[tuple[str, JitSavePlan, JitSavePlan]] = [
    ("nothing asked yet: ask for the step reported + LEAD",
     plan(pending=None, now=T0), RequestSave(SaveOrder(3, 40 + LEAD_STEPS, T0, ("node-1",)))),
    ("a save newer than the step reported counts: ask past it",
     plan(pending=None, reported=40, saved=41, now=T0), RequestSave(SaveOrder(3, 41 + LEAD_STEPS, T0, ("node-1",)))),
    ("an order of an older attempt is not this one's: ask again",
     plan(pending=SaveOrder(2, 10, T0 - 500, ("node-1",)), now=T0), RequestSave(SaveOrder(3, 40 + LEAD_STEPS, T0, ("node-1",)))),
    ("asked, not saved yet: wait", plan(), AwaitSave(ORDER, RECHECK_S)),
    ("an older save does not count", plan(saved=41), AwaitSave(ORDER, RECHECK_S)),
    ("saved at S: move, resumed from S", plan(saved=42), MoveNow(42, "")),
    ("saved past S (a rank heard late): move from there", plan(saved=44), MoveNow(44, "")),
    ("the wait is bounded: the last recheck ends at the timeout",
     plan(now=T0 + DEFAULT_TIMEOUT_S - 0.25), AwaitSave(ORDER, 0.25)),
]


@pytest.mark.parametrize(("case", "got", "expected"), ROWS, ids=[r[0] for r in ROWS])
def test_the_save_before_a_planned_move(case: str, got: JitSavePlan, expected: JitSavePlan) -> None:
    assert got == expected


@pytest.mark.parametrize(("got", "why"), [
    (plan(now=T0 + DEFAULT_TIMEOUT_S), "was not committed within"),
    (plan(pending=None, groups=2), "heals from a live peer"),
    (plan(pending=None, in_place=False), "in-place restarts are off"),
    (plan(pending=None, memory=False), "the memory tier is off"),
], ids=["timed out", "replica groups", "no in-place restarts", "no memory tier"])
def test_without_a_save_the_move_goes_ahead_and_says_why(got: JitSavePlan, why: str) -> None:
    assert isinstance(got, MoveNow) and got.saved == -1 and why in got.note


def report(attempt: int = 3, *, save_step: int = -1, pod_index: int = 0) -> LauncherReport:
    return LauncherReport("j", attempt, pod_index, f"j-a0-{pod_index}", LauncherState.RUNNING, save_step=save_step)


def test_the_save_order_and_its_acknowledgement_travel_the_control_channel() -> None:
    order = ControlOrder("j", 3, Action.SAVE, "save", save_step=42)
    assert parse_order(order.to_json()) == order
    assert parse_report(report(save_step=42).to_json()).save_step == 42
    assert parse_report(report().to_json()).save_step == -1
    # a launcher acts on a save for the attempt it runs only
    assert decide_launcher_step(3, order) is Action.SAVE
    assert decide_launcher_step(2, order) is Action.CONTINUE
    assert decide_launcher_step(4, order) is Action.CONTINUE


def test_the_board_answers_the_save_once_to_each_launcher_of_its_attempt() -> None:
    board = ControlBoard()
    board.publish("ns", "j", attempt=3, members={0: "j-a0-0", 1: "j-a0-1"})
    assert board.answer("ns", "j", report())[1] is Action.CONTINUE
    board.order_save("ns", "j", ORDER)
    got, action = board.answer("ns", "j", report())
    assert action is Action.SAVE and isinstance(got, ControlOrder) and got.save_step == 42
    # passed on: not told again (no busy poll); the other launcher still is
    assert board.answer("ns", "j", report(save_step=42))[1] is Action.CONTINUE
    assert board.answer("ns", "j", report(pod_index=1))[1] is Action.SAVE
    # a launcher of another attempt never gets it; a new attempt drops the order
    assert board.answer("ns", "j", report(attempt=2))[1] is not Action.SAVE
    board.publish("ns", "j", attempt=4, members={0: "j-a0-0", 1: "j-a0-1"})
    assert board.save_order("ns", "j") is None
    assert board.answer("ns", "j", report(attempt=4))[1] is Action.CONTINUE


SUSPEND = "spec.suspend"
STOP_ORDER = SaveOrder(attempt=3, step=42, requested_at=T0, nodes=(), purpose=SUSPEND)


def stop(*, pending: SaveOrder | None = STOP_ORDER, attempt: int = 3, running: bool = True, reported: int = 40,
         saved: int = 35, now: float = T0 + 5, groups: int = 1, in_place: bool = True, memory: bool = True,
         on_host: bool = True, released: bool = False, timeout_s: float = DEFAULT_TIMEOUT_S) -> StopPlan:
    return decide_stop_save(purpose=SUSPEND, pending=pending, attempt=attempt, running=running, reported_step=reported,
                            memory_saved_step=saved, now=now, replica_groups=groups, in_place=in_place,
                            memory_tier=memory, memory_on_host=on_host, quota_released=released, timeout_s=timeout_s)


STOP_ROWS: list[tuple[str, StopPlan, StopPlan]] = [
    ("a running gang: ask for the step reported + LEAD, before the suspend",
     stop(pending=None, now=T0), RequestSave(SaveOrder(3, 40 + LEAD_STEPS, T0, (), purpose=SUSPEND))),
    ("a newer save known: ask past it", stop(pending=None, saved=41, now=T0),
     RequestSave(SaveOrder(3, 41 + LEAD_STEPS, T0, (), purpose=SUSPEND))),
    ("an order of an older attempt is not this one's", stop(pending=SaveOrder(2, 10, T0 - 500, (), purpose=SUSPEND), now=T0),
     RequestSave(SaveOrder(3, 40 + LEAD_STEPS, T0, (), purpose=SUSPEND))),
    ("asked, not committed: wait, the pods stay", stop(), AwaitSave(STOP_ORDER, RECHECK_S)),
    ("a planned move's order of this attempt serves the stop too", stop(pending=ORDER), AwaitSave(ORDER, RECHECK_S)),
    ("committed at S: delete the pods, the next attempt resumes from S", stop(saved=42), StopNow(42, "")),
    ("committed past S: from there", stop(saved=43), StopNow(43, "")),
    ("the wait is bounded by the setting", stop(now=T0 + 9.5, timeout_s=10), AwaitSave(STOP_ORDER, 0.5)),
]


@pytest.mark.parametrize(("case", "got", "expected"), STOP_ROWS, ids=[r[0] for r in STOP_ROWS])
def test_the_save_before_a_stop_on_purpose(case: str, got: StopPlan, expected: StopPlan) -> None:
    assert got == expected


@pytest.mark.parametrize(("got", "why"), [
    (stop(now=T0 + 10, timeout_s=10), "was not committed within 10s; the next attempt resumes from the newest"),
    (stop(pending=None, running=False), "not training whole"),
    (stop(pending=None, released=True), "Kueue released the job's quota at once"),
    (stop(pending=None, groups=2), "not built for ReplicaGroups"),
    (stop(pending=None, in_place=False), "in-place restarts are off"),
    (stop(pending=None, memory=False), "the memory tier is off"),
    (stop(pending=None, on_host=False), "checkpoint.memory.medium: Pod"),
    (stop(pending=None, timeout_s=0), "waits 0 s for one (--save-before-stop-seconds)"),
], ids=["timed out", "not running whole", "quota released (deactivated)", "replica groups", "no in-place restarts",
        "no memory tier", "memory tier in the pods", "no wait allowed"])
def test_without_a_save_the_stop_deletes_the_pods_now_and_says_why(got: StopPlan, why: str) -> None:
    assert isinstance(got, StopNow) and got.saved == -1 and why in got.note


def test_the_launchers_are_told_what_the_save_comes_before() -> None:
    board = ControlBoard()
    board.publish("ns", "j", attempt=3, members={0: "j-a0-0"})
    board.order_save("ns", "j", STOP_ORDER)
    got, action = board.answer("ns", "j", report())
    assert action is Action.SAVE and isinstance(got, ControlOrder) and got.reason == "save before spec.suspend"
    assert RequestSave(ORDER).message.endswith("before the planned move off node-1")
