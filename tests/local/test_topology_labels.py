"""Simulated nodes: names, loopback addresses and topology labels in both conventions."""

from __future__ import annotations

import pytest

from railyard_local.topology import (
    ClusterShape,
    TopologyError,
    build_nodes,
    parse_topology_file,
    parse_topology_spec,
)


def test_eight_nodes_on_two_spines_of_two_leaves() -> None:
    nodes = build_nodes(ClusterShape(nodes=8, gpus_per_node=2, levels=parse_topology_spec("spine=2,leaf=2")))
    assert [n.name for n in nodes] == [f"node-{i}" for i in range(8)]
    assert [n.ip for n in nodes] == [f"127.0.0.{10 + i}" for i in range(8)]
    leaves = [n.labels["railyard.dev/leaf"] for n in nodes]
    spines = [n.labels["railyard.dev/spine"] for n in nodes]
    assert leaves == ["leaf-0", "leaf-0", "leaf-1", "leaf-1", "leaf-2", "leaf-2", "leaf-3", "leaf-3"]
    assert spines == ["spine-0"] * 4 + ["spine-1"] * 4
    for n in nodes:
        assert n.labels["kubernetes.io/hostname"] == n.name
        # Topograph v0.x and v1.x, and GKE, mirror our levels (tier 0 = nearest the node)
        assert n.labels["network.topology.nvidia.com/leaf"] == n.labels["railyard.dev/leaf"]
        assert n.labels["network.topology.nvidia.com/spine"] == n.labels["railyard.dev/spine"]
        assert n.labels["fabric.topograph.run/tier-0"] == n.labels["railyard.dev/leaf"]
        assert n.labels["fabric.topograph.run/tier-1"] == n.labels["railyard.dev/spine"]
        assert n.labels["cloud.google.com/gce-topology-block"] == n.labels["railyard.dev/spine"]
        assert n.capacity()["nvidia.com/gpu"] == "2"


def test_three_levels_and_uneven_fill() -> None:
    nodes = build_nodes(ClusterShape(nodes=5, levels=parse_topology_spec("core=1,spine=2,leaf=2")))
    assert [n.labels["railyard.dev/leaf"] for n in nodes] == ["leaf-0", "leaf-0", "leaf-1", "leaf-1", "leaf-2"]
    assert nodes[4].labels["fabric.topograph.run/tier-2"] == "core-0"
    assert nodes[4].labels["network.topology.nvidia.com/core"] == "core-0"
    assert "nvidia.com/gpu" not in nodes[0].capacity()


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [("spine", "NAME=COUNT"), ("spine=0", "COUNT >= 1"), ("Spine=2", "lowercase"), ("leaf=2,leaf=3", "twice"), ("", "empty")],
)
def test_bad_specs_name_the_fix(spec: str, fragment: str) -> None:
    with pytest.raises(TopologyError, match=fragment):
        parse_topology_spec(spec)


def test_topology_file_forms() -> None:
    shape = parse_topology_file({"nodes": 6, "gpusPerNode": 8, "levels": [{"name": "spine", "count": 1}, {"name": "leaf", "count": 3}]})
    assert (shape.nodes, shape.gpus_per_node, [lv.name for lv in shape.levels]) == (6, 8, ["spine", "leaf"])
    assert parse_topology_file({"levels": {"spine": 2, "leaf": 2}}).levels == parse_topology_spec("spine=2,leaf=2")
    with pytest.raises(TopologyError) as err:
        parse_topology_file({"nodez": 3, "nodes": -1})
    assert "nodez: unknown field" in str(err.value) and "nodes: must be a non-negative integer" in str(err.value)
