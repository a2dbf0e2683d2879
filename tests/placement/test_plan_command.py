"""`railyard plan`: placement, rank table summary and cost per level, or the reason."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from railyard.api.trainingjob import TrainingJob
from railyard.cli import main
from railyard.logic.placement import build_gang_request
from railyard.logic.topology import build_synthetic_nodes

JOB = Path(__file__).parent / "job_small.yaml"


def test_plan_prints_placement_rank_table_and_cost(capsys):
    assert main(["plan", str(JOB), "--nodes", "spine=2,leaf=4,nodes=4,gpus=8"]) == 0
    out = capsys.readouterr().out
    assert "placed small: 8 pods" in out
    assert "pp 4 x dp 4 x tp 4 = world 64" in out
    assert "rail-aligned" in out
    assert "railyard.dev/spine" in out and "network cost per step" in out


def test_plan_json_with_a_failed_node_shows_sticky_replacement(capsys):
    rc = main(
        ["plan", str(JOB), "--nodes", "spine=2,leaf=4,nodes=4", "--fail", "node-s0-l0-n1", "--json"]
    )
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    first, second = doc["placement"], doc["replacement"]
    assert first["placed"] and second["placed"]
    assert second["moved"] == [first["nodes"].index("node-s0-l0-n1")]
    assert len(set(first["nodes"]) ^ set(second["nodes"])) == 2
    assert first["railsPerDataParallelGroup"] == 1


def test_plan_reports_the_reason_when_unplaceable(capsys, tmp_path):
    nodes = build_synthetic_nodes(2, 2, 3, 8)  # 12 nodes, 6 per spine: 9 needed
    path = tmp_path / "nodes.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": nodes}))
    assert main(["plan", str(JOB), "--nodes", str(path)]) == 3
    out = capsys.readouterr().out
    assert "unplaceable (requiredLevel)" in out
    assert "railyard.dev/spine" in out and "short" in out


def test_plan_refuses_a_bad_nodes_spec(capsys):
    assert main(["plan", str(JOB), "--nodes", "spine=2,leaf=x,nodes=4"]) == 1
    assert "--nodes" in capsys.readouterr().err


def test_gang_request_from_the_trainingjob_model():
    doc = yaml.safe_load(JOB.read_text())
    doc["spec"]["tolerations"] = [
        {"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}
    ]
    req = build_gang_request(TrainingJob.model_validate(doc))
    assert (req.job, req.nodes, req.procs_per_node) == ("small", 8, 8)
    assert (req.pp, req.dp, req.tp) == (4, 4, 4)
    assert req.hot_spares == 1
    assert req.mode == "Required" and req.required_level == "railyard.dev/spine"
    assert req.levels == ("railyard.dev/spine", "railyard.dev/leaf")
    assert req.tolerations[0].key == "dedicated" and req.tolerations[0].operator == "Exists"
    assert req.problems() == []


def test_placement_status_for_the_trainingjob():
    from railyard.logic.placement import (
        Placement,
        Unplaceable,
        build_placement_input,
        plan_placement,
    )
    from railyard.logic.status import placement_status

    job = TrainingJob.model_validate(yaml.safe_load(JOB.read_text()))
    placed = plan_placement(build_placement_input(job, nodes=build_synthetic_nodes(2, 4, 4, 8)))
    assert isinstance(placed, Placement)
    status = placement_status(placed, attempt=2)
    assert status.node_count == 8 and status.rail_aligned and status.attempt == 2 and status.moved == []
    assert status.domains == {"railyard.dev/spine": 1, "railyard.dev/leaf": 2}
    assert status.cross_bytes_per_step["railyard.dev/spine"] == 0
    refused = Unplaceable("capacity", "needs 9 nodes", short=1)
    assert refused.condition_reason == "NotEnoughNodes" and not refused.permanent
    assert refused.message == "needs 9 nodes; 1 nodes short"


def test_generated_nodes_carry_the_jobs_topology_preset_labels(capsys):
    """The README's 16k-GPU example names the topograph preset; nodes from a --nodes spec must
    carry that preset's level keys, or the job's requiredLevel names a level no node has."""
    example = Path(__file__).parents[2] / "examples" / "llama-8b-16k-gpus.yaml"
    assert main(["plan", str(example), "--nodes", "spine=2,leaf=32,nodes=66,gpus=8"]) == 0
    out = capsys.readouterr().out
    assert "placed llama-8b: 2048 pods on 2048 nodes + 16 hot spares" in out
    assert "fabric.topograph.run/tier-1: 1 domains" in out


def test_plan_shows_the_nvlink_domains_and_their_tp_groups(capsys):
    """The NVL72 example: tensor 16 on trays of 4 GPUs, racks of 18 trays (nvl=18)."""
    example = Path(__file__).parents[2] / "examples" / "nvl72-job.yaml"
    spec = "spine=2,leaf=9,nodes=72,gpus=4,nvl=18"
    assert main(["plan", str(example), "--nodes", spec, "--tp-bytes", "32e9"]) == 0
    out = capsys.readouterr().out
    assert "every group inside one domain" in out and "NVLink domains (nvidia.com/gpu.clique): 64 hold" in out
    assert "nvl-0-0-0                    TP groups 0, 1, 2, 3 (16 of its 18 nodes)" in out
    assert "    nvlink " in out and "rail-aligned" in out
    assert main(["plan", str(example), "--nodes", spec, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)["placement"]
    groups = [g for gs in doc["nvlinkDomains"].values() for g in gs]
    assert sorted(groups) == list(range(256)), "every TP group in exactly one domain"
    assert max(len(gs) for gs in doc["nvlinkDomains"].values()) == 4
    assert doc["crossBytesPerStep"]["nvlink"] > 0
    # the same job on nodes without the label: refused, naming the field and the fix
    assert main(["plan", str(example), "--nodes", "spine=2,leaf=9,nodes=72,gpus=4"]) == 3
    out = capsys.readouterr().out
    assert "unplaceable (topology)" in out and "parallelism.tensor 16" in out and "nvidia.com/gpu.clique" in out
