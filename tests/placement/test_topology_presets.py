"""Topology tree from node labels: presets, implied host level, missing labels."""

from __future__ import annotations

import pytest

from railyard.logic.topology import (
    build_synthetic_nodes,
    build_topology,
    parse_synthetic_spec,
    resolve_level_keys,
)


def _node(name: str, labels: dict[str, str], gpus: int = 8) -> dict:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}},
        "spec": {},
        "status": {
            "allocatable": {"nvidia.com/gpu": str(gpus)},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


@pytest.mark.parametrize(
    ("preset", "labels", "expected"),
    [
        (
            "railyard",
            {"railyard.dev/spine": "s", "railyard.dev/leaf": "l"},
            ("railyard.dev/spine", "railyard.dev/leaf"),
        ),
        (
            "topograph",
            {"fabric.topograph.run/tier-1": "sp", "fabric.topograph.run/tier-0": "lf"},
            (
                "fabric.topograph.run/tier-2",
                "fabric.topograph.run/tier-1",
                "fabric.topograph.run/tier-0",
            ),
        ),
        (
            "topograph",
            {"network.topology.nvidia.com/spine": "sp", "network.topology.nvidia.com/leaf": "lf"},
            (
                "network.topology.nvidia.com/core",
                "network.topology.nvidia.com/spine",
                "network.topology.nvidia.com/leaf",
                "network.topology.nvidia.com/block",
            ),
        ),
        (
            "gke",
            {
                "cloud.google.com/gce-topology-block": "b",
                "cloud.google.com/gce-topology-subblock": "sb",
            },
            ("cloud.google.com/gce-topology-block", "cloud.google.com/gce-topology-subblock"),
        ),
        (
            "eks",
            {"topology.k8s.aws/network-node-layer-1": "a"},
            (
                "topology.k8s.aws/network-node-layer-1",
                "topology.k8s.aws/network-node-layer-2",
                "topology.k8s.aws/network-node-layer-3",
            ),
        ),
    ],
)
def test_presets_resolve_to_the_label_family_present(preset, labels, expected):
    nodes = [_node("a", labels)]
    assert resolve_level_keys(preset, None, nodes) == expected


def test_levels_no_node_carries_are_dropped_and_host_keys_are_implied():
    nodes = [
        _node("a", {"fabric.topograph.run/tier-1": "sp1", "fabric.topograph.run/tier-0": "lf1"}),
        _node("b", {"fabric.topograph.run/tier-1": "sp1", "fabric.topograph.run/tier-0": "lf2"}),
    ]
    keys = resolve_level_keys("topograph", None, nodes)
    topo = build_topology(nodes, levels=keys)
    assert topo.levels == ("fabric.topograph.run/tier-1", "fabric.topograph.run/tier-0")
    assert topo.dropped_levels == ("fabric.topograph.run/tier-2",)
    explicit = resolve_level_keys(
        None, ["x/spine", "cloud.google.com/gce-topology-host", "kubernetes.io/hostname"], nodes
    )
    assert explicit == ("x/spine",)


def test_a_node_missing_a_level_label_gets_its_own_domain():
    nodes = [
        _node("a", {"x/leaf": "l1"}),
        _node("b", {"x/leaf": "l1"}),
        _node("c", {}),
        _node("d", {}),
    ]
    topo = build_topology(nodes, levels=("x/leaf",))
    leaves = {n: topo.leaf_of(topo.index[n]) for n in "abcd"}
    assert leaves["a"] == leaves["b"]
    assert len({leaves["a"], leaves["c"], leaves["d"]}) == 3


def test_unknown_preset_names_the_known_ones():
    with pytest.raises(ValueError, match=r"topology\.preset"):
        resolve_level_keys("nope", None, [])


def test_synthetic_nodes_and_spec_build_the_same_tree():
    a = build_topology(build_synthetic_nodes(2, 3, 4, 8))
    b = build_topology(parse_synthetic_spec("spine=2,leaf=3,nodes=4,gpus=8"))
    assert a == b
    assert a.size == 24 and len(a.leaf_nodes) == 6 and len(a.domain_names[0]) == 2
    assert set(a.gpus) == {8}


@pytest.mark.parametrize(
    "spec", ["spine=2,leaf=3", "spine=2,leaf=x,nodes=1", "rack=1,leaf=1,nodes=1"]
)
def test_bad_synthetic_spec_is_refused(spec):
    with pytest.raises(ValueError, match="--nodes"):
        parse_synthetic_spec(spec)


def test_nodes_are_ordered_naturally_inside_leaves():
    nodes = [
        _node(f"n-{i}", {"railyard.dev/spine": "s", "railyard.dev/leaf": "l"}) for i in (10, 2, 1)
    ]
    topo = build_topology(nodes)
    assert topo.names == ("n-1", "n-2", "n-10")


def test_init_containers_and_limits_count_as_gpu_use():
    nodes = [_node("a", {}), _node("b", {})]
    pods = [
        {
            "spec": {
                "nodeName": "a",
                "containers": [{"resources": {"limits": {"nvidia.com/gpu": "3"}}}],
            },
            "status": {"phase": "Running"},
        },
        {
            "spec": {
                "nodeName": "b",
                "initContainers": [{"resources": {"requests": {"nvidia.com/gpu": 6}}}],
                "containers": [{"resources": {"requests": {"nvidia.com/gpu": "2"}}}],
            },
            "status": {"phase": "Pending"},
        },
    ]
    topo = build_topology(nodes, pods, levels=())
    assert topo.free_gpus[topo.index["a"]] == 5
    assert topo.free_gpus[topo.index["b"]] == 2
