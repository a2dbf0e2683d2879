"""In-place restart: which pods stay, which move, what each launcher is told. Pure decisions.

A recoverable failure restarts the gang *in place* by default: pods on healthy nodes stay (the
same pod object on the same node, with its memory tier) and their launchers restart the worker
processes for the new attempt; only the pods that cannot stay are replaced, each by a pod with
the same index on a spare (sticky placement). A full restart (every pod deleted and created
again, as before) is the fallback, and the Event says which fallback and why
(:data:`FALLBACKS`).

The launchers learn of the new attempt through the control channel (railyard.protocol.control);
:func:`decide_control_answer` is what the operator answers each of them, and
:func:`apply_launcher_reports` turns what they report (their workers' exit codes, while the pod
itself keeps running) into the pod evidence the failure rules of railyard.logic.failures read.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from railyard.api.corev1 import node_is_ready
from railyard.api.trainingjob import TrainingJobStatus
from railyard.logic.conditions import format_micro_time
from railyard.logic.gang import planned_node_of, pod_index_of, pod_name_of
from railyard.logic.placement import Placement, Unplaceable
from railyard.protocol.control import Action, LauncherReport, LauncherState
from railyard.protocol.mesh import group_of_pod_index, pods_per_group
from railyard.protocol.ranktable import RankTable

Obj = Mapping[str, Any]
Mode = Literal["InPlace", "Full"]

#: Why a restart was not done in place: reason -> what it means (docs/operator.md).
FALLBACKS: Mapping[str, str] = {
    "InPlaceDisabled": "spec.restartPolicy.inPlace is false",
    "SpecChanged": "the spec changed since the gang was built; a full restart applies it",
    "NoControlChannel": "a pod that would stay has not spoken the restart protocol in this attempt (an image without "
                        "railyard-train's launcher, or no route to the operator)",
    "NothingToKeep": "no pod can stay where it is",
    "NotPlaceable": "the pods that must move cannot be re-placed sticky",
    "RestartNotAnswered": "a kept pod's launcher did not restart its workers in time",
}

#: ``RestartPlan.reason`` (and ``lastRestart.reason``) of an in-place restart that replaces
#: whole replica groups and leaves the other groups' workers running (faultTolerance ReplicaGroups).
GROUP_REPAIR = "ReplicaGroupReplaced"



def _node(pod: Obj) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


def _terminated(pod: Obj) -> bool:
    """The pod's trainer container has exited (restartPolicy Never: its process cannot come back)."""
    if str((pod.get("status") or {}).get("phase") or "") in ("Succeeded", "Failed"):
        return True
    return any(
        ((cs.get("state") or {}).get("terminated")) for cs in (pod.get("status") or {}).get("containerStatuses") or ()
    )


# --------------------------------------------------------------------------- launcher reports as evidence


#: Reason of the container state synthesised from a launcher's report (its workers exited, the
#: launcher and the pod still run).
WORKERS_EXITED = "WorkersExited"


def apply_launcher_reports(
    pods: Sequence[Obj],
    reports: Mapping[int, tuple[LauncherReport, float]],
    *,
    attempt: int,
    carried: Mapping[int, int] | None = None,
) -> list[dict[str, Any]]:
    """The pods as the failure rules should see them: a pod whose launcher reported that the
    workers of ``attempt`` failed looks as if its container had exited with that code (at the
    time the report arrived, with the workers' last words as its termination message), although
    the launcher keeps the pod running to restart in place.
    Reports of other attempts, of other pods (a replaced pod's name) and pods that did exit are
    left alone. ``reports``: pod index -> (latest report, when it arrived). ``carried``: pod
    index -> the attempt a pod that carries on after a replica-group repair still runs from
    (its workers' failure in that attempt counts too)."""
    out: list[dict[str, Any]] = []
    for p in pods:
        got = reports.get(pod_index_of(p))
        if got is None or _terminated(p):
            out.append(dict(p))
            continue
        report, at = got
        current = report.attempt == attempt or (
            carried is not None and carried.get(pod_index_of(p), attempt) <= report.attempt < attempt
        )
        if not current or report.pod != pod_name_of(p) or report.state is not LauncherState.FAILED or report.code == 0:
            out.append(dict(p))
            continue
        view = copy.deepcopy(dict(p))
        status = view.setdefault("status", {})
        status["phase"] = "Failed"
        started = ""
        for cs in status.get("containerStatuses") or ():
            started = ((cs.get("state") or {}).get("running") or {}).get("startedAt") or started
        status["containerStatuses"] = [
            {
                "name": "trainer",
                "state": {
                    "terminated": {
                        "exitCode": report.code,
                        "reason": WORKERS_EXITED,
                        "startedAt": started,
                        "finishedAt": format_micro_time(at),
                        "message": report.message
                        or f"workers of attempt {attempt} exited "
                           f"({', '.join(f'rank {r}: {c}' for r, c in report.workers)}); the launcher waits to "
                           "restart them",
                    }
                },
            }
        ]
        out.append(view)
    return out


