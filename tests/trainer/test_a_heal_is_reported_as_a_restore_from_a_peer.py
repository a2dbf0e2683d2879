"""A replica group that heals tells the operator as it tells it of a restore: its rank 0 puts a
``restore`` event from tier ``peer`` (the fetch's bytes and seconds) into the next heartbeat and
marks the attempt restored from ``peer`` (status.restore, the restore metrics)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from railyard.protocol.heartbeat import HEAL_SOURCE, CheckpointEvent
from railyard_trainer.ft import ReplicaGroupsFT
from railyard_trainer.replicas import HealReceipt, Share

RECEIPT = HealReceipt(source="http://10.9.0.5:4100/checkpoint/", bytes=2_169_756, seconds=0.09)


class Monitor:
    def __init__(self) -> None:
        self.events: list[CheckpointEvent] = []
        self.restored: list[tuple[str, int]] = []

    def note_checkpoint(self, event: CheckpointEvent) -> None:
        self.events.append(event)

    def note_restore(self, tier: str, step: int) -> None:
        self.restored.append((tier, step))


def _group(*, rank: int, heals_to: int | None) -> tuple[ReplicaGroupsFT, Monitor]:
    """A group whose first quorum heals it to step ``heals_to`` (None: nobody is ahead)."""
    monitor = Monitor()
    ctx = SimpleNamespace(step=0, extra={"health_monitor": monitor})
    replicas = SimpleNamespace(group=1, heals=0, last_heal=None)

    def start_step(**_: Any) -> Share:
        if heals_to is not None:
            ctx.step, replicas.heals, replicas.last_heal = heals_to, replicas.heals + 1, (heals_to, RECEIPT)
        return Share(first=0, count=1, rank=0, participants=2)

    replicas.start_step = start_step
    cfg = SimpleNamespace(trainer=SimpleNamespace(batch_size=2))
    ft = ReplicaGroupsFT(replicas, ctx=ctx, data=SimpleNamespace(consumed=0), cfg=cfg, unit=1, rank=rank)  # type: ignore[arg-type]
    return ft, monitor


def test_rank_0_of_a_healed_group_reports_a_restore_from_a_peer() -> None:
    ft, monitor = _group(rank=0, heals_to=6)
    assert ft.restore(lambda: pytest.fail("a group that heals reads no tier")) is None
    (event,) = monitor.events
    assert (event.kind, event.tier, event.step, event.ok) == ("restore", HEAL_SOURCE, 6, True)
    assert (event.bytes, event.duration_s) == (RECEIPT.bytes, RECEIPT.seconds) and RECEIPT.source in event.detail
    assert monitor.restored == [(HEAL_SOURCE, 6)]


@pytest.mark.parametrize(("rank", "heals_to"), [(1, 6), (0, None)], ids=["another-rank", "no-heal"])
def test_only_rank_0_of_a_group_that_healed_reports(rank: int, heals_to: int | None) -> None:
    ft, monitor = _group(rank=rank, heals_to=heals_to)
    ft.restore(lambda: None)
    assert monitor.events == [] and monitor.restored == []
