"""One schema: each trainer setting is declared once, in railyard.protocol.trainerconfig; the
TrainingJob API holds those sections, the operator writes them into config.json and the trainer
reads them back from it as the same values."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from railyard.api import trainingjob as api
from railyard.api.crd import build_crd
from railyard.api.validation import check_spec_rules
from railyard.logic.manifests import build_trainer_config
from railyard.protocol import trainerconfig as proto
from railyard_trainer.config import TrainerConfig


def test_the_api_holds_the_contracts_sections() -> None:
    """spec.trainer, .parallelism, .faultTolerance, .health and .checkpoint are the contract's
    classes; where the API checks more (Kubernetes names and quantities, list items) a subclass
    narrows the types and keeps every default, bound and description."""
    spec = api.TrainingJobSpec()
    for section, contract in [(spec.parallelism, proto.Parallelism), (spec.health, proto.Health)]:
        assert type(section) is contract
    for section, contract in [(spec.trainer, proto.TrainerSettings), (spec.checkpoint, proto.Checkpoint), (spec.checkpoint.memory, proto.MemoryTier), (spec.checkpoint.shared, proto.SharedTier),
                              (spec.fault_tolerance, proto.FaultTolerance), (spec.fault_tolerance.lighthouse, proto.LighthousePlacement)]:
        assert isinstance(section, contract)
        assert proto.to_wire(section, keep_none=True) == proto.to_wire(contract(), keep_none=True)
        assert [(f.name, f.metadata) for f in dataclasses.fields(section)] == [(f.name, f.metadata) for f in dataclasses.fields(contract)]


def test_what_the_operator_writes_the_trainer_reads_as_the_same_values() -> None:
    spec = api.TrainingJobSpec.model_validate({
        "nodes": 2, "procsPerNode": 2,
        "parallelism": {"tensor": 2, "dataReplicas": 2, "pipeline": 1},
        "trainer": {"preset": "small", "seqLen": 256, "dataset": {"type": "tokens", "path": "/data/s", "shuffle": False},
                    "faults": [{"kind": "bitflip", "target": "grad", "step": 3}]},
        "health": {"sdc": {"intervalSteps": 7}},
    })
    got = TrainerConfig.from_dict(build_trainer_config(spec, job="j", namespace="n", attempt=1))
    assert proto.to_wire(got.trainer) == proto.to_wire(spec.trainer)
    assert got.health == spec.health
    assert (got.parallelism.tensor, got.parallelism.data, got.parallelism.data_replicas) == (2, 2, 2)
    # an empty spec and an empty config.json mean the same job
    empty = TrainerConfig.from_dict({})
    assert empty.trainer == TrainerConfig.from_dict(build_trainer_config(api.TrainingJobSpec(), job="j", namespace="n", attempt=0)).trainer
    assert empty.health == api.Health()


@pytest.mark.parametrize(
    "trainer",
    [
        {},
        {"dataset": {"type": "tokens"}},
        {"dataset": {"type": "files"}},
        {"dataset": {"type": "tokens", "path": "/d"}},
        {"watchdogSeconds": 120, "collectiveTimeoutSeconds": 120},
        {"watchdogSeconds": 30, "collectiveTimeoutSeconds": 60},
        {"dataset": {"type": "files"}, "watchdogSeconds": 200},
        {"program": {"script": "train.py", "args": ["--steps", "5"]}},
        {"program": {"module": "pkg.train"}},
        {"program": {"command": ["./run.sh"]}},
        {"program": {"args": ["--steps", "5"]}},
        {"program": {"script": "train.py", "module": "pkg.train"}},
    ],
)
def test_the_trainer_side_rules_agree_with_the_crd_rules(trainer: dict[str, Any]) -> None:
    cel = {p.path.removeprefix("spec.") for p in check_spec_rules({"trainer": trainer}) if p.path.startswith("spec.trainer")}
    ours = {p.split(":")[0] for p in proto.trainer_rule_problems(proto.parse(proto.TrainerSettings, trainer))}
    assert ours == cel


def test_fault_tolerance_travels_to_the_trainer_and_makes_each_group_its_own_world() -> None:
    spec = api.TrainingJobSpec.model_validate({"nodes": 6, "trainer": {"batchSize": 6}, "parallelism": {"dataReplicas": 3}, "faultTolerance": {"mode": "ReplicaGroups", "minReplicas": 2}})
    cfg = TrainerConfig.from_dict(build_trainer_config(spec, job="j", namespace="n", attempt=0))
    assert (cfg.fault_tolerance.mode, cfg.fault_tolerance.min_replicas) == ("ReplicaGroups", 2)
    world = proto.world_parallelism(cfg.parallelism, cfg.fault_tolerance)
    assert (world.data, world.data_replicas) == (2, 1)  # one group: 6 / 3 data-parallel ranks
    plain = proto.world_parallelism(cfg.parallelism, proto.FaultTolerance())
    assert (plain.data, plain.data_replicas) == (6, 3)


@pytest.mark.parametrize(("data_replicas", "min_replicas", "mode"), [
    (1, 1, "None"), (3, 1, "ReplicaGroups"), (3, 3, "ReplicaGroups"), (2, 3, "ReplicaGroups"), (1, 2, "None"),
])
def test_the_min_replicas_rule_is_one_rule_for_the_crd_and_the_trainer(data_replicas: int, min_replicas: int,
                                                                        mode: str) -> None:
    parallelism, fault_tolerance = {"dataReplicas": data_replicas}, {"mode": mode, "minReplicas": min_replicas}
    spec = {"nodes": 6, "parallelism": parallelism, "faultTolerance": fault_tolerance}
    cel = {p.path.removeprefix("spec.") for p in check_spec_rules(spec) if p.path == "spec.faultTolerance.minReplicas"}
    problems = proto.min_replicas_problems(proto.parse(proto.FaultTolerance, fault_tolerance),
                                           proto.parse(proto.Parallelism, parallelism))
    ours = {p.split(":")[0] for p in problems}
    assert ours == cel
    assert bool(ours) == (min_replicas > data_replicas)


def test_config_json_is_the_declared_envelope_around_the_declared_sections() -> None:
    """config.json's own fields are the contract's AttemptEnvelope: what the operator writes for an
    attempt the trainer reads back as the same values, and nothing else is at the top level."""
    spec = api.TrainingJobSpec.model_validate({"restartPolicy": {"inPlaceTimeoutSeconds": 90}})
    hint = {"tier": "local", "step": 40, "lastStep": 43}
    written = build_trainer_config(spec, job="j", namespace="n", attempt=3, restore=hint)
    assert set(written) == set(proto.TOP_LEVEL)
    got = TrainerConfig.from_dict(written)
    want = proto.AttemptEnvelope(job="j", namespace="n", attempt=3, restore=hint, restart_wait_seconds=180.0)
    assert got.envelope() == want
    assert TrainerConfig.from_dict(got.to_dict()) == got
    with pytest.raises(ValueError) as err:
        TrainerConfig.from_dict({"job": "", "attempt": -1, "restore": "memory"})
    assert {p.split(":")[0] for p in err.value.problems} == {"job", "attempt", "restore"}  # type: ignore[attr-defined]


def test_the_trainer_reads_the_checkpoint_section_with_the_crds_fields_and_its_own() -> None:
    """checkpoint: each of the CRD's tier settings is the contract's, read by the contract; the
    trainer-only ones (a tier's dir, timeoutSeconds) extend it and never reach the CRD."""
    from railyard_trainer.checkpoint.settings import (
        CheckpointConfigError,
        parse_checkpoint_settings,
    )

    for crd, ours in [(proto.Checkpoint, proto.CheckpointConfig), (proto.MemoryTier, proto.MemoryTierConfig),
                      (proto.LocalTier, proto.LocalTierConfig), (proto.SharedTier, proto.SharedTierConfig)]:
        theirs = {f.name: f.metadata for f in dataclasses.fields(crd)}
        assert {f.name: f.metadata for f in dataclasses.fields(ours) if f.name in theirs} == theirs
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    crd = schema["properties"]["spec"]["properties"]["checkpoint"]
    assert "timeoutSeconds" not in crd["properties"] and "keep" in crd["properties"]["local"]["properties"]
    assert not any("dir" in crd["properties"][tier]["properties"] for tier in ("memory", "local", "shared"))
    spec = api.TrainingJobSpec.model_validate({"checkpoint": {"memory": {"medium": "Pod", "keep": 4}}})
    written = build_trainer_config(spec, job="j", namespace="n", attempt=0)
    s = parse_checkpoint_settings(written["checkpoint"], env={"RAILYARD_CHECKPOINT_MEMORY_DIR": "/m"})
    assert (s.tier("memory").keep, s.tier("memory").root, s.tier("memory").replicate) == (4, "/m", True)
    assert parse_checkpoint_settings({"local": {"dir": "/l"}, "timeoutSeconds": 9}, env={}).tier("local").root == "/l"
    with pytest.raises(CheckpointConfigError) as err:
        parse_checkpoint_settings({"local": {"replicate": True}, "timeoutSeconds": 0}, env={})
    assert [p.split(":")[0] for p in err.value.problems] == ["checkpoint.local.replicate", "checkpoint.timeoutSeconds"]