def decide_capable(
    members: Sequence[Obj],
    reports: Mapping[int, tuple[LauncherReport, float]],
    *,
    attempt: int,
    restarting_from: int | None = None,
    carried: Mapping[int, int] | None = None,
) -> frozenset[int]:
    """Pod indices whose launcher speaks the control protocol (an in-place restart keeps only
    such pods: nothing else could tell them to restart). Its latest report is this very pod's
    (not a replaced pod's of that index) and of ``attempt``; or of ``restarting_from`` (the
    attempt an in-place restart of ``attempt`` still under way came from): a kept launcher told
    to wait or to restart that has not reported the new attempt yet still listens (a second
    failure during the restart, issue 46: the replacement's node went down, must not turn the
    next restart into a full one); or, for a pod that carries on after a replica-group repair
    (``carried``: pod index -> the attempt it runs from), of an attempt since then."""
    out = set()
    for p in members:
        i = pod_index_of(p)
        got = reports.get(i)
        if got is None or got[0].pod != pod_name_of(p):
            continue
        said = got[0].attempt
        if said == attempt or (restarting_from is not None and said == restarting_from) or (
            carried is not None and i in carried and carried[i] <= said < attempt
        ):
            out.add(i)
    return frozenset(out)


def members_since(status: TrainingJobStatus) -> int | None:
    """The ``since`` of :func:`railyard.logic.gang.gang_members` for the status's attempt: the
    attempt of the last full creation while that attempt was started in place, else None."""
    lr = status.last_restart
    if lr is not None and lr.mode == "InPlace" and lr.attempt == status.attempt:
        return status.pods_since_attempt
    return None


# --------------------------------------------------------------------------- restart mode


@dataclass(frozen=True, slots=True)
class RestartPlan:
    """How to restart the gang: in place (``replace`` moves, the rest stays) or full."""

    mode: Mode
    #: A :data:`FALLBACKS` key when the mode is Full.
    reason: str = ""
    message: str = ""
    #: Pod indices whose pods are replaced (in place), and why each.
    replace: tuple[int, ...] = ()
    why: Mapping[int, str] = field(default_factory=dict)
    #: Pod indices that stay.
    keep: tuple[int, ...] = ()
    #: Of ``replace``: the pods that move only to leave a straggler node behind (they stay when
    #: the placement finds no room for them).
    optional: tuple[int, ...] = ()
    #: faultTolerance ReplicaGroups (reason :data:`GROUP_REPAIR`): pods per replica group.
    group_size: int = 0
    #: Of ``keep``: the pods of the groups the failure did not touch. They *carry on*: their
    #: launchers are never told to restart (their workers keep training through torchft); only
    #: the lost groups restart (their pods that must move replaced, the others in place).
    carry_on: tuple[int, ...] = ()
    #: A Full plan's detail (NotPlaceable: the placement's reason), without the reason's prefix.
    detail: str = ""
    #: Flagged straggler nodes whose pods stay all the same (node -> why they stay).
    stragglers_kept: Mapping[str, str] = field(default_factory=dict)


def _full(reason: str, detail: str = "") -> RestartPlan:
    text = FALLBACKS[reason] + (f": {detail}" if detail else "")
    return RestartPlan("Full", reason, f"full restart ({reason}): {text}", detail=detail)


