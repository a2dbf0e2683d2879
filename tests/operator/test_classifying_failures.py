"""Failure classification: evidence -> class, blamed nodes, root cause among echoes."""

from __future__ import annotations

import pytest
from tests.operator.builders import make_node, make_pod

from railyard.logic.failures import (
    RULES,
    SDC_CONDITION,
    STRAGGLER_CONDITION,
    classify_pod,
    decide_root_failure,
)
from railyard.protocol.exitcodes import ExitCode, FailureClass

NODES = {"node-0": make_node("node-0"), "node-1": make_node("node-1")}


@pytest.mark.parametrize(
    ("pod", "kind", "cls", "blamed"),
    [
        (make_pod().exited(1).obj(), "ApplicationExitCode", FailureClass.APPLICATION, ()),
        (make_pod().exited(ExitCode.CONFIG_PERMANENT).obj(), "PermanentExitCode", FailureClass.PERMANENT, ()),
        (make_pod().exited(ExitCode.NO_VERIFIED_CHECKPOINT).obj(), "PermanentExitCode", FailureClass.PERMANENT, ()),
        (make_pod().exited(ExitCode.INFRASTRUCTURE).obj(), "InfrastructureExitCode", FailureClass.INFRASTRUCTURE, ()),
        (make_pod().exited(ExitCode.SDC_DETECTED).obj(), "SDCExitCode", FailureClass.SDC, ("node-0",)),
        (make_pod().exited(ExitCode.HANG_OR_STRAGGLER).obj(), "StragglerExitCode", FailureClass.STRAGGLER, ("node-0",)),
        (make_pod().exited(137).obj(), "Killed", FailureClass.INFRASTRUCTURE, ()),
        (make_pod().exited(143).obj(), "Killed", FailureClass.INFRASTRUCTURE, ()),
        (make_pod().exited(137, reason="OOMKilled").obj(), "OOMKilled", FailureClass.APPLICATION, ()),
        (make_pod().evicted().obj(), "Evicted", FailureClass.INFRASTRUCTURE, ()),
        (make_pod().condition("DisruptionTarget", "preempted").obj(), "Disrupted", FailureClass.INFRASTRUCTURE, ()),
        (make_pod().condition(SDC_CONDITION, "rank 3 KAT mismatch").obj(), "SDCCondition", FailureClass.SDC, ("node-0",)),
        (make_pod().condition(STRAGGLER_CONDITION).obj(), "StragglerCondition", FailureClass.STRAGGLER, ("node-0",)),
        (make_pod(node="node-9").obj(), "NodeGone", FailureClass.INFRASTRUCTURE, ("node-9",)),
        (make_pod().deleting().obj(), "PodDeleted", FailureClass.INFRASTRUCTURE, ()),
    ],
)
def test_each_kind_of_evidence_has_its_class_and_blame(pod: dict, kind: str, cls: FailureClass, blamed: tuple[str, ...]) -> None:
    f = classify_pod(pod, NODES)
    assert f is not None
    assert (f.kind, f.cls, f.nodes) == (kind, cls, blamed)
    assert f.message


def test_healthy_pods_are_not_failures() -> None:
    assert classify_pod(make_pod().obj(), NODES) is None
    assert classify_pod(make_pod().exited(0).obj(), NODES) is None
    assert classify_pod(make_pod().gated().obj(), NODES) is None


def test_a_not_ready_node_blames_the_node_even_if_the_pod_looks_running() -> None:
    nodes = {"node-0": make_node("node-0", ready=False)}
    f = classify_pod(make_pod().obj(), nodes)
    assert f is not None and f.kind == "NodeNotReady" and f.nodes == ("node-0",)


def test_a_succeeded_pod_on_a_dead_node_is_not_a_failure() -> None:
    assert classify_pod(make_pod().exited(0).obj(), {"node-0": make_node("node-0", ready=False)}) is None


def test_root_cause_beats_its_echoes_and_permanent_beats_all() -> None:
    nodes = {"node-0": make_node("node-0", ready=False), "node-1": make_node("node-1")}
    dead = classify_pod(make_pod(index=0, node="node-0").obj(), nodes)
    echo = classify_pod(make_pod(index=1, node="node-1").exited(ExitCode.INFRASTRUCTURE).obj(), nodes)
    crash = classify_pod(make_pod(index=1, node="node-1").exited(1).obj(), nodes)
    perm = classify_pod(make_pod(index=1, node="node-1").exited(64).obj(), nodes)
    root = decide_root_failure([echo, dead, crash])  # type: ignore[list-item]
    assert root is not None and root.kind == "NodeNotReady" and root.nodes == ("node-0",)
    root = decide_root_failure([dead, perm])  # type: ignore[list-item]
    assert root is not None and root.cls is FailureClass.PERMANENT
    assert decide_root_failure([]) is None


def test_two_dead_nodes_are_both_blamed() -> None:
    nodes = {"node-0": make_node("node-0", ready=False), "node-1": make_node("node-1", ready=False)}
    fs = [classify_pod(make_pod(index=i, node=f"node-{i}").obj(), nodes) for i in range(2)]
    root = decide_root_failure(fs)  # type: ignore[arg-type]
    assert root is not None and set(root.nodes) == {"node-0", "node-1"}


def test_every_rule_names_a_class_and_a_message_template() -> None:
    for kind, rule in RULES.items():
        assert isinstance(rule.cls, FailureClass), kind
        assert "{detail}" in rule.message, kind
