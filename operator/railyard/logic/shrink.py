"""Replica groups shrink and grow back (faultTolerance ReplicaGroups): shrink, wait, grow back,
finish. Pure; railyard.logic.recovery's ``decide_recovery`` composes these rules into its plans
(``ShrinkAndWait``, ``GrowBack``, ``KeepWaiting``), the status reads the counts from here.

A failure restarts only the replica groups it touched (:func:`railyard.logic.inplace.decide_group_repair`).
When their pods that must move cannot be placed (no spare, no usable node) but at least
``minReplicas`` groups carry on, the job does not fall to a full restart: it *shrinks*
(:func:`decide_shrink`). The lost groups' pods that must move are deleted, their other pods stay
with their launchers told to wait, and the carried-on groups train on (torchft already dropped
the lost groups from the quorum). ``status.lastRestart`` holds the state :data:`WAITING` and the
waiting groups; the condition Degraded says how many groups train (:func:`describe_groups`).

While groups wait, every cycle (a node event wakes the job: a node Ready or uncordoned again, a
new node) asks the placement again and :func:`decide_grow_back` says whether the waiting groups
can come back: then they are placed (sticky: on their old nodes if those are usable again) and
started as an ordinary group repair of a new attempt, and they join the quorum and heal from a
live peer. All waiting groups come back together (one placement of the gang).

The end of a run with groups that restarted late: a group whose every pod exited 0 trained the
last step (the trainer exits 0 only after it, and every step it counts was committed by a quorum
of at least ``minReplicas`` groups), so the run is complete. A group that is still running then
is either finishing the same step (it exits within moments) or behind: it cannot heal from peers
that are gone (with ``minReplicas`` 1 it would form a quorum alone and train the rest of the run
again from its own tier). :func:`decide_groups_finished` gives the others a short settle time,
then the job Succeeds (docs/fault-tolerance.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from railyard.api.trainingjob import TrainingJobStatus
from railyard.logic.conditions import parse_time
from railyard.logic.gang import pod_index_of
from railyard.logic.inplace import GROUP_REPAIR, RestartPlan
from railyard.logic.placement import Placement, Unplaceable
from railyard.protocol.mesh import group_of_pod_index, pods_of_group, pods_per_group

Obj = Mapping[str, Any]

#: ``lastRestart.state`` while replica groups wait for a node and the others train.
WAITING = "Waiting"
#: How long the other groups may take to finish once one group finished the last step.
GROUPS_FINISH_SETTLE_S = 30.0
#: How often waiting groups ask the placement again without a node event (node events wake the
#: job at once; this only bounds a missed one).
GROW_BACK_RECHECK_S = 10.0


def _groups(xs: Sequence[int]) -> str:
    word = "group" if len(xs) == 1 else "groups"
    return f"{word} {', '.join(map(str, xs))}"


def describe_groups(training: int, replicas: int, *, waiting: Sequence[int] = (), restarting: int = 0) -> str:
    """The Degraded message (and the Running condition's while groups wait), written once."""
    text = f"{training}/{replicas} replica groups training"
    if waiting:
        text += f"; {_groups(sorted(waiting))} {'waits' if len(waiting) == 1 else 'wait'} for a node"
    if restarting:
        text += f" while {restarting} restart"
    return text


# --------------------------------------------------------------------------- shrink


@dataclass(frozen=True, slots=True)
class Shrink:
    """The job goes on with fewer replica groups."""

    #: The groups that wait for a node.
    waiting: tuple[int, ...]
    #: Pod indices to delete now (their node is unusable or their container exited).
    delete: tuple[int, ...]
    #: Pod indices of the groups that train on (their launchers are never told to restart).
    carry_on: tuple[int, ...]
    #: Pods per group.
    group_size: int
    #: Replica groups of the job.
    replicas: int
    #: Why the waiting groups found no place (the placement's reason).
    why: str

    @property
    def training(self) -> int:
        """Replica groups that train on."""
        return len({group_of_pod_index(i, self.group_size) for i in self.carry_on})

    @property
    def message(self) -> str:
        return f"{describe_groups(self.training, self.replicas, waiting=self.waiting)} ({self.why})"


def decide_shrink(plan: RestartPlan, why: str, *, replicas: int, min_replicas: int) -> Shrink | None:
    """A replica-group repair ``plan`` whose pods that must move found no place (``why``: the
    placement's reason) becomes a shrink when at least ``min_replicas`` groups carry on; None
    (the full restart, as before) otherwise, or when ``plan`` is no group repair."""
    size = plan.group_size
    if plan.mode != "InPlace" or plan.reason != GROUP_REPAIR or size <= 0 or replicas <= 1:
        return None
    carry = set(plan.carry_on)
    training = len({group_of_pod_index(i, size) for i in carry})
    if training < min_replicas or training >= replicas:
        return None
    waiting = tuple(sorted({group_of_pod_index(i, size) for i in range(replicas * size) if i not in carry}))
    delete = tuple(i for i in plan.replace if i not in set(plan.optional))
    return Shrink(waiting=waiting, delete=delete, carry_on=plan.carry_on, group_size=size, replicas=replicas, why=why)


def waiting_groups(status: TrainingJobStatus) -> tuple[int, ...]:
    """The replica groups that wait for a node in the status's attempt (none: none wait)."""
    lr = status.last_restart
    if lr is None or lr.state != WAITING or lr.attempt != status.attempt:
        return ()
    return tuple(lr.waiting_groups)


def waiting_pods(status: TrainingJobStatus, replicas: int) -> frozenset[int]:
    """Pod indices of the waiting groups: absent or idle by plan, not a failure of the gang."""
    groups = waiting_groups(status)
    if not groups or replicas <= 1:
        return frozenset()
    lr = status.last_restart
    assert lr is not None
    pods = (
        status.placement.node_count
        if status.placement is not None and status.placement.node_count
        else lr.kept + len(lr.replaced)
    )
    return frozenset(i for g in groups for i in pods_of_group(g, pods_per_group(pods, replicas)))


# --------------------------------------------------------------------------- grow back


@dataclass(frozen=True, slots=True)
class GrowBack:
    """Place the waiting groups and start them (a group repair of a new attempt)."""

    placement: Placement
    #: Pod indices to create (the waiting groups' pods that are gone or that the placement moved).
    replace: frozenset[int]
    #: Pod indices that stay (the waiting groups' kept pods restart in place).
    keep: tuple[int, ...]
    carry_on: tuple[int, ...]
    #: The groups that come back.
    waiting: tuple[int, ...] = ()
    #: Pods per group.
    group_size: int = 1
    #: Pod index -> its node in the running attempt.
    old_nodes: Mapping[int, str] = field(default_factory=dict)

    @property
    def reason(self) -> str:
        """``lastRestart.reason``: the groups come back as a group repair."""
        return GROUP_REPAIR

    @property
    def message(self) -> str:
        nodes = self.placement.nodes
        where = ", ".join(f"pod {i} {self.old_nodes.get(i) or '?'} -> {nodes[i]}" for i in sorted(self.replace)[:8])
        training = len({group_of_pod_index(i, self.group_size) for i in self.carry_on})
        replicas = len({group_of_pod_index(i, self.group_size) for i in range(len(self.placement.nodes))})
        return (f"a node is usable again: {_groups(sorted(self.waiting))} placed ({where}); "
                f"{training}/{replicas} groups carry on untouched, the placed ones join the quorum and heal "
                "from a live peer")


@dataclass(frozen=True, slots=True)
class KeepWaiting:
    """The waiting groups still find no place: nothing to do until a node event or the recheck."""

    message: str


def decide_grow_back(
    result: Placement | Unplaceable,
    *,
    waiting: Sequence[int],
    group_size: int,
    present: frozenset[int] | set[int],
    carry_on: Sequence[int],
    old_nodes: Mapping[int, str] | None = None,
) -> GrowBack | KeepWaiting:
    """Whether the waiting groups can come back, given the placement of the whole gang with the
    training groups where they are (``result``; ``present``: pod indices that have a pod).
    They come back when the gang fits without moving a pod of a training group (those never
    stop); a pod of a waiting group goes where the placement says (its old node if usable)."""
    if isinstance(result, Unplaceable):
        return KeepWaiting(f"no node for {_groups(sorted(waiting))} yet: {result.message}")
    size = max(group_size, 1)
    mine = {i for g in waiting for i in pods_of_group(g, size)}
    carry = set(carry_on)
    moved_training = sorted(i for i in result.moved if i in carry)
    if moved_training:
        return KeepWaiting(f"placing {_groups(sorted(waiting))} would move pods {moved_training} of training groups; "
                           "waiting for another node")
    replace = frozenset(i for i in mine if i not in present or i in set(result.moved))
    keep = tuple(i for i in range(len(result.nodes)) if i not in replace)
    return GrowBack(placement=result, replace=replace, keep=keep, carry_on=tuple(carry_on), waiting=tuple(waiting),
                    group_size=size, old_nodes=dict(old_nodes or {}))


# --------------------------------------------------------------------------- how many train


def count_training_groups(status: TrainingJobStatus, replicas: int) -> int:
    """Replica groups taking steps now, as the status says: all of them while Running, less the
    waiting ones; during a group repair the carried-on ones; none otherwise (starting, a whole
    restart, finished). A job without replica groups is one world: 1 while Running."""
    if replicas <= 1:
        return 1 if status.phase == "Running" else 0
    lr = status.last_restart
    current = lr is not None and lr.attempt == status.attempt
    if current and lr is not None and lr.state == WAITING:
        return max(replicas - len(lr.waiting_groups), 0)
    if status.phase == "Running":
        return replicas
    if current and lr is not None and lr.reason == GROUP_REPAIR and status.phase in ("Restarting", "Starting"):
        pods = (
            status.placement.node_count
            if status.placement is not None and status.placement.node_count
            else lr.kept + len(lr.replaced)
        )
        return len({group_of_pod_index(i, pods_per_group(pods, replicas)) for i in lr.carried_on})
    return 0


# --------------------------------------------------------------------------- the end


@dataclass(frozen=True, slots=True)
class GroupsFinished:
    """Some replica group finished the last step."""

    finished: tuple[int, ...]
    #: Groups with a pod not finished (waiting groups not counted).
    unfinished: tuple[int, ...]
    #: Seconds the unfinished ones still have (0: succeed now).
    left_s: float
    replicas: int

    @property
    def message(self) -> str:
        done = f"replica {_groups(self.finished)} finished the last step ({len(self.finished)}/{self.replicas})"
        if not self.unfinished:
            return done
        return (f"{done}; {_groups(self.unfinished)} had not finished {GROUPS_FINISH_SETTLE_S:g}s later "
                "(too late to heal from a peer) and are stopped")


def _finished_at(pod: Obj) -> float | None:
    times = [parse_time(str(((cs.get("state") or {}).get("terminated") or {}).get("finishedAt") or ""))
             for cs in (pod.get("status") or {}).get("containerStatuses") or ()]
    known = [t for t in times if t is not None]
    return max(known) if known else None


def decide_groups_finished(
    members: Sequence[Obj],
    *,
    replicas: int,
    expected: int,
    now: float,
    waiting: frozenset[int] = frozenset(),
    settle_s: float = GROUPS_FINISH_SETTLE_S,
) -> GroupsFinished | None:
    """None unless some replica group has every pod Succeeded (exit 0). Then the run is
    complete: the others get ``settle_s`` from that group's end (its last pod's finish time;
    unknown: none left) to finish too, then the job Succeeds without them. Pods of ``waiting``
    (groups waiting for a node) are not waited for."""
    if replicas <= 1 or expected % replicas or not members:
        return None
    size = pods_per_group(expected, replicas)
    by_group: dict[int, list[Obj]] = {}
    for p in members:
        i = pod_index_of(p)
        if 0 <= i < expected and i not in waiting:
            by_group.setdefault(group_of_pod_index(i, size), []).append(p)

    def succeeded(p: Obj) -> bool:
        return str((p.get("status") or {}).get("phase") or "") == "Succeeded"

    finished = tuple(sorted(g for g, ps in by_group.items() if len(ps) == size and all(succeeded(p) for p in ps)))
    if not finished:
        return None
    unfinished = tuple(sorted(g for g in by_group if g not in finished))
    # a group ended when its last pod did; the first group to end starts the settle time
    ends = []
    for g in finished:
        times = [_finished_at(p) for p in by_group[g]]
        if all(t is not None for t in times):
            ends.append(max(t for t in times if t is not None))
    left = 0.0 if not ends or not unfinished else max(min(ends) + settle_s - now, 0.0)
    return GroupsFinished(finished=finished, unfinished=unfinished, left_s=left, replicas=replicas)
