"""The lifecycle of a TrainingJob as one pure decision: from what a reconcile cycle observed
(the job's status and spec, its gang as :func:`railyard.logic.gang.assess_gang` sees it, an
in-place restart in progress, the clock) to what to do.

:func:`decide_standing` reads the job before its gang: a finished job is released, a job that
failed on its spec starts over once the spec is edited, ``spec.suspend`` suspends and resumes.
:func:`decide_lifecycle` reads the gang and returns the steps of the cycle, in order. The
handlers (handlers/reconcile.py) execute these steps and decide nothing; the rules, and the
numbers they use (the gang deadline, the SDC wait, the restart streak timer, the placement
retry backoff, how many earlier attempts are kept), are here and tested as tables
(tests/operator/test_lifecycle_decisions.py).

The states of the gang and what follows each (docs/operator.md "How a job runs"):

- Absent: wait for an earlier attempt's pods to go, then for the backoff; then place it.
- Partial/Gated (an operator died mid-creation): finish creating it; what is left of a refused
  creation (rolled back) is let go.
- Starting: all Running within ``spec.gang.scheduleTimeoutSeconds``, else placed again; placed
  again at once when a planned node can no longer take its pod. Meanwhile the job's message
  carries why the pods wait, where the scheduler or a controller says it (logic/pending.py). A
  gang that was Running and lost a pod stays Running until the loss is classified (it never goes
  back to Starting).
- Running: record it, clear the restart streak after ``restartPolicy.resetAfterSeconds``.
- Succeeded: record it. Failed: handle the failure (an SDC exit waits a moment for the
  heartbeat that names the suspect).
- An in-place restart in progress: continue it, then wait for every kept launcher to restart
  its workers (falling back to a full restart after ``restartPolicy.inPlaceTimeoutSeconds``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

from railyard.api.trainingjob import RestartPolicy, Restarts, TrainingJobStatus
from railyard.logic.conditions import find_condition, parse_time
from railyard.logic.failures import Failure
from railyard.logic.gang import GangAssessment, StalePlacement
from railyard.logic.pending import PENDING_REASONS, PendingReason
from railyard.logic.rejections import PERMANENT_REASONS
from railyard.logic.restarts import RestartDecision, decide_restart, decide_streak_reset
from railyard.logic.shrink import GROW_BACK_RECHECK_S, WAITING, GroupsFinished
from railyard.logic.status import TERMINAL_PHASES
from railyard.protocol.exitcodes import FailureClass

#: Failed reasons a new spec generation recovers from: the spec itself, or an object built from
#: it, could not be accepted.
RESTART_ON_EDIT = frozenset({"InvalidSpec"}) | PERMANENT_REASONS
#: How many attempts before the current one keep their ConfigMap (rank table: where a sticky
#: placement and a checkpoint cleanup look), their PodGroup, and are searched for a placement.
KEPT_ATTEMPTS = 4
#: Longest wait between placement tries of a gang that does not fit (it doubles from 2 s).
PLACEMENT_RETRY_MAX_S = 30.0
#: How long an SDC exit waits for the heartbeat that names the suspect (then: no node blamed).
SDC_VERDICT_WAIT_S = 5.0
#: How often a Running gang that lost a pod looks again until the loss is classified.
LOST_POD_RECHECK_S = 1.0


def earlier_attempts(attempt: int, kept: int = KEPT_ATTEMPTS) -> range:
    """The attempts before ``attempt`` whose objects are kept (oldest first)."""
    return range(max(attempt - kept, 0), attempt)


def placement_retry_s(failures: int) -> float:
    """Seconds until the next placement try after ``failures`` in a row (2, 4, 8, ... 30)."""
    return min(2.0 ** failures, PLACEMENT_RETRY_MAX_S)


# --------------------------------------------------------------------------- before the gang


@dataclass(frozen=True, slots=True)
class Release:
    """The job finished: keep or delete its pods as ``spec.cleanup`` says; nothing else."""


@dataclass(frozen=True, slots=True)
class StartOver:
    """A job Failed on its spec whose spec was edited: a fresh status, the next attempt."""


@dataclass(frozen=True, slots=True)
class Suspend:
    """``spec.suspend``: delete the gang's pods (``pods``: some are left; a running gang saves
    first, :func:`railyard.logic.jitsave.decide_stop_save`); ``enter``: the phase becomes Suspended."""

    pods: bool
    enter: bool


@dataclass(frozen=True, slots=True)
class Resume:
    """``spec.suspend`` cleared: the next attempt, placed again (not a restart)."""


Standing = Release | StartOver | Suspend | Resume


def decide_standing(status: TrainingJobStatus, *, generation: int, suspend: bool, has_pods: bool,
                    failed_reason: str | None) -> Standing | None:
    """What the job's own state asks for before its gang is looked at (None: look at the gang).
    ``failed_reason``: the reason of the Failed condition, if any. A :class:`StartOver` or
    :class:`Resume` is followed by this decision again on the new status."""
    if status.phase in TERMINAL_PHASES:
        if status.phase == "Failed" and failed_reason in RESTART_ON_EDIT and status.observed_generation != generation:
            return StartOver()
        return Release()
    if suspend:
        return Suspend(pods=has_pods, enter=status.phase != "Suspended")
    if status.phase == "Suspended":
        return Resume()
    return None


# --------------------------------------------------------------------------- the gang


@dataclass(frozen=True, slots=True)
class Relaunch:
    """An in-place restart whose replacements are created and whose kept launchers were told
    (``lastRestart.state`` Started): who has not restarted its workers yet, since when."""

    #: Kept pods whose launcher has not reported the new attempt: "pod (index i, why)".
    waiting: tuple[str, ...]
    started: float
    timeout_s: float


@dataclass(frozen=True, slots=True)
class Observed:
    """What one reconcile cycle saw of a job and its gang (after :func:`decide_standing`)."""

    status: TrainingJobStatus
    generation: int
    now: float
    gang: GangAssessment
    schedule_timeout_s: int
    heartbeat_interval_s: float
    restart_policy: RestartPolicy
    #: The gang's unbound pods whose planned node can no longer take them (Starting only).
    stale_placement: tuple[StalePlacement, ...] = ()
    #: Every pod of the current attempt is one this operator asked to delete (a creation the
    #: API server refused, rolled back).
    rolled_back: bool = False
    #: ``lastRestart.state`` of an in-place restart of the current attempt (None: none, or done).
    in_place: str | None = None
    #: The kept launchers, once the in-place restart is Started.
    relaunch: Relaunch | None = None
    #: The heartbeat store holds the job (a Running gang's health is looked at regularly).
    heartbeats: bool = False
    #: When the first container of the gang exited non-zero (an SDC exit waits from there).
    first_exit: float | None = None
    #: faultTolerance ReplicaGroups: a group finished the last step (logic/shrink.py).
    groups_finished: GroupsFinished | None = None
    #: Why the gang's pods wait, as the scheduler or a controller says it (Starting only;
    #: :func:`railyard.logic.pending.decide_pending_reason`).
    pending: PendingReason | None = None


@dataclass(frozen=True, slots=True)
class Wait:
    """Look again in ``seconds`` (the cycle's delay is the smallest of its steps')."""

    seconds: float


@dataclass(frozen=True, slots=True)
class WaitForOldPods:
    """Earlier attempts' pods still terminating: no new gang before they are gone."""

    count: int
    enter: bool


