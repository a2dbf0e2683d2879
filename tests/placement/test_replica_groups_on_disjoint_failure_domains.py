"""Failure domains: no two replica groups share a leaf switch, rack or NVLink domain when the
topology allows it (groups of whole leaves, placed as blocks), so a switch, rack or power failure
takes at most one group; ``railyard plan`` prints each group's domains and any shared one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from railyard.commands.plan import _groups_summary, plan
from railyard.logic.placement import Placement, compute_shared_domains
from railyard.logic.topology import parse_synthetic_spec, synthetic_levels


def _doc(nodes: int, tp: int, replicas: int, *, pp: int = 1, spares: int = 0) -> dict[str, object]:
    return {"metadata": {"name": "g", "namespace": "ns"}, "spec": {
        "nodes": nodes, "procsPerNode": 8, "parallelism": {"tensor": tp, "pipeline": pp, "dataReplicas": replicas},
        "faultTolerance": {"mode": "ReplicaGroups"}, "gang": {"hotSpares": spares},
        **({"topology": {"nvlinkLevel": "nvidia.com/gpu.clique"}} if tp > 8 else {})}}


ROWS = [
    # id, job, cluster, whether the topology allows disjoint groups
    ("groups of two leaves", _doc(256, 8, 4, pp=4, spares=8), "spine=3,leaf=4,nodes=32", True),
    ("groups of one leaf, cluster partly used", _doc(96, 8, 3, pp=2, spares=4), "spine=2,leaf=3,nodes=32", True),
    ("open count: the operator's choice", _doc(512, 8, 0, pp=8, spares=32), "spine=3,leaf=8,nodes=32", True),
    ("NVLink domains: groups of whole NVL72 racks", _doc(72, 16, 2, spares=0), "spine=1,leaf=2,nodes=36,nvl=18",
     True),
    ("groups of half a leaf share it", _doc(64, 8, 4, spares=0), "spine=1,leaf=2,nodes=32", False),
]


@pytest.mark.parametrize(("doc", "cluster", "disjoint"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_no_two_groups_share_a_failure_domain_when_the_topology_allows(
    doc: dict[str, object], cluster: str, disjoint: bool
) -> None:
    nodes = parse_synthetic_spec(cluster, levels=synthetic_levels(None),
                                 nvlink_key="nvidia.com/gpu.clique")
    req, placed, _ = plan(doc, nodes)
    assert isinstance(placed, Placement), placed
    groups = placed.replica_groups
    assert len(groups) == req.replicas > 1
    leaf_depth = len(req.levels) - (req.nvlink_level in req.levels)
    shared = compute_shared_domains(groups, leaf_depth=leaf_depth)
    assert (shared == {}) is disjoint, shared
    # every leaf-or-deeper domain a group uses is checked, spines are not failure domains here
    assert all(len(path) >= leaf_depth for path in shared)
    text = "\n".join(_groups_summary(placed, req, None))
    assert ("no leaf or NVLink domain holds two replica groups" in text) is disjoint
    for g in groups:
        assert all("/".join(path[1:]) in text for path in g.leaves), "each group's failure domains are printed"


def test_a_shared_domain_names_the_groups_in_it() -> None:
    from railyard.logic.placement.types import GroupPlacement

    a = GroupPlacement(0, (0, 1), ("n0", "n1"), (("s0", "l0"), ("s0", "l1")))
    b = GroupPlacement(1, (2, 3), ("n2", "n3"), (("s0", "l1"), ("s0", "l2")))
    assert compute_shared_domains([a, b]) == {("s0", "l1"): (0, 1)}
    assert compute_shared_domains([a, b], leaf_depth=1) == {("s0",): (0, 1), ("s0", "l1"): (0, 1)}


def test_plan_prints_the_chosen_count_why_and_each_groups_domains(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """``railyard plan`` on a 16,384-GPU job that leaves the count open: the operator's choice,
    its reason and the other counts' expected losses, then every group's failure domains."""
    import yaml

    from railyard.cli import main

    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"apiVersion": "railyard.dev/v1alpha1", "kind": "TrainingJob",
                                   **_doc(2048, 8, 0, pp=16, spares=32)}))
    assert main(["plan", str(job), "--nodes", "spine=9,leaf=8,nodes=32,gpus=8", "--show-pods", "0"]) == 0
    out = capsys.readouterr().out
    chosen = next(line for line in out.splitlines() if line.startswith("replica groups chosen"))
    groups = int(chosen.split("0): ", 1)[1].split()[0])  # "... (parallelism.dataReplicas: 0): N groups of ..."
    assert groups > 1 and 2048 // groups % 32 == 0, chosen
    assert "expected loss by number of groups: 2: " in out
    rows = [line for line in out.splitlines() if line.startswith("    ") and "leaf-" in line and "node-" in line]
    assert len(rows) == groups, "one line per group with its domains"
    assert "no leaf or NVLink domain holds two replica groups" in out
    assert main(["plan", str(job), "--nodes", "spine=9,leaf=8,nodes=32,gpus=8", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["replicaGroupsChosen"]["groups"] == groups and len(doc["placement"]["replicaGroups"]) == groups
