"""The trainer's settings as they travel in ``config.json``: one schema, read by both sides.

The TrainingJob's pydantic models (``railyard.api.trainingjob``) are the CRD; the operator
dumps ``spec.trainer``, ``spec.parallelism`` and ``spec.health`` from them into the job's
config.json. The trainer may not import pydantic, so it reads these frozen stdlib dataclasses
instead. They carry the same wire names (camelCase), defaults, bounds and choices as the
pydantic models, and ``tests/trainer/test_one_schema_for_operator_and_trainer.py`` proves it
field by field: there is no second set of defaults to drift.

:func:`parse` reads a camelCase mapping into one of these classes and reports every problem at
once, each naming its field path; :func:`to_wire` writes one back. Standard library only.
"""

from __future__ import annotations

import math
import types
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields, is_dataclass, replace
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

T = TypeVar("T")


def _c(default: Any, **bounds: Any) -> Any:
    """A field with a default and its bounds (``ge``, ``gt``, ``le``, ``min_length``,
    ``max_length``, as pydantic's ``Field``)."""
    return field(default=default, metadata=bounds)


# --------------------------------------------------------------------------- trainer


@dataclass(frozen=True)
class FaultSpec:
    """One injected fault (tests and demos); applies only in attempt ``attempt``."""

    kind: Literal["crash", "hang", "slow", "bitflip", "exit"]
    rank: int = _c(0, ge=0)
    step: int = _c(1, ge=0)
    factor: float = _c(1.5, ge=1.0, le=100.0)
    target: Literal["param", "grad"] = "param"
    #: bitflip: the bit of the float32 layout (30: top exponent bit; bf16 uses its top 16 bits).
    bit: int = _c(30, ge=0, le=30)
    code: int = _c(1, ge=0, le=255)
    attempt: int = _c(0, ge=0)
    #: faultTolerance ReplicaGroups: only in this replica group (``rank`` is then the group's own
    #: rank); None: in every group.
    group: int | None = _c(None, ge=0)


DATASET_TYPES = ("synthetic", "files", "tokens")
#: The largest vocabulary the trainer takes (token shards hold uint32 ids; a bound keeps a typo
#: from asking for a terabyte embedding).
MAX_VOCAB = 16_777_216


@dataclass(frozen=True)
class Dataset:
    """Training data. ``tokens``: a folder of pre-tokenized shards written by
    ``railyard-train prepare`` (``index.json`` + token files, see docs/trainer.md)."""

    type: Literal["synthetic", "files", "tokens"] = "synthetic"
    path: str | None = _c(None, max_length=4096)
    #: tokens: visit the sequences of each epoch in a seeded random order (else in file order).
    shuffle: bool = True


@dataclass(frozen=True)
class Program:
    """The user's program, started by ``railyard-train`` once per local rank with torchrun's
    environment (docs/trainer.md, "Your own program"). Exactly one of ``script``, ``module``
    and ``command``, as torchrun takes a script, ``-m module`` or ``--no-python command``."""

    script: str | None = _c(None, min_length=1, max_length=4096)
    module: str | None = _c(None, min_length=1, max_length=512)
    command: tuple[str, ...] | None = _c(None, min_length=1, max_length=64)
    args: tuple[str, ...] = _c((), max_length=256)

    @property
    def kinds(self) -> tuple[str, ...]:
        """Which of script/module/command are given (exactly one is valid)."""
        return tuple(k for k in ("script", "module", "command") if getattr(self, k) is not None)


@dataclass(frozen=True)
class TrainerSettings:
    preset: Literal["tiny", "small", "1b", "8b"] = "tiny"
    #: The model's vocabulary. None: the shards' tokenizer's (dataset type tokens), else the
    #: preset's (``railyard_trainer.data.model_vocab_size``).
    vocab_size: int | None = _c(None, ge=1, le=MAX_VOCAB)
    steps: int = _c(100, ge=1, le=100_000_000)
    batch_size: int = _c(8, ge=1, le=1_000_000)
    seq_len: int = _c(128, ge=8, le=1_048_576)
    learning_rate: float = _c(3e-4, gt=0.0, le=1.0)
    warmup_steps: int = _c(10, ge=0)
    weight_decay: float = _c(0.1, ge=0.0, le=1.0)
    grad_clip: float = _c(1.0, ge=0.0)
    seed: int = _c(0, ge=0)
    dataset: Dataset = field(default_factory=Dataset)
    activation_checkpointing: bool = False
    mixed_precision: Literal["auto", "bf16", "fp32"] = "auto"
    cpu_offload: bool = False
    log_every_steps: int = _c(1, ge=1)
    collective_timeout_seconds: float = _c(120.0, gt=0.0, le=3600)
    watchdog_seconds: float = _c(60.0, gt=0.0, le=3600)
    faults: tuple[FaultSpec, ...] = _c((), max_length=32)
    #: None: the bundled trainer; else the user's program under the launcher.
    program: Program | None = None


