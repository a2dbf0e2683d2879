"""The trainer's configuration, parsed from the operator's ``config.json`` (torch-free).

The operator writes ``config.json`` from the TrainingJob spec (camelCase keys, as in the CRD).
This module turns it into frozen dataclasses with defaults that work, and reports every problem
at once, each naming its field. It must not import torch: tests, the operator's tools and the
launcher's parent process import it cheaply.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

PRESETS = ("tiny", "small", "1b", "8b")
DATASET_TYPES = ("synthetic", "files")
MIXED_PRECISION = ("auto", "bf16", "fp32")
SCHEDULES = ("GPipe", "1F1B", "Interleaved1F1B")
FAULT_KINDS = ("crash", "hang", "slow", "bitflip", "exit")
FAULT_TARGETS = ("param", "grad")


class ConfigError(ValueError):
    """A configuration that cannot run; the launcher exits with CONFIG_PERMANENT."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class FaultSpec:
    """One injected fault (tests and demos). Applies only in attempt ``attempt``."""

    kind: str
    rank: int = 0
    step: int = 1
    #: slow: compute takes ``factor`` times as long from ``step`` on.
    factor: float = 2.0
    #: bitflip: which tensor of the rank gets one high-order bit flipped.
    target: str = "param"
    #: exit: the process exit code.
    code: int = 1
    attempt: int = 0


@dataclass(frozen=True)
class DatasetConfig:
    type: str = "synthetic"
    #: files: a file or a directory of text files (read as bytes, tokens 0..255).
    path: str = ""


@dataclass(frozen=True)
class TrainingConfig:
    preset: str = "tiny"
    steps: int = 100
    #: Global batch size in sequences (split over the data-parallel ranks).
    batch_size: int = 8
    seq_len: int = 64
    learning_rate: float = 3e-3
    warmup_steps: int = 10
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    activation_checkpointing: bool = False
    mixed_precision: str = "auto"
    cpu_offload: bool = False
    log_every_steps: int = 1
    faults: tuple[FaultSpec, ...] = ()
    #: A collective that does not finish within this fails the rank (INFRASTRUCTURE).
    collective_timeout_s: float = 120.0
    #: The rank's own watchdog: no step progress for this long exits with HANG_OR_STRAGGLER.
    #: Kept below collective_timeout_s so a hung rank reports itself before its peers time out.
    watchdog_s: float = 60.0


@dataclass(frozen=True)
class ParallelismConfig:
    tensor: int = 1
    pipeline: int = 1
    #: -1 or 0: derived as world_size / (tensor * pipeline).
    data: int = -1
    pipeline_schedule: str = "1F1B"
    #: 0: one microbatch per pipeline stage.
    microbatches: int = 0


@dataclass(frozen=True)
class TrainerConfig:
    job: str = "local"
    namespace: str = "default"
    attempt: int = 0
    trainer: TrainingConfig = field(default_factory=TrainingConfig)
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    #: Passed through untouched to railyard_trainer.checkpoint.
    checkpoint: dict[str, Any] = field(default_factory=dict)
    #: Passed through untouched to railyard_trainer.health.
    health: dict[str, Any] = field(default_factory=dict)
    #: Operator hint {"tier", "step"}; None: the checkpointer picks the newest verified one.
    restore: dict[str, Any] | None = None

    @classmethod
    def from_dict(cls, raw: Any) -> TrainerConfig:
        return _parse(raw)

    def to_dict(self) -> dict[str, Any]:
        t, p = self.trainer, self.parallelism
        return {
            "job": self.job,
            "namespace": self.namespace,
            "attempt": self.attempt,
            "trainer": {
                "preset": t.preset,
                "steps": t.steps,
                "batchSize": t.batch_size,
                "seqLen": t.seq_len,
                "learningRate": t.learning_rate,
                "warmupSteps": t.warmup_steps,
                "weightDecay": t.weight_decay,
                "gradClip": t.grad_clip,
                "seed": t.seed,
                "dataset": {"type": t.dataset.type, "path": t.dataset.path},
                "activationCheckpointing": t.activation_checkpointing,
                "mixedPrecision": t.mixed_precision,
                "cpuOffload": t.cpu_offload,
                "logEverySteps": t.log_every_steps,
                "collectiveTimeoutSeconds": t.collective_timeout_s,
                "watchdogSeconds": t.watchdog_s,
                "faults": [
                    {
                        "kind": f.kind,
                        "rank": f.rank,
                        "step": f.step,
                        "factor": f.factor,
                        "target": f.target,
                        "code": f.code,
                        "attempt": f.attempt,
                    }
                    for f in t.faults
                ],
            },
            "parallelism": {
                "tensor": p.tensor,
                "pipeline": p.pipeline,
                "data": p.data,
                "pipelineSchedule": p.pipeline_schedule,
                "microbatches": p.microbatches,
            },
            "checkpoint": dict(self.checkpoint),
            "health": dict(self.health),
            "restore": None if self.restore is None else dict(self.restore),
        }

    def with_overrides(self, **trainer_fields: Any) -> TrainerConfig:
        """A copy with some ``trainer`` fields replaced (snake_case names)."""
        return replace(self, trainer=replace(self.trainer, **trainer_fields))

    def active_faults(self) -> tuple[FaultSpec, ...]:
        """Faults that apply to this attempt: a restarted gang does not re-inject."""
        return tuple(f for f in self.trainer.faults if f.attempt == self.attempt)


