"""Which nodes of a gang are announced to go (logic/planned.py), as a table: a cordon, someone
else's NoSchedule/NoExecute taint, a maintenance label or annotation are planned moves; a node
that stopped answering, our own quarantine, a taint the job tolerates and an unrelated label
are not."""

from __future__ import annotations

from typing import Any

import pytest
from tests.operator.builders import make_node

from railyard.api.corev1 import Toleration
from railyard.logic.planned import GKE_MAINTENANCE, RAILYARD_MAINTENANCE, find_going_nodes, find_planned_moves
from railyard.logic.quarantine import QUARANTINE_KEY


def cordoned(name: str) -> dict[str, Any]:
    node = make_node(name)
    node["spec"]["unschedulable"] = True
    return node


def tainted(name: str, key: str, effect: str = "NoSchedule") -> dict[str, Any]:
    return make_node(name, taints=[{"key": key, "value": "x", "effect": effect}])


ROWS: list[tuple[str, dict[str, Any], str]] = [
    ("a healthy node stays", make_node("n"), ""),
    ("a cordoned node goes", cordoned("n"), "cordoned"),
    ("the cordon's taint alone is a cordon too", tainted("n", "node.kubernetes.io/unschedulable"),
     "tainted node.kubernetes.io/unschedulable:NoSchedule"),
    ("someone else's NoExecute taint", tainted("n", "example.com/upgrade", "NoExecute"),
     "tainted example.com/upgrade:NoExecute"),
    ("a PreferNoSchedule taint is no announcement", tainted("n", "example.com/upgrade", "PreferNoSchedule"), ""),
    ("our own quarantine is a failure's business", tainted("n", QUARANTINE_KEY), ""),
    ("an unreachable node is a failure, not a plan", tainted("n", "node.kubernetes.io/unreachable", "NoExecute"), ""),
    ("a NotReady cordoned node is a failure", {**cordoned("n"), "status": make_node("n", ready=False)["status"]}, ""),
    ("GKE's maintenance label", make_node("n", labels={GKE_MAINTENANCE: "1767225600"}),
     f"maintenance announced (label {GKE_MAINTENANCE}=1767225600)"),
    ("Railyard's maintenance annotation", make_node("n", annotations={RAILYARD_MAINTENANCE: "kernel"}),
     f"maintenance announced (annotation {RAILYARD_MAINTENANCE}=kernel)"),
    ("an unrelated label", make_node("n", labels={"example.com/maintenance-window": "sun"}), ""),
]


@pytest.mark.parametrize(("what", "node", "why"), ROWS, ids=[r[0] for r in ROWS])
def test_which_nodes_are_announced_to_go(what: str, node: dict[str, Any], why: str) -> None:
    node["metadata"]["name"] = "n"
    assert find_planned_moves({"n": node}, ["n"]) == ({"n": why} if why else {}), what


def test_only_the_gangs_nodes_and_all_of_them_at_once() -> None:
    nodes = {"a": cordoned("a"), "b": cordoned("b"), "c": make_node("c"), "d": cordoned("d")}
    assert find_planned_moves(nodes, ["a", "b", "c", "a"]) == {"a": "cordoned", "b": "cordoned"}


def test_a_tolerated_taint_and_an_added_signal() -> None:
    node = tainted("n", "example.com/upgrade")
    tolerates = (Toleration.from_dict({"key": "example.com/upgrade", "operator": "Exists"}),)
    assert find_planned_moves({"n": node}, ["n"], tolerations=tolerates) == {}
    mine = make_node("n", labels={"example.com/retire": "soon"})
    assert find_planned_moves({"n": mine}, ["n"]) == {}
    assert find_planned_moves({"n": mine}, ["n"], signals=("example.com/retire",)) == {
        "n": "maintenance announced (label example.com/retire=soon)"}


def test_the_going_nodes_of_the_cluster_are_the_table_in_name_order() -> None:
    """find_going_nodes (asked at every placement, of every node) answers what the table says of
    each node, all of them at once and ordered by name: its quick "no mark at all" answer agrees."""
    nodes: dict[str, dict[str, Any]] = {}
    for i, (_, node, _) in reversed(list(enumerate(ROWS))):
        node["metadata"]["name"] = name = f"n{i:02d}"
        nodes[name] = node
    expected = {f"n{i:02d}": why for i, (_, _, why) in enumerate(ROWS) if why}
    going = find_going_nodes(nodes)
    assert going == expected
    assert list(going) == sorted(expected)
    assert going == find_planned_moves(nodes, nodes)
