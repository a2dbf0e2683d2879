"""A fresh placement: the whole gang and its hot spares at once, inside the required domain when
there is one, best fit at every level (via the tree planner), spares closest to the gang; and the
:class:`~railyard.logic.placement.types.Placement` built from chosen nodes (its domains, spreads,
replica peers and notes), which a sticky re-placement builds the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

from railyard.logic.cost import CostInputs
from railyard.logic.layout import compute_dp_group_spread
from railyard.logic.placement.tree import TreePlanner
from railyard.logic.placement.types import GangRequest, Placement, Unplaceable
from railyard.logic.topology import BUSY, Topology


def affinity(topo: Topology, used: list[set[int]], i: int) -> int:
    """How many levels, broadest first, node ``i`` shares a domain with the gang."""
    a = 0
    for lv in range(len(topo.levels)):
        if topo.domain_of[lv][i] in used[lv]:
            a = lv + 1
    return a


def _network_leaves(topo: Topology, nodes: Sequence[int]) -> list[int]:
    """The network leaf of each of ``nodes`` (:meth:`Topology.network_leaf_of`, the level looked
    up once for all of them: a gang's every pod asks it twice per decision)."""
    lv = topo.network_leaf_level
    if lv < 0:
        return [0] * len(nodes)
    leaf_of = topo.domain_of[lv]
    return [leaf_of[i] for i in nodes]


def _replica_peers(topo: Topology, nodes: Sequence[int]) -> list[int]:
    """Pod i's checkpoint replica goes to pod ``(i + k) % n`` for the smallest uniform shift ``k``
    that puts every pair in different leaves (a permutation: each pod holds one replica)."""
    n = len(nodes)
    if n < 2:
        return [-1] * n
    leaf = _network_leaves(topo, nodes)
    for k in range(1, n):
        if all(leaf[i] != leaf[(i + k) % n] for i in range(n)):
            return [(i + k) % n for i in range(n)]
        if k > 64:
            break
    return [(i + 1) % n for i in range(n)]


def excluded_counts(topo: Topology, need_gpus: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for i, why in enumerate(topo.excluded):
        if not why and topo.free_gpus[i] < need_gpus:
            why = BUSY
        if why:
            out[why] = out.get(why, 0) + 1
    return out


def finish_placement(
    topo: Topology,
    req: GangRequest,
    gang: list[int],
    spares: list[int],
    cost_inputs: CostInputs | None,
    notes: list[str],
    moved: tuple[int, ...] = (),
) -> Placement:
    shape = req.shape
    domains = {
        key: tuple(sorted({topo.domain_names[lv][topo.domain_of[lv][i]] for i in gang}))
        for lv, key in enumerate(topo.levels)
    }
    rails, spans, widest = compute_dp_group_spread(
        shape,
        pod_rail_offset=[topo.rail_offset[i] for i in gang],
        pod_gpus=[topo.gpus[i] for i in gang],
        pod_domain=_network_leaves(topo, gang),
    )
    spans = max(spans, 1)
    minimum = 1
    nlv = topo.network_leaf_level
    if nlv >= 0:
        # how many of a DP group's pods one leaf can hold: a DP group has one pod in each of
        # its units (TP groups of k pods, 1 when TP stays in a node), a leaf holds the whole
        # units of its deepest domains (its NVLink domains, or itself)
        k = shape.pods_per_tp_group
        per_leaf: dict[int, int] = {}
        for members in topo.leaf_nodes:
            leaf = topo.domain_of[nlv][members[0]]
            per_leaf[leaf] = per_leaf.get(leaf, 0) + len(members) // k
        minimum = max(1, -(-widest // max(max(per_leaf.values()), 1)))
    if rails > 1:
        notes.append(
            f"data-parallel groups span up to {rails} rails: procsPerNode/tensor = {shape.slots_per_node} "
            f"does not divide pipeline = {shape.pp}"
        )
    if spans > minimum:
        notes.append(
            f"a data-parallel group spans {spans} leaf domains (least possible on an empty cluster: {minimum})"
        )
    tp_domains: tuple[tuple[str, ...], ...] = ()
    nv = topo.nvlink_level
    if nv >= 0:
        names, dom_of, k = topo.domain_names[nv], topo.domain_of[nv], shape.pods_per_tp_group
        span = shape.procs_per_node if k > 1 else shape.tp
        tp_domains = tuple(
            tuple(sorted({names[dom_of[gang[shape.position(g * shape.tp + q * span)[0]]]] for q in range(k)}))
            for g in range(shape.pp * shape.dp)
        )
    return Placement(
        nodes=tuple(topo.names[i] for i in gang),
        spares=tuple(topo.names[i] for i in spares),
        replica_peers=tuple(_replica_peers(topo, gang)),
        domains=domains,
        rails_per_dp_group=rails,
        dp_leaf_spans=spans,
        dp_leaf_minimum=minimum,
        moved=moved,
        notes=tuple(notes),
        tp_domains=tp_domains,
        topology=topo,
        request=req,
        cost_inputs=cost_inputs,
    )


def plan_fresh(
    topo: Topology,
    req: GangRequest,
    cand: list[bool],
    cost_inputs: CostInputs | None,
    notes: list[str],
) -> Placement | Unplaceable:
    total = req.nodes + req.hot_spares
    available = sum(cand)
    what = f"{req.nodes} nodes + {req.hot_spares} hot spares with {req.gpus_needed} free GPUs each"
    if available < total:
        excl = excluded_counts(topo, req.gpus_needed)
        detail = ", ".join(f"{k}: {v}" for k, v in sorted(excl.items()))
        return Unplaceable(
            "capacity",
            f"needs {what}; {available} usable nodes ({total - available} short; excluded: {detail or 'none'})",
            short=total - available,
            excluded=excl,
        )
    if not topo.levels:
        order = sorted(
            (i for i in range(topo.size) if cand[i]), key=lambda i: (topo.free_gpus[i], i)
        )
        gang = sorted(order[: req.nodes])
        spares = order[req.nodes : total]
        return finish_placement(topo, req, gang, spares, cost_inputs, notes)

    planner = TreePlanner(topo, req, cand)
    tree = planner.tree
    k = planner.unit
    units = req.nodes // k
    if k > 1 and sum(tree.free[0]) < units:
        room = sum(tree.free[0])
        where = "NVLink domain" if topo.nvlink_key else "leaf"
        return Unplaceable(
            "capacity",
            f"needs {units} tensor-parallel groups of {k} nodes, each inside one {where}; the usable nodes hold "
            f"{room} ({units - room} groups short; a domain holds its usable nodes // {k} groups)",
            short=(units - room) * k,
            excluded=excluded_counts(topo, req.gpus_needed),
        )
    start_lv, doms = 0, list(range(len(topo.domain_names[0])))
    if req.required_level is not None and req.required_level in topo.levels:
        rl = topo.levels.index(req.required_level)
        fitting = [
            d for d in range(len(topo.domain_names[rl]))
            if tree.free[rl][d] >= units and tree.nfree[rl][d] >= total
        ]
        if fitting:
            best = min(
                fitting, key=lambda d: (planner.capb[rl][d] < planner.blocks, tree.nfree[rl][d], d)
            )
            start_lv, doms = rl, [best]
        elif req.mode == "Required":
            # nodes short per domain: for the gang plus spares, and (TP groups across nodes)
            # for the whole units its NVLink domains hold
            lack = [
                max(total - tree.nfree[rl][d], (units - tree.free[rl][d]) * k)
                for d in range(len(topo.domain_names[rl]))
            ]
            ranked = sorted(range(len(lack)), key=lambda d: (lack[d], -tree.nfree[rl][d], d))
            most = tree.nfree[rl][ranked[0]] if ranked else 0
            short = lack[ranked[0]] if ranked else total
            top = tuple(
                f"{topo.domain_names[rl][d]} ({tree.nfree[rl][d]} usable"
                + (f", {tree.free[rl][d]} TP groups of {k})" if k > 1 else ")")
                for d in ranked[:3]
            )
            unit_note = (
                f" and {units} tensor-parallel groups of {k} nodes, each inside one NVLink domain" if k > 1 else ""
            )
            return Unplaceable(
                "requiredLevel",
                f"topology.requiredLevel {req.required_level}: no single domain holds {what}{unit_note}; "
                f"the closest has {most} usable nodes ({short} short): {', '.join(top)}",
                short=short,
                domains=top,
            )
        else:
            notes.append(
                f"no single {req.required_level} domain holds the gang: spread over several (Preferred)"
            )
    gang, aligned = planner.gang(start_lv, doms)
    if not aligned:
        notes.append(
            "not enough room for whole data-parallel blocks in single leaves: blocks cut across leaves"
        )
    # spares: closest to the gang, best fit
    in_gang = set(gang)
    scope = {i for d in doms for lf in tree.leaves_under(start_lv, d) for i in tree.leaf_cands[lf]}
    used = [{topo.domain_of[lv][i] for i in gang} for lv in range(len(topo.levels))]
    rest = sorted(
        (i for i in scope if i not in in_gang),
        key=lambda i: (-affinity(topo, used, i), topo.free_gpus[i], i),
    )
    spares = rest[: req.hot_spares]
    return finish_placement(topo, req, gang, spares, cost_inputs, notes)
