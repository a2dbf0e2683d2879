"""Pure gang decisions: what state is a gang in, and where should the next one go.

:func:`assess_gang` reads the pods of one attempt (and the nodes under them) and says what the
gang is doing: absent, partly created (an operator died mid-creation), gated, starting, running,
finished, or failed, with the failure explained by :mod:`railyard.logic.failures`.

:func:`plan_placement` turns the job and the cluster into a :class:`GangPlacement` (nodes by pod
index and the rank table) or an :class:`Unplaceable` with the reason. It calls the rail-aware
placement of :mod:`railyard.logic.placement` and keeps only what the operator needs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from railyard.api.corev1 import node_is_ready, node_ready_changed_at
from railyard.api.trainingjob import TrainingJob
from railyard.logic import placement as _placement
from railyard.logic.conditions import parse_time
from railyard.logic.failures import (
    Failure,
    build_failure,
    classify_pod,
    decide_root_failure,
)
from railyard.logic.manifests import ATTEMPT_LABEL, GANG_GATE, POD_INDEX_LABEL
from railyard.logic.placement import PreviousPlacement, build_gang_request
from railyard.logic.topology import build_topology
from railyard.protocol.ranktable import RankTable


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
) -> GangAssessment:
    """What the gang of ``attempt`` is doing.

    ``echo_settle_s``: when the only failures are echoes (:data:`ECHO_KINDS`: exit 70, "a peer
    or a collective failed") while other pods of the gang still run, wait up to this long after
    the first echo exited for the cause to show (the crashed rank's own exit code arrives a
    moment later): state ``Settling`` with ``recheck_after``. 0 decides at once.
    """
    current = [p for p in pods if attempt_of(p) == attempt]
    stale = tuple(sorted(str((p.get("metadata") or {}).get("name", "")) for p in pods if attempt_of(p) != attempt))
    by_index = {pod_index_of(p): p for p in current}
    missing = tuple(i for i in range(expected) if i not in by_index)
    gated = tuple(sorted(str(p["metadata"]["name"]) for p in current if is_gated(p)))
    running = sum(1 for p in current if _phase(p) == "Running" and not (p.get("metadata") or {}).get("deletionTimestamp"))
    succeeded = sum(1 for p in current if _phase(p) == "Succeeded")
    base = {"expected": expected, "present": len(current), "missing": missing, "gated": gated,
            "running": running, "succeeded": succeeded, "stale": stale}

    failures: list[Failure] = []
    recheck = 0.0
    deferred_node = False
    for p in current:
        f = classify_pod(p, nodes)
        if f is None:
            continue
        if f.kind == "NodeNotReady" and not_ready_grace_s > 0:
            since = _not_ready_since(nodes.get(f.nodes[0]) if f.nodes else None)
            if since is not None and now - since < not_ready_grace_s:
                left = not_ready_grace_s - (now - since)
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
    elif succeeded == expected:
        state = "Succeeded"
    elif running + succeeded == expected and running > 0:
        state = "Running"
    else:
        state = "Starting"
    return GangAssessment(state, recheck_after=recheck, **base)  # type: ignore[arg-type]


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
        terms = [((cs.get("state") or {}).get("terminated") or {}) for cs in (p.get("status") or {}).get("containerStatuses") or ()]
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


# placement ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GangPlacement:
    nodes: tuple[str, ...]
    rank_table: RankTable
    spares: tuple[str, ...] = ()
    domains: Mapping[str, int] = field(default_factory=dict)
    cross_bytes_per_step: Mapping[str, float] = field(default_factory=dict)
    rail_aligned: bool = False
    #: Pod indices whose node differs from the previous placement.
    moved: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Unplaceable:
    reason: str
    message: str
    #: The job's shape can never be placed (not a matter of waiting for capacity).
    permanent: bool = False


def plan_placement(
    job: TrainingJob,
    *,
    attempt: int,
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    previous: Sequence[str] | None = None,
    previous_spares: Sequence[str] = (),
    failed: Iterable[str] = (),
) -> GangPlacement | Unplaceable:
    """Where the gang of ``attempt`` goes, by the rail-aware placement of
    :mod:`railyard.logic.placement`. ``previous``: the last attempt's nodes by pod index; sticky
    re-placement keeps those still usable (with their ranks) and replaces ``failed`` ones,
    spares first. ``pods``: all pods bound to nodes (GPU accounting; this job's are ignored)."""
    spec = job.spec
    name = job.metadata.name or ""
    selected = [n for n in nodes if _matches(n, spec.node_selector)]
    req = build_gang_request(job, nodes=selected, attempt=attempt)
    topo = build_topology(selected, pods, levels=req.levels, tolerations=req.tolerations, ignore_job=name)
    prev = None
    if previous:
        prev = PreviousPlacement(tuple(previous), tuple(previous_spares), frozenset(failed))
    result = _placement.plan_placement(topo, req, previous=prev)
    if isinstance(result, _placement.Unplaceable):
        where = f" in {', '.join(result.domains[:5])}" if result.domains else ""
        excluded = ", ".join(f"{v} {k}" for k, v in sorted(result.excluded.items()))
        short = f"; {result.short} nodes short{where}" if result.short else ""
        more = f" (excluded: {excluded})" if excluded else ""
        reason = {"shape": "InvalidShape", "capacity": "NotEnoughNodes", "requiredLevel": "NoDomainFits", "topology": "TopologyMismatch"}.get(result.constraint, "Unplaceable")
        return Unplaceable(reason, f"{result.reason}{short}{more}", permanent=result.constraint == "shape")
    return GangPlacement(
        nodes=result.nodes,
        rank_table=result.rank_table,
        spares=result.spares,
        domains={k: len(v) for k, v in result.domains.items()},
        cross_bytes_per_step={c.level: c.bytes_per_step for c in result.cost.levels},
        rail_aligned=result.rail_aligned,
        moved=result.moved,
    )


def _matches(node: Mapping[str, Any], selector: Mapping[str, str]) -> bool:
    labels = (node.get("metadata") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())
