"""Pure gang decisions: what state is a gang in, and which of its pods to delete how.

:func:`assess_gang` reads the pods of one attempt (and the nodes under them) and says what the
gang is doing: absent, partly created (an operator died mid-creation), gated, starting, running,
finished, or failed, with the failure explained by :mod:`railyard.logic.failures`. Where the
next gang goes is :func:`railyard.logic.placement.plan_placement`'s decision.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from railyard.api.corev1 import node_is_ready, node_ready_changed_at
from railyard.api.trainingjob import TrainingJob
from railyard.logic.conditions import parse_time
from railyard.logic.failures import (
    Failure,
    build_failure,
    classify_pod,
    decide_root_failure,
)
from railyard.logic.manifests import ATTEMPT_LABEL, GANG_GATE, NODE_ANNOTATION, POD_INDEX_LABEL
from railyard.logic.placement import job_tolerations, matches_node_selector
from railyard.logic.topology import NOT_READY, node_exclusion


def pod_name_of(pod: Mapping[str, Any]) -> str:
    """A pod's name ("" when the object has none yet)."""
    return str((pod.get("metadata") or {}).get("name") or "")


def pod_index_of(pod: Mapping[str, Any]) -> int:
    try:
        return int(((pod.get("metadata") or {}).get("labels") or {}).get(POD_INDEX_LABEL, -1))
    except (TypeError, ValueError):
        return -1


def attempt_of(pod: Mapping[str, Any]) -> int:
    try:
        return int(((pod.get("metadata") or {}).get("labels") or {}).get(ATTEMPT_LABEL, -1))
    except (TypeError, ValueError):
        return -1


def gang_members(
    pods: Sequence[Mapping[str, Any]], *, attempt: int, since: int | None = None
) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """The pods serving ``attempt``, and the stale rest.

    A pod's ``railyard.dev/attempt`` label is the attempt it was created for. An in-place
    restart keeps the pods on healthy nodes and creates replacements (labelled with the new
    attempt) only for the others, so the gang of ``attempt`` is, per pod index, the newest pod
    created in ``[since, attempt]``; ``since`` is the attempt of the last full (re)creation
    (``status.podsSinceAttempt``; None: ``attempt``, every pod was created for it). Every other
    pod (an older attempt, a pod superseded by a replacement of its index) is stale."""
    low = attempt if since is None else min(since, attempt)
    newest: dict[int, Mapping[str, Any]] = {}
    stale: list[Mapping[str, Any]] = []
    for p in pods:
        a = attempt_of(p)
        if not low <= a <= attempt:
            stale.append(p)
            continue
        i = pod_index_of(p)
        other = newest.get(i)
        if other is None:
            newest[i] = p
        elif attempt_of(other) < a:
            stale.append(other)
            newest[i] = p
        else:
            stale.append(p)
    return [newest[i] for i in sorted(newest)], stale


def is_gated(pod: Mapping[str, Any]) -> bool:
    return any(g.get("name") == GANG_GATE for g in (pod.get("spec") or {}).get("schedulingGates") or ())


