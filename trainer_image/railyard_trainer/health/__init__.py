"""Health checks and heartbeats inside the trainer.

``build_health_monitor(config, ctx)`` returns the :class:`hooks.HealthMonitor` the train loop
calls; see :mod:`.monitor` for what runs when and docs/health.md for the SDC scheme. The monitor
(and torch) is imported on first use: the torch-free parts, :mod:`.client` and :mod:`.reporter`
(one rank's heartbeats), are imported by the launcher's side and the SDK without it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from railyard_trainer.health.monitor import HealthSettings, RailyardHealthMonitor
    from railyard_trainer.hooks import TrainContext


def build_health_monitor(config: Any, ctx: TrainContext) -> RailyardHealthMonitor:
    """``config``: the TrainerConfig (its ``health`` is the job's spec.health, read with the
    shared schema) or a config.json-shaped dict. The monitor reports through
    ``ctx.extra["reporter"]`` when the train loop put one there (the SDK's)."""
    from railyard_trainer.health.monitor import HealthSettings, RailyardHealthMonitor

    health = config.get("health") if isinstance(config, dict) else getattr(config, "health", None)
    settings = HealthSettings.from_config(health, os.environ)
    monitor = RailyardHealthMonitor(settings, ctx)
    ctx.extra["health_monitor"] = monitor
    return monitor


def __getattr__(name: str) -> Any:
    if name in ("HealthSettings", "RailyardHealthMonitor"):
        from railyard_trainer.health import monitor

        return getattr(monitor, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["HealthSettings", "RailyardHealthMonitor", "build_health_monitor"]