@dataclass(frozen=True, slots=True)
class Place:
    """Place the gang and create it whole."""


@dataclass(frozen=True, slots=True)
class LetGo:
    """Delete what is left of a refused creation."""


@dataclass(frozen=True, slots=True)
class FinishCreation:
    """Finish creating the gang an operator left half created (same names, same nodes)."""


@dataclass(frozen=True, slots=True)
class PlaceAgain:
    """Tear the gang down; the next attempt places it again."""

    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class MarkStarting:
    """The job is Starting; ``reason``: the condition's (why the gang waits, where known)."""

    message: str
    reason: str = "GangStarting"


@dataclass(frozen=True, slots=True)
class MarkRunning:
    """The gang runs: record it (``enter``: it was not Running) and the spec edits it waits for."""

    message: str
    enter: bool
    pending_spec_changes: str


@dataclass(frozen=True, slots=True)
class CheckHealth:
    """Read the heartbeats: progress into the status; a verdict that asks for a restart is
    handled as a failure and ends the cycle's steps. ``report=False``: progress only."""

    report: bool = True


@dataclass(frozen=True, slots=True)
class ResetStreak:
    restarts: Restarts


@dataclass(frozen=True, slots=True)
class Succeed:
    message: str


@dataclass(frozen=True, slots=True)
class HandleFailure:
    """Spend the failure class's budget (or fail the job), quarantine, restart in place or in full."""

    failure: Failure


