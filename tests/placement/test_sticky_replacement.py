"""Sticky re-placement: only the failed nodes' pods move; every other rank stays put."""

from __future__ import annotations

from railyard.logic.placement import (
    Placement,
    PlacementInput,
    PreviousPlacement,
    Unplaceable,
    plan_placement,
)

from .placement_builders import assert_valid, make_job, make_nodes


def _first(nodes, req):
    pl = plan_placement(PlacementInput(nodes.topology(req), req))
    assert isinstance(pl, Placement)
    return pl


def test_only_the_failed_nodes_ranks_move():
    nodes = make_nodes(2, 2, 4)
    req = make_job(nodes=8, procs=8).with_parallelism(tp=4, pp=2).with_spares(2).obj()
    first = _first(nodes, req)
    failed = first.nodes[3]
    nodes.not_ready(failed)
    topo = nodes.topology(req)
    again = plan_placement(PlacementInput(topo, req, previous=PreviousPlacement(first.nodes, first.spares)))
    assert isinstance(again, Placement)
    assert_valid(again, topo, req)
    assert again.moved == (3,)
    assert again.nodes[3] in first.spares
    for i in range(8):
        if i != 3:
            assert again.nodes[i] == first.nodes[i]
    old = {(e.rank, e.pod_index, e.local_rank) for e in first.rank_table.ranks}
    new = {(e.rank, e.pod_index, e.local_rank) for e in again.rank_table.ranks}
    assert old == new, "ranks keep their pod index and local rank"
    moved_ranks = {
        e.rank for e in again.rank_table.ranks if e.node != first.rank_table.ranks[e.rank].node
    }
    assert moved_ranks == {e.rank for e in first.rank_table.ranks if e.pod_index == 3}


def test_replacement_prefers_a_spare_in_the_failed_nodes_leaf():
    nodes = make_nodes(1, 2, 4)
    req = make_job(nodes=4, procs=8).with_parallelism(tp=8).with_spares(2).obj()
    topo = nodes.topology(req)
    # previous placement: pods on leaf 0 (n0..n3), spares one per leaf
    prev = PreviousPlacement(
        nodes=("node-s0-l0-n0", "node-s0-l0-n1", "node-s0-l0-n2", "node-s0-l1-n0"),
        spares=("node-s0-l1-n3", "node-s0-l0-n3"),
        failed=frozenset({"node-s0-l0-n1"}),
    )
    pl = plan_placement(PlacementInput(topo, req, previous=prev))
    assert isinstance(pl, Placement)
    assert pl.nodes[1] == "node-s0-l0-n3"
    assert pl.moved == (1,)
    assert "node-s0-l0-n1" not in pl.spares, "a failed node is never held as a spare"
    assert len(pl.spares) == 2


def test_quarantined_node_is_replaced_and_healthy_busy_looking_nodes_are_kept():
    nodes = make_nodes(1, 2, 4)
    req = make_job("job", nodes=4, procs=8).with_parallelism(tp=8).with_spares(1).obj()
    first = _first(nodes, req)
    # the job's own pods hold the GPUs of its nodes: they must not make them look busy
    for n in first.nodes:
        nodes.busy(n, 8, job="job")
    nodes.quarantine(first.nodes[0])
    again = plan_placement(PlacementInput(
        nodes.topology(req), req, previous=PreviousPlacement(first.nodes, first.spares)
    ))
    assert isinstance(again, Placement)
    assert again.moved == (0,)
    assert again.nodes[1:] == first.nodes[1:]


def test_nothing_failed_keeps_everything():
    nodes = make_nodes(1, 2, 4)
    req = make_job(nodes=4, procs=8).with_parallelism(tp=8).with_spares(1).obj()
    first = _first(nodes, req)
    again = plan_placement(PlacementInput(
        nodes.topology(req), req, previous=PreviousPlacement(first.nodes, first.spares)
    ))
    assert isinstance(again, Placement)
    assert again.nodes == first.nodes and again.spares == first.spares and again.moved == ()


def test_no_replacement_left_is_unplaceable():
    nodes = make_nodes(1, 1, 4)
    req = make_job(nodes=4, procs=8).with_parallelism(tp=8).obj()
    first = _first(nodes, req)
    nodes.not_ready(first.nodes[2])
    out = plan_placement(PlacementInput(nodes.topology(req), req, previous=PreviousPlacement(first.nodes)))
    assert isinstance(out, Unplaceable)
    assert out.constraint == "capacity" and out.short == 1 and "[2]" in out.reason


def test_required_level_keeps_replacements_and_spares_in_the_gangs_domain():
    nodes = make_nodes(2, 1, 4)
    req = (
        make_job(nodes=3, procs=8)
        .with_parallelism(tp=8)
        .with_spares(1)
        .required("railyard.dev/spine")
        .obj()
    )
    first = _first(nodes, req)
    spine = first.domains["railyard.dev/spine"]
    nodes.not_ready(first.nodes[0])
    again = plan_placement(PlacementInput(
        nodes.topology(req), req, previous=PreviousPlacement(first.nodes, first.spares)
    ))
    assert isinstance(again, Placement)
    assert again.domains["railyard.dev/spine"] == spine
    assert again.nodes[0] == first.spares[0]
    # the spare replaced the failed node; the other spine has free nodes but is out of bounds
    assert again.spares == () and any("hot spares" in n for n in again.notes)
