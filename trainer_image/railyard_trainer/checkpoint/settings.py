"""Checkpoint settings from config.json's ``checkpoint`` object and the pod's environment.

The object is read with the contract (railyard.protocol.trainerconfig's ``CheckpointConfig``):
every setting, its default and bounds are declared there once; here the settings only meet the
pod's environment.

torch-free: the launcher and the cleanup command import it cheaply. Every problem is reported
at once, each naming its field and the fix.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from railyard.protocol import podenv
from railyard.protocol.exitcodes import ExitCode
from railyard.protocol.manifest import TIERS
from railyard.protocol.trainerconfig import (
    CheckpointConfig,
    LocalTierConfig,
    MemoryTierConfig,
    SharedTierConfig,
    parse,
)

ENV_DIRS: Mapping[str, podenv.Text] = podenv.CHECKPOINT_DIRS
#: How the checkpoint's background threads share the CPU with training (manager.BackgroundCpu):
#: ``idle``, Linux's idle class (they run on CPU time no other thread wants; lifted to nice 10
#: whenever training waits for them or runs a collective on their group), ``nice`` (nice 10: a
#: small share of a busy core), or ``auto`` (the default): ``idle`` where this process may take
#: a thread out of the idle class again (CAP_SYS_NICE or RLIMIT_NICE), else ``nice``.
ENV_CPU_CLASS = podenv.CHECKPOINT_CPU.name
CPU_CLASSES = ("auto", "idle", "nice")
DEFAULT_CPU_CLASS = podenv.CHECKPOINT_CPU.default


class CheckpointConfigError(ValueError):
    """A checkpoint setting that cannot work: the worker exits with CONFIG_PERMANENT (64)."""

    exit_code = int(ExitCode.CONFIG_PERMANENT)

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class TierSettings:
    name: str
    enabled: bool
    interval_steps: int
    keep: int
    #: ``<root>``; the job's checkpoints live in ``<root>/<job>/step-<N>/``. Empty: tier off.
    root: str = ""
    #: memory tier only: send each pod's shards to its replica peer's memory tier.
    replicate: bool = False

    @property
    def active(self) -> bool:
        return self.enabled and bool(self.root) and self.interval_steps > 0

    def due(self, step: int) -> bool:
        return self.active and step > 0 and step % self.interval_steps == 0


@dataclass(frozen=True)
class CheckpointSettings:
    tiers: tuple[TierSettings, ...]
    cleanup_on_delete: bool = False
    #: Operator hint (config.json ``restore``): {"tier", "step"} and optionally "lastStep".
    restore_hint: Mapping[str, Any] | None = None
    #: Process-group timeout of the checkpoint gloo group (background collectives).
    timeout_s: float = 300.0
    #: The background threads' CPU class (:data:`CPU_CLASSES`, from :data:`ENV_CPU_CLASS`).
    cpu_class: str = DEFAULT_CPU_CLASS
    extra: dict[str, Any] = field(default_factory=dict)

    def tier(self, name: str) -> TierSettings:
        return next(t for t in self.tiers if t.name == name)

    @property
    def active_tiers(self) -> tuple[TierSettings, ...]:
        return tuple(t for t in self.tiers if t.active)


def parse_checkpoint_settings(
    raw: Mapping[str, Any] | None,
    *,
    env: Mapping[str, str] | None = None,
    restore: Mapping[str, Any] | None = None,
) -> CheckpointSettings:
    """Settings from config.json's ``checkpoint`` object (camelCase, as in the TrainingJob spec),
    read with the contract (``CheckpointConfig``: the CRD's tiers and the trainer-only
    settings), and the pod's environment (each tier's folder, the background CPU class)."""
    env = os.environ if env is None else env
    problems: list[str] = []
    config = parse(CheckpointConfig, raw, where="checkpoint", problems=problems)
    tiers = []
    for name in TIERS:
        tier: MemoryTierConfig | LocalTierConfig | SharedTierConfig = getattr(config, name)
        tiers.append(
            TierSettings(
                name=name, enabled=tier.enabled, interval_steps=tier.interval_steps, keep=tier.keep,
                root=str(tier.dir or ENV_DIRS[name].get(env)),
                replicate=isinstance(tier, MemoryTierConfig) and tier.replicate,
            )
        )
    cpu_class = podenv.CHECKPOINT_CPU.get(env)
    if cpu_class not in CPU_CLASSES:
        problems.append(
            f"{ENV_CPU_CLASS}={cpu_class!r}: expected one of {', '.join(CPU_CLASSES)} "
            f"(or unset for {DEFAULT_CPU_CLASS})"
        )
        cpu_class = DEFAULT_CPU_CLASS
    if restore is not None and not isinstance(restore, Mapping):
        problems.append("restore: expected an object {tier, step} or null")
        restore = None
    if problems:
        raise CheckpointConfigError(problems)
    return CheckpointSettings(
        tiers=tuple(tiers), cleanup_on_delete=config.cleanup_on_delete, restore_hint=restore,
        timeout_s=config.timeout_seconds, cpu_class=cpu_class,
    )