def load_config(path: str | Path) -> TrainerConfig:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError([f"RAILYARD_CONFIG: cannot read {p} ({exc.strerror}); mount the job ConfigMap at /etc/railyard"]) from exc
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise ConfigError([f"{p}: not valid JSON ({exc})"]) from exc
    return TrainerConfig.from_dict(raw)


class _Reader:
    """Reads typed fields out of nested dicts, collecting every problem with its path."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def obj(self, d: dict[str, Any], key: str, where: str) -> dict[str, Any]:
        v = d.get(key)
        if v is None:
            return {}
        if not isinstance(v, dict):
            self.problems.append(f"{where}{key}: expected an object, got {type(v).__name__}")
            return {}
        return v

    def int_(self, d: dict[str, Any], key: str, where: str, default: int, *, minimum: int | None = None) -> int:
        v = d.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int):
            if isinstance(v, float) and v.is_integer():
                v = int(v)
            else:
                self.problems.append(f"{where}{key}: expected an integer, got {v!r}")
                return default
        if minimum is not None and v < minimum:
            self.problems.append(f"{where}{key}: {v} is below the minimum {minimum}")
            return default
        return v

    def float_(self, d: dict[str, Any], key: str, where: str, default: float, *, minimum: float | None = None, exclusive: bool = False) -> float:
        v = d.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            self.problems.append(f"{where}{key}: expected a finite number, got {v!r}")
            return default
        if minimum is not None and (v <= minimum if exclusive else v < minimum):
            bound = "above" if exclusive else "at least"
            self.problems.append(f"{where}{key}: {v} must be {bound} {minimum}")
            return default
        return float(v)

    def bool_(self, d: dict[str, Any], key: str, where: str, default: bool) -> bool:
        v = d.get(key, default)
        if not isinstance(v, bool):
            self.problems.append(f"{where}{key}: expected true or false, got {v!r}")
            return default
        return v

    def str_(self, d: dict[str, Any], key: str, where: str, default: str, *, choices: tuple[str, ...] | None = None) -> str:
        v = d.get(key, default)
        if not isinstance(v, str):
            self.problems.append(f"{where}{key}: expected a string, got {v!r}")
            return default
        if choices is not None and v not in choices:
            self.problems.append(f"{where}{key}: {v!r} is not one of {', '.join(choices)}")
            return default
        return v


def _parse(raw: Any) -> TrainerConfig:
    if not isinstance(raw, dict):
        raise ConfigError(["config: expected a JSON object"])
    r = _Reader()
    d = TrainingConfig()
    t = r.obj(raw, "trainer", "")
    ds = r.obj(t, "dataset", "trainer.")
    dataset = DatasetConfig(
        type=r.str_(ds, "type", "trainer.dataset.", d.dataset.type, choices=DATASET_TYPES),
        path=r.str_(ds, "path", "trainer.dataset.", ""),
    )
    if dataset.type == "files" and not dataset.path:
        r.problems.append("trainer.dataset.path: required when trainer.dataset.type is 'files'")
    faults_raw = t.get("faults", [])
    faults: list[FaultSpec] = []
    if not isinstance(faults_raw, list):
        r.problems.append("trainer.faults: expected a list")
        faults_raw = []
    for i, f in enumerate(faults_raw):
        w = f"trainer.faults[{i}]."
        if not isinstance(f, dict):
            r.problems.append(f"trainer.faults[{i}]: expected an object")
            continue
        faults.append(
            FaultSpec(
                kind=r.str_(f, "kind", w, "crash", choices=FAULT_KINDS),
                rank=r.int_(f, "rank", w, 0, minimum=0),
                step=r.int_(f, "step", w, 1, minimum=1),
                factor=r.float_(f, "factor", w, 2.0, minimum=1.0),
                target=r.str_(f, "target", w, "param", choices=FAULT_TARGETS),
                code=r.int_(f, "code", w, 1, minimum=0),
                attempt=r.int_(f, "attempt", w, 0, minimum=0),
            )
        )
    training = TrainingConfig(
        preset=r.str_(t, "preset", "trainer.", d.preset, choices=PRESETS),
        steps=r.int_(t, "steps", "trainer.", d.steps, minimum=1),
        batch_size=r.int_(t, "batchSize", "trainer.", d.batch_size, minimum=1),
        seq_len=r.int_(t, "seqLen", "trainer.", d.seq_len, minimum=2),
        learning_rate=r.float_(t, "learningRate", "trainer.", d.learning_rate, minimum=0.0, exclusive=True),
        warmup_steps=r.int_(t, "warmupSteps", "trainer.", d.warmup_steps, minimum=0),
        weight_decay=r.float_(t, "weightDecay", "trainer.", d.weight_decay, minimum=0.0),
        grad_clip=r.float_(t, "gradClip", "trainer.", d.grad_clip, minimum=0.0),
        seed=r.int_(t, "seed", "trainer.", d.seed, minimum=0),
        dataset=dataset,
        activation_checkpointing=r.bool_(t, "activationCheckpointing", "trainer.", d.activation_checkpointing),
        mixed_precision=r.str_(t, "mixedPrecision", "trainer.", d.mixed_precision, choices=MIXED_PRECISION),
        cpu_offload=r.bool_(t, "cpuOffload", "trainer.", d.cpu_offload),
        log_every_steps=r.int_(t, "logEverySteps", "trainer.", d.log_every_steps, minimum=1),
        faults=tuple(faults),
        collective_timeout_s=r.float_(t, "collectiveTimeoutSeconds", "trainer.", d.collective_timeout_s, minimum=0.0, exclusive=True),
        watchdog_s=r.float_(t, "watchdogSeconds", "trainer.", d.watchdog_s, minimum=0.0, exclusive=True),
    )
    if training.watchdog_s >= training.collective_timeout_s:
        r.problems.append(
            f"trainer.watchdogSeconds: {training.watchdog_s} must be below trainer.collectiveTimeoutSeconds "
            f"({training.collective_timeout_s}) so a hung rank reports itself before its peers time out"
        )
    pd = ParallelismConfig()
    p = r.obj(raw, "parallelism", "")
    parallelism = ParallelismConfig(
        tensor=r.int_(p, "tensor", "parallelism.", pd.tensor, minimum=1),
        pipeline=r.int_(p, "pipeline", "parallelism.", pd.pipeline, minimum=1),
        data=r.int_(p, "data", "parallelism.", pd.data, minimum=-1),
        pipeline_schedule=r.str_(p, "pipelineSchedule", "parallelism.", pd.pipeline_schedule, choices=SCHEDULES),
        microbatches=r.int_(p, "microbatches", "parallelism.", pd.microbatches, minimum=0),
    )
    restore = raw.get("restore")
    if restore is not None and not isinstance(restore, dict):
        r.problems.append("restore: expected an object {tier, step} or null")
        restore = None
    cfg = TrainerConfig(
        job=r.str_(raw, "job", "", "local"),
        namespace=r.str_(raw, "namespace", "", "default"),
        attempt=r.int_(raw, "attempt", "", 0, minimum=0),
        trainer=training,
        parallelism=parallelism,
        checkpoint=r.obj(raw, "checkpoint", ""),
        health=r.obj(raw, "health", ""),
        restore=restore,
    )
    if r.problems:
        raise ConfigError(r.problems)
    return cfg
