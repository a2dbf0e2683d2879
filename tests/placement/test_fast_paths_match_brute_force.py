"""The shortcuts placement takes at scale give the answers of the plain definitions.

- Sticky re-placement picks, for every lost pod in order, the minimum over all free nodes of
  (not a spare, -domains shared with the failed node, free GPUs, tree order) (docs/placement.md,
  "Sticky re-placement"), without scanning the pool per pod.

The DP-group spread's walk over every rank is tests/placement/test_mesh_positions_in_bulk.py's
(every kind of shape, replica groups included).
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from railyard.logic.placement import (
    GangRequest,
    Placement,
    PlacementInput,
    PreviousPlacement,
    plan_placement,
)
from railyard.logic.topology import Topology

from .placement_builders import LEAF, SPINE, make_job, make_nodes


def _depth(topo: Topology, a: int, b: int) -> int:
    depth = 0
    for lv in range(len(topo.levels)):
        if topo.domain_of[lv][a] != topo.domain_of[lv][b]:
            break
        depth = lv + 1
    return depth


def _exhaustive(topo: Topology, req: GangRequest, prev: PreviousPlacement) -> list[str]:
    cand = [not why and f >= req.gpus_needed for why, f in zip(topo.excluded, topo.free_gpus, strict=True)]
    for name in prev.failed:
        cand[topo.index[name]] = False
    gang = [topo.index[n] if cand[topo.index[n]] and n not in prev.failed else -1 for n in prev.nodes]
    taken = {i for i in gang if i >= 0}
    if req.mode == "Required" and req.required_level in topo.levels:
        rl = topo.levels.index(req.required_level)
        kept = {topo.domain_of[rl][i] for i in taken}
        if len(kept) == 1:
            cand = [c and topo.domain_of[rl][i] in kept for i, c in enumerate(cand)]
    spares = {topo.index[s] for s in prev.spares if s not in prev.failed}
    pool = {i for i in range(topo.size) if cand[i] and i not in taken}
    for p, i in enumerate(gang):
        if i >= 0:
            continue
        old = topo.index[prev.nodes[p]]
        best = min(pool, key=lambda j: (j not in spares, -_depth(topo, old, j), topo.free_gpus[j], j))
        pool.discard(best)
        gang[p] = best
    return [topo.names[i] for i in gang]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_sticky_replacement_picks_what_an_exhaustive_scan_picks(data: st.DataObject) -> None:
    nodes = make_nodes(data.draw(st.integers(1, 3)), data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4)), gpus=4)
    names = nodes.names()
    for name in names:
        used = data.draw(st.sampled_from([0, 0, 1, 2, 4]))
        if used:
            nodes.busy(name, used)
    size = data.draw(st.integers(1, max(1, len(names) // 2)))
    job = make_job(nodes=size, procs=1).with_spares(data.draw(st.integers(0, 3))).gpus(data.draw(st.sampled_from([1, 2])))
    mode = data.draw(st.sampled_from(["none", "req-spine", "req-leaf"]))
    if mode != "none":
        job.required(SPINE if mode == "req-spine" else LEAF)
    req = job.obj()
    first = plan_placement(PlacementInput(nodes.topology(req), req))
    if not isinstance(first, Placement):
        return
    failed = frozenset(data.draw(st.sets(st.sampled_from(first.nodes + first.spares), min_size=1)))
    # other tenants may have taken some free nodes since
    for name in data.draw(st.sets(st.sampled_from(names), max_size=3)):
        nodes.busy(name, 4)
    topo = nodes.topology(req)
    prev = PreviousPlacement(first.nodes, first.spares, failed)
    again = plan_placement(PlacementInput(topo, req, prev))
    if isinstance(again, Placement):
        assert list(again.nodes) == _exhaustive(topo, req, prev)
