"""Placement as the operator calls it: unplaceable reasons, sticky re-placement, quarantine marks."""

from __future__ import annotations

from tests.operator.builders import make_node

from railyard.api.trainingjob import TrainingJob
from railyard.logic.placement import Placement, Unplaceable, build_placement_input, plan_placement
from railyard.logic.quarantine import (
    REASON_ANNOTATION,
    RELEASE_ANNOTATION,
    is_quarantined,
    wants_release,
)

Q = "railyard.dev/quarantined"


def _job(nodes: int, **spec: object) -> TrainingJob:
    return TrainingJob.model_validate({"metadata": {"name": "j", "namespace": "ns"}, "spec": {"nodes": nodes, "procsPerNode": 8, **spec}})


def _cluster(n: int = 8) -> list[dict]:
    return [make_node(f"node-{i}", leaf=f"leaf-{i // 4}") for i in range(n)]


def test_unplaceable_says_how_many_nodes_are_missing() -> None:
    res = plan_placement(build_placement_input(_job(10), nodes=_cluster(8)))
    assert isinstance(res, Unplaceable) and res.condition_reason == "NotEnoughNodes" and not res.permanent
    assert res.message


def test_sticky_replacement_moves_only_the_failed_nodes_ranks() -> None:
    nodes = _cluster(8)
    first = plan_placement(build_placement_input(_job(4), nodes=nodes))
    assert isinstance(first, Placement)
    victim = first.nodes[2]
    for n in nodes:
        if n["metadata"]["name"] == victim:
            n["metadata"]["labels"][Q] = "true"
    second = plan_placement(build_placement_input(_job(4), attempt=1, nodes=nodes, previous_nodes=first.nodes, failed={victim}))
    assert isinstance(second, Placement)
    assert second.moved == (2,)
    assert [a for a, b in zip(first.nodes, second.nodes, strict=True) if a != b] == [victim]
    assert victim not in second.nodes
    assert second.rank_table.attempt == 1


def test_node_selector_limits_the_candidates() -> None:
    nodes = _cluster(4)
    nodes[3]["metadata"]["labels"]["pool"] = "a"
    res = plan_placement(build_placement_input(_job(1, nodeSelector={"pool": "a"}), nodes=nodes))
    assert isinstance(res, Placement) and res.nodes == ("node-3",)


def test_quarantine_release_rules() -> None:
    marked = make_node("n", labels={Q: "true"}, taints=[{"key": Q, "value": "NodeNotReady", "effect": "NoSchedule"}],
                       annotations={REASON_ANNOTATION: "NodeNotReady"})
    assert is_quarantined(marked) and not wants_release(marked)
    released = make_node("n", labels={Q: "true"}, taints=[{"key": Q, "effect": "NoSchedule"}],
                         annotations={REASON_ANNOTATION: "x", RELEASE_ANNOTATION: "true"})
    assert wants_release(released)
    label_removed = make_node("n", taints=[{"key": Q, "effect": "NoSchedule"}], annotations={REASON_ANNOTATION: "x"})
    assert wants_release(label_removed), "half a quarantine is cleaned up"
    foreign = make_node("n", labels={Q: "true"})
    assert not wants_release(foreign), "marks we did not set are left alone"


def test_a_released_or_vanished_node_leaves_the_jobs_quarantine_list() -> None:
    from railyard.api.trainingjob import QuarantinedNode
    from railyard.logic.quarantine import decide_still_quarantined

    marked = [QuarantinedNode(node=n, reason="x") for n in ("kept", "released", "gone")]
    nodes = {"kept": make_node("kept", labels={Q: "true"}), "released": make_node("released")}
    assert [q.node for q in decide_still_quarantined(marked, nodes)] == ["kept"]