def _phase(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


@dataclass(frozen=True, slots=True)
class GangAssessment:
    #: Absent, Partial (some pods missing, none started), Gated, Starting, Running, Succeeded,
    #: Settling (only echo failures so far, the cause may still come), Failed
    state: str
    expected: int
    present: int
    missing: tuple[int, ...]
    gated: tuple[str, ...]
    running: int
    succeeded: int
    failure: Failure | None = None
    failures: tuple[Failure, ...] = ()
    #: Pods of other attempts still in the API (to delete before the next gang starts).
    stale: tuple[str, ...] = ()
    #: Seconds until a NotReady node's grace runs out (0: nothing pending).
    recheck_after: float = 0.0


def assess_gang(
    pods: Sequence[Mapping[str, Any]],
    nodes: Mapping[str, Mapping[str, Any]],
    *,
    attempt: int,
    expected: int,
    now: float,
    not_ready_grace_s: float = 0.0,
    echo_settle_s: float = 0.0,
    since: int | None = None,
    waiting: frozenset[int] = frozenset(),
) -> GangAssessment:
    """What the gang of ``attempt`` is doing (its pods: :func:`gang_members` with ``since``).
    ``waiting``: pod indices of replica groups that wait for a node (logic/shrink.py): absent
    or idle by plan, neither a failure nor needed for the gang to run.

    An attempt started in place (``since`` given: pods of earlier attempts are kept and wait
    for its replacements) also fails on a replacement its planned node can never run
    (:func:`classify_stranded`), within the same NotReady grace as a bound pod: the restart
    decided before that node was known to be down (issue 46) is repaired by moving it, not
    waited on for ``spec.gang.scheduleTimeoutSeconds``. A gang created whole waits for the
    timeout, as :func:`find_stale_placement` says (nothing runs yet; the node may come back).

    ``echo_settle_s``: when the only failures are echoes (:data:`ECHO_KINDS`: exit 70, "a peer
    or a collective failed") while other pods of the gang still run, wait up to this long after
    the first echo exited for the cause to show (the crashed rank's own exit code arrives a
    moment later): state ``Settling`` with ``recheck_after``. 0 decides at once.
    """
    current, old = gang_members(pods, attempt=attempt, since=since)
    stale = tuple(sorted(str((p.get("metadata") or {}).get("name", "")) for p in old))
    if waiting:
        current = [p for p in current if pod_index_of(p) not in waiting]
    by_index = {pod_index_of(p): p for p in current}
    missing = tuple(i for i in range(expected) if i not in by_index and i not in waiting)
    wanted = expected - sum(1 for i in waiting if 0 <= i < expected)
    gated = tuple(sorted(pod_name_of(p) for p in current if is_gated(p)))
    running = sum(
        1 for p in current if _phase(p) == "Running" and not (p.get("metadata") or {}).get("deletionTimestamp")
    )
    succeeded = sum(1 for p in current if _phase(p) == "Succeeded")
    base = {"expected": expected, "present": len(current), "missing": missing, "gated": gated,
            "running": running, "succeeded": succeeded, "stale": stale}

    failures: list[Failure] = []
    recheck = 0.0
    deferred_node = False
    for p in current:
        f = classify_pod(p, nodes)
        if f is None and since is not None:
            # kept pods wait on this attempt's replacements: one its node can never run is lost
            f = classify_stranded(p, nodes)
        if f is None:
            continue
        if f.kind == "NodeNotReady" and not_ready_grace_s > 0:
            down = _not_ready_since(nodes.get(f.nodes[0]) if f.nodes else None)
            if down is not None and now - down < not_ready_grace_s:
                left = not_ready_grace_s - (now - down)
                recheck = left if recheck == 0 else min(recheck, left)
                deferred_node = True
                continue
        failures.append(f)
    started = len(current) > 0 and len(gated) < len(current)
    if missing and started:
        # the whole gang existed once (gates are lifted only then): a pod vanished
        failures += [_lost(i) for i in missing]
    root = decide_root_failure(failures)
    if root is not None and root.kind in ECHO_KINDS and deferred_node:
        # a NotReady node in its grace is the likelier cause of the echo: wait for the verdict
        return GangAssessment("Settling", failure=None, failures=tuple(failures), recheck_after=recheck, **base)  # type: ignore[arg-type]
    if root is not None and echo_settle_s > 0 and root.kind in ECHO_KINDS:
        left = _echo_settle_left(current, now, echo_settle_s)
        if left > 0:
            recheck = left if recheck == 0 else min(recheck, left)
            return GangAssessment("Settling", failure=None, failures=tuple(failures), recheck_after=recheck, **base)  # type: ignore[arg-type]
    if root is not None:
        return GangAssessment("Failed", failure=root, failures=tuple(failures), recheck_after=recheck, **base)  # type: ignore[arg-type]
    if not current:
        state = "Absent"
    elif missing:
        state = "Partial"
    elif gated:
        state = "Gated"
    elif succeeded == wanted:
        state = "Succeeded"
    elif running + succeeded == wanted and running > 0:
        state = "Running"
    else:
        state = "Starting"
    return GangAssessment(state, recheck_after=recheck, **base)  # type: ignore[arg-type]


#: Taints kube-controller-manager's node lifecycle controller puts on a node whose kubelet it
#: stopped hearing from (it sets Ready Unknown too, and may do so a moment later): the scheduler
#: binds no new pod there.
NODE_DOWN_TAINTS = frozenset({"node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready"})


def planned_node_of(pod: Mapping[str, Any]) -> str:
    """The node the placement chose for ``pod`` (its ``NODE_ANNOTATION``; "" when none)."""
    return str((((pod.get("metadata") or {}).get("annotations")) or {}).get(NODE_ANNOTATION) or "")


def classify_stranded(pod: Mapping[str, Any], nodes: Mapping[str, Mapping[str, Any]]) -> Failure | None:
    """The failure of a pod not yet bound whose planned node can never run it: the node is gone
    (NodeGone), NotReady or Unknown, or tainted as unreachable or not ready (NodeNotReady),
    blaming that node as a bound pod's failure there would. The placement pins the pod to that
    node and the scheduler binds nothing there, so the pod would stay Pending for ever. None:
    bound (:func:`railyard.logic.failures.classify_pod` judges it), gated, being deleted, or
    its planned node can still take it."""
    meta = pod.get("metadata") or {}
    planned = planned_node_of(pod)
    if not planned or (pod.get("spec") or {}).get("nodeName") or meta.get("deletionTimestamp") or is_gated(pod):
        return None
    name = str(meta.get("name", ""))
    node = nodes.get(planned)
    if node is None:
        return build_failure("NodeGone", planned, node=planned, pod=name)
    taints = {str(t.get("key") or "") for t in (node.get("spec") or {}).get("taints") or ()}
    if not node_is_ready(node) or taints & NODE_DOWN_TAINTS:
        return build_failure("NodeNotReady", planned, node=planned, pod=name)
    return None


#: Why a planned node can no longer take its pod, besides topology's exclusion reasons.
NODE_GONE = "NodeGone"
NOT_SELECTED = "NotSelected"


@dataclass(frozen=True, slots=True)
class StalePlacement:
    """A pod the scheduler has not bound whose planned node can no longer take it."""

    pod: str
    node: str
    #: topology's exclusion reason (Unschedulable, Quarantined, Tainted), NodeGone or NotSelected.
    why: str


def find_stale_placement(
    job: TrainingJob, pods: Sequence[Mapping[str, Any]], nodes: Mapping[str, Mapping[str, Any]]
) -> list[StalePlacement]:
    """The gang's unbound pods whose planned node (the placement's ``NODE_ANNOTATION``) changed
    since the placement so that the scheduler will never bind them there: deleted, no longer
    matching ``spec.nodeSelector``, cordoned, quarantined, or tainted against ``spec.tolerations``.
    Such a gang would wait out ``spec.gang.scheduleTimeoutSeconds`` for nothing. A node that is
    NotReady is not listed: it may come back, and the schedule timeout covers it. ``nodes``: the
    operator's view by name (it may trail the API server; it only ever makes this list late)."""
    tolerations = job_tolerations(job)
    selector = job.spec.node_selector
    out = []
    for p in pods:
        meta = p.get("metadata") or {}
        planned = planned_node_of(p)
        if not planned or (p.get("spec") or {}).get("nodeName") or meta.get("deletionTimestamp"):
            continue
        node = nodes.get(planned)
        if node is None:
            why = NODE_GONE
        elif selector and not matches_node_selector(node, selector):
            why = NOT_SELECTED
        else:
            why = node_exclusion(node, tolerations)
            if why == NOT_READY:
                continue
        if why:
            out.append(StalePlacement(str(meta.get("name", "")), planned, why))
    return out


#: Evidence kinds that are usually the echo of another pod's failure, not its cause.
ECHO_KINDS = frozenset({"InfrastructureExitCode"})
#: How long the operator waits for the cause behind echoes: the trainer's launcher waits 5 s
#: (RAILYARD_FAIL_GRACE_S) for its other workers before it exits with the most specific code.
DEFAULT_ECHO_SETTLE_S = 8.0


def first_exit_time(pods: Sequence[Mapping[str, Any]]) -> float | None:
    """When the first container of these pods exited non-zero (None: none did, or unknown)."""
    first: float | None = None
    for p in pods:
        for cs in (p.get("status") or {}).get("containerStatuses") or ():
            t = (cs.get("state") or {}).get("terminated") or {}
            if t and int(t.get("exitCode", 0) or 0) != 0:
                at = parse_time(str(t.get("finishedAt") or ""))
                if at is not None:
                    first = at if first is None else min(first, at)
    return first


def _echo_settle_left(current: Sequence[Mapping[str, Any]], now: float, settle_s: float) -> float:
    """Seconds left to wait for the cause behind echo failures: 0 when no pod of the gang is
    still running, or when an echo's exit time is unknown (decide at once, as before)."""
    still_running = False
    first_exit: float | None = None
    for p in current:
        terms = [
            ((cs.get("state") or {}).get("terminated") or {})
            for cs in (p.get("status") or {}).get("containerStatuses") or ()
        ]
        terms = [t for t in terms if t]
        if _phase(p) == "Running" and not terms:
            still_running = True
            continue
        for t in terms:
            if int(t.get("exitCode", 0) or 0) == 0:
                continue
            at = parse_time(str(t.get("finishedAt") or ""))
            if at is None:
                return 0.0
            first_exit = at if first_exit is None else min(first_exit, at)
    if not still_running or first_exit is None:
        return 0.0
    return max(0.0, first_exit + settle_s - now)


def _lost(index: int) -> Failure:
    return build_failure("PodLost", f"pod index {index}")


def _not_ready_since(node: Mapping[str, Any] | None) -> float | None:
    return parse_time(node_ready_changed_at(node))


def plan_pod_deletions(
    pods: Sequence[Mapping[str, Any]],
    nodes: Mapping[str, Mapping[str, Any]],
    *,
    now: float,
    asked: Mapping[str, float],
    stuck_terminating_s: float = 30.0,
    reask_after_s: float = 2.0,
) -> tuple[list[str], list[str]]:
    """Which pods to delete with grace and which to force-delete (grace 0).

    Force: pods on a NotReady or vanished node (no kubelet will confirm their end), pods already
    terminated, unbound pods, and pods still Terminating ``stuck_terminating_s`` after their
    deletion. ``asked`` (pod -> when we last asked) keeps a cycle from re-sending a DELETE for
    a pod that is terminating normally."""
    normal: list[str] = []
    force: list[str] = []
    for p in pods:
        meta = p.get("metadata") or {}
        name = str(meta.get("name"))
        node = str((p.get("spec") or {}).get("nodeName") or "")
        dead = bool(node) and not node_is_ready(nodes.get(node))
        last = asked.get(name)
        recently = last is not None and now - last < reask_after_s
        if meta.get("deletionTimestamp"):
            since = parse_time(meta.get("deletionTimestamp")) or now
            if (dead or now - since >= stuck_terminating_s) and not recently:
                force.append(name)
            continue
        if recently:
            continue
        if dead or (p.get("status") or {}).get("phase") in ("Succeeded", "Failed") or not node:
            force.append(name)
        else:
            normal.append(name)
    return normal, force
