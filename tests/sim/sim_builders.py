"""Small scenarios and hand-made traces for the simulator tests."""

from __future__ import annotations

from typing import Any

from railyard.sim.model import LLAMA3_CAUSES, Cause, Scenario
from railyard.sim.trace import Event


def tiny(**changes: Any) -> Scenario:
    """8 nodes x 8 GPUs for a day, 1 s steps, no failures unless asked."""
    base: dict[str, Any] = dict(
        gpus=64,
        gpus_per_node=8,
        pp=1,
        tp=8,
        days=1.0,
        step_time_s=1.0,
        model_params=8e9,
        failure_scale=0.0,
        planned=0,
        stragglers_per_day=0.0,
        sdc_per_day=0.0,
    )
    base.update(changes)
    return Scenario(**base)


def cause(name: str) -> Cause:
    return next(c for c in LLAMA3_CAUSES if c.name == name)


def one_fault(
    at: float, name: str, *, pod: int = 3, u1: float = 0.5, u2: float = 0.5
) -> tuple[Event, ...]:
    return (Event(0, at, "fault", cause(name), pod, u1=u1, u2=u2),)
