"""One schema: the trainer reads config.json with railyard.protocol.trainerconfig, the operator
writes it from the CRD's pydantic models. Every field, wire name, default, bound and choice of
the two must agree, and what the operator writes must read back as the same values."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal, get_args, get_origin

import annotated_types as at
import pytest
from pydantic import BaseModel

from railyard.api import trainingjob as api
from railyard.api.validation import check_spec_rules
from railyard.logic.manifests import build_trainer_config
from railyard.protocol import trainerconfig as proto
from railyard_trainer.config import TrainerConfig

PAIRS: list[tuple[type[BaseModel], type]] = [
    (api.TrainerSettings, proto.TrainerSettings),
    (api.Dataset, proto.Dataset),
    (api.FaultSpec, proto.FaultSpec),
    (api.Parallelism, proto.Parallelism),
    (api.Health, proto.Health),
    (api.FaultTolerance, proto.FaultTolerance),
    (api.StragglerPolicy, proto.StragglerPolicy),
    (api.SdcPolicy, proto.SdcPolicy),
    (api.Checkpoint, proto.Checkpoint),
    (api.MemoryTier, proto.MemoryTier),
    (api.LocalTier, proto.LocalTier),
    (api.SharedTier, proto.SharedTier),
]
_BOUNDS = {at.Ge: ("ge", "ge"), at.Gt: ("gt", "gt"), at.Le: ("le", "le"), at.Lt: ("lt", "lt"),
           at.MinLen: ("min_length", "min_length"), at.MaxLen: ("max_length", "max_length")}


def _bounds(metadata: list[Any]) -> dict[str, Any]:
    out = {}
    for m in metadata:
        for cls, (attr, key) in _BOUNDS.items():
            if isinstance(m, cls):
                out[key] = getattr(m, attr)
    return out


def _nested_metadata(tp: Any) -> list[Any]:
    """Constraints carried inside a field's type (``Optional[Annotated[str, Field(max_length=...)]]``)."""
    out: list[Any] = []
    origin = get_origin(tp)
    if origin is typing.Annotated:
        for m in get_args(tp)[1:]:
            out.extend(getattr(m, "metadata", None) or [m])
        out.extend(_nested_metadata(get_args(tp)[0]))
    elif origin in (typing.Union, types.UnionType):
        for a in get_args(tp):
            out.extend(_nested_metadata(a))
    return out


def _shape(tp: Any) -> Any:
    """A comparable description of a field type: Literal choices, optional, list/tuple items."""
    origin = get_origin(tp)
    if origin is typing.Annotated:
        return _shape(get_args(tp)[0])
    if origin in (typing.Union, types.UnionType):
        return ("optional", *sorted(str(_shape(a)) for a in get_args(tp) if a is not type(None)))
    if origin is Literal:
        return ("choices", get_args(tp))
    if origin in (list, tuple):
        return ("items", _shape(get_args(tp)[0]))
    if isinstance(tp, type) and (issubclass(tp, BaseModel) or hasattr(tp, "__dataclass_fields__")):
        return ("object", tp.__name__)
    return tp.__name__


def _plain_default(v: Any) -> Any:
    if isinstance(v, BaseModel):
        return v.model_dump(by_alias=True, exclude_none=True, mode="json")
    if hasattr(v, "__dataclass_fields__"):
        return proto.to_wire(v)
    if isinstance(v, list | tuple):
        return [_plain_default(x) for x in v]
    return v


@pytest.mark.parametrize(("model", "schema"), PAIRS, ids=[m.__name__ for m, _ in PAIRS])
def test_every_field_default_bound_and_choice_agrees(model: type[BaseModel], schema: type) -> None:
    ours = proto.schema_fields(schema)
    theirs = {f.alias or name: f for name, f in model.model_fields.items()}
    assert set(ours) == set(theirs), f"{model.__name__}: fields differ"
    hints = typing.get_type_hints(model, include_extras=True)
    by_alias = {f.alias or n: n for n, f in model.model_fields.items()}
    for wire, (tp, default, bounds) in ours.items():
        f = theirs[wire]
        name = by_alias[wire]
        assert _shape(tp) == _shape(hints[name]), f"{model.__name__}.{wire}: type"
        if f.is_required():
            assert default is dataclasses.MISSING, f"{model.__name__}.{wire}: required on one side only"
        else:
            assert _plain_default(default) == _plain_default(f.default), f"{model.__name__}.{wire}: default"
        assert dict(bounds) == _bounds([*f.metadata, *_nested_metadata(hints[name])]), f"{model.__name__}.{wire}: bounds"


def test_what_the_operator_writes_the_trainer_reads_as_the_same_values() -> None:
    spec = api.TrainingJobSpec.model_validate({
        "nodes": 2, "procsPerNode": 2,
        "parallelism": {"tensor": 2, "dataReplicas": 2, "pipeline": 1},
        "trainer": {"preset": "small", "seqLen": 256, "dataset": {"type": "tokens", "path": "/data/s", "shuffle": False},
                    "faults": [{"kind": "bitflip", "target": "grad", "step": 3}]},
        "health": {"sdc": {"intervalSteps": 7}},
    })
    got = TrainerConfig.from_dict(build_trainer_config(spec, job="j", namespace="n", attempt=1))
    assert proto.to_wire(got.trainer) == spec.trainer.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert proto.to_wire(got.health) == spec.health.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert (got.parallelism.tensor, got.parallelism.data, got.parallelism.data_replicas) == (2, 2, 2)
    # an empty spec and an empty config.json mean the same job
    empty = TrainerConfig.from_dict({})
    assert empty.trainer == TrainerConfig.from_dict(build_trainer_config(api.TrainingJobSpec(), job="j", namespace="n", attempt=0)).trainer
    assert empty.health == proto.parse(proto.Health, api.Health().model_dump(by_alias=True))


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
