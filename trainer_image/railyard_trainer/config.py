"""The trainer's configuration, parsed from the operator's ``config.json`` (torch-free).

The operator writes ``config.json`` from the TrainingJob spec (camelCase keys, as in the CRD).
The sections ``trainer``, ``parallelism``, ``health`` and ``faultTolerance`` are read with the
contract both sides share, :mod:`railyard.protocol.trainerconfig`, where each setting is declared
once (the CRD is generated from the same classes), so there is no second set of defaults here.
``checkpoint`` is handed to :mod:`railyard_trainer.checkpoint.settings`, which takes its tier
defaults from the same contract. Every problem is reported at once, each naming its field. This
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


_TOP_LEVEL = ("job", "namespace", "attempt", "trainer", "parallelism", "checkpoint", "health", "faultTolerance", "restore", "restartWaitSeconds")


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "namespace": self.namespace,
            "attempt": self.attempt,
            "trainer": to_wire(self.trainer),
            "parallelism": to_wire(self.parallelism),
            "checkpoint": dict(self.checkpoint),
            "health": to_wire(self.health),
            "faultTolerance": to_wire(self.fault_tolerance),
            "restore": None if self.restore is None else dict(self.restore),
            "restartWaitSeconds": self.restart_wait_seconds,
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
        raise ConfigError([f"{podenv.CONFIG.name}: cannot read {p} ({exc.strerror}); mount the job ConfigMap at /etc/railyard"]) from exc
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise ConfigError([f"{p}: not valid JSON ({exc})"]) from exc
    return TrainerConfig.from_dict(raw)


def _parse(raw: Any) -> TrainerConfig:
    if not isinstance(raw, dict):
        raise ConfigError(["config: expected a JSON object"])
    problems: list[str] = [f"{k}: unknown top-level field; known: {', '.join(_TOP_LEVEL)}" for k in raw if k not in _TOP_LEVEL]
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
    restore = raw.get("restore")
    if restore is not None and not isinstance(restore, dict):
        problems.append("restore: expected an object {tier, step} or null")
        restore = None
    job, namespace, attempt = raw.get("job", "local"), raw.get("namespace", "default"), raw.get("attempt", 0)
    if not isinstance(job, str) or not job:
        problems.append(f"job: expected a non-empty string, got {job!r}")
        job = "local"
    if not isinstance(namespace, str):
        problems.append(f"namespace: expected a string, got {namespace!r}")
        namespace = "default"
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 0:
        problems.append(f"attempt: expected a whole number >= 0, got {attempt!r}")
        attempt = 0
    restart_wait = raw.get("restartWaitSeconds", RESTART_WAIT_FLOOR_SECONDS)
    if isinstance(restart_wait, bool) or not isinstance(restart_wait, int | float) or not 0 <= restart_wait < float("inf"):
        problems.append(f"restartWaitSeconds: expected a number of seconds >= 0, got {restart_wait!r}")
        restart_wait = RESTART_WAIT_FLOOR_SECONDS
    if problems:
        raise ConfigError(problems)
    return TrainerConfig(
        job=job, namespace=namespace, attempt=attempt, trainer=trainer, parallelism=parallelism,
        checkpoint=checkpoint, health=health, fault_tolerance=fault_tolerance, restore=restore,
        restart_wait_seconds=float(restart_wait),
    )
