"""`railyard plan` for a faultTolerance ReplicaGroups job: which pods form each replica group,
where each group lands (leaf domains), the re-placement after a failure moving only the failed
node's group, and the Lighthouse pod the operator creates. That these are the operator's own
answers is checked in test_operator_plan_and_simulate_agree.py; here, the output as a table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from railyard.cli import main


def _job(tmp_path: Path, *, nodes: int, procs: int, tensor: int, groups: int, min_replicas: int = 1) -> Path:
    doc = {"apiVersion": "railyard.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "rg", "namespace": "ml"},
           "spec": {"nodes": nodes, "procsPerNode": procs, "parallelism": {"tensor": tensor, "dataReplicas": groups},
                    "faultTolerance": {"mode": "ReplicaGroups", "minReplicas": min_replicas},
                    "gang": {"hotSpares": 1}, "trainer": {"batchSize": nodes * procs}}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _plan(capsys: Any, *argv: str) -> tuple[int, dict[str, Any]]:
    rc = main(["plan", *argv, "--json"])
    return rc, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    ("nodes", "procs", "tensor", "groups", "cluster", "pods", "leaves_per_group"),
    [
        # (cluster: nodes per leaf) groups of 2 pods in leaves of 4 nodes: each group in one leaf
        (4, 2, 1, 2, "spine=1,leaf=2,nodes=4,gpus=2", [[0, 1], [2, 3]], [1, 1]),
        # 3 groups of one 8-GPU pod each (tensor 8 inside the pod)
        (3, 8, 8, 3, "spine=2,leaf=2,nodes=4,gpus=8", [[0], [1], [2]], [1, 1, 1]),
        # groups of 4 pods, leaves of 3 nodes: a group cannot fit one leaf; it takes the fewest, two
        (8, 2, 2, 2, "spine=1,leaf=4,nodes=3,gpus=2", [[0, 1, 2, 3], [4, 5, 6, 7]], [2, 2]),
    ],
)
def test_plan_lists_each_group_its_pods_and_leaf_domains(capsys: Any, tmp_path: Path, nodes: int, procs: int, tensor: int,
                                                         groups: int, cluster: str, pods: list[list[int]],
                                                         leaves_per_group: list[int]) -> None:
    rc, doc = _plan(capsys, str(_job(tmp_path, nodes=nodes, procs=procs, tensor=tensor, groups=groups)), "--nodes", cluster)
    assert rc == 0
    placed = doc["placement"]
    got = placed["replicaGroups"]
    assert [g["pods"] for g in got] == pods
    assert [len(g["leaves"]) for g in got] == leaves_per_group
    assert [n for g in got for n in g["nodes"]] == placed["nodes"], "the groups cover the gang in pod order"
    assert all(g["moved"] == [] for g in got)


def test_plan_shows_the_lighthouse_and_the_groups_in_text(capsys: Any, tmp_path: Path) -> None:
    job = _job(tmp_path, nodes=4, procs=2, tensor=1, groups=2, min_replicas=2)
    assert main(["plan", str(job), "--nodes", "spine=1,leaf=2,nodes=4,gpus=2"]) == 0
    out = capsys.readouterr().out
    assert "replica groups: 2 of 2 pods each (faultTolerance ReplicaGroups), each its own world pp 1 x dp 4 x tp 1" in out
    assert "lighthouse: pod rg-lighthouse at http://rg-lighthouse.rg.ml.svc:" in out
    assert "railyard-train lighthouse --min-replicas 2 --bind [::]:" in out
    assert "created while the gang holds its nodes (Starting, Running, Restarting); recreated when lost" in out
    assert "not chosen by the operator: kube-scheduler places it" in out
    rc, doc = _plan(capsys, str(job), "--nodes", "spine=1,leaf=2,nodes=4,gpus=2")
    lh = doc["placement"]["lighthouse"]
    assert rc == 0
    assert lh["pod"] == "rg-lighthouse" and lh["command"][:4] == ["railyard-train", "lighthouse", "--min-replicas", "2"]


def test_after_a_failure_only_the_failed_nodes_group_moves(capsys: Any, tmp_path: Path) -> None:
    job = str(_job(tmp_path, nodes=6, procs=2, tensor=1, groups=3))
    rc, doc = _plan(capsys, job, "--nodes", "spine=1,leaf=2,nodes=4,gpus=2")
    victim = doc["placement"]["replicaGroups"][1]["nodes"][0]
    rc, doc = _plan(capsys, job, "--nodes", "spine=1,leaf=2,nodes=4,gpus=2", "--fail", victim)
    assert rc == 0
    before, after = doc["placement"]["replicaGroups"], doc["replacement"]["replicaGroups"]
    assert [g["moved"] for g in after] == [[], [2], []]
    assert victim not in after[1]["nodes"]
    assert before[0]["nodes"] == after[0]["nodes"] and before[2]["nodes"] == after[2]["nodes"]


def test_a_job_of_one_world_shows_no_groups_and_no_lighthouse(capsys: Any) -> None:
    job = Path(__file__).parent / "job_small.yaml"
    rc, doc = _plan(capsys, str(job), "--nodes", "spine=2,leaf=4,nodes=4,gpus=8")
    assert rc == 0 and "replicaGroups" not in doc["placement"] and "lighthouse" not in doc["placement"]
