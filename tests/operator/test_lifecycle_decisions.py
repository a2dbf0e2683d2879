"""The lifecycle decision, table-driven and pure: a job's status, what its gang is doing, the
clock, and the steps that must follow (logic/lifecycle.py). Every phase transition of
docs/operator.md has a row here; test_reconcile_state_machine.py runs the same transitions
through the handlers that execute the steps."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from railyard.api.trainingjob import LastRestart, RestartPolicy, Restarts, TrainingJobStatus
from railyard.logic import lifecycle as lc
from railyard.logic.conditions import format_micro_time
from railyard.logic.failures import build_failure
from railyard.logic.gang import GangAssessment, StalePlacement
from railyard.logic.pending import PendingReason
from railyard.logic.rejections import PERMANENT_REASONS
from railyard.logic.status import apply_phase

NOW = 1_767_225_600.0


def ago(seconds: float) -> str:
    return format_micro_time(NOW - seconds)


def gang(state: str, *, expected: int = 4, running: int = 0, stale: tuple[str, ...] = (), failure: Any = None) -> GangAssessment:
    return GangAssessment(state, expected=expected, present=expected, missing=(), gated=(), running=running, succeeded=0,
                          failure=failure, stale=stale)


def status(phase: str = "Pending", **fields: Any) -> TrainingJobStatus:
    return TrainingJobStatus(phase=phase, **fields)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Seen:
    """A compact :class:`lc.Observed`: the defaults are a job at generation 1, attempt 0."""

    phase: str = "Pending"
    gang: GangAssessment = field(default_factory=lambda: gang("Absent"))
    status: dict[str, Any] = field(default_factory=dict)
    generation: int = 1
    kw: dict[str, Any] = field(default_factory=dict)

    def observed(self) -> lc.Observed:
        st = status(self.phase, **self.status)
        return lc.Observed(status=st, generation=self.generation, now=NOW, gang=self.gang, schedule_timeout_s=300,
                           heartbeat_interval_s=5.0, restart_policy=RestartPolicy(), **self.kw)


UNSCHEDULABLE = PendingReason("Unschedulable", "the scheduler left 4/4 pods unscheduled: 0/6 nodes are available")
SHOWN = ("attempt 0: 0/4 pods Running; the scheduler left 4/4 pods unscheduled: 0/6 nodes are available "
         "(placed again after spec.gang.scheduleTimeoutSeconds=300)")
CRASH = build_failure("ApplicationExitCode", "1", pod="j-a0-0")
SDC_EXIT = build_failure("SDCExitCode", "exit 75", node="node-1", pod="j-a0-1")
RESET_AFTER = RestartPolicy().reset_after_seconds


def names(seen: Seen) -> list[str]:
    return list(lc.describe_steps(lc.decide_lifecycle(seen.observed())))


ROWS: list[tuple[str, Seen, list[str]]] = [
    # Pending -> Starting (or Placing, or Failed: placement's verdict, executed by the handler)
    ("absent gang is placed", Seen(), ["Place"]),
    # Restarting: an earlier attempt's pods still terminate
    ("waits for old pods", Seen("Restarting", gang("Absent", stale=("j-a0-0",))), ["WaitForOldPods"]),
    # Restarting: the backoff has not passed
    ("backs off", Seen("Restarting", status={"next_attempt_time": format_micro_time(NOW + 7)}), ["Wait"]),
    # Restarting -> Starting: backoff passed
    ("re-places after the backoff", Seen("Restarting", status={"next_attempt_time": ago(1)}), ["Place"]),
    # Placing: an operator died mid-creation
    ("finishes a half-created gang", Seen("Placing", gang("Partial")), ["FinishCreation"]),
    ("lets a refused creation go", Seen("Placing", gang("Gated"), kw={"rolled_back": True}), ["LetGo"]),
    # Starting: waits for the rest within the schedule timeout
    ("starting waits", Seen("Starting", gang("Starting", running=3), status={"gang_created_time": ago(10)}), ["CheckHealth", "Wait"]),
    ("first look at a starting gang", Seen("Placing", gang("Starting"), status={"gang_created_time": ago(1)}),
     ["MarkStarting", "CheckHealth", "Wait"]),
    # Starting, and the scheduler says why it waits: shown in the cycle that sees it, once
    ("the scheduler's reason", Seen("Starting", gang("Starting"), status={"gang_created_time": ago(10)},
                                    kw={"pending": UNSCHEDULABLE}), ["MarkStarting", "CheckHealth", "Wait"]),
    ("the scheduler's reason, already shown", Seen("Starting", gang("Starting"),
                                                   status={"gang_created_time": ago(10), "message": SHOWN},
                                                   kw={"pending": UNSCHEDULABLE}), ["CheckHealth", "Wait"]),
    # Starting -> Placing: the schedule timeout passed, whatever the scheduler said
    ("gang timeout, the scheduler refusing", Seen("Starting", gang("Starting"), status={"gang_created_time": ago(300)},
                                                  kw={"pending": UNSCHEDULABLE}), ["PlaceAgain"]),
    ("gang timeout", Seen("Starting", gang("Starting", running=3), status={"gang_created_time": ago(300)}), ["PlaceAgain"]),
    # Starting -> Placing at once: a planned node can no longer take its pod
    ("planned node unusable", Seen("Starting", gang("Starting"), status={"gang_created_time": ago(1)},
                                   kw={"stale_placement": (StalePlacement("j-a0-1", "node-1", "Tainted"),)}), ["PlaceAgain"]),
    # Starting -> Running
    ("all running", Seen("Starting", gang("Running", running=4), status={"gang_created_time": ago(20)}), ["MarkRunning", "CheckHealth"]),
    # Running -> Running: a pod lost is not a gang starting again (issue 35)
    ("a running gang that lost a pod stays Running", Seen("Running", gang("Starting", running=3), status={"gang_created_time": ago(3600)}),
     ["CheckHealth", "Wait"]),
    # Running -> Succeeded
    ("all succeeded", Seen("Running", gang("Succeeded")), ["CheckHealth", "Succeed"]),
    # Running -> Restarting / Failed: the failure's class and budget decide (handlers/failures.py)
    ("a failure is handled", Seen("Running", gang("Failed", failure=CRASH)), ["HandleFailure"]),
    ("an SDC exit waits for the verdict", Seen("Running", gang("Failed", failure=SDC_EXIT), kw={"first_exit": NOW - 1}), ["AwaitSdcVerdict"]),
    # Running: an echo may still be followed by its cause
    ("settling", Seen("Running", gang("Settling", running=3)), []),
    # in place: the replacements are created once the backoff passed
    ("in place pending", Seen("Restarting", gang("Running", running=3), kw={"in_place": "Pending"}), ["ContinueInPlace"]),
    ("in place started, all relaunched", Seen("Starting", gang("Running", running=4), status={"gang_created_time": ago(2)},
                                            kw={"in_place": "Started", "relaunch": lc.Relaunch((), NOW - 2, 30.0)}),
     ["FinishInPlace", "MarkRunning", "CheckHealth"]),
    ("in place started, waiting", Seen("Starting", gang("Starting", running=3), status={"gang_created_time": ago(2)},
                                     kw={"in_place": "Started", "relaunch": lc.Relaunch(("j-a0-1 (index 1, never reported)",), NOW - 2, 30.0)}),
     ["AwaitRelaunch", "CheckHealth", "Wait"]),
    ("in place running, waiting", Seen("Starting", gang("Running", running=4),
                                     kw={"in_place": "Started", "relaunch": lc.Relaunch(("j-a0-1 (index 1, never reported)",), NOW - 2, 30.0)}),
     ["AwaitRelaunch"]),
    ("in place not answered", Seen("Starting", gang("Running", running=4),
                                 kw={"in_place": "Started", "relaunch": lc.Relaunch(("j-a0-1 (index 1, never reported)",), NOW - 30, 30.0)}),
     ["FallBackToFull"]),
]


@pytest.mark.parametrize(("seen", "steps"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_steps(seen: Seen, steps: list[str]) -> None:
    assert names(seen) == steps


def step(seen: Seen, kind: type[Any]) -> Any:
    return next(s for s in lc.decide_lifecycle(seen.observed()).steps if isinstance(s, kind))


def test_the_gang_deadline_and_its_wait() -> None:
    waiting = Seen("Starting", gang("Starting", running=3), status={"gang_created_time": ago(298)})
    assert step(waiting, lc.Wait).seconds == pytest.approx(2.0)  # the deadline is nearer than the next heartbeat
    timeout = step(Seen("Starting", gang("Starting", running=3), status={"gang_created_time": ago(300)}), lc.PlaceAgain)
    assert timeout.reason == "GangTimeout" and "3/4 pods Running after 300s" in timeout.message
    stuck = (StalePlacement("j-a0-1", "node-1", "Tainted"), StalePlacement("j-a0-2", "node-2", "NodeGone"))
    unusable = step(Seen("Starting", gang("Starting"), status={"gang_created_time": ago(1)}, kw={"stale_placement": stuck}), lc.PlaceAgain)
    assert unusable.reason == "NodeUnusable" and "j-a0-1" in unusable.message and "1 more pods likewise" in unusable.message


def test_a_starting_job_says_why_its_gang_waits_and_stops_saying_it_when_that_is_over() -> None:
    seen = Seen("Starting", gang("Starting"), status={"gang_created_time": ago(10)}, kw={"pending": UNSCHEDULABLE})
    said = step(seen, lc.MarkStarting)
    assert (said.reason, said.message) == ("Unschedulable", SHOWN)
    missing = PendingReason("ComputeDomainDriverMissing", "install the NVIDIA DRA driver")
    entering = step(Seen("Placing", gang("Starting"), status={"gang_created_time": ago(20)}, kw={"pending": missing}),
                    lc.MarkStarting)
    assert entering.reason == "ComputeDomainDriverMissing" and "install the NVIDIA DRA driver" in entering.message
    # the pods were scheduled after all: the usual message again (and only after a reason was shown)
    for reason, expected in (("Unschedulable", ["MarkStarting", "CheckHealth", "Wait"]),
                             ("GangCreated", ["CheckHealth", "Wait"])):
        shown = apply_phase(TrainingJobStatus(gang_created_time=ago(5)), "Starting", reason=reason, message="m",
                            now=ago(5))
        seen = lc.Observed(status=shown, generation=1, now=NOW, gang=gang("Starting"), schedule_timeout_s=300,
                           heartbeat_interval_s=5.0, restart_policy=RestartPolicy())
        got = lc.decide_lifecycle(seen)
        assert list(lc.describe_steps(got)) == expected, reason
        if expected[0] == "MarkStarting":
            back = next(s for s in got.steps if isinstance(s, lc.MarkStarting))
            assert back.reason == "GangStarting" and "waiting for the rest" in back.message


def test_a_running_gang_never_goes_back_to_starting() -> None:
    lost = Seen("Running", gang("Starting", running=511, expected=512), status={"gang_created_time": ago(10)})
    got = lc.decide_lifecycle(lost.observed()).steps
    assert not any(isinstance(s, (lc.MarkStarting, lc.PlaceAgain)) for s in got)
    assert step(lost, lc.Wait).seconds == lc.LOST_POD_RECHECK_S


def test_running_records_pending_spec_edits_and_the_streak_timer() -> None:
    edited = step(Seen("Running", gang("Running", running=4), generation=3, status={"observed_generation": 2}), lc.MarkRunning)
    assert not edited.enter and "spec generation 3 differs from the running gang's (2)" in edited.pending_spec_changes
    entering = step(Seen("Starting", gang("Running", running=4)), lc.MarkRunning)
    assert entering.enter and entering.pending_spec_changes == ""
    streak = Restarts(total=2, application=2, streak={"application": 2})
    young = Seen("Running", gang("Running", running=4), status={"gang_created_time": ago(100), "time_to_all_ready_seconds": 10.0, "restarts": streak})
    assert step(young, lc.Wait).seconds == pytest.approx(RESET_AFTER - 90)
    old = Seen("Running", gang("Running", running=4), status={"gang_created_time": ago(RESET_AFTER + 100), "time_to_all_ready_seconds": 10.0,
                                                              "restarts": streak})
    reset = step(old, lc.ResetStreak)
    assert reset.restarts.streak == {"application": 0} and reset.restarts.total == 2
    beating = Seen("Running", gang("Running", running=4), kw={"heartbeats": True})
    assert step(beating, lc.Wait).seconds == 5.0  # no streak: the heartbeat interval


def test_an_sdc_exit_blames_the_suspect_of_the_verdict_or_no_node_after_the_wait() -> None:
    waiting = step(Seen("Running", gang("Failed", failure=SDC_EXIT), kw={"first_exit": NOW - 1}), lc.AwaitSdcVerdict)
    assert lc.decide_sdc(waiting, None) == 0.5
    verdict = build_failure("SDCVerdict", "rank 3 disagrees", node="node-3")
    assert lc.decide_sdc(waiting, verdict) == verdict
    late = step(Seen("Running", gang("Failed", failure=SDC_EXIT), kw={"first_exit": NOW - lc.SDC_VERDICT_WAIT_S}), lc.AwaitSdcVerdict)
    blamed_none = lc.decide_sdc(late, None)
    assert not isinstance(blamed_none, float) and blamed_none.nodes == () and blamed_none.kind == "SDCExitCode"


def test_an_in_place_restart_not_answered_names_the_silent_pods() -> None:
    silent = tuple(f"j-a0-{i} (index {i}, never reported)" for i in range(10))
    seen = Seen("Starting", gang("Running", running=4), kw={"in_place": "Started", "relaunch": lc.Relaunch(silent, NOW - 31, 30.0)})
    full = step(seen, lc.FallBackToFull)
    assert full.reason == "RestartNotAnswered" and full.message.startswith("10 kept pods did not restart their workers within 30s")
    assert "j-a0-7" in full.message and "j-a0-8" not in full.message  # the first eight


# --------------------------------------------------------------------------- before the gang


STANDING: list[tuple[str, TrainingJobStatus, dict[str, Any], type[Any] | None]] = [
    ("succeeded is released", status("Succeeded"), {}, lc.Release),
    ("failed is released", status("Failed"), {"failed_reason": "RestartBudgetSpent", "generation": 2}, lc.Release),
    ("a fixed spec starts over", status("Failed", observed_generation=1), {"failed_reason": "InvalidSpec", "generation": 2}, lc.StartOver),
    ("an unchanged bad spec stays Failed", status("Failed", observed_generation=2), {"failed_reason": "InvalidSpec", "generation": 2}, lc.Release),
    ("suspend", status("Running"), {"suspend": True, "has_pods": True}, lc.Suspend),
    ("suspended, nothing left", status("Suspended"), {"suspend": True}, lc.Suspend),
    ("resume", status("Suspended"), {}, lc.Resume),
    ("running looks at the gang", status("Running"), {}, None),
]


@pytest.mark.parametrize(("st", "kw", "expected"), [r[1:] for r in STANDING], ids=[r[0] for r in STANDING])
def test_standing(st: TrainingJobStatus, kw: dict[str, Any], expected: type[Any] | None) -> None:
    args: dict[str, Any] = {"generation": 1, "suspend": False, "has_pods": False, "failed_reason": None, **kw}
    got = lc.decide_standing(st, **args)
    assert (type(got) if got is not None else None) is expected


def test_every_refusal_that_fails_a_job_recovers_on_a_spec_edit() -> None:
    for reason in PERMANENT_REASONS:
        got = lc.decide_standing(status("Failed", observed_generation=1), generation=2, suspend=False, has_pods=False, failed_reason=reason)
        assert isinstance(got, lc.StartOver), reason


def test_suspend_enters_once_and_deletes_while_pods_are_left() -> None:
    first = lc.decide_standing(status("Running"), generation=1, suspend=True, has_pods=True, failed_reason=None)
    again = lc.decide_standing(status("Suspended"), generation=1, suspend=True, has_pods=False, failed_reason=None)
    assert first == lc.Suspend(pods=True, enter=True) and again == lc.Suspend(pods=False, enter=False)


# --------------------------------------------------------------------------- the numbers


def test_placement_retries_double_up_to_thirty_seconds() -> None:
    assert [lc.placement_retry_s(n) for n in (1, 2, 3, 4, 5, 9)] == [2.0, 4.0, 8.0, 16.0, 30.0, 30.0]


def test_the_earlier_attempts_kept() -> None:
    assert list(lc.earlier_attempts(0)) == [] and list(lc.earlier_attempts(2)) == [0, 1]
    assert list(lc.earlier_attempts(9)) == [5, 6, 7, 8] and len(lc.earlier_attempts(100)) == lc.KEPT_ATTEMPTS


def test_an_in_place_restart_of_another_attempt_is_not_followed() -> None:
    # the observation carries an in-place state only for the current attempt (handlers/inplace.py)
    lr = LastRestart(attempt=1, mode="InPlace", state="Started")
    seen = Seen("Running", gang("Running", running=4), status={"attempt": 2, "last_restart": lr})
    assert names(seen) == ["MarkRunning", "CheckHealth"]


def test_a_failure_fails_the_job_when_permanent_or_its_budget_is_spent_else_restarts_it() -> None:
    permanent = build_failure("PermanentExitCode", "64", pod="j-a0-0")
    assert lc.decide_failure(permanent, "exit 64", RestartPolicy(), Restarts()) == lc.FailJob("PermanentExitCode", "exit 64: not retried (permanent)")
    spent = lc.decide_failure(CRASH, "exit 1", RestartPolicy(), Restarts(application=3, total=3))
    assert isinstance(spent, lc.FailJob) and spent.reason == "RestartBudgetSpent" and "3/3" in spent.message
    again = lc.decide_failure(CRASH, "exit 1", RestartPolicy(), Restarts(application=1, total=1))
    assert not isinstance(again, lc.FailJob) and again.allowed and again.backoff_seconds == 20.0