def decide_restart_mode(
    *,
    enabled: bool,
    spec_changed: bool,
    members: Sequence[Obj],
    expected: int,
    nodes: Mapping[str, Obj],
    move_off: Mapping[str, str],
    capable: frozenset[int],
    leave: Mapping[str, str] | None = None,
) -> RestartPlan:
    """In place or full, and which pods must move.

    A pod must move when it is gone or being deleted, its container has exited (restartPolicy
    Never), its node is NotReady or gone, or its node is in ``move_off`` (node -> why: the nodes
    the failure blames and quarantined ones). A pod on a node of ``leave`` (straggler nodes)
    moves too, if the placement has room (``optional``). Every pod that may stay must have a
    launcher that spoke the control protocol in this attempt (``capable``: pod indices), else
    nothing could tell it to restart."""
    leave = leave or {}
    if not enabled:
        return _full("InPlaceDisabled")
    if spec_changed:
        return _full("SpecChanged")
    by_index = {pod_index_of(p): p for p in members}
    move: list[int] = []
    why: dict[int, str] = {}
    keep: list[int] = []
    optional: list[int] = []
    for i in range(expected):
        p = by_index.get(i)
        if p is None:
            move.append(i)
            why[i] = "pod gone"
            continue
        node = str((p.get("spec") or {}).get("nodeName") or "")
        if (p.get("metadata") or {}).get("deletionTimestamp"):
            reason = "pod being deleted"
        elif not node:
            # a replacement not yet bound: blamed where the placement pinned it (issue 46)
            planned = planned_node_of(p)
            reason = f"node {planned} {move_off[planned]}" if planned in move_off else "pod not bound"
        elif node in move_off:
            reason = f"node {node} {move_off[node]}"
        elif node not in nodes or not node_is_ready(nodes.get(node)):
            reason = f"node {node} {'gone' if node not in nodes else 'NotReady'}"
        elif _terminated(p):
            reason = "its container exited"
        elif node in leave:
            optional.append(i)
            move.append(i)
            why[i] = f"node {node} {leave[node]}"
            continue
        else:
            keep.append(i)
            continue
        move.append(i)
        why[i] = reason
    stayed: dict[str, str] = {}
    if not keep and optional:
        # a straggler's pod moves only when there is room, and moving it must never turn an
        # in-place restart into a full one: with nothing else left to keep, the stragglers stay
        keep, optional = optional, []
        move = [i for i in move if i not in keep]
        why = {i: w for i, w in why.items() if i not in keep}
        stayed = {_node(by_index[i]): "no other pod could stay" for i in keep}
    if not keep:
        return _full("NothingToKeep")
    deaf = [i for i in keep + optional if i not in capable]
    if deaf:
        return _full("NoControlChannel", f"pod indices {_short(deaf)}")
    return RestartPlan("InPlace", replace=tuple(move), why=why, keep=tuple(keep), optional=tuple(optional),
                       message=describe_in_place(tuple(move), why, len(keep)), stragglers_kept=stayed)


def failed_pod_indices(pods: Sequence[Obj]) -> set[int]:
    """Pod indices of the gang members that failed (as the failure rules see them: a pod whose
    launcher reported its workers' failure counts, :func:`apply_launcher_reports`)."""
    return {
        pod_index_of(p)
        for p in pods
        if _terminated(p) and str((p.get("status") or {}).get("phase") or "") != "Succeeded"
    }


def decide_group_repair(plan: RestartPlan, *, expected: int, replicas: int, min_replicas: int,
                        failed: set[int] | frozenset[int] = frozenset()) -> RestartPlan:
    """faultTolerance ReplicaGroups: an in-place ``plan`` (from :func:`decide_restart_mode`)
    becomes the repair of the groups the failure touched (a pod of theirs must move, or is in
    ``failed``: its workers failed). Those groups restart: their pods that must move are
    replaced, their other pods restart in place. Every pod of the other groups carries on
    untouched (torchft took the lost groups out of the quorum; their workers never stopped).
    Straggler moves in carried-on groups are dropped (moving one pod would break a healthy
    group). When fewer than ``min_replicas`` groups would carry on, no step can commit without
    the lost ones anyway: the ordinary in-place restart of the whole gang (``plan`` as it is).
    A Full plan stays Full."""
    if replicas <= 1 or plan.mode != "InPlace" or expected % replicas:
        return plan
    size = pods_per_group(expected, replicas)
    optional = set(plan.optional)
    lost = ({group_of_pod_index(i, size) for i in plan.replace if i not in optional}
            | {group_of_pod_index(i, size) for i in failed if 0 <= i < expected})
    if not lost or replicas - len(lost) < min_replicas:
        return plan
    replace = tuple(i for i in plan.replace if group_of_pod_index(i, size) in lost)
    keep = tuple(i for i in range(expected) if i not in set(replace))
    carry_on = tuple(i for i in keep if group_of_pod_index(i, size) not in lost)
    why = {i: w for i, w in plan.why.items() if i in set(replace)}
    message = (describe_group_repair(sorted(lost), replicas - len(lost), replicas) + "; "
               + describe_moves(replace, why, len(keep) - len(carry_on)))
    return RestartPlan(
        "InPlace",
        reason=GROUP_REPAIR,
        message=message,
        replace=replace,
        why=why,
        keep=keep,
        optional=tuple(i for i in plan.optional if i in set(replace)),
        group_size=size,
        carry_on=carry_on,
    )


