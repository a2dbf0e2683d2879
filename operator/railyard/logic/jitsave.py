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
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

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
    """A save asked of the gang's launchers: attempt, the earliest step, since when, off which nodes;
    ``pods``: the pod indices it is for (empty: every pod; logic/groupleave.py names the moved groups')."""

    attempt: int
    step: int
    requested_at: float
    nodes: tuple[str, ...]
    pods: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class RequestSave:
    """Publish ``order`` on the control channel and look again after ``recheck_s``."""

    order: SaveOrder
    recheck_s: float = RECHECK_S

    @property
    def message(self) -> str:
        return (f"saving to the memory tier at step {self.order.step} or the next step boundary after it before the "
                f"planned move off {', '.join(self.order.nodes)}")


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
    if pending is None or pending.attempt != attempt:
        # (past the newest save known too: only a save made after the order lets the move go)
        step = max(reported_step, memory_saved_step, 0) + LEAD_STEPS
        return RequestSave(SaveOrder(attempt=attempt, step=step, requested_at=now,
                                     nodes=tuple(sorted(going))))
    if memory_saved_step >= pending.step:
        return MoveNow(memory_saved_step, "")
    waited = now - pending.requested_at
    if waited >= timeout_s:
        return MoveNow(-1, f"the just-in-time save at step {pending.step} was not committed within {timeout_s:g}s; "
                           "resumed from the newest checkpoint (steps since it are trained again)")
    return AwaitSave(pending, min(RECHECK_S, timeout_s - waited))


def answer_save(order: SaveOrder | None, report: LauncherReport) -> bool:
    """Whether the control channel answers ``report`` with the save ``order``: a launcher of the
    order's attempt (and of its ``pods``, when it names some) that has not passed this save on yet
    (it reports ``save_step`` back)."""
    return (order is not None and report.attempt == order.attempt and report.save_step != order.step
            and (not order.pods or report.pod_index in order.pods))
