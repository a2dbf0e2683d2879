"""A replica group that heals from a live peer replaces its parameters between two steps, on
purpose. The state guard (bits of every parameter unchanged from one optimizer step to the next
backward) must take the peer's bits as the new state at rest, not as corruption: a false
``state_guard`` verdict after a heal restarted a group twice and spent its SDC budget in a CI run
of tests/system's fence test."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from railyard_trainer.ft import ReplicaGroupsFT
from railyard_trainer.health import build_health_monitor
from railyard_trainer.health.harness import build_model
from railyard_trainer.hooks import SDCDetected, TrainContext
from railyard_trainer.replicas import Share

pytestmark = pytest.mark.torch


def _healing_group(model: torch.nn.Module, peer: torch.nn.Module) -> tuple[ReplicaGroupsFT, Any, TrainContext]:
    """The real monitor on a one-rank context, and a group whose next quorum heals it from ``peer``."""
    ctx = TrainContext(
        rank=0, local_rank=0, world_size=1, node="node-a", pod_index=0, job="j", attempt=0,
        dims=None, mesh=None, model_parts=[model], optimizer=None, lr_scheduler=None, data=None,
    )
    monitor = build_health_monitor({"health": {"sdc": {"intervalSteps": 1000}}}, ctx)
    replicas = SimpleNamespace(group=1, heals=0, last_heal=None)

    def start_step(**_: Any) -> Share:
        with torch.no_grad():  # the peer's parameters, fetched over the heal endpoint
            for mine, theirs in zip(model.parameters(), peer.parameters(), strict=True):
                mine.copy_(theirs)
        replicas.heals, replicas.last_heal = replicas.heals + 1, (ctx.step, None)
        return Share(first=0, count=1, rank=0, participants=2)

    replicas.start_step = start_step
    cfg = SimpleNamespace(trainer=SimpleNamespace(batch_size=2))
    ft = ReplicaGroupsFT(replicas, ctx=ctx, data=SimpleNamespace(consumed=0), cfg=cfg, unit=1, rank=1)  # type: ignore[arg-type]
    return ft, monitor, ctx


def _backward(monitor: Any, ctx: TrainContext) -> None:
    ctx.step += 1
    monitor.after_backward(ctx, torch.tensor(2.0), torch.tensor(1.0))


def test_a_heal_between_steps_is_the_new_state_at_rest() -> None:
    model, peer = build_model(0), build_model(1)
    ft, monitor, ctx = _healing_group(model, peer)
    try:
        monitor.preflight(ctx)
        ft._start_step()  # the quorum heals the group: every parameter now holds the peer's bits
        _backward(monitor, ctx)
        assert monitor._verdict is None, monitor._verdict
        assert monitor.checks_passed()
    finally:
        monitor.close()


def test_the_same_change_without_a_heal_is_still_caught() -> None:
    model, peer = build_model(0), build_model(1)
    _, monitor, ctx = _healing_group(model, peer)
    try:
        monitor.preflight(ctx)
        with torch.no_grad():
            for mine, theirs in zip(model.parameters(), peer.parameters(), strict=True):
                mine.copy_(theirs)
        with pytest.raises(SDCDetected, match=r"state_guard: .* changed at rest"):
            _backward(monitor, ctx)
    finally:
        monitor.close()
