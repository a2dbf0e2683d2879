"""The TrainingJob adapter: the one place a placement decision's input is made from a job and the
cluster's Node and Pod objects (node selector, tolerations, topology preset, the previous
attempt's nodes and spares).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from railyard.api.corev1 import Toleration, labels_match
from railyard.api.trainingjob import TrainingJob
from railyard.logic.cost import CostInputs
from railyard.logic.placement.types import GangRequest, PlacementInput, PreviousPlacement
from railyard.logic.tas import TopologyAssignment, compute_allowed_nodes, decide_outside_assignment
from railyard.logic.topology import (
    REFUSED,
    TopologyCache,
    build_topology,
    resolve_level_keys,
    resolve_nvlink_key,
)


def build_gang_request(
    job: TrainingJob, *, nodes: Sequence[Mapping[str, Any]] = (), attempt: int = 0
) -> GangRequest:
    """The GangRequest for a TrainingJob. ``nodes`` resolves a preset with several label
    families (topograph) to the one the cluster carries. A job whose tensor-parallel group
    spans nodes (tensor > procsPerNode) gets the NVLink-domain level below its leaf."""
    spec = job.spec
    topo = spec.topology
    levels = resolve_level_keys(topo.preset, topo.levels, nodes)
    nvlink = resolve_nvlink_key(topo.preset, topo.nvlink_level, nodes)
    if spec.parallelism.tensor > spec.procs_per_node:
        levels = (*(k for k in levels if k != nvlink), nvlink)  # the deepest level
    return GangRequest(
        job=job.metadata.name or "",
        nodes=spec.nodes,
        procs_per_node=spec.procs_per_node,
        pp=spec.parallelism.pipeline,
        dp=spec.data_parallel,
        tp=spec.parallelism.tensor,
        hot_spares=spec.gang.hot_spares,
        levels=levels,
        mode=topo.mode,
        required_level=topo.required_level
        if topo.mode == "Required" or topo.required_level
        else None,
        tolerations=job_tolerations(job),
        gpus_per_pod=spec.gpus_per_pod,
        attempt=attempt,
        replicas=spec.replica_groups,
        nvlink_level=nvlink,
    )


def job_tolerations(job: TrainingJob) -> tuple[Toleration, ...]:
    """The tolerations of the job's pods (``spec.tolerations``), as placement matches them."""
    return tuple(Toleration.from_dict(t.model_dump(exclude_none=True)) for t in job.spec.tolerations)


def matches_node_selector(node: Mapping[str, Any], selector: Mapping[str, str]) -> bool:
    """Whether the Node's labels carry every ``key: value`` of ``spec.nodeSelector`` (the rule is
    :func:`railyard.api.corev1.labels_match`, the local scheduler's too)."""
    return labels_match(selector, (node.get("metadata") or {}).get("labels") or {})


def build_placement_input(
    job: TrainingJob,
    *,
    nodes: Sequence[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]] = (),
    attempt: int = 0,
    previous_nodes: Sequence[str] | None = None,
    previous_spares: Sequence[str] = (),
    failed: Iterable[str] = (),
    cost_inputs: CostInputs | None = None,
    cache: TopologyCache | None = None,
    refused: Iterable[str] = (),
    admitted: TopologyAssignment | None = None,
) -> PlacementInput:
    """The one place a placement decision's input is made, from the job and the cluster.

    ``nodes``: Node dicts (kopf's index, ``kubectl get nodes -o yaml``, a generated cluster);
    only those matching ``spec.nodeSelector`` are candidates, and readiness, cordons, taints
    against ``spec.tolerations`` and our quarantine marks exclude nodes. ``pods``: pods bound
    to nodes (their GPUs are in use; this job's own are not counted). ``previous_nodes``: the
    last attempt's nodes by pod index, ``previous_spares`` its hot spares, ``failed`` the nodes
    to move off (the job's quarantined nodes): sticky re-placement. ``cache``: what the last
    call derived from the same Node objects (:class:`~railyard.logic.topology.TopologyCache`),
    for callers that decide again and again on one cluster; the answer is the same without.
    ``refused``: nodes the scheduler refused this job's pods for lack of GPUs
    (:func:`railyard.logic.pending.decide_refused_nodes`): GPUs held by pods not in ``pods``
    (another namespace's, which a namespaced operator does not see) are left out this way.
    ``admitted``: Kueue's topology assignment of the job's admission: only its nodes, as many per
    domain as Kueue counted there (:func:`railyard.logic.tas.decide_outside_assignment`)."""
    selector = job.spec.node_selector
    selected = [n for n in nodes if matches_node_selector(n, selector)] if selector else list(nodes)
    req = build_gang_request(job, nodes=selected, attempt=attempt)
    topo = build_topology(
        selected, pods, levels=req.levels, tolerations=req.tolerations, ignore_job=req.job, cache=cache,
        nvlink_level=req.nvlink_level,
    )
    refused = frozenset(refused)
    if refused:
        topo = dataclasses.replace(topo, excluded=tuple(
            why or (REFUSED if name in refused else "") for name, why in zip(topo.names, topo.excluded, strict=True)))
    failed = frozenset(failed)
    if admitted is not None:
        keep = set(previous_nodes or ()) | set(previous_spares)
        usable = [not why and free >= req.gpus_needed for why, free in zip(topo.excluded, topo.free_gpus, strict=True)]
        topo = dataclasses.replace(topo, excluded=decide_outside_assignment(
            compute_allowed_nodes(admitted, selected), names=topo.names, excluded=topo.excluded, usable=usable,
            keep=keep - failed))
    previous = None
    if previous_nodes:
        previous = PreviousPlacement(tuple(previous_nodes), tuple(previous_spares), failed)
    return PlacementInput(topo, req, previous, cost_inputs)
