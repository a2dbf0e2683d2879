"""The one decision: check the request, then repair the previous placement or place afresh."""

from __future__ import annotations

from railyard.logic.placement.fresh import plan_fresh
from railyard.logic.placement.sticky import plan_sticky
from railyard.logic.placement.types import GangRequest, Placement, PlacementInput, Unplaceable
from railyard.logic.topology import Topology


def plan_placement(inp: PlacementInput) -> Placement | Unplaceable:
    """Place the gang (or repair ``inp.previous``) on ``inp.topology``. Deterministic for the
    same input.

    The topology must be built with this job's tolerations and ``ignore_job=req.job`` so that
    the job's own pods do not make its kept nodes look busy (:func:`build_placement_input` does).
    """
    topo, req, previous, cost_inputs = inp.topology, inp.request, inp.previous, inp.cost_inputs
    problems = req.problems()
    if problems:
        return Unplaceable("shape", "; ".join(problems))
    need_gpus = req.gpus_needed
    cand = [
        not why and free >= need_gpus
        for why, free in zip(topo.excluded, topo.free_gpus, strict=True)
    ]
    notes: list[str] = []
    if req.required_level is not None and req.required_level not in topo.levels:
        try:
            topo.level_index(req.required_level)
        except ValueError as exc:
            if req.mode == "Required":
                return Unplaceable("topology", str(exc))
            notes.append(f"ignored (Preferred): {exc}")
    refusal = _nvlink_refusal(topo, req)
    if refusal is not None:
        return refusal
    if previous is not None and len(previous.nodes) == req.nodes:
        return plan_sticky(topo, req, previous, cand, cost_inputs)
    if previous is not None:
        notes.append(
            f"previous placement has {len(previous.nodes)} pods, the gang {req.nodes}: placed afresh"
        )
    return plan_fresh(topo, req, cand, cost_inputs, notes)


def _nvlink_refusal(topo: Topology, req: GangRequest) -> Unplaceable | None:
    """A TP group spanning pods needs the NVLink-domain level on the cluster and one domain
    that can hold it; else the reason, naming the field and the fix."""
    k = req.tp_pods
    if k == 1 or req.nvlink_level is None:
        return None
    what = (
        f"parallelism.tensor {req.tp} spans {k} nodes of procsPerNode {req.procs_per_node} and needs them "
        f"inside one NVLink domain (node label {req.nvlink_level}, topology.nvlinkLevel)"
    )
    if topo.nvlink_key != req.nvlink_level:
        return Unplaceable(
            "topology",
            f"{what}, but no candidate node carries that label; set tensor to a divisor of procsPerNode, "
            "or label each NVLink domain's nodes (NVIDIA GPU feature discovery sets nvidia.com/gpu.clique on "
            "GB200/GB300 NVL trays; name another key in topology.nvlinkLevel)",
        )
    nv = topo.nvlink_level
    largest = max(len(x) for x in topo.leaf_nodes) if topo.leaf_nodes else 0
    if largest < k:
        biggest = max(range(len(topo.leaf_nodes)), key=lambda d: (len(topo.leaf_nodes[d]), -d))
        return Unplaceable(
            "topology",
            f"{what}, but the largest NVLink domain ({topo.domain_names[nv][biggest]}) has {largest} nodes; "
            f"set tensor to at most {largest * req.procs_per_node} (a multiple or a divisor of procsPerNode)",
            short=k - largest,
        )
    return None
