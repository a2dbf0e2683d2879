"""MeshShape.positions (the placement's bulk form of MeshShape.position, asked of every
data-parallel group at every decision) answers what position answers rank by rank, and the
DP-group spread built on it matches a walk over every rank, for every kind of shape: TP inside a
pod, TP spanning pods (an NVLink unit), replica groups."""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from railyard.logic.layout import compute_dp_group_spread, compute_rail
from railyard.protocol.mesh import MeshShape


@st.composite
def shapes(draw: st.DrawFn) -> MeshShape:
    nodes = draw(st.integers(1, 12))
    procs = draw(st.sampled_from([1, 2, 4, 8]))
    tp = draw(st.sampled_from([1, 2, 4, 8, 16]))
    ranks = nodes * procs
    assume(ranks % tp == 0)
    groups = ranks // tp
    pp = draw(st.sampled_from([p for p in range(1, groups + 1) if groups % p == 0]))
    dp = groups // pp
    replicas = draw(st.sampled_from([r for r in range(1, dp + 1) if dp % r == 0]))
    shape = MeshShape(nodes, procs, pp, dp, tp, replicas)
    assume(not shape.problems())
    return shape


@settings(max_examples=300, deadline=None)
@given(shape=shapes(), data=st.data())
def test_positions_are_position_rank_by_rank(shape: MeshShape, data: st.DataObject) -> None:
    start = data.draw(st.integers(0, shape.world_size - 1))
    step = data.draw(st.integers(1, shape.world_size))
    ranks = range(start, shape.world_size, step)
    assert shape.positions(ranks) == [shape.position(r) for r in ranks]
    assert shape.positions(range(shape.world_size)) == [(pod, local) for _, pod, local, *_ in shape.layout()]


@settings(max_examples=300, deadline=None)
@given(shape=shapes(), data=st.data())
def test_dp_group_spread_matches_a_walk_over_every_rank_of_any_shape(shape: MeshShape, data: st.DataObject) -> None:
    n = shape.nodes
    offsets = data.draw(st.lists(st.integers(0, 7), min_size=n, max_size=n))
    gpus = data.draw(st.lists(st.sampled_from([0, shape.procs_per_node, 8]), min_size=n, max_size=n))
    domain = data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    rails: dict[tuple[int, int], set[int]] = {}
    pods: dict[tuple[int, int], set[int]] = {}
    for _, pod, local, p, _, t in shape.layout():
        rails.setdefault((p, t), set()).add(compute_rail(local, offsets[pod], gpus[pod]))
        pods.setdefault((p, t), set()).add(pod)
    expected = (
        max(len(v) for v in rails.values()),
        max(len({domain[x] for x in v}) for v in pods.values()),
        max(len(v) for v in pods.values()),
    )
    assert compute_dp_group_spread(shape, pod_rail_offset=offsets, pod_gpus=gpus, pod_domain=domain) == expected
