"""Pure gang decisions: what state is a gang in, and where should the next one go.

:func:`assess_gang` reads the pods of one attempt (and the nodes under them) and says what the
gang is doing: absent, partly created (an operator died mid-creation), gated, starting, running,
finished, or failed, with the failure explained by :mod:`railyard.logic.failures`.

:func:`plan_placement` turns the job and the cluster into a :class:`GangPlacement` (nodes by pod
index and the rank table) or an :class:`Unplaceable` with the reason. It uses the rail-aware
placement of :mod:`railyard.logic.placement` when that module provides ``place_gang``; until
then a simple stand-in (first fitting nodes in topology order, sticky on re-placement) keeps the
operator working.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from railyard.api.trainingjob import TrainingJobSpec
from railyard.logic.conditions import parse_time
from railyard.logic.failures import Failure, build_failure, classify_pod, decide_root_failure
from railyard.logic.manifests import ATTEMPT_LABEL, GANG_GATE, POD_INDEX_LABEL
from railyard.logic.topology import Toleration, build_topology, resolve_level_keys
from railyard.protocol.ranktable import PodEntry, RankEntry, RankTable


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
    #: Absent, Partial (some pods missing, none started), Gated, Starting, Running, Succeeded, Failed
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
) -> GangAssessment:
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
    for p in current:
        f = classify_pod(p, nodes)
        if f is None:
            continue
        if f.kind == "NodeNotReady" and not_ready_grace_s > 0:
            since = _not_ready_since(nodes.get(f.nodes[0]) if f.nodes else None)
            if since is not None and now - since < not_ready_grace_s:
                left = not_ready_grace_s - (now - since)
                recheck = left if recheck == 0 else min(recheck, left)
                continue
        failures.append(f)
    started = len(current) > 0 and len(gated) < len(current)
    if missing and started:
        # the whole gang existed once (gates are lifted only then): a pod vanished
        failures += [_lost(i) for i in missing]
    root = decide_root_failure(failures)
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


def _lost(index: int) -> Failure:
    return build_failure("PodLost", f"pod index {index}")


def _not_ready_since(node: Mapping[str, Any] | None) -> float | None:
    if node is None:
        return None
    for c in (node.get("status") or {}).get("conditions") or ():
        if c.get("type") == "Ready":
            return parse_time(c.get("lastTransitionTime"))
    return None


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


def build_rank_table(spec: TrainingJobSpec, job: str, attempt: int, nodes: Sequence[str]) -> RankTable:
    """A pod-major rank table (``tp`` innermost, rail = local rank) for the stand-in placement."""
    tp, pp, ppn = spec.parallelism.tensor, spec.parallelism.pipeline, spec.procs_per_node
    dp = spec.data_parallel or max(spec.world_size // (tp * pp), 1)
    ranks = []
    for rank in range(spec.world_size):
        pod, local = divmod(rank, ppn)
        ranks.append(RankEntry(rank=rank, node=nodes[pod], pod_index=pod, local_rank=local, rail=local,
                               pp=rank // (tp * dp), dp=(rank // tp) % dp, tp=rank % tp))
    n = len(nodes)
    pods = tuple(PodEntry(pod_index=i, node=nodes[i], replica_peer=(i + 1) % n if n > 1 else -1) for i in range(n))
    return RankTable(job=job, attempt=attempt, pp=pp, dp=dp, tp=tp, procs_per_node=ppn, pods=pods, ranks=tuple(ranks))


def _placement_module() -> Any:
    try:
        mod = importlib.import_module("railyard.logic.placement")
    except ImportError:
        return None
    return mod if hasattr(mod, "place_gang") else None


def plan_placement(
    spec: TrainingJobSpec,
    *,
    job: str,
    attempt: int,
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    previous: Sequence[str] | None = None,
) -> GangPlacement | Unplaceable:
    """Where the gang of ``attempt`` goes. ``previous``: the last attempt's nodes by pod index
    (sticky re-placement keeps those still usable, with their ranks)."""
    mod = _placement_module()
    if mod is not None:
        result: GangPlacement | Unplaceable = mod.place_gang(spec, job=job, attempt=attempt, nodes=nodes, pods=pods, previous=previous)
        return result
    return _stand_in_placement(spec, job=job, attempt=attempt, nodes=nodes, pods=pods, previous=previous)


def _stand_in_placement(
    spec: TrainingJobSpec,
    *,
    job: str,
    attempt: int,
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    previous: Sequence[str] | None,
) -> GangPlacement | Unplaceable:
    selected = [n for n in nodes if all(((n.get("metadata") or {}).get("labels") or {}).get(k) == v for k, v in spec.node_selector.items())]
    levels = resolve_level_keys(spec.topology.preset, spec.topology.levels, selected)
    tolerations = [Toleration.from_dict(t.model_dump(exclude_none=True)) for t in spec.tolerations]
    topo = build_topology(selected, pods, levels=levels, tolerations=tolerations, ignore_job=job)
    need = spec.gpus
    usable = [i for i in range(topo.size) if not topo.excluded[i] and topo.free_gpus[i] >= need]
    if len(usable) < spec.nodes:
        reasons: dict[str, int] = {}
        for i in range(topo.size):
            r = topo.excluded[i] or ("NotEnoughFreeGPUs" if topo.free_gpus[i] < need else "")
            if r:
                reasons[r] = reasons.get(r, 0) + 1
        why = ", ".join(f"{v} {k}" for k, v in sorted(reasons.items())) or "no nodes"
        return Unplaceable(
            "NotEnoughNodes",
            f"need {spec.nodes} nodes with {need} free GPUs, {len(usable)} usable of {len(nodes)} ({why})",
        )
    usable_names = [topo.names[i] for i in usable]
    usable_set = set(usable_names)
    chosen: list[str | None] = [None] * spec.nodes
    taken: set[str] = set()
    moved: list[int] = []
    if previous:
        for i, name in enumerate(previous[: spec.nodes]):
            if name in usable_set and name not in taken:
                chosen[i] = name
                taken.add(name)
    leaf_of = {topo.names[i]: topo.leaf_of(i) for i in range(topo.size)}
    for i in range(spec.nodes):
        if chosen[i] is not None:
            continue
        old = previous[i] if previous and i < len(previous) else None
        # a spare in the failed node's leaf keeps the gang's locality; else the first free node
        near = [n for n in usable_names if n not in taken and old is not None and leaf_of.get(n) == leaf_of.get(old, -1)]
        pick = near[0] if near else next(n for n in usable_names if n not in taken)
        chosen[i] = pick
        taken.add(pick)
        if previous is not None:
            moved.append(i)
    names = tuple(n for n in chosen if n is not None)
    domains = {lv: len({topo.domain_of[k][topo.index[n]] for n in names}) for k, lv in enumerate(topo.levels)}
    return GangPlacement(
        nodes=names,
        rank_table=build_rank_table(spec, job, attempt, names),
        domains=domains,
        moved=tuple(moved),
    )
