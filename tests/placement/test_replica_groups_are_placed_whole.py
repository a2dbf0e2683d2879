"""faultTolerance ReplicaGroups: the data dimension's outermost factor splits the gang into
replica groups, each its own world on consecutive pods, placed whole inside the fewest leaf
domains (a group is a placement block), with its own rank table cut from the job's."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from railyard.logic.layout import build_rank_table, build_replica_group_table
from railyard.logic.placement import Placement, PlacementInput, plan_placement
from railyard.protocol.mesh import MeshShape

from .placement_builders import make_job, make_nodes


@pytest.mark.parametrize(
    "shape",
    [
        MeshShape(4, 2, dp=8, replicas=2),
        MeshShape(6, 2, dp=12, replicas=3),
        MeshShape(2, 2, dp=4, replicas=2),
        MeshShape(4, 4, pp=2, dp=4, tp=2, replicas=2),
        MeshShape(16, 8, pp=4, dp=4, tp=8, replicas=4),
        MeshShape(4, 1, dp=4, replicas=4),
    ],
    ids=str,
)
def test_each_group_is_a_world_of_its_own_pods(shape: MeshShape) -> None:
    assert shape.problems() == []
    table = build_rank_table(job="j", attempt=0, shape=shape, pod_nodes=[f"n{i}" for i in range(shape.nodes)],
                             pod_rail_offset=[0] * shape.nodes, pod_gpus=[shape.procs_per_node] * shape.nodes)
    table.validate()
    for e in table.ranks:
        assert shape.position(e.rank) == (e.pod_index, e.local_rank)
        assert shape.group_of_pod(e.pod_index) == e.dp // (shape.dp // shape.replicas), "a pod holds ranks of one group only"
    slots: set[tuple[int, int]] = set()
    for g in range(shape.replicas):
        t = build_replica_group_table(table, group=g, replicas=shape.replicas, master_port=100 + g)
        t.validate()
        per = shape.nodes // shape.replicas
        assert [p.pod_index for p in t.pods] == list(range(g * per, (g + 1) * per))
        assert t.world_size == shape.world_size // shape.replicas and t.dp == shape.dp // shape.replicas
        assert t.master_port == 100 + g
        slots |= {(e.pod_index, e.local_rank) for e in t.ranks}
    assert len(slots) == shape.world_size, "the groups' ranks together fill every slot once"


def test_one_replica_is_the_layout_of_before() -> None:
    for shape in (MeshShape(4, 2, dp=8), MeshShape(4, 4, pp=2, dp=4, tp=2)):
        assert [shape.position(r) for r in range(shape.world_size)] == [
            (g % shape.nodes, (g // shape.nodes) * shape.tp + t) for g in range(shape.world_size // shape.tp) for t in range(shape.tp)
        ]


@pytest.mark.parametrize(
    ("shape", "field"),
    [(MeshShape(3, 2, dp=6, replicas=2), "nodes"), (MeshShape(4, 1, pp=2, dp=2, replicas=4), "parallelism.dataReplicas")],
)
def test_groups_that_do_not_divide_are_refused_naming_the_field(shape: MeshShape, field: str) -> None:
    assert any(p.startswith(f"{field}:") for p in shape.problems())


@pytest.mark.parametrize(
    ("topo_shape", "job_nodes", "replicas"),
    [
        pytest.param((1, 4, 4), 8, 2, id="two-groups-of-4-in-leaves-of-4"),
        pytest.param((1, 4, 6), 12, 3, id="three-groups-of-4-in-leaves-of-6"),
        pytest.param((2, 4, 4), 16, 4, id="four-groups-fill-four-leaves"),
        pytest.param((1, 4, 3), 8, 2, id="groups-of-4-over-leaves-of-3"),
    ],
)
def test_each_group_spans_the_fewest_leaves(topo_shape: tuple[int, int, int], job_nodes: int, replicas: int) -> None:
    nodes = make_nodes(*topo_shape)
    req = replace(make_job(nodes=job_nodes, procs=8).with_parallelism(tp=1).obj(), replicas=replicas)
    topo = nodes.topology(req)
    pl = plan_placement(PlacementInput(topo, req))
    assert isinstance(pl, Placement), pl
    per = job_nodes // replicas
    leaf = {n: topo.leaf_of(topo.index[n]) for n in pl.nodes}
    for g in range(replicas):
        group_leaves = {leaf[n] for n in pl.nodes[g * per:(g + 1) * per]}
        assert len(group_leaves) == math.ceil(per / topo_shape[2]), f"group {g} spans {group_leaves}"


def test_a_group_stays_in_one_leaf_when_busy_nodes_break_up_leaves() -> None:
    nodes = make_nodes(1, 3, 6)
    for lf in range(3):
        nodes.busy(f"node-s0-l{lf}-n0", 8).busy(f"node-s0-l{lf}-n1", 8)
    req = replace(make_job(nodes=8, procs=8).with_parallelism(tp=1).obj(), replicas=2)
    topo = nodes.topology(req)
    pl = plan_placement(PlacementInput(topo, req))
    assert isinstance(pl, Placement), pl
    for g in range(2):
        assert len({topo.leaf_of(topo.index[n]) for n in pl.nodes[g * 4:(g + 1) * 4]}) == 1
