"""Required topology: the whole gang plus spares inside one domain of the named level."""

from __future__ import annotations

import pytest

from railyard.logic.placement import Placement, PlacementInput, Unplaceable, plan_placement

from .placement_builders import LEAF, SPINE, assert_valid, make_job, make_nodes, node


@pytest.mark.parametrize(
    ("level", "nodes_", "spares", "placed"),
    [
        pytest.param(SPINE, 8, 0, True, id="fits-one-spine"),
        pytest.param(SPINE, 8, 1, False, id="spares-push-it-over"),
        pytest.param(SPINE, 9, 0, False, id="too-big-for-any-spine"),
        pytest.param(LEAF, 4, 0, True, id="fits-one-leaf"),
        pytest.param(LEAF, 5, 0, False, id="too-big-for-any-leaf"),
    ],
)
def test_required_level_holds_the_whole_gang(level, nodes_, spares, placed):
    nodes = make_nodes(2, 2, 4)
    req = (
        make_job(nodes=nodes_, procs=8)
        .with_parallelism(tp=8)
        .with_spares(spares)
        .required(level)
        .obj()
    )
    topo = nodes.topology(req)
    out = plan_placement(PlacementInput(topo, req))
    if placed:
        assert isinstance(out, Placement), out
        assert_valid(out, topo, req)
    else:
        assert isinstance(out, Unplaceable)
        assert out.constraint == "requiredLevel"
        assert level in out.reason
        assert out.short == nodes_ + spares - (8 if level == SPINE else 4)
        assert out.domains, "the reason names the closest domains"


def test_required_refusal_counts_only_usable_nodes():
    nodes = make_nodes(2, 1, 4).not_ready(node(0, 0, 0)).busy(node(1, 0, 0), 2)
    req = make_job(nodes=4, procs=8).with_parallelism(tp=8).required(SPINE).obj()
    out = plan_placement(PlacementInput(nodes.topology(req), req))
    assert isinstance(out, Unplaceable)
    assert out.short == 1
    assert "spine-0 (3 usable)" in out.reason


def test_preferred_spreads_when_no_single_domain_fits():
    nodes = make_nodes(2, 2, 4)
    req = make_job(nodes=10, procs=8).with_parallelism(tp=8).preferred(SPINE).obj()
    topo = nodes.topology(req)
    pl = plan_placement(PlacementInput(topo, req))
    assert isinstance(pl, Placement)
    assert len(pl.domains[SPINE]) == 2
    assert any("Preferred" in n for n in pl.notes)


def test_required_picks_the_fullest_domain_that_fits():
    nodes = make_nodes(3, 1, 4).busy(node(1, 0, 0), 8).busy(node(2, 0, 0), 8).busy(node(2, 0, 1), 8)
    req = make_job(nodes=2, procs=8).with_parallelism(tp=8).required(SPINE).obj()
    pl = plan_placement(PlacementInput(nodes.topology(req), req))
    assert isinstance(pl, Placement)
    assert pl.domains[SPINE] == ("spine-2",)


def test_unknown_required_level_names_the_known_levels():
    nodes = make_nodes(1, 1, 2)
    req = make_job(nodes=1, procs=8).with_parallelism(tp=8).required("example.com/rack").obj()
    out = plan_placement(PlacementInput(nodes.topology(req), req))
    assert isinstance(out, Unplaceable) and out.constraint == "topology"
    assert SPINE in out.reason