@dataclass(frozen=True)
class Parallelism:
    tensor: int = _c(1, ge=1, le=64)
    pipeline: int = _c(1, ge=1, le=1024)
    #: None: derived as world size / (tensor x pipeline).
    data: int | None = _c(None, ge=1)
    #: HSDP: the data-parallel ranks form this many replica groups, each sharding the model
    #: over data / dataReplicas ranks. 1: plain FSDP over all data-parallel ranks.
    data_replicas: int = _c(1, ge=1, le=4096)
    pipeline_schedule: Literal["GPipe", "1F1B", "Interleaved1F1B"] = "1F1B"
    #: None: one microbatch per pipeline rank.
    microbatches: int | None = _c(None, ge=1, le=4096)


# --------------------------------------------------------------------------- restarts

#: config.json's ``restartWaitSeconds``: how long a launcher whose workers failed waits for word
#: from the operator before it exits (and the pod fails). The operator writes
#: ``max(RESTART_WAIT_FLOOR_SECONDS, 2 x spec.restartPolicy.inPlaceTimeoutSeconds)``: the in-place
#: restart's window, with room for the backoff; this floor is also the default.
RESTART_WAIT_FLOOR_SECONDS = 60.0


def restart_wait_seconds(in_place_timeout_seconds: float) -> float:
    """The launcher's wait for the operator, from ``spec.restartPolicy.inPlaceTimeoutSeconds``."""
    return max(RESTART_WAIT_FLOOR_SECONDS, 2 * in_place_timeout_seconds)


# --------------------------------------------------------------------------- fault tolerance


@dataclass(frozen=True)
class FaultTolerance:
    """ReplicaGroups: each HSDP replica group is its own world and the cross-replica gradient
    all-reduce goes through torchft (railyard_trainer/replicas.py, docs/fault-tolerance.md)."""

    mode: Literal["None", "ReplicaGroups"] = "None"
    #: The fewest replica groups that may commit a step.
    min_replicas: int = _c(1, ge=1, le=4096)