@dataclass(frozen=True, slots=True)
class InPlaceMoves:
    """Where an in-place restart puts the new attempt: its placement, the pod indices replaced
    (and why, from which node) and kept; :attr:`message` is built from them."""

    placement: Placement
    replace: frozenset[int]
    keep: tuple[int, ...]
    #: Pod index -> why it is replaced.
    why: Mapping[int, str] = field(default_factory=dict)
    #: Pod index -> the node it ran on in the running attempt.
    old_nodes: Mapping[int, str] = field(default_factory=dict)
    #: Straggler nodes the restart leaves behind (node -> why).
    left_behind: Mapping[str, str] = field(default_factory=dict)
    #: Flagged straggler nodes whose pods stay all the same (node -> why they stay).
    stragglers_kept: Mapping[str, str] = field(default_factory=dict)
    #: Of ``keep``: the pods whose workers carry on, not restarted (a replica-group repair).
    carry_on: tuple[int, ...] = ()
    #: Pods per replica group (a replica-group repair; 0 otherwise).
    group_size: int = 0

    @property
    def restarting_groups(self) -> tuple[int, ...]:
        """A replica-group repair: the groups that restart (every group without a carried-on pod)."""
        if not self.carry_on:
            return ()
        carry = set(self.carry_on)
        pods = range(len(self.placement.nodes))
        return tuple(sorted({group_of_pod_index(i, self.group_size) for i in pods if i not in carry}))

    @property
    def message(self) -> str:
        moves = {i: (self.old_nodes.get(i, ""), self.placement.nodes[i]) for i in sorted(self.replace)}
        replaced = sorted(self.replace)
        kept = len(self.keep) - len(self.carry_on)
        if self.carry_on:
            groups = len({group_of_pod_index(i, self.group_size) for i in range(len(self.placement.nodes))})
            restarting = self.restarting_groups
            return (describe_group_repair(restarting, groups - len(restarting), groups) + "; "
                    + describe_moves(replaced, self.why, kept, moves))
        text = "restart in place: " + describe_moves(replaced, self.why, kept, moves)
        if self.left_behind:
            text += f"; left stragglers behind: {', '.join(f'{n} ({w})' for n, w in sorted(self.left_behind.items()))}"
        if self.stragglers_kept:
            text += f"; stragglers kept: {', '.join(f'{n} ({w})' for n, w in sorted(self.stragglers_kept.items()))}"
        return text


def plan_in_place_moves(
    plan: RestartPlan,
    prev: RankTable,
    stragglers: Mapping[str, str],
    failed: set[str],
    place: Callable[[set[str]], Placement | Unplaceable],
) -> InPlaceMoves | RestartPlan:
    """The moves of an in-place ``plan`` from the running attempt's table ``prev``: place the
    new attempt sticky (``place(nodes to avoid)``, avoiding ``failed`` and the straggler nodes
    the optional moves leave); with no room to leave the stragglers behind they stay and only
    what must move moves. A pod the placement moves anyway is replaced too. A Full plan when the
    pods that must move cannot be placed (``detail``: the placement's reason) or no pod can stay."""
    old_nodes = {p.pod_index: p.node for p in prev.pods}
    leave = {old_nodes.get(i, "") for i in plan.optional}
    result = place(failed | leave)
    replace = set(plan.replace)
    left_behind = {n: w for n, w in stragglers.items() if n in leave}
    stayed = dict(plan.stragglers_kept)
    if isinstance(result, Unplaceable) and leave:
        stayed.update(dict.fromkeys(left_behind, "no room to leave it"))
        left_behind = {}
        replace -= set(plan.optional)
        result = place(failed)
    if isinstance(result, Unplaceable):
        return _full("NotPlaceable", result.message)
    why = dict(plan.why)
    for i in result.moved:
        if i not in replace:
            replace.add(i)
            why[i] = f"node {old_nodes.get(i, '')} no longer usable by placement"
    keep = tuple(i for i in range(len(result.nodes)) if i not in replace)
    if not keep:
        return _full("NothingToKeep")
    # a group repair: a group the placement moves a pod of restarts too (no longer carries on)
    size = plan.group_size
    moved_groups = {group_of_pod_index(j, size) for j in replace} if size else set()
    carry_on = tuple(i for i in plan.carry_on if i in keep and group_of_pod_index(i, size) not in moved_groups)
    return InPlaceMoves(result, frozenset(replace), keep, why=why, old_nodes=old_nodes,
                        left_behind={} if carry_on else left_behind, stragglers_kept={} if carry_on else stayed,
                        carry_on=carry_on, group_size=size if carry_on else 0)


