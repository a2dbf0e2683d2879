"""Layout rules: TP inside a node, DP groups on one rail and in the fewest leaves, determinism."""

from __future__ import annotations

import math
import random

import pytest

from railyard.logic.layout import MeshShape
from railyard.logic.placement import Placement, PlacementInput, plan_placement

from .placement_builders import assert_valid, dp_group_leaves, make_job, make_nodes

# (spines, leaves, per_leaf, gpus), (nodes, procs, tp, pp)
SHAPES = [
    pytest.param((2, 2, 4, 8), (8, 8, 8, 1), id="tp8-one-tp-group-per-node"),
    pytest.param((2, 2, 4, 8), (8, 8, 8, 2), id="tp8-pp2"),
    pytest.param((2, 2, 4, 8), (8, 8, 4, 2), id="tp4-two-slots-pp2"),
    pytest.param((2, 2, 4, 8), (8, 8, 2, 4), id="tp2-four-slots-pp4"),
    pytest.param((2, 4, 4, 8), (16, 8, 1, 8), id="tp1-eight-slots-pp8"),
    pytest.param((2, 2, 4, 4), (6, 4, 2, 2), id="uneven-dp3"),
    pytest.param((1, 3, 5, 8), (12, 8, 8, 3), id="odd-leaf-size"),
]


@pytest.mark.parametrize(("topo_shape", "job_shape"), SHAPES)
def test_tp_groups_stay_inside_a_node_and_dp_groups_share_a_rail(topo_shape, job_shape):
    nodes = make_nodes(*topo_shape)
    n, procs, tp, pp = job_shape
    req = make_job(nodes=n, procs=procs).with_parallelism(tp=tp, pp=pp).obj()
    pl = plan_placement(PlacementInput(nodes.topology(req), req))
    assert isinstance(pl, Placement), pl
    assert_valid(pl, nodes.topology(req), req)
    assert pl.rails_per_dp_group == 1
    assert pl.rail_aligned
    by_rank = {e.rank: e for e in pl.rank_table.ranks}
    for p in range(req.pp):
        for t in range(req.tp):
            locals_ = {by_rank[(p * req.dp + d) * req.tp + t].local_rank for d in range(req.dp)}
            assert len(locals_) == 1, "a DP group's ranks must share their local GPU index"


@pytest.mark.parametrize(
    ("job_shape", "rails"),
    [
        pytest.param((4, 4, 1, 1), 4, id="pure-dp-4-ranks-per-node"),
        pytest.param((4, 4, 2, 1), 2, id="tp2-pp1-two-slots"),
        pytest.param((4, 4, 1, 2), 2, id="tp1-pp2-four-slots"),
    ],
)
def test_shapes_that_cannot_be_rail_pure_report_rails_per_dp_group(job_shape, rails):
    nodes = make_nodes(1, 2, 4, gpus=4)
    n, procs, tp, pp = job_shape
    req = make_job(nodes=n, procs=procs).with_parallelism(tp=tp, pp=pp).obj()
    pl = plan_placement(PlacementInput(nodes.topology(req), req))
    assert isinstance(pl, Placement)
    assert_valid(pl, nodes.topology(req), req)
    assert pl.rails_per_dp_group == rails
    assert any("rails" in note for note in pl.notes)


@pytest.mark.parametrize(
    ("topo_shape", "job_shape"),
    [
        pytest.param((2, 4, 4, 8), (16, 8, 8, 4), id="dp4-fills-leaves"),
        pytest.param((2, 4, 6, 8), (16, 8, 8, 4), id="dp4-in-leaves-of-6"),
        pytest.param((2, 4, 4, 8), (16, 8, 8, 2), id="dp8-spans-two-leaves"),
        pytest.param((2, 4, 3, 8), (12, 8, 8, 2), id="dp6-over-leaves-of-3"),
        pytest.param((3, 4, 5, 8), (24, 8, 8, 2), id="dp12-over-leaves-of-5"),
        pytest.param((2, 4, 4, 8), (8, 8, 4, 2), id="two-slots-dp4"),
    ],
)
def test_every_dp_group_spans_the_fewest_leaf_domains(topo_shape, job_shape):
    nodes = make_nodes(*topo_shape)
    n, procs, tp, pp = job_shape
    req = make_job(nodes=n, procs=procs).with_parallelism(tp=tp, pp=pp).obj()
    pl = plan_placement(PlacementInput(nodes.topology(req), req))
    assert isinstance(pl, Placement)
    dp_nodes = len({e.node for e in pl.rank_table.ranks if e.pp == 0 and e.tp == 0})
    minimum = math.ceil(dp_nodes / topo_shape[2])
    assert max(dp_group_leaves(pl, nodes.topology(req))) == minimum
    assert pl.dp_leaf_spans == minimum == pl.dp_leaf_minimum
    assert not any("leaf" in note for note in pl.notes)