@dataclass(frozen=True, slots=True)
class AwaitSdcVerdict:
    """An SDC exit: blame the suspect the health verdict names; without one yet, wait up to
    ``wait_s`` for it, then restart blaming no node (:func:`decide_sdc`)."""

    failure: Failure
    wait_s: float


@dataclass(frozen=True, slots=True)
class ContinueInPlace:
    """Create the replacements, lift their gates, open the restart orders."""


@dataclass(frozen=True, slots=True)
class FallBackToFull:
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class FinishInPlace:
    """Every kept launcher runs the new attempt: the in-place restart is Done."""


@dataclass(frozen=True, slots=True)
class AwaitRelaunch:
    waiting: int
    seconds: float


@dataclass(frozen=True, slots=True)
class GrowBack:
    """faultTolerance ReplicaGroups: replica groups wait for a node while the others train; ask
    the placement whether they can come back (:func:`railyard.logic.shrink.decide_grow_back`)."""


Step = (Wait | WaitForOldPods | Place | LetGo | FinishCreation | PlaceAgain | MarkStarting | MarkRunning | CheckHealth
        | ResetStreak | Succeed | HandleFailure | AwaitSdcVerdict | ContinueInPlace | FallBackToFull | FinishInPlace
        | AwaitRelaunch | GrowBack)


@dataclass(frozen=True, slots=True)
class Decision:
    """The steps of one cycle, in order (none: only events and rechecks wake the job)."""

    steps: tuple[Step, ...] = field(default_factory=tuple)


def decide_lifecycle(seen: Observed) -> Decision:
    """The cycle's steps for the gang ``seen.gang`` of ``seen.status.attempt``."""
    if seen.groups_finished is not None and seen.gang.state != "Succeeded":
        return Decision(tuple(_groups_finished(seen.groups_finished, seen)))
    if seen.in_place == WAITING:
        return Decision(tuple(_waiting(seen)))
    if seen.in_place is not None:
        return Decision(tuple(_in_place(seen)))
    return Decision(tuple(_gang(seen)))


def _groups_finished(done: GroupsFinished, seen: Observed) -> list[Step]:
    """A replica group finished the last step: the run is complete. The others get a settle
    time to finish too (they are in the same last step), then the job Succeeds without them
    (a group still behind can no longer heal from peers that are gone); a failure of theirs
    meanwhile is moot."""
    if done.left_s > 0 and seen.gang.state != "Failed":
        return [Wait(done.left_s)]
    return [CheckHealth(report=False), Succeed(f"{done.message} (attempt {seen.status.attempt})")]


def _waiting(seen: Observed) -> list[Step]:
    """Replica groups wait for a node (the gang as assessed leaves them out): the others' gang
    is looked after as always; while it runs, ask the placement again."""
    steps = _gang(seen)
    if seen.gang.state == "Running":
        steps += [GrowBack(), Wait(GROW_BACK_RECHECK_S)]
    return steps


