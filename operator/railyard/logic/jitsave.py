"""The just-in-time save before a planned move without ReplicaGroups: the state machine "save
requested at step S -> saved -> move", decided from what was observed (no clock: ``now`` is a
parameter) and executed by handlers/planned.py.

A planned move (logic/planned.py) restarts the gang in place. Resumed from the newest periodic
memory checkpoint, the steps since it are trained again. So first the operator orders the
launchers to have their workers save to the memory tier at a step boundary no earlier than
``S = the newest step reported (or saved) + LEAD_STEPS`` (the control channel's ``save`` order); the workers
agree among themselves on the one step every rank saves (the first boundary where all of them
have heard, and not before S) and then hold still. When the memory tier reports a committed save
at S or later (``status.checkpoints``, from the heartbeats), the move goes ahead and its restore
hint names that save: no step is trained twice. When no such save arrives within
``timeout_s``, the move goes ahead as without it, from the newest checkpoint there is, and its
Event says so.

With ReplicaGroups nothing is saved: the moved group heals from a live peer. Without a memory
tier, or without in-place restarts (no launcher to tell), the move goes ahead at once.

A stop on purpose (``spec.suspend: true``, Kueue's eviction of the job's Workload) takes the same
path before the gang's pods are deleted (:func:`decide_stop_save`): the save goes to the memory
tier, which outlives the pods on the host (``checkpoint.memory.medium: HostPath``), and the next
attempt, placed sticky on the same nodes, restores it: its first step is the saved step + 1.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass

from railyard.protocol.control import LauncherReport

#: Steps between the newest step reported and the save step asked for: the order reaches every
#: launcher and worker within that (one step is in flight, the next has begun).
LEAD_STEPS = 2
#: How long the move waits for the save by default (then it goes ahead from the newest save).
DEFAULT_TIMEOUT_S = 60.0
#: How often a waiting move looks again (status.checkpoints changes with a heartbeat).
RECHECK_S = 1.0


@dataclass(frozen=True, slots=True)
class SaveOrder:
    """A save asked of the gang's launchers: attempt, the earliest step, since when, off which nodes
    (a planned move), or ``purpose``: the stop it is for (``spec.suspend``, Kueue's eviction);
    ``pods``: the pod indices it is for (empty: every pod; logic/groupleave.py names the moved groups')."""

    attempt: int
    step: int
    requested_at: float
    nodes: tuple[str, ...]
    _: KW_ONLY
    pods: tuple[int, ...] = ()
    purpose: str = ""

    @property
    def before(self) -> str:
        """What the save comes before, in the Event and the launchers' log."""
        return self.purpose or f"the planned move off {', '.join(self.nodes)}"


@dataclass(frozen=True, slots=True)
class RequestSave:
    """Publish ``order`` on the control channel and look again after ``recheck_s``."""

    order: SaveOrder
    recheck_s: float = RECHECK_S

    @property
    def message(self) -> str:
        return (f"saving to the memory tier at step {self.order.step} or the next step boundary after it before "
                f"{self.order.before}")


@dataclass(frozen=True, slots=True)
class AwaitSave:
    """The save is not committed yet: look again after ``recheck_s``."""

    order: SaveOrder
    recheck_s: float


@dataclass(frozen=True, slots=True)
class MoveNow:
    """Execute the move. ``saved``: the step of the just-in-time save it resumes from (-1: none,
    ``why`` says why: not wanted, or timed out)."""

    saved: int
    why: str

    @property
    def note(self) -> str:
        """What the PlannedMove Event adds."""
        return f"resumed from the just-in-time save at step {self.saved}" if self.saved >= 0 else self.why


JitSavePlan = RequestSave | AwaitSave | MoveNow


def decide_jit_save(
    *,
    pending: SaveOrder | None,
    attempt: int,
    going: Mapping[str, str],
    reported_step: int,
    memory_saved_step: int,
    now: float,
    replica_groups: int,
    in_place: bool,
    memory_tier: bool,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> JitSavePlan:
    """What to do about the save before a planned move off ``going``.

    ``pending``: the order published earlier (None: none); ``reported_step``: the newest step the
    ranks reported (status.step); ``memory_saved_step``: the newest committed, verified memory-tier
    save (status.checkpoints; -1: none)."""
    if replica_groups > 1:
        return MoveNow(-1, "no save: with ReplicaGroups the moved group heals from a live peer")
    if not in_place:
        return MoveNow(-1, "no just-in-time save: in-place restarts are off (no launcher to tell)")
    if not memory_tier:
        return MoveNow(-1, "no just-in-time save: the memory tier is off; resumed from the newest checkpoint")
    got = _save_then(pending, attempt=attempt, reported_step=reported_step, memory_saved_step=memory_saved_step,
                     now=now, timeout_s=timeout_s, nodes=tuple(sorted(going)), purpose="")
    if not isinstance(got, _Go):
        return got
    return MoveNow(got.saved, "" if got.saved >= 0 else f"{_not_committed(got, timeout_s)}; resumed from the newest "
                                                          "checkpoint (steps since it are trained again)")


@dataclass(frozen=True, slots=True)
class _Go:
    """Go on: from the save at ``saved``, or (-1) without the save asked for at ``asked`` (timed out)."""

    saved: int
    asked: int


def _not_committed(got: _Go, timeout_s: float) -> str:
    return f"the just-in-time save at step {got.asked} was not committed within {timeout_s:g}s"


def _save_then(pending: SaveOrder | None, *, attempt: int, reported_step: int, memory_saved_step: int, now: float,
               timeout_s: float, nodes: tuple[str, ...], purpose: str) -> RequestSave | AwaitSave | _Go:
    """The save's own state machine, shared by the planned move and the stop: ask, wait, go on."""
    if pending is None or pending.attempt != attempt:
        # (past the newest save known too: only a save made after the order lets the move go)
        step = max(reported_step, memory_saved_step, 0) + LEAD_STEPS
        return RequestSave(SaveOrder(attempt=attempt, step=step, requested_at=now, nodes=nodes, purpose=purpose))
    if memory_saved_step >= pending.step:
        return _Go(memory_saved_step, pending.step)
    waited = now - pending.requested_at
    if waited >= timeout_s:
        return _Go(-1, pending.step)
    return AwaitSave(pending, min(RECHECK_S, timeout_s - waited))


@dataclass(frozen=True, slots=True)
class StopNow:
    """Delete the gang's pods now. ``saved``: the step of the just-in-time save the next attempt
    resumes from (-1: none, ``why`` says why: not possible, not wanted, or timed out)."""

    saved: int
    why: str

    @property
    def note(self) -> str:
        """What the stop's Event and message add."""
        return f"the next attempt resumes from the just-in-time save at step {self.saved}" if self.saved >= 0 \
            else self.why


StopPlan = RequestSave | AwaitSave | StopNow


def decide_stop_save(
    *,
    purpose: str,
    pending: SaveOrder | None,
    attempt: int,
    running: bool,
    reported_step: int,
    memory_saved_step: int,
    now: float,
    replica_groups: int,
    in_place: bool,
    memory_tier: bool,
    memory_on_host: bool,
    quota_released: bool = False,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> StopPlan:
    """What to do about the save before the gang's pods are deleted for ``purpose`` (a suspend, an
    eviction): save first (request, wait), or delete now and say why not.

    ``running``: the gang trains whole (phase Running, no restart under way, every pod's launcher
    on this attempt: every rank can hear the order); ``memory_on_host``: the memory tier outlives
    the pods (``medium: HostPath``); ``quota_released``: the quota system gave the job's quota to
    others already (Kueue's deactivation, record 052): the pods must stop at once. The rest as
    :func:`decide_jit_save`."""
    if not running:
        return StopNow(-1, "no just-in-time save: the gang was not training whole (starting, restarting or failed); "
                           "the next attempt resumes from the newest checkpoint")
    if quota_released:
        return StopNow(-1, "no just-in-time save: Kueue released the job's quota at once (deactivated), so the pods "
                           "stop now; the next attempt resumes from the newest checkpoint")
    if replica_groups > 1:
        return StopNow(-1, "no just-in-time save: not built for ReplicaGroups; the next attempt resumes from the "
                           "newest checkpoint")
    if not in_place:
        return StopNow(-1, "no just-in-time save: in-place restarts are off (no launcher to tell); the next attempt "
                           "resumes from the newest checkpoint")
    if not memory_tier:
        return StopNow(-1, "no just-in-time save: the memory tier is off; the next attempt resumes from the newest "
                           "checkpoint")
    if not memory_on_host:
        return StopNow(-1, "no just-in-time save: the memory tier lives in the pods (checkpoint.memory.medium: Pod) "
                           "and goes with them; the next attempt resumes from the newest local or shared checkpoint")
    if timeout_s <= 0:
        return StopNow(-1, "no just-in-time save: the operator waits 0 s for one (--save-before-stop-seconds); the "
                           "next attempt resumes from the newest checkpoint")
    got = _save_then(pending, attempt=attempt, reported_step=reported_step, memory_saved_step=memory_saved_step,
                     now=now, timeout_s=timeout_s, nodes=(), purpose=purpose)
    if not isinstance(got, _Go):
        return got
    why = "" if got.saved >= 0 else (f"{_not_committed(got, timeout_s)}; the next attempt resumes from the newest "
                                     "checkpoint (steps since it are trained again)")
    return StopNow(got.saved, why)


def answer_save(order: SaveOrder | None, report: LauncherReport) -> bool:
    """Whether the control channel answers ``report`` with the save ``order``: a launcher of the
    order's attempt (and of its ``pods``, when it names some) that has not passed this save on yet
    (it reports ``save_step`` back)."""
    return (order is not None and report.attempt == order.attempt and report.save_step != order.step
            and (not order.pods or report.pod_index in order.pods))