def test_dp_groups_stay_in_one_leaf_even_when_busy_nodes_break_up_leaves():
    # leaves of 6 with 1 busy node each: 5 free per leaf, dp=4 -> one block per leaf, never split
    nodes = make_nodes(1, 4, 6)
    for lf in range(4):
        nodes.busy(f"node-s0-l{lf}-n0", 8)
    req = make_job(nodes=16, procs=8).with_parallelism(tp=8, pp=4).obj()
    pl = plan_placement(PlacementInput(nodes.topology(req), req))
    assert isinstance(pl, Placement)
    assert max(dp_group_leaves(pl, nodes.topology(req))) == 1


def test_same_input_gives_the_same_placement_whatever_the_node_order():
    nodes = make_nodes(2, 3, 4).busy("node-s0-l1-n2", 8).not_ready("node-s1-l0-n0")
    req = make_job(nodes=8, procs=8).with_parallelism(tp=4, pp=2).with_spares(2).obj()
    first = plan_placement(PlacementInput(nodes.topology(req), req))
    again = plan_placement(PlacementInput(nodes.topology(req), req))
    shuffled = nodes.copy()
    random.Random(7).shuffle(shuffled.nodes)
    third = plan_placement(PlacementInput(shuffled.topology(req), req))
    assert isinstance(first, Placement)
    assert first == again
    assert isinstance(third, Placement)
    assert third.nodes == first.nodes and third.spares == first.spares
    assert third.rank_table == first.rank_table


def test_rank_table_coordinates_follow_the_mesh_order():
    shape = MeshShape(nodes=4, procs_per_node=8, pp=2, dp=8, tp=2)
    for rank in range(32):
        p, d, t = shape.coords(rank)
        assert shape.rank_of(p, d, t) == rank
        pod, local = shape.position(rank)
        assert 0 <= pod < 4 and 0 <= local < 8


@pytest.mark.parametrize(
    ("shape", "field"),
    [
        (MeshShape(nodes=4, procs_per_node=8, pp=2, dp=8, tp=4), "parallelism"),
        (MeshShape(nodes=4, procs_per_node=6, pp=1, dp=6, tp=4), "parallelism.tensor"),
        (MeshShape(nodes=0, procs_per_node=8), "nodes"),
    ],
)
def test_invalid_shapes_are_refused_naming_the_field(shape, field):
    problems = shape.problems()
    assert problems and any(p.startswith(field) for p in problems)


def test_replica_peer_is_in_another_leaf():
    nodes = make_nodes(1, 4, 4)
    req = make_job(nodes=16, procs=8).with_parallelism(tp=8, pp=4).obj()
    topo = nodes.topology(req)
    pl = plan_placement(PlacementInput(topo, req))
    assert isinstance(pl, Placement)
    peers = [p.replica_peer for p in pl.rank_table.pods]
    assert sorted(peers) == list(range(16)), "each pod holds exactly one replica"
    for pod in pl.rank_table.pods:
        mine = topo.leaf_of(topo.index[pod.node])
        theirs = topo.leaf_of(topo.index[pl.nodes[pod.replica_peer]])
        assert mine != theirs


def test_rail_offset_label_shifts_the_reported_rail():
    nodes = make_nodes(1, 1, 2).rail_offset("node-s0-l0-n1", 4)
    req = make_job(nodes=2, procs=8).with_parallelism(tp=8).obj()
    pl = plan_placement(PlacementInput(nodes.topology(req), req))
    assert isinstance(pl, Placement)
    shifted = [e for e in pl.rank_table.ranks if e.node == "node-s0-l0-n1"]
    assert {(e.local_rank + 4) % 8 == e.rail for e in shifted} == {True}
