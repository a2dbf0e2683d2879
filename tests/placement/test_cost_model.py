"""Cost model: bytes per step per level, from ring hops over the layout."""

from __future__ import annotations

import random

import pytest

from railyard.logic.cost import CostInputs, compute_cost
from railyard.logic.layout import MeshShape, build_rank_table
from railyard.logic.placement import Placement, PlacementInput, plan_placement

from .placement_builders import make_job, make_nodes

X = 1e9  # parameter bytes


def _table(nodes: list[str], *, procs: int, tp: int, pp: int, gpus: int = 8):
    n = len(nodes)
    shape = MeshShape(n, procs, pp, n * procs // (tp * pp), tp)
    return build_rank_table(
        job="j",
        attempt=0,
        shape=shape,
        pod_nodes=nodes,
        pod_rail_offset=[0] * n,
        pod_gpus=[gpus] * n,
    )


def test_dp_ring_between_two_spines_crosses_the_spine_twice_per_rail():
    topo = make_nodes(2, 1, 1).topology()
    table = _table(["node-s0-l0-n0", "node-s1-l0-n0"], procs=8, tp=8, pp=1)
    cost = compute_cost(table, topo, CostInputs(param_bytes=X, activation_bytes=0))
    # 8 DP groups (one per rail) of 2 ranks, ring of 2 hops, each 2*(1/2)*X/8
    per_group = 2 * (2 * 0.5 * X / 8)
    assert cost.bytes_at("railyard.dev/spine") == pytest.approx(8 * per_group)
    assert cost.bytes_at("railyard.dev/leaf") == pytest.approx(8 * per_group)
    assert cost.bytes_at("host") == 0
    assert cost.cross_rail_bytes == 0


def test_same_leaf_traffic_stays_off_the_upper_levels():
    topo = make_nodes(1, 1, 2).topology()
    table = _table(["node-s0-l0-n0", "node-s0-l0-n1"], procs=8, tp=8, pp=1)
    cost = compute_cost(table, topo, CostInputs(param_bytes=X, activation_bytes=0))
    assert cost.bytes_at("network") == pytest.approx(8 * 2 * (2 * 0.5 * X / 8))
    assert cost.bytes_at("railyard.dev/leaf") == 0
    assert cost.bytes_at("railyard.dev/spine") == 0
    # time = busiest (node, rail) sender over the NIC bandwidth
    net = next(c for c in cost.levels if c.level == "network")
    assert net.seconds == pytest.approx((2 * 0.5 * X / 8) / (400e9 / 8))


def test_tp_traffic_is_intra_host_and_pp_traffic_is_point_to_point():
    topo = make_nodes(2, 1, 1).topology()
    table = _table(["node-s0-l0-n0", "node-s1-l0-n0"], procs=8, tp=8, pp=2)
    cost = compute_cost(
        table,
        topo,
        CostInputs(param_bytes=0, activation_bytes=1e6, microbatches=4, tp_bytes_per_step=1e6),
    )
    assert cost.bytes_at("host") == pytest.approx(2 * 8 * 2 * (7 / 8) * 1e6)
    assert cost.bytes_at("railyard.dev/spine") == pytest.approx(8 * 2 * 4 * 1e6 / 8)


def test_rail_mismatch_counts_as_cross_rail():
    topo = make_nodes(1, 1, 2).topology()
    shape = MeshShape(2, 4, 1, 8, 1)  # pure DP, 4 ranks per node: DP group spans 4 slots
    table = build_rank_table(
        job="j",
        attempt=0,
        shape=shape,
        pod_nodes=["node-s0-l0-n0", "node-s0-l0-n1"],
        pod_rail_offset=[0, 0],
        pod_gpus=[8, 8],
    )
    cost = compute_cost(table, topo, CostInputs(param_bytes=X, activation_bytes=0))
    assert cost.cross_rail_bytes > 0


def test_our_layout_crosses_spines_less_than_the_same_nodes_in_random_order():
    nodes = make_nodes(4, 2, 4)
    req = make_job(nodes=32, procs=8).with_parallelism(tp=8, pp=4).obj()
    topo = nodes.topology(req)
    pl = plan_placement(PlacementInput(topo, req))
    assert isinstance(pl, Placement)
    shuffled = list(pl.nodes)
    random.Random(1).shuffle(shuffled)
    other = _table(shuffled, procs=8, tp=8, pp=4)
    ours = pl.cost.bytes_at("railyard.dev/spine")
    theirs = compute_cost(other, topo).bytes_at("railyard.dev/spine")
    assert ours < theirs / 4
