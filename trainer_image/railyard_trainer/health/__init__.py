"""Health checks and heartbeats inside the trainer.

``build_health_monitor(config, ctx)`` returns the :class:`hooks.HealthMonitor` the train loop
calls; see :mod:`.monitor` for what runs when and docs/health.md for the SDC scheme.
"""

from __future__ import annotations

import os
from typing import Any

from railyard_trainer.health.monitor import HealthSettings, RailyardHealthMonitor
from railyard_trainer.hooks import TrainContext


def build_health_monitor(config: Any, ctx: TrainContext) -> RailyardHealthMonitor:
    """``config``: the TrainerConfig (its ``health`` is the job's spec.health, read with the
    shared schema) or a config.json-shaped dict."""
    health = config.get("health") if isinstance(config, dict) else getattr(config, "health", None)
    settings = HealthSettings.from_config(health, os.environ)
    monitor = RailyardHealthMonitor(settings, ctx)
    ctx.extra["health_monitor"] = monitor
    return monitor


__all__ = ["HealthSettings", "RailyardHealthMonitor", "build_health_monitor"]
