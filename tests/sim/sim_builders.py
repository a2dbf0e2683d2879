"""Small scenarios and hand-made traces for the simulator tests."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from railyard.sim.model import LLAMA3_CAUSES, Cause, PolicyConfig, Scenario, our_policy
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


def ours_every(memory: int = 10, local: int = 50, shared: int = 100, **kw: Any) -> PolicyConfig:
    """Our policy with its tiers' intervals set in the spec (a spec value wins over the rule of
    railyard.logic.intervals): for tests of the engine's accounting, whose answers are written
    for these intervals."""
    pol = our_policy(**kw)
    ck = pol.checkpoint
    return replace(pol, checkpoint=replace(
        ck, memory=replace(ck.memory, interval_steps=memory), local=replace(ck.local, interval_steps=local),
        shared=replace(ck.shared, interval_steps=shared)))