def world_parallelism(p: Parallelism, ft: FaultTolerance) -> Parallelism:
    """The parallelism of one torch.distributed world: the job's, or with ReplicaGroups one
    replica group's (a world of its own: data / dataReplicas data-parallel ranks, no replicas
    inside; the groups meet through torchft)."""
    if ft.mode != "ReplicaGroups":
        return p
    return replace(p, data=None if p.data is None else p.data // p.data_replicas, data_replicas=1)


# --------------------------------------------------------------------------- health


@dataclass(frozen=True)
class StragglerPolicy:
    threshold: float = _c(0.9, gt=0.0, le=1.0)
    window_steps: int = _c(20, ge=3, le=10000)
    action: Literal["Report", "Restart"] = "Report"


@dataclass(frozen=True)
class SdcPolicy:
    interval_steps: int = _c(50, ge=1)
    action: Literal["Report", "Restart"] = "Restart"
    replay_on_spike: bool = True


@dataclass(frozen=True)
class Health:
    heartbeat_interval_seconds: float = _c(2.0, ge=0.1, le=300)
    heartbeat_timeout_seconds: float = _c(10.0, ge=1, le=3600)
    hang_timeout_seconds: float = _c(10.0, ge=1, le=86400)
    hang_p99_multiplier: float = _c(3.0, ge=1, le=100)
    straggler: StragglerPolicy = field(default_factory=StragglerPolicy)
    sdc: SdcPolicy = field(default_factory=SdcPolicy)


# --------------------------------------------------------------------------- checkpoint tiers


@dataclass(frozen=True)
class MemoryTier:
    enabled: bool = True
    interval_steps: int = _c(10, ge=1)
    keep: int = _c(2, ge=1, le=100)
    replicate: bool = True
    medium: Literal["HostPath", "Pod"] = "HostPath"
    size_limit: str | None = _c(None, min_length=1, max_length=64)
    host_path: str = _c("/dev/shm/railyard", min_length=1, max_length=4096)


@dataclass(frozen=True)
class LocalTier:
    enabled: bool = True
    interval_steps: int = _c(50, ge=1)
    keep: int = _c(2, ge=1, le=100)
    host_path: str = _c("/var/lib/railyard/checkpoints", min_length=1, max_length=4096)


@dataclass(frozen=True)
class SharedTier:
    enabled: bool = True
    interval_steps: int = _c(100, ge=1)
    keep: int = _c(3, ge=1, le=100)
    #: The operator checks it is a DNS subdomain; the trainer never reads it.
    claim_name: str | None = _c(None, max_length=253)
    host_path: str = _c("/mnt/railyard-shared", min_length=1, max_length=4096)


@dataclass(frozen=True)
class Checkpoint:
    memory: MemoryTier = field(default_factory=MemoryTier)
    local: LocalTier = field(default_factory=LocalTier)
    shared: SharedTier = field(default_factory=SharedTier)
    cleanup_on_delete: bool = False


# --------------------------------------------------------------------------- cross-field rules


def trainer_rule_problems(t: TrainerSettings) -> list[str]:
    """The CEL rules of ``railyard.api.trainingjob.SPEC_RULES`` that concern only
    ``spec.trainer``, for configs that never passed an API server (``railyard-train`` by hand).
    A test evaluates both on the same table of cases."""
    out = []
    if t.program is not None and len(t.program.kinds) != 1:
        given = ", ".join(t.program.kinds) or "none"
        out.append(f"trainer.program: name exactly one of script (a Python file), module (python -m) or command (an executable); got {given}")
    if t.dataset.type != "synthetic" and t.dataset.path is None:
        out.append(f"trainer.dataset.path: required when trainer.dataset.type is {t.dataset.type}; name the folder (or file) of the data")
    if not t.watchdog_seconds < t.collective_timeout_seconds:
        out.append(
            f"trainer.watchdogSeconds: {t.watchdog_seconds} must be below trainer.collectiveTimeoutSeconds "
            f"({t.collective_timeout_seconds}) so a hung rank reports itself before its peers time out"
        )
    return out


# --------------------------------------------------------------------------- wire format


def wire_name(name: str) -> str:
    """snake_case -> camelCase, as pydantic's ``to_camel`` (the CRD's field names)."""
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def _is_optional(tp: Any) -> tuple[bool, Any]:
    origin = get_origin(tp)
    if origin is Union or origin is types.UnionType:
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(get_args(tp)) == 2:
            return True, args[0]
    return False, tp


class _Bad:
    """A value that failed to convert (its problem is already recorded)."""


_BAD = _Bad()


def _check_bounds(value: Any, bounds: Mapping[str, Any], where: str, problems: list[str]) -> bool:
    n = len(value) if isinstance(value, str | tuple) else None
    for key, limit in bounds.items():
        if key == "ge" and not value >= limit:
            problems.append(f"{where}: {value!r} is below the minimum {limit}")
        elif key == "gt" and not value > limit:
            problems.append(f"{where}: {value!r} must be above {limit}")
        elif key == "le" and not value <= limit:
            problems.append(f"{where}: {value!r} is above the maximum {limit}")
        elif key == "min_length" and n is not None and n < limit:
            problems.append(f"{where}: must not be empty" if limit == 1 else f"{where}: needs at least {limit} items")
        elif key == "max_length" and n is not None and n > limit:
            problems.append(f"{where}: at most {limit} {'characters' if isinstance(value, str) else 'items'}")
        else:
            continue
        return False
    return True


def _convert(tp: Any, raw: Any, where: str, bounds: Mapping[str, Any], problems: list[str]) -> Any:
    optional, inner = _is_optional(tp)
    if raw is None:
        if optional:
            return None
        problems.append(f"{where}: must not be null")
        return _BAD
    tp = inner
    origin = get_origin(tp)
    if origin is Literal:
        choices = get_args(tp)
        if raw not in choices:
            problems.append(f"{where}: {raw!r} is not one of {', '.join(map(str, choices))}")
            return _BAD
        return raw
    if is_dataclass(tp) and isinstance(tp, type):
        return _parse(tp, raw, where + ".", problems)
    if origin is tuple:
        item_tp = get_args(tp)[0]
        if not isinstance(raw, list | tuple):
            problems.append(f"{where}: expected a list")
            return _BAD
        items = [_convert(item_tp, x, f"{where}[{i}]", {}, problems) for i, x in enumerate(raw)]
        value: Any = tuple(x for x in items if x is not _BAD)
    elif tp is bool:
        if not isinstance(raw, bool):
            problems.append(f"{where}: expected true or false, got {raw!r}")
            return _BAD
        value = raw
    elif tp is int:
        if isinstance(raw, float) and raw.is_integer():
            raw = int(raw)
        if isinstance(raw, bool) or not isinstance(raw, int):
            problems.append(f"{where}: expected a whole number, got {raw!r}")
            return _BAD
        value = raw
    elif tp is float:
        if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw):
            problems.append(f"{where}: expected a finite number, got {raw!r}")
            return _BAD
        value = float(raw)
    elif tp is str:
        if not isinstance(raw, str):
            problems.append(f"{where}: expected a string, got {raw!r}")
            return _BAD
        value = raw
    else:  # pragma: no cover - a field type this reader does not know
        raise TypeError(f"{where}: unsupported field type {tp!r}")
    return value if _check_bounds(value, bounds, where, problems) else _BAD