def describe_group_repair(restarting: Sequence[int], carrying_on: int, groups: int) -> str:
    """The head of a replica-group repair's line: which groups restart, how many carry on."""
    return f"replica groups {', '.join(map(str, restarting))} restart, {carrying_on}/{groups} groups carry on untouched"


def describe_moves(replace: Sequence[int], why: Mapping[int, str], kept: int,
                   moves: Mapping[int, tuple[str, str]] | None = None) -> str:
    """What stayed, what moved where, and why (the tail of every in-place restart's line)."""
    parts = []
    for i in replace[:8]:
        where = ""
        if moves and i in moves:
            where = f" {moves[i][0] or '?'} -> {moves[i][1]}"
        parts.append(f"pod {i}{where} ({why.get(i, 'moved')})")
    more = f" and {len(replace) - 8} more" if len(replace) > 8 else ""
    moved = f"; replaced {', '.join(parts)}{more}" if parts else "; no pod moved"
    return f"{kept} pods kept on their nodes{moved}"


def describe_in_place(replace: Sequence[int], why: Mapping[int, str], kept: int,
                      moves: Mapping[int, tuple[str, str]] | None = None) -> str:
    """One line for the Event: what stayed, what moved where, and why."""
    return "restart in place: " + describe_moves(replace, why, kept, moves)


def _short(xs: Sequence[int]) -> str:
    head = ", ".join(str(x) for x in xs[:8])
    return f"[{head}{', ...' if len(xs) > 8 else ''}]"


def decide_nodes_to_leave(stragglers: Sequence[tuple[str, int, float]], keep_nodes: Sequence[str]) -> dict[str, str]:
    """Straggler nodes (node, rank, score) in the current window that a restart moves off:
    only nodes the gang keeps a pod on (a node already being replaced needs nothing); whether a
    spare is there for them is for the placement to say (the caller retries without them)."""
    kept = set(keep_nodes)
    out: dict[str, str] = {}
    for node, rank, score in stragglers:
        if node in kept and node not in out:
            out[node] = f"flagged as a straggler (rank {rank}, score {score:.2f})"
    return out


def decide_unacknowledged(
    keep: Sequence[int],
    reports: Mapping[int, tuple[LauncherReport, float]],
    names: Mapping[int, str],
    *,
    attempt: int,
) -> list[int]:
    """Kept pod indices whose launcher has not yet reported running (or done with) ``attempt``."""
    out = []
    for i in keep:
        got = reports.get(i)
        if got is None:
            out.append(i)
            continue
        r = got[0]
        if r.attempt < attempt or r.pod != names.get(i):
            out.append(i)
    return out


# --------------------------------------------------------------------------- the operator's answer


@dataclass(frozen=True, slots=True)
class GangControl:
    """What the operator has published for one job's launchers."""

    attempt: int
    #: Pod index -> the name of the pod that is that index's member in ``attempt``.
    members: Mapping[int, str]
    #: Restart orders may go out (the new attempt's status is written, its pods created).
    open: bool = True
    #: The job is over (Succeeded, Failed, deleted): every launcher stops.
    finished: str = ""
    #: Why the launchers of a failed attempt are told to wait (backoff, placement).
    waiting: str = ""
    #: Pod indices whose launchers carry on with their older attempt (a replica-group repair):
    #: never told to restart.
    carry_on: frozenset[int] = frozenset()


def decide_control_answer(gang: GangControl, report: LauncherReport) -> tuple[Action, str]:
    """What one launcher is told (the order's payload is the caller's: rank table, restore)."""
    if gang.finished:
        return Action.STOP, gang.finished
    member = gang.members.get(report.pod_index)
    if member is not None and member != report.pod:
        return (
            Action.STOP,
            f"pod index {report.pod_index} of attempt {gang.attempt} is {member}; {report.pod} was replaced",
        )
    if member is None:
        return Action.STOP, f"pod index {report.pod_index} is not part of attempt {gang.attempt}"
    if report.attempt < gang.attempt:
        if report.pod_index in gang.carry_on:
            return (
                Action.CONTINUE,
                f"replica group carries on with attempt {report.attempt} (attempt {gang.attempt} replaced another "
                "group)",
            )
        if gang.open:
            return Action.RESTART, f"restart in place for attempt {gang.attempt}"
        return Action.CONTINUE, gang.waiting or f"attempt {gang.attempt} is being prepared"
    if report.attempt > gang.attempt:
        # the launcher is ahead of what this operator published (it restarted and has not yet
        # caught up): never move a launcher backwards; it keeps its attempt
        return Action.CONTINUE, f"the operator is at attempt {gang.attempt}"
    return Action.CONTINUE, gang.waiting
