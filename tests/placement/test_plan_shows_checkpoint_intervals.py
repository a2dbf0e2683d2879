"""`railyard plan` prints the checkpoint intervals the operator writes into config.json and why
(railyard.logic.intervals): the rule's where the spec leaves one open, the spec's where it sets
one, each with its inputs and their sources; --step-time and --save-stall give a job's own figures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from railyard.api.trainingjob import TrainingJob
from railyard.cli import main
from railyard.logic.intervals import build_interval_inputs, decide_intervals
from railyard.logic.manifests.config import build_trainer_config


def _job(tmp_path: Path, **spec: Any) -> tuple[Path, dict[str, Any]]:
    doc = {"apiVersion": "railyard.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "ck", "namespace": "ml"},
           "spec": {"nodes": 4, "procsPerNode": 2, **spec}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path, doc


def test_plan_prints_what_the_operator_writes_and_why(capsys: Any, tmp_path: Path) -> None:
    path, doc = _job(tmp_path, checkpoint={"shared": {"intervalSteps": 500}})
    assert main(["plan", str(path), "--nodes", "spine=1,leaf=2,nodes=4,gpus=2", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["checkpointIntervals"]
    config = build_trainer_config(TrainingJob.model_validate(doc).spec, job="ck", namespace="ml", attempt=0)
    assert {t["tier"]: t["steps"] for t in shown["tiers"]} == {
        t: config["checkpoint"][t]["intervalSteps"] for t in ("memory", "local", "shared")}
    by_tier = {t["tier"]: t for t in shown["tiers"]}
    assert by_tier["shared"]["chosenBy"] == "spec" and by_tier["memory"]["chosenBy"] == "rule"
    assert "protects against" in by_tier["memory"]["reason"] and "Young/Daly" in by_tier["memory"]["reason"]
    assert any("bench/results/checkpoint.json" in line for line in shown["inputs"])
    assert any("Llama 3 Table 5" in line for line in shown["inputs"])


def test_the_jobs_own_figures_change_the_answer_and_the_text_shows_it(capsys: Any, tmp_path: Path) -> None:
    path, doc = _job(tmp_path)
    args = ["plan", str(path), "--nodes", "spine=1,leaf=2,nodes=4,gpus=2", "--step-time", "0.5", "--save-stall", "2"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "checkpoint intervals" in out and "step time 0.5 s (--step-time)" in out
    spec = TrainingJob.model_validate(doc).spec
    default = {c.tier: c.steps for c in decide_intervals(build_interval_inputs(spec))}
    memory_line = next(line for line in out.splitlines() if line.strip().startswith("memory every"))
    assert "save stall 2 s" in memory_line
    assert memory_line.split()[2] != str(default["memory"])


def test_figures_that_cannot_be_are_refused_with_their_option(capsys: Any, tmp_path: Path) -> None:
    path, _ = _job(tmp_path)
    nodes = ["--nodes", "spine=1,leaf=2,nodes=4,gpus=2"]
    assert main(["plan", str(path), *nodes, "--step-time", "0"]) == 1
    assert "step time: must be > 0 s, got 0.0 (--step-time)" in capsys.readouterr().err
    assert main(["plan", str(path), *nodes, "--save-stall", "-1"]) == 1
    err = capsys.readouterr().err
    assert "memory save: stall must be >= 0 s, got -1.0 (--save-stall)" in err and "shared save" in err
