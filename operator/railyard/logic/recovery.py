"""Recovery: what the operator does about a failure of the gang, and about replica groups that
wait for a node, decided in one pure function. :func:`decide_recovery` takes what was observed
(:class:`Observed`: the cause, the pods and nodes, the cluster's bound pods for the placement,
the running attempt's rank table, the spec and the status with its budgets) and returns ONE
typed plan (:data:`RecoveryPlan`); handlers/ execute it and decide nothing on the way.

The plans, and which module of logic/ each step comes from:

- :class:`Fail`: a permanent failure, or its class's restart budget spent (``decide_failure``).
- :class:`FullRestart`: every pod deleted, the next attempt created whole after the backoff;
  ``reason`` is a :data:`railyard.logic.inplace.FALLBACKS` key (why not in place).
- :class:`RestartInPlace`: the pods on healthy nodes stay, the others are replaced sticky
  (``decide_restart_mode``, then the placement, ``plan_in_place_moves``). A pod on a flagged
  straggler node moves only when the placement has room; that it was flagged never turns an
  in-place restart into a full one.
- :class:`RepairGroups`: faultTolerance ReplicaGroups: only the groups the failure touched
  restart, the others carry on untouched (``decide_group_repair``).
- :class:`ShrinkAndWait`: the touched groups cannot be placed but enough groups carry on: the job
  goes on with fewer groups, the lost ones wait for a node (logic/shrink.py's ``decide_shrink``).
- :class:`GrowBack` / :class:`KeepWaiting`: while groups wait, whether they fit again
  (``decide_grow_back``); :class:`FallBackToFull` when there is nothing to grow back onto.
- :class:`MoveAhead`: a planned disruption (:class:`PlannedMoves`: nodes announced to go,
  logic/planned.py): the pods on them move ahead of time as an in-place restart (a replica-group
  repair with ReplicaGroups) of class Planned, spending no restart budget. When no pod can stay
  (in place off, no control channel) the planned move is a :class:`FullRestart` of class
  Planned; with ReplicaGroups and no room, a :class:`ShrinkAndWait`: still no budget spent.

Reason codes and messages are properties of the plans, built from their fields: no caller
parses a message or decodes a union of return types.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from railyard.api.trainingjob import TrainingJob, TrainingJobStatus
from railyard.logic.failures import Failure
from railyard.logic.gang import pod_index_of
from railyard.logic.inplace import (
    FALLBACKS,
    GROUP_REPAIR,
    InPlaceMoves,
    RestartPlan,
    decide_group_repair,
    decide_nodes_to_leave,
    decide_restart_mode,
    failed_pod_indices,
    plan_in_place_moves,
)
from railyard.logic.lifecycle import FailJob, FallBackToFull, decide_failure
from railyard.logic.placement import Placement, Unplaceable, build_placement_input, plan_placement
from railyard.logic.restarts import RestartDecision
from railyard.logic.shrink import GrowBack, KeepWaiting, Shrink, decide_grow_back, decide_shrink
from railyard.logic.tas import TopologyAssignment
from railyard.logic.topology import TopologyCache
from railyard.protocol.exitcodes import FailureClass
from railyard.protocol.mesh import pods_per_group
from railyard.protocol.ranktable import RankTable

__all__ = [
    "Fail",
    "FallBackToFull",
    "FullRestart",
    "GrowBack",
    "KeepWaiting",
    "MoveAhead",
    "Observed",
    "PlannedMoves",
    "RecoveryPlan",
    "RepairGroups",
    "RestartInPlace",
    "ShrinkAndWait",
    "WaitingGroups",
    "decide_recovery",
]

Obj = Mapping[str, Any]


# --------------------------------------------------------------------------- what was observed


@dataclass(frozen=True, slots=True)
class WaitingGroups:
    """The cause of a grow-back check: replica groups wait for a node (``lastRestart.state``
    Waiting) while the others train, and a cycle asks whether they fit again."""

    groups: tuple[int, ...]
    #: Pod indices of the groups that train on.
    carry_on: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PlannedMoves:
    """The cause of a planned move: nodes of the running gang announced to go (node -> why,
    logic/planned.py's ``find_planned_moves``); every node marked now, in one move."""

    nodes: Mapping[str, str]

    @property
    def failure(self) -> Failure:
        """The restart's record: class Planned (no budget), no node to blame or quarantine."""
        going = ", ".join(f"{n} ({w})" for n, w in sorted(self.nodes.items()))
        return Failure(kind=PLANNED_MOVE, cls=FailureClass.PLANNED, nodes=(), message=f"planned move off {going}")


@dataclass(frozen=True, slots=True)
class Observed:
    """What :func:`decide_recovery` decides from; the handler reads it, nothing more."""

    cause: Failure | WaitingGroups | PlannedMoves
    job: TrainingJob
    status: TrainingJobStatus
    #: ``metadata.generation`` of the TrainingJob (a spec edited since the gang was built).
    generation: int
    #: The gang's pods as they are (not the launchers' reports laid over them).
    members: Sequence[Obj]
    nodes: Mapping[str, Obj]
    #: Every bound pod of the cluster (what the placement counts as taken).
    cluster_pods: Sequence[Obj] = ()
    #: The running attempt's rank table (None: gone, or not read because in place is off).
    table: RankTable | None = None
    #: Pod indices whose launcher spoke the control protocol in this attempt.
    capable: frozenset[int] = frozenset()
    #: The gang as the failure rules see it (launcher reports as pod evidence): whose workers failed.
    reported: Sequence[Obj] = ()
    #: The failure as the status tells it (logic/failure_report.py).
    said: str = ""
    #: Nodes the scheduler refused the job's pods for lack of GPUs (logic/pending.py).
    refused: Sequence[str] = ()
    #: The operator's memo of what it derived from the Node objects (the answer is the same
    #: without; :class:`railyard.logic.topology.TopologyCache`).
    topology_cache: TopologyCache | None = None
    #: Nodes of the cluster announced to go (node -> why; logic/planned.py): no pod is placed
    #: there, or it would have to move again at once.
    going: Mapping[str, str] = field(default_factory=dict)
    #: Kueue's topology assignment of the job's admission: replacements stay inside it (logic/tas.py).
    admitted: TopologyAssignment | None = None


# --------------------------------------------------------------------------- the plans


@dataclass(frozen=True, slots=True)
class Fail:
    """The job fails (its phase Failed)."""

    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class FullRestart:
    """Delete every pod of the gang; the next attempt is created whole after the backoff."""

    failure: Failure
    budget: RestartDecision
    #: Why not in place: a :data:`FALLBACKS` key.
    fallback: str
    #: What the fallback's own text leaves out (the placement's reason, the pods without a launcher).
    detail: str = ""

    @property
    def reason(self) -> str:
        return self.fallback

    @property
    def message(self) -> str:
        return f"full restart ({self.fallback}): {FALLBACKS[self.fallback]}" + (
            f": {self.detail}" if self.detail else ""
        )

    @property
    def notable(self) -> bool:
        """Whether the full restart is worth a Warning of its own (in place was possible in principle)."""
        return self.fallback != "InPlaceDisabled"


@dataclass(frozen=True, slots=True)
class RestartInPlace:
    """Keep the pods that can stay, replace the others sticky, tell the kept launchers to
    restart their workers for the new attempt."""

    failure: Failure
    budget: RestartDecision
    moves: InPlaceMoves

    @property
    def placement(self) -> Placement:
        return self.moves.placement

    @property
    def replace(self) -> frozenset[int]:
        return self.moves.replace

    @property
    def keep(self) -> tuple[int, ...]:
        return self.moves.keep

    @property
    def carry_on(self) -> tuple[int, ...]:
        """Pods whose workers are never told to restart (none: every kept launcher restarts)."""
        return self.moves.carry_on

    @property
    def reason(self) -> str:
        """``lastRestart.reason`` (empty: an ordinary in-place restart)."""
        return ""

    @property
    def message(self) -> str:
        return self.moves.message


@dataclass(frozen=True, slots=True)
class RepairGroups(RestartInPlace):
    """faultTolerance ReplicaGroups: restart (in place) only the groups the failure touched;
    every pod of the other groups carries on, its launcher never told to restart."""

    @property
    def groups(self) -> tuple[int, ...]:
        """The replica groups that restart."""
        return self.moves.restarting_groups

    @property
    def reason(self) -> str:
        return GROUP_REPAIR


@dataclass(frozen=True, slots=True)
class ShrinkAndWait:
    """The touched groups cannot be placed: the job goes on with fewer replica groups; theirs
    wait for a node (their pods that must move deleted, the others' launchers told to wait)."""

    failure: Failure
    budget: RestartDecision
    groups: Shrink

    @property
    def reason(self) -> str:
        return GROUP_REPAIR

    @property
    def message(self) -> str:
        return self.groups.message


@dataclass(frozen=True, slots=True)
class MoveAhead(RestartInPlace):
    """A planned disruption (nodes announced to be drained or retired): move the pods off them
    before they go, while the gang still runs, as an in-place restart of class Planned (its
    ``failure``: :attr:`PlannedMoves.failure`; its ``budget``: none spent). With ReplicaGroups
    (``carry_on``) only the groups on those nodes restart. The failure path never returns it."""

    #: Node -> why it is going (the announcement).
    nodes: Mapping[str, str]

    @property
    def groups(self) -> tuple[int, ...]:
        """The replica groups that restart (none: not a replica-group repair)."""
        return self.moves.restarting_groups

    @property
    def reason(self) -> str:
        """``lastRestart.reason``: with ReplicaGroups the move is executed, and followed, as the
        group repair it is (what carries on is read from that reason); PlannedMove otherwise.
        That it was planned is in the message, the Event and ``restarts.planned`` either way."""
        return GROUP_REPAIR if self.moves.carry_on else PLANNED_MOVE

    @property
    def message(self) -> str:
        going = ", ".join(f"{n} ({w})" for n, w in sorted(self.nodes.items()))
        return f"moving ahead of {going}: {self.moves.message}"


#: ``lastRestart.reason`` and the failure kind of a planned move.
PLANNED_MOVE = "PlannedMove"

#: Every plan :func:`decide_recovery` returns.
RecoveryPlan = (
    Fail | FullRestart | RestartInPlace | RepairGroups | MoveAhead | ShrinkAndWait | GrowBack | KeepWaiting
    | FallBackToFull
)


# --------------------------------------------------------------------------- the decision


def decide_recovery(seen: Observed) -> RecoveryPlan:
    """The one recovery decision: after a failure (:class:`Failure`), or while replica groups
    wait for a node (:class:`WaitingGroups`), or ahead of nodes announced to go
    (:class:`PlannedMoves`)."""
    if isinstance(seen.cause, WaitingGroups):
        return _grow_back(seen, seen.cause)
    if isinstance(seen.cause, PlannedMoves):
        return _after_failure(seen, seen.cause.failure, planned=seen.cause.nodes)
    return _after_failure(seen, seen.cause)


def _node(p: Obj) -> str:
    return str((p.get("spec") or {}).get("nodeName") or "")


def _place(seen: Observed, table: RankTable, avoid: set[str], attempt: int) -> Placement | Unplaceable:
    """The next attempt's placement, sticky to ``table`` (the running attempt's), avoiding ``avoid``."""
    status = seen.status
    return plan_placement(
        build_placement_input(
            seen.job,
            nodes=list(seen.nodes.values()),
            pods=seen.cluster_pods,
            attempt=attempt,
            previous_nodes=[p.node for p in sorted(table.pods, key=lambda p: p.pod_index)],
            previous_spares=status.placement.spares if status.placement else (),
            failed=avoid | set(seen.going),
            cache=seen.topology_cache,
            refused=seen.refused,
            admitted=seen.admitted,
        )
    )


def _after_failure(seen: Observed, failure: Failure, planned: Mapping[str, str] | None = None) -> RecoveryPlan:
    """After ``failure``; or, with ``planned`` (node -> why it is going), the planned move off
    those nodes (``failure`` then of class Planned: the same steps, no budget)."""
    spec, status = seen.job.spec, seen.status
    budget = decide_failure(failure, seen.said, spec.restart_policy, status.restarts)
    if isinstance(budget, FailJob):
        return Fail(budget.reason, budget.message)
    # the nodes to move off: those the failure blames (quarantined as the plan is executed),
    # those announced to go, and the quarantined ones
    move_off = {n: f"blamed: {failure.kind}" for n in failure.nodes}
    move_off.update({n: f"going: {why}" for n, why in (planned or {}).items()})
    for q in status.quarantined_nodes:
        move_off.setdefault(q.node, "quarantined")
    stragglers = decide_nodes_to_leave(
        [(s.node, s.rank, s.score) for s in status.stragglers],
        [_node(p) for p in seen.members if _node(p) not in move_off],
    )
    spec_changed = bool(status.observed_generation) and seen.generation != status.observed_generation
    expected = status.placement.node_count if status.placement and status.placement.node_count else spec.nodes
    mode = decide_restart_mode(
        enabled=spec.restart_policy.in_place,
        spec_changed=spec_changed,
        members=seen.members,
        expected=expected,
        nodes=seen.nodes,
        move_off=move_off,
        leave=stragglers,
        capable=seen.capable,
    )
    # a planned move has no failed workers: only the pods on the going nodes decide the groups
    failed_pods = frozenset(() if planned else failed_pod_indices(seen.reported)) | frozenset(failure.pod_indices)
    mode = decide_group_repair(
        mode,
        expected=expected,
        replicas=spec.replica_groups,
        min_replicas=spec.fault_tolerance.min_replicas,
        failed=failed_pods,
    )
    if mode.mode == "Full":
        return FullRestart(failure, budget, mode.reason, mode.detail)
    table = seen.table
    if table is None:
        return FullRestart(failure, budget, "NotPlaceable", "the running attempt's rank table is gone")
    attempt = status.attempt + 1
    avoid = set(move_off)
    moves = plan_in_place_moves(mode, table, stragglers, avoid, lambda nodes: _place(seen, table, nodes, attempt))
    if isinstance(moves, RestartPlan):
        # the lost replica groups found no place: the others go on without them
        shrink = (
            decide_shrink(
                mode, moves.detail, replicas=spec.replica_groups, min_replicas=spec.fault_tolerance.min_replicas
            )
            if moves.reason == "NotPlaceable"
            else None
        )
        if shrink is not None:
            return ShrinkAndWait(failure, budget, shrink)
        return FullRestart(failure, budget, moves.reason, moves.detail)
    if planned:
        return MoveAhead(failure, budget, moves, planned)
    if moves.carry_on:
        return RepairGroups(failure, budget, moves)
    return RestartInPlace(failure, budget, moves)


def _grow_back(seen: Observed, waiting: WaitingGroups) -> RecoveryPlan:
    status, table = seen.status, seen.table
    if table is None:
        return FallBackToFull("NotPlaceable", f"the rank table of attempt {status.attempt} is gone")
    result = _place(seen, table, {q.node for q in status.quarantined_nodes}, status.attempt + 1)
    return decide_grow_back(
        result,
        waiting=waiting.groups,
        group_size=pods_per_group(len(table.pods), seen.job.spec.replica_groups),
        present={pod_index_of(p) for p in seen.members},
        carry_on=waiting.carry_on,
        old_nodes={p.pod_index: p.node for p in table.pods},
    )
