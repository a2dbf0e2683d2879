"""faultTolerance ReplicaGroups: a health verdict on one group restarts that group alone.

The chain the operator runs (handlers/failures.py, handlers/inplace.py ``plan_restart``), as pure
calls: the verdict becomes a failure (``build_verdict_failure``: the nodes it blames, the pods it
names), the nodes it blames must be left (``decide_restart_mode``), and the groups of those pods
and of the named pods restart while every other group carries on (``decide_group_repair``):

- an SDC verdict of the cross-group vote: the diverged group's pod is replaced (its node is
  quarantined), the group heals from a good one;
- a hang verdict naming one group's pod (the others only waited for it): that group restarts in
  place, nothing is quarantined;
- a straggler verdict with ``straggler.action: Restart``: the slow pod moves to a spare, its
  group restarts, the others never slow down for it again;
- an SDC verdict without a suspect (two groups that differ): no group is named, the whole gang
  restarts in place (from the tiers, no newer than the last agreement).
"""

from __future__ import annotations

import pytest
from tests.operator.builders import make_node, make_pod

from railyard.logic.failures import build_verdict_failure
from railyard.logic.inplace import (
    GROUP_REPAIR,
    RestartPlan,
    decide_group_repair,
    decide_restart_mode,
)
from railyard.protocol.exitcodes import FailureClass

NODES = {f"n{i}": make_node(f"n{i}") for i in range(8)}


def _repair(verdict: str, nodes: tuple[str, ...], pods: tuple[int, ...], *, on: tuple[str, ...], replicas: int) -> RestartPlan:
    f = build_verdict_failure(verdict, "detail", nodes, pod_indices=pods)
    assert f is not None
    members = [make_pod(index=i, node=n).obj() for i, n in enumerate(on)]
    plan = decide_restart_mode(enabled=True, spec_changed=False, members=members, expected=len(on), nodes=NODES,
                               move_off={n: f"blamed: {f.kind}" for n in f.nodes}, capable=frozenset(range(len(on))))
    return decide_group_repair(plan, expected=len(on), replicas=replicas, min_replicas=1, failed=frozenset(f.pod_indices))


@pytest.mark.parametrize(
    ("verdict", "nodes", "pods", "on", "replicas", "replace", "carry_on"),
    [
        pytest.param("SDC", ("n1",), (1,), ("n0", "n1", "n2"), 3, (1,), (0, 2), id="sdc-diverged-group-1-replaced"),
        pytest.param("SDC", ("n3",), (3,), ("n0", "n1", "n2", "n3", "n4", "n5"), 3, (3,), (0, 1, 4, 5), id="sdc-3x2-its-partner-restarts-in-place"),
        pytest.param("Hang", (), (2,), ("n0", "n1", "n2"), 3, (), (0, 1), id="hang-group-2-in-place"),
        pytest.param("Hang", (), (1,), ("n0", "n1"), 2, (), (0,), id="hang-of-2-groups"),
        pytest.param("Straggler", ("n2",), (2,), ("n0", "n1", "n2"), 3, (2,), (0, 1), id="straggler-restart-moves-the-slow-pod"),
        pytest.param("Dead", (), (0,), ("n0", "n1", "n2"), 3, (), (1, 2), id="dead-rank-its-group"),
    ],
)
def test_a_verdict_on_one_group_restarts_that_group_alone(verdict: str, nodes: tuple[str, ...], pods: tuple[int, ...], on: tuple[str, ...],
                                                          replicas: int, replace: tuple[int, ...], carry_on: tuple[int, ...]) -> None:
    plan = _repair(verdict, nodes, pods, on=on, replicas=replicas)
    assert plan.mode == "InPlace" and plan.reason == GROUP_REPAIR, plan
    assert (plan.replace, plan.carry_on) == (replace, carry_on)


def test_the_failure_blames_the_sdc_and_straggler_nodes_only() -> None:
    sdc = build_verdict_failure("SDC", "group 1 diverged", ("n1",), pod_indices=(1, -1, 1))
    hang = build_verdict_failure("Hang", "stuck", (), pod_indices=(2,))
    assert sdc is not None and hang is not None
    assert (sdc.cls, sdc.nodes, sdc.pod_indices) == (FailureClass.SDC, ("n1",), (1,)), "its node is quarantined"
    assert (hang.cls, hang.nodes, hang.pod_indices) == (FailureClass.STRAGGLER, (), (2,))


def test_a_tie_names_no_group_and_the_whole_gang_restarts_from_the_tiers() -> None:
    f = build_verdict_failure("SDC", "no majority", (), pod_indices=(-1,), restore_not_after=10)
    assert f is not None and f.nodes == () and f.pod_indices == () and f.restore_not_after == 10
    plan = _repair("SDC", (), (), on=("n0", "n1"), replicas=2)
    assert plan.mode == "InPlace" and plan.reason != GROUP_REPAIR and plan.carry_on == () and plan.keep == (0, 1)


def test_a_hang_of_every_group_restarts_the_whole_gang() -> None:
    plan = _repair("Hang", (), (0, 1, 2), on=("n0", "n1", "n2"), replicas=3)
    assert plan.reason != GROUP_REPAIR and plan.carry_on == ()
