"""A TopologyCache changes how fast a topology is built, never what it is: after any sequence
of node changes (each a new Node dict, as the kopf index and the simulator hand them over) the
cached build equals a build from scratch."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from railyard.api.corev1 import Toleration
from railyard.logic.quarantine import QUARANTINE_KEY
from railyard.logic.topology import TopologyCache, build_synthetic_nodes, build_topology

from .placement_builders import LEAF, SPINE

CHANGES = ["not_ready", "ready", "quarantine", "taint", "move_leaf", "drop_leaf_label", "gpus", "remove", "add", "shuffle", "tolerate", "pods",
           "heartbeat", "untaint", "cordon", "rail"]


def _changed(node: dict[str, Any], change: str, k: int) -> dict[str, Any]:
    n = copy.deepcopy(node)
    if change == "not_ready":
        n["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    elif change == "ready":
        n["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    elif change == "quarantine":
        n["metadata"]["labels"][QUARANTINE_KEY] = "true"
    elif change == "taint":
        n["spec"]["taints"] = [{"key": "maintenance", "effect": "NoSchedule"}]
    elif change == "move_leaf":
        n["metadata"]["labels"][LEAF] = f"leaf-x{k % 3}"
    elif change == "drop_leaf_label":
        n["metadata"]["labels"].pop(LEAF, None)
    elif change == "gpus":
        n["status"]["allocatable"]["nvidia.com/gpu"] = str(k % 9)
    elif change == "heartbeat":  # a new object that reads the same (a status post)
        for c in n["status"]["conditions"]:
            c["lastHeartbeatTime"] = f"2026-12-07T00:00:{k % 60:02d}Z"
    elif change == "untaint":
        n["spec"].pop("taints", None)
    elif change == "cordon":
        n["spec"]["unschedulable"] = not n["spec"].get("unschedulable")
    elif change == "rail":
        n["metadata"]["labels"]["railyard.dev/rail-offset"] = str(k % 4)
    return n


@settings(max_examples=120, deadline=None)
@given(data=st.data())
def test_cached_builds_equal_fresh_builds(data: st.DataObject) -> None:
    nodes = build_synthetic_nodes(2, 2, 3, 8)
    spare_pool = build_synthetic_nodes(1, 1, 3, 8, prefix="extra")
    pods: list[dict[str, Any]] = []
    tolerations: tuple[Toleration, ...] = ()
    cache = TopologyCache()
    for step in range(data.draw(st.integers(1, 8))):
        change = data.draw(st.sampled_from(CHANGES))
        k = data.draw(st.integers(0, 100))
        i = k % len(nodes)
        if change == "remove" and len(nodes) > 1:
            nodes = nodes[:i] + nodes[i + 1 :]
        elif change == "add" and spare_pool:
            nodes = [*nodes, spare_pool.pop()]
        elif change == "shuffle":
            nodes = nodes[i:] + nodes[:i]
        elif change == "tolerate":
            tolerations = (Toleration(key="maintenance", operator="Exists"),) if not tolerations else ()
        elif change == "pods":
            name = nodes[i]["metadata"]["name"]
            pods = [*pods, {"metadata": {"name": f"p{step}"}, "spec": {"nodeName": name, "containers": [
                {"resources": {"requests": {"nvidia.com/gpu": "2"}}}]}, "status": {"phase": "Running"}}]
        else:
            nodes = [*nodes[:i], _changed(nodes[i], change, k), *nodes[i + 1 :]]
        levels = (SPINE, LEAF) if data.draw(st.booleans()) else (LEAF,)
        cached = build_topology(nodes, pods, levels=levels, tolerations=tolerations, cache=cache)
        fresh = build_topology(copy.deepcopy(nodes), pods, levels=levels, tolerations=tolerations)
        assert cached == fresh, change


def test_a_node_changed_in_place_is_seen_when_its_resource_version_changes() -> None:
    nodes = build_synthetic_nodes(1, 1, 2, 8)
    for n in nodes:
        n["metadata"]["resourceVersion"] = "1"
    cache = TopologyCache()
    assert build_topology(nodes, cache=cache).excluded == ("", "")
    nodes[1]["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    nodes[1]["metadata"]["resourceVersion"] = "2"
    assert build_topology(nodes, cache=cache).excluded == ("", "NotReady")


def test_jobs_asking_with_other_levels_or_tolerations_in_turn_keep_their_derived_tree() -> None:
    """One operator-wide cache serves every job: a job placed with other level keys or
    tolerations in between finds its own context's tree again (the same object), and the
    least recently used context goes once more than TopologyCache.CONTEXTS are asked for."""
    nodes = build_synthetic_nodes(2, 2, 3, 8)
    cache = TopologyCache()
    first = build_topology(nodes, levels=(SPINE, LEAF), cache=cache)
    build_topology(nodes, levels=(LEAF,), cache=cache)
    build_topology(nodes, levels=(SPINE, LEAF), tolerations=(Toleration(key="maintenance", operator="Exists"),), cache=cache)
    again = build_topology(nodes, levels=(SPINE, LEAF), cache=cache)
    assert again == first and again.domain_of is first.domain_of
    for k in range(TopologyCache.CONTEXTS):
        build_topology(nodes, levels=(SPINE, LEAF), tolerations=(Toleration(key=f"k{k}", operator="Exists"),), cache=cache)
    evicted = build_topology(nodes, levels=(SPINE, LEAF), cache=cache)
    assert evicted == first and evicted.domain_of is not first.domain_of
