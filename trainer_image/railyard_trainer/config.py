"""The trainer's configuration, parsed from the operator's ``config.json`` (torch-free).

The operator writes ``config.json`` from the TrainingJob spec (camelCase keys, as in the CRD).
The sections ``trainer``, ``parallelism``, ``health`` and ``faultTolerance`` and the envelope
around them (``job``, ``namespace``, ``attempt``, ``restore``, ``restartWaitSeconds``:
``AttemptEnvelope``) are read with the contract both sides share,
:mod:`railyard.protocol.trainerconfig`, where each setting is declared once (the CRD is generated
from the same classes), so there is no second set of defaults here. ``checkpoint`` is handed to
:mod:`railyard_trainer.checkpoint.settings`, which reads it with the same contract
(``CheckpointConfig``). Every problem is reported at once, each naming its field. This
module must not import torch: tests, the operator's tools and the launcher's parent process
import it cheaply.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from railyard.protocol import podenv
from railyard.protocol.trainerconfig import (
    RESTART_WAIT_FLOOR_SECONDS,
    SECTIONS,
    TOP_LEVEL,
    AttemptEnvelope,
    Dataset,
    FaultSpec,
    FaultTolerance,
    Health,
    Parallelism,
    TrainerSettings,
    min_replicas_problems,
    parse,
    to_wire,
    trainer_rule_problems,
)

# The schema's classes under the names the trainer's modules use.
DatasetConfig = Dataset
TrainingConfig = TrainerSettings
ParallelismConfig = Parallelism

__all__ = [
    "ConfigError",
    "DatasetConfig",
    "FaultSpec",
    "FaultTolerance",
    "Health",
    "ParallelismConfig",
    "TrainerConfig",
    "TrainingConfig",
    "load_config",
]


class ConfigError(ValueError):
    """A configuration that cannot run; the launcher exits with CONFIG_PERMANENT."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class TrainerConfig:
    job: str = "local"
    namespace: str = "default"
    attempt: int = 0
    trainer: TrainerSettings = field(default_factory=TrainerSettings)
    parallelism: Parallelism = field(default_factory=Parallelism)
    #: Read by railyard_trainer.checkpoint (tier objects, or the plain form {path, intervalSteps}).
    checkpoint: dict[str, Any] = field(default_factory=dict)
    health: Health = field(default_factory=Health)
    #: Replica-group fault tolerance (railyard_trainer.replicas).
    fault_tolerance: FaultTolerance = field(default_factory=FaultTolerance)
    #: Operator hint {"tier", "step"}; None: the checkpointer picks the newest verified one.
    restore: dict[str, Any] | None = None
    #: How long the launcher waits for the operator after its workers failed
    #: (railyard.protocol.trainerconfig.restart_wait_seconds; railyard_trainer.inplace).
    restart_wait_seconds: float = RESTART_WAIT_FLOOR_SECONDS

    @classmethod
    def from_dict(cls, raw: Any) -> TrainerConfig:
        return _parse(raw)

    def envelope(self) -> AttemptEnvelope:
        """config.json's own fields of this config."""
        return AttemptEnvelope(
            job=self.job, namespace=self.namespace, attempt=self.attempt,
            restore=None if self.restore is None else dict(self.restore),
            restart_wait_seconds=self.restart_wait_seconds,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            **to_wire(self.envelope(), keep_none=True),
            "trainer": to_wire(self.trainer),
            "parallelism": to_wire(self.parallelism),
            "checkpoint": dict(self.checkpoint),
            "health": to_wire(self.health),
            "faultTolerance": to_wire(self.fault_tolerance),
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
        raise ConfigError(
            [f"{podenv.CONFIG.name}: cannot read {p} ({exc.strerror}); mount the job ConfigMap at /etc/railyard"]
        ) from exc
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise ConfigError([f"{p}: not valid JSON ({exc})"]) from exc
    return TrainerConfig.from_dict(raw)


def _parse(raw: Any) -> TrainerConfig:
    if not isinstance(raw, dict):
        raise ConfigError(["config: expected a JSON object"])
    known = ", ".join(TOP_LEVEL)
    problems: list[str] = [f"{k}: unknown top-level field; known: {known}" for k in raw if k not in TOP_LEVEL]
    trainer = parse(TrainerSettings, raw.get("trainer"), where="trainer", problems=problems)
    parallelism = parse(Parallelism, raw.get("parallelism"), where="parallelism", problems=problems)
    health = parse(Health, raw.get("health"), where="health", problems=problems)
    fault_tolerance = parse(FaultTolerance, raw.get("faultTolerance"), where="faultTolerance", problems=problems)
    problems.extend(min_replicas_problems(fault_tolerance, parallelism))
    # A field that is itself invalid already has its problem; its rule would only repeat it.
    invalid = {p.split(":")[0] for p in problems}
    problems.extend(p for p in trainer_rule_problems(trainer) if p.split(":")[0] not in invalid)
    checkpoint = raw.get("checkpoint")
    if checkpoint is None:
        checkpoint = {}
    elif not isinstance(checkpoint, dict):
        problems.append("checkpoint: expected an object")
        checkpoint = {}
    # the envelope: config.json's own fields (the sections are read above)
    own = {k: v for k, v in raw.items() if k in TOP_LEVEL and k not in SECTIONS}
    envelope = parse(AttemptEnvelope, own, problems=problems)
    if problems:
        raise ConfigError(problems)
    return TrainerConfig(
        job=envelope.job, namespace=envelope.namespace, attempt=envelope.attempt, trainer=trainer,
        parallelism=parallelism, checkpoint=checkpoint, health=health, fault_tolerance=fault_tolerance,
        restore=envelope.restore,
        restart_wait_seconds=envelope.restart_wait_seconds,
    )