def _parse(cls: type[T], raw: Any, where: str, problems: list[str]) -> T:
    if raw is None:
        raw = {}
    label = where.rstrip(".") or "config"
    if not isinstance(raw, Mapping):
        problems.append(f"{label}: expected an object, got {type(raw).__name__}")
        raw = {}
    hints = _hints(cls)
    by_wire = {wire_name(f.name): f for f in fields(cls)}  # type: ignore[arg-type]
    for key in raw:
        if key not in by_wire:
            close = [w for w in by_wire if w.lower() == str(key).lower().replace("_", "")]
            hint = f"; did you mean {close[0]!r}?" if close else f"; known fields: {', '.join(sorted(by_wire))}"
            problems.append(f"{where}{key}: unknown field{hint}")
    values: dict[str, Any] = {}
    for wire, f in by_wire.items():
        if wire not in raw:
            if f.default is MISSING and f.default_factory is MISSING:
                problems.append(f"{where}{wire}: required")
                return _BAD  # type: ignore[return-value]
            continue
        v = _convert(hints[f.name], raw[wire], where + wire, f.metadata, problems)
        if v is not _BAD:
            values[f.name] = v
    try:
        return cls(**values)
    except TypeError:  # a required field failed to convert (its problem is recorded)
        return _BAD  # type: ignore[return-value]


class SchemaError(ValueError):
    """Every problem of one config section, each naming its field."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def parse(cls: type[T], raw: Any, *, where: str = "", problems: list[str] | None = None) -> T:
    """``raw`` (camelCase mapping) as ``cls``; missing fields take the schema's defaults.

    With ``problems`` given, problems are appended there and the defaults stand in for bad
    values; without it, :class:`SchemaError` is raised listing all of them.
    """
    out: list[str] = [] if problems is None else problems
    prefix = where + "." if where and not where.endswith(".") else where
    value = _parse(cls, raw, prefix, out)
    if problems is None and out:
        raise SchemaError(out)
    if isinstance(value, _Bad):
        return cls()
    return value


def to_wire(obj: Any) -> Any:
    """A schema dataclass as its camelCase JSON value (None fields omitted, as the operator's
    ``model_dump(exclude_none=True)``)."""
    if is_dataclass(obj) and not isinstance(obj, type):
        return {wire_name(f.name): to_wire(getattr(obj, f.name)) for f in fields(obj) if getattr(obj, f.name) is not None}
    if isinstance(obj, tuple | list):
        return [to_wire(x) for x in obj]
    return obj


def schema_fields(cls: type) -> dict[str, tuple[Any, Any, Mapping[str, Any]]]:
    """wire name -> (type, default, bounds): what the agreement test compares with pydantic."""
    hints = _hints(cls)
    out: dict[str, tuple[Any, Any, Mapping[str, Any]]] = {}
    for f in fields(cls):
        default: Any = f.default
        if f.default_factory is not MISSING:
            default = f.default_factory()
        out[wire_name(f.name)] = (hints[f.name], default, f.metadata)
    return out


__all__ = [
    "DATASET_TYPES",
    "RESTART_WAIT_FLOOR_SECONDS",
    "Checkpoint",
    "Dataset",
    "FaultSpec",
    "FaultTolerance",
    "Health",
    "LocalTier",
    "MemoryTier",
    "Parallelism",
    "Program",
    "SchemaError",
    "SdcPolicy",
    "SharedTier",
    "StragglerPolicy",
    "TrainerSettings",
    "parse",
    "restart_wait_seconds",
    "schema_fields",
    "to_wire",
    "trainer_rule_problems",
    "wire_name",
    "world_parallelism",
]