def _in_place(seen: Observed) -> list[Step]:
    state = seen.gang.state
    if seen.in_place == "Pending" or state in ("Partial", "Gated"):
        # the replaced indices have no pod yet: that is the plan, not a lost pod
        return [ContinueInPlace()]
    if state not in ("Starting", "Running") or seen.relaunch is None:
        return _gang(seen)
    relaunch = seen.relaunch
    if not relaunch.waiting:
        return [FinishInPlace(), *_gang(seen)]
    if seen.now - relaunch.started >= relaunch.timeout_s:
        return [FallBackToFull(
            "RestartNotAnswered",
            f"{len(relaunch.waiting)} kept pods did not restart their workers within {relaunch.timeout_s:g}s "
            f"(restartPolicy.inPlaceTimeoutSeconds): {', '.join(relaunch.waiting[:8])}",
        )]
    wait = AwaitRelaunch(len(relaunch.waiting), max(min(relaunch.started + relaunch.timeout_s - seen.now, 1.0), 0.1))
    return [wait, *_gang(seen)] if state == "Starting" else [wait]


def _gang(seen: Observed) -> list[Step]:
    status, gang = seen.status, seen.gang
    if gang.state == "Absent":
        if gang.stale:
            return [WaitForOldPods(len(gang.stale), enter=status.phase not in ("Restarting", "Placing"))]
        next_try = parse_time(status.next_attempt_time)
        if next_try is not None and seen.now < next_try:
            return [Wait(next_try - seen.now)]
        return [Place()]
    if gang.state in ("Partial", "Gated"):
        return [LetGo()] if seen.rolled_back else [FinishCreation()]
    if gang.state == "Starting":
        if status.phase == "Running":
            # a Running gang that lost a pod: the loss is classified within the NotReady grace
            # (or the pod's deletion shows): it stays Running until then
            return [CheckHealth(), Wait(LOST_POD_RECHECK_S)]
        return _starting(seen)
    if gang.state == "Running":
        return _running(seen)
    if gang.state == "Succeeded":
        return [CheckHealth(report=False), Succeed(f"all {gang.expected} pods exited 0 (attempt {status.attempt})")]
    if gang.state == "Failed":
        assert gang.failure is not None
        failure = gang.failure
        if failure.cls is FailureClass.SDC and failure.kind == "SDCExitCode":
            left = (seen.first_exit + SDC_VERDICT_WAIT_S - seen.now) if seen.first_exit is not None else 0.0
            return [AwaitSdcVerdict(failure, left)]
        return [HandleFailure(failure)]
    return []  # Settling: the cause behind an echo may still come (the gang's recheck says when)


def _starting(seen: Observed) -> list[Step]:
    status, gang = seen.status, seen.gang
    created = parse_time(status.gang_created_time) or seen.now
    deadline = created + seen.schedule_timeout_s
    if seen.now >= deadline:
        return [PlaceAgain(
            "GangTimeout",
            f"{gang.running}/{gang.expected} pods Running after {seen.schedule_timeout_s}s "
            "(spec.gang.scheduleTimeoutSeconds): tearing down and re-placing",
        )]
    if seen.stale_placement:
        stuck = seen.stale_placement[0]
        more = len(seen.stale_placement) - 1
        return [PlaceAgain(
            "NodeUnusable",
            f"pod {stuck.pod} cannot be scheduled on its node {stuck.node} any more ({stuck.why}"
            + (f"; {more} more pods likewise" if more else "")
            + "): tearing down and re-placing without waiting for spec.gang.scheduleTimeoutSeconds",
        )]
    steps: list[Step] = []
    running = f"attempt {status.attempt}: {gang.running}/{gang.expected} pods Running"
    placed = find_condition(status.conditions, "Placed")
    said = placed is not None and placed.reason in PENDING_REASONS
    if seen.pending is not None:
        # the scheduler's (or a controller's) reason within the cycle that sees it, not at the timeout
        message = (f"{running}; {seen.pending.message} (placed again after "
                   f"spec.gang.scheduleTimeoutSeconds={seen.schedule_timeout_s})")
        if status.phase != "Starting" or status.message != message:
            steps.append(MarkStarting(message, seen.pending.reason))
    elif status.phase != "Starting" or said:
        steps.append(MarkStarting(
            f"{running}; waiting for the rest (spec.gang.scheduleTimeoutSeconds={seen.schedule_timeout_s})"))
    return [*steps, CheckHealth(), Wait(min(deadline - seen.now, seen.heartbeat_interval_s))]


