"""Kueue's Topology-Aware Scheduling assignment honoured (issue 48, logic/tas.py): the assignment
read as a real Kueue v0.13.1 wrote it (record 107), turned into the nodes a gang may use with
their counts, and the operator's own placement choosing only among them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.operator.builders import make_node
from tests.operator.fake_cluster import make_job

from railyard.api.trainingjob import TrainingJob
from railyard.logic.placement import Placement, Unplaceable, build_placement_input, plan_placement
from railyard.logic.tas import (
    OUTSIDE,
    AllowedNodes,
    TasDomain,
    TopologyAssignment,
    compute_allowed_nodes,
    decide_outside_assignment,
    read_topology_assignment,
)

RECORD = Path(__file__).resolve().parents[1] / "golden" / "kueue-v0.13-workload"
HOST = "kubernetes.io/hostname"
LEAF = "railyard.dev/leaf"


def _admitted(**pod_sets: dict[str, Any]) -> dict[str, Any]:
    return {"status": {"admission": {"clusterQueue": "cq", "podSetAssignments": [
        {"name": name, "count": sum(d["count"] for d in topology["domains"]), "topologyAssignment": topology}
        for name, topology in pod_sets.items()]}}}


def _by(level: str | list[str], *domains: tuple[str | list[str], int]) -> dict[str, Any]:
    levels = [level] if isinstance(level, str) else level
    return {"levels": levels, "domains": [{"values": [v] if isinstance(v, str) else v, "count": c} for v, c in domains]}


def _nodes() -> list[dict[str, Any]]:
    """Six nodes of 2 GPUs, two per leaf (leaf-0: node-0, node-1; ...)."""
    return [make_node(f"node-{i}", gpus=2, leaf=f"leaf-{i // 2}") for i in range(6)]


def test_the_recorded_assignment_is_read_as_kueue_wrote_it() -> None:
    body = json.loads((RECORD / "107-t12-workload-tas-admitted.json").read_text())["response"]["body"]
    got = read_topology_assignment(body)
    assert got == TopologyAssignment((HOST,), (TasDomain(((HOST, "kq-tas-0"),), 2), TasDomain(((HOST, "kq-tas-1"),), 2)))
    assert got.describe() == "placed inside the topology assignment: 2 domains at level kubernetes.io/hostname"
    assert got.problems() == [
        f"Kueue assigned 2 pods to node kq-tas-{i}, Railyard places one pod per node: request the node's whole "
        "GPUs per pod (procsPerNode, gpusPerPod) so that Kueue assigns one" for i in (0, 1)]


@pytest.mark.parametrize(("workload", "expected"), [
    ({"status": {}}, None),
    ({"status": {"admission": {"podSetAssignments": [{"name": "workers", "count": 2}]}}}, None),
    (_admitted(workers=_by(HOST, ("node-1", 1), ("node-4", 1))),
     TopologyAssignment((HOST,), (TasDomain(((HOST, "node-1"),), 1), TasDomain(((HOST, "node-4"),), 1)))),
    # the spares' pod set counts in the same domains as the workers'
    (_admitted(workers=_by(LEAF, ("leaf-1", 2)), spares=_by(LEAF, ("leaf-1", 1), ("leaf-2", 1))),
     TopologyAssignment((LEAF,), (TasDomain(((LEAF, "leaf-1"),), 3), TasDomain(((LEAF, "leaf-2"),), 1)))),
    # another pod set's assignment is not the job's
    (_admitted(launcher=_by(HOST, ("node-0", 1))), None),
])
def test_reading_the_assignment(workload: dict[str, Any], expected: TopologyAssignment | None) -> None:
    assert read_topology_assignment(workload) == expected


def _assign(level: str | list[str], *domains: tuple[str | list[str], int]) -> TopologyAssignment:
    got = read_topology_assignment(_admitted(workers=_by(level, *domains)))
    assert got is not None
    return got


@pytest.mark.parametrize(("assignment", "allowed", "missing"), [
    # node level: the node itself
    (_assign(HOST, ("node-1", 1), ("node-4", 1)), {"node-1": ("node-1",), "node-4": ("node-4",)}, ()),
    # a higher level: every node carrying the label value
    (_assign(LEAF, ("leaf-1", 1), ("leaf-2", 2)), {"leaf-1": ("node-2", "node-3"), "leaf-2": ("node-4", "node-5")}, ()),
    # several levels: every value must match
    (_assign([LEAF, HOST], (["leaf-0", "node-1"], 1), (["leaf-1", "node-1"], 1)),
     {"leaf-0/node-1": ("node-1",), "leaf-1/node-1": ()}, ("leaf-1/node-1",)),
    # a node gone since the admission
    (_assign(HOST, ("node-9", 1)), {"node-9": ()}, ("node-9",)),
])
def test_the_nodes_each_domain_allows(assignment: TopologyAssignment, allowed: dict[str, tuple[str, ...]],
                                      missing: tuple[str, ...]) -> None:
    got = compute_allowed_nodes(assignment, _nodes())
    assert {d.name: names for d, names in got.domains} == allowed
    assert got.missing == missing
    assert got.nodes == frozenset(n for names in allowed.values() for n in names)


def test_the_node_level_matches_the_nodes_name_without_the_label() -> None:
    node = make_node("node-7")
    del node["metadata"]["labels"][HOST]
    assert compute_allowed_nodes(_assign(HOST, ("node-7", 1)), [node]).nodes == {"node-7"}


NAMES = ("a0", "a1", "a2", "b0", "b1")


def _domains(**counts: tuple[int, tuple[str, ...]]) -> AllowedNodes:
    return AllowedNodes(tuple((TasDomain(((LEAF, name),), count), nodes) for name, (count, nodes) in counts.items()))


@pytest.mark.parametrize(("allowed", "excluded", "usable", "keep", "expected"), [
    # in no domain: outside
    (_domains(a=(3, ("a0", "a1", "a2"))), ("",) * 5, (True,) * 5, (), ("", "", "", OUTSIDE, OUTSIDE)),
    # beyond the count: the usable ones in tree order get it
    (_domains(a=(2, ("a0", "a1", "a2")), b=(1, ("b0", "b1"))), ("",) * 5, (True,) * 5, (),
     ("", "", OUTSIDE, "", OUTSIDE)),
    (_domains(a=(2, ("a0", "a1", "a2")), b=(1, ("b0", "b1"))), ("NotReady", "", "", "", ""),
     (False, True, True, True, True), (), ("NotReady", "", "", "", OUTSIDE)),
    # the gang's nodes first (a restart keeps them), even past usable ones in tree order
    (_domains(a=(2, ("a0", "a1", "a2")), b=(1, ("b0", "b1"))), ("",) * 5, (True,) * 5, ("a2", "b1"),
     ("", OUTSIDE, "", OUTSIDE, "")),
    # too few usable nodes: the unusable ones keep their own reason (the placement says why it waits)
    (_domains(a=(3, ("a0", "a1", "a2"))), ("NotReady", "", "", "", ""), (False, True, True, True, True), (),
     ("NotReady", "", "", OUTSIDE, OUTSIDE)),
])
def test_which_nodes_are_outside(allowed: AllowedNodes, excluded: tuple[str, ...], usable: tuple[bool, ...],
                                 keep: tuple[str, ...], expected: tuple[str, ...]) -> None:
    assert decide_outside_assignment(allowed, names=NAMES, excluded=excluded, usable=usable, keep=keep) == expected


def _job(nodes: int = 2, **gang: Any) -> TrainingJob:
    return TrainingJob.model_validate(make_job("j", nodes=nodes, gang=gang))


def _place(job: TrainingJob, assignment: TopologyAssignment | None, **kw: Any) -> Placement | Unplaceable:
    return plan_placement(build_placement_input(job, nodes=_nodes(), admitted=assignment, **kw))


@pytest.mark.parametrize(("assignment", "gang", "spares"), [
    (None, ["node-0", "node-1"], []),  # the placement's own choice: one leaf, best fit
    (_assign(HOST, ("node-1", 1), ("node-4", 1)), ["node-1", "node-4"], []),
    (_assign(LEAF, ("leaf-1", 1), ("leaf-2", 1)), ["node-2", "node-4"], []),
    (_assign(LEAF, ("leaf-2", 2)), ["node-4", "node-5"], []),
])
def test_the_placement_stays_inside(assignment: TopologyAssignment | None, gang: list[str], spares: list[str]) -> None:
    got = _place(_job(), assignment)
    assert isinstance(got, Placement), got
    assert sorted(got.nodes) == gang and list(got.spares) == spares


def test_a_spare_is_placed_inside_too() -> None:
    """The spares' pod set has the workers' template, so Kueue counts a domain the same whichever
    pod goes there: which of the assigned nodes holds a spare is the placement's (rail-aware) choice,
    here the gang in one leaf."""
    assignment = read_topology_assignment(_admitted(workers=_by(HOST, ("node-1", 1), ("node-4", 1)),
                                                    spares=_by(HOST, ("node-5", 1))))
    got = _place(_job(hotSpares=1), assignment)
    assert isinstance(got, Placement) and got.nodes == ("node-4", "node-5") and got.spares == ("node-1",)


def test_a_replacement_goes_to_an_unused_allowed_node_else_the_job_waits() -> None:
    job = _job(hotSpares=1)
    assignment = read_topology_assignment(_admitted(workers=_by(HOST, ("node-1", 1), ("node-4", 1)),
                                                    spares=_by(HOST, ("node-5", 1))))
    moved = _place(job, assignment, previous_nodes=["node-1", "node-4"], previous_spares=["node-5"], failed={"node-4"})
    assert isinstance(moved, Placement) and moved.nodes == ("node-1", "node-5") and moved.moved == (1,), moved
    alone = _assign(HOST, ("node-1", 1), ("node-4", 1))
    waits = _place(_job(), alone, previous_nodes=["node-1", "node-4"], failed={"node-4"})
    assert isinstance(waits, Unplaceable) and waits.constraint == "capacity", waits
    assert waits.excluded == {OUTSIDE: 4}, "node-4 is failed, every other node but node-1 outside"
    assert f"4 {OUTSIDE}" in waits.message and "1 short" in waits.message


def test_two_pods_on_one_node_cannot_be_honoured_and_the_job_waits() -> None:
    """Railyard places one pod per node: Kueue's two pods on node-1 leave the gang a node short
    (docs/deploy.md, Kueue limits), and the assignment says why."""
    assignment = _assign(HOST, ("node-1", 2))
    got = _place(_job(), assignment)
    assert isinstance(got, Unplaceable) and got.constraint == "capacity" and got.short == 1, got
    assert assignment.problems() and "Kueue assigned 2 pods to node node-1" in assignment.problems()[0]