def _running(seen: Observed) -> list[Step]:
    status = seen.status
    pending = ""
    if seen.generation != status.observed_generation and status.observed_generation:
        pending = (
            f"spec generation {seen.generation} differs from the running gang's ({status.observed_generation}); "
            "it takes effect at the next restart (suspend and resume to apply it now)"
        )
    steps: list[Step] = [
        MarkRunning(
            f"all {seen.gang.expected} pods Running (attempt {status.attempt})", status.phase != "Running", pending
        ),
        CheckHealth(),
    ]
    reset_in = _streak_timer(seen, steps)
    due = seen.heartbeat_interval_s if seen.heartbeats else None
    wait = reset_in if due is None else (due if reset_in is None else min(due, reset_in))
    if wait is not None:
        steps.append(Wait(wait))
    return steps


def _streak_timer(seen: Observed, steps: list[Step]) -> float | None:
    """Clear the restart streak once the gang has run healthy long enough (appending the step);
    returns the seconds until that is due (None: nothing to wait for)."""
    status, policy = seen.status, seen.restart_policy
    created = parse_time(status.gang_created_time)
    if created is None:
        return None
    # a gang marked Running in this cycle has run since now (MarkRunning records that)
    ready = status.time_to_all_ready_seconds if status.phase == "Running" else round(seen.now - created, 3)
    if ready is None:
        return None
    running_since = created + ready
    reset = decide_streak_reset(status.restarts, policy, running_since, seen.now)
    if reset is not None:
        steps.append(ResetStreak(reset))
        return None
    streak = status.restarts.streak
    if (
        policy.reset_after_seconds <= 0
        or (streak is not None and not any(streak.values()))
        or status.restarts.total == 0
    ):
        return None
    return max(running_since + policy.reset_after_seconds - seen.now, 0.5)


def decide_sdc(step: AwaitSdcVerdict, verdict: Failure | None) -> Failure | float:
    """The failure to handle for an SDC exit given the health verdict (the suspect it names),
    or the seconds to wait for that verdict. Every rank of an SDC vote exits 75, so the exit
    codes do not say whose node is bad; without a verdict in time the gang restarts blaming no
    node (docs/operator.md)."""
    if verdict is not None and verdict.cls is FailureClass.SDC:
        return verdict
    if step.wait_s > 0:
        return min(step.wait_s, 0.5)
    return dataclasses.replace(step.failure, nodes=())


@dataclass(frozen=True, slots=True)
class FailJob:
    """The job fails with this reason and message (its phase Failed)."""

    reason: str
    message: str


def decide_failure(failure: Failure, said: str, policy: RestartPolicy, restarts: Restarts) -> FailJob | RestartDecision:
    """A failure of the gang fails the job (a permanent class, or its class's budget spent) or
    restarts it (the allowed :class:`RestartDecision`, with its backoff). ``said``: the failure
    as the status tells it (logic/failure_report.py)."""
    if failure.cls is FailureClass.PERMANENT:
        return FailJob(failure.kind, f"{said}: not retried (permanent)")
    decision = decide_restart(policy, restarts, failure.cls)
    if not decision.allowed:
        return FailJob("RestartBudgetSpent", f"{said}; {decision.reason}")
    return decision


def describe_steps(decision: Decision) -> Sequence[str]:
    """The step names, for logs and tests."""
    return [type(s).__name__ for s in decision.steps]
