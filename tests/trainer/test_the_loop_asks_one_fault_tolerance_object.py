"""The train loop's fault tolerance is one object (railyard_trainer/ft.py): without replica groups
a step always commits and reads the next batch; with them a step reads its share, is weighted by
it, and a step that does not commit is tried again with the same global batch (the data position
moves only on a commit). Fakes stand in for torchft and the data; no process group."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from railyard_trainer.ft import NoFT, ReplicaGroupsFT, StepExchange  # noqa: E402
from railyard_trainer.hooks import StepMetrics  # noqa: E402
from railyard_trainer.replicas import Share  # noqa: E402

BATCH = 6


class Data:
    """The shared data position and what each step read."""

    def __init__(self) -> None:
        self.consumed = 0
        self.read: list[tuple[int, int]] = []

    def next_batch(self) -> tuple[Any, Any]:
        self.read.append((self.consumed, BATCH))
        self.consumed += BATCH
        return None, None

    def share_batch(self, first: int, count: int) -> tuple[Any, Any]:
        self.read.append((first, count))
        return None, None

    def advance(self, samples: int) -> None:
        self.consumed += samples


class Group:
    """torchft's side: participants per quorum, commit votes in order, the weights it was given."""

    def __init__(self, participants: list[int], commits: list[bool]) -> None:
        self.group, self.heals, self.waiting = 1, 0, False
        self.participants, self.commits = participants, commits
        self.weights: list[float] = []

    def start_step(self, *, consumed_of: Any, batch_size: int, unit: int) -> Share:
        n = self.participants.pop(0)
        return Share(first=consumed_of(), count=batch_size // n, rank=0, participants=n)

    def reduce_gradients(self, params: Any, weight: float) -> None:
        self.weights.append(weight)

    def reduce_scalar(self, value: Any, weight: float) -> float:
        return float(value) * weight

    def commit(self) -> bool:
        return self.commits.pop(0)


def _step(tried: list[int], data: Data) -> Any:
    """A train step as the loop's: batch, gradients, loss, then the commit decides."""

    def train_step(step: int, exchange: StepExchange) -> StepMetrics | None:
        tried.append(step)
        exchange.batch(data)  # type: ignore[arg-type]
        exchange.reduce_gradients(iter(()))
        loss = exchange.reduce_loss(2.0)
        if not exchange.commit(step):
            return None
        return StepMetrics(step=step, loss=loss, grad_norm=0.0, step_time_s=0.0, compute_s=0.0, tokens_per_s=0.0,
                           lr=0.0)

    return train_step


def test_without_replica_groups_every_step_commits_and_reads_the_next_batch() -> None:
    data = Data()
    ctx = SimpleNamespace(step=0)
    ft = NoFT(ctx)  # type: ignore[arg-type]
    tried: list[int] = []
    losses = [ft.next_step(_step(tried, data)).loss for _ in range(3)]
    assert (tried, ctx.step, losses) == ([1, 2, 3], 3, [2.0, 2.0, 2.0])
    assert data.read == [(0, 6), (6, 6), (12, 6)] and ft.done_fields([]) == {} and ft.group is None


def test_a_replica_groups_step_that_does_not_commit_is_tried_again_with_the_same_global_batch() -> None:
    data = Data()
    ctx = SimpleNamespace(step=0)
    group = Group(participants=[2, 3, 3], commits=[False, True, True])
    cfg = SimpleNamespace(trainer=SimpleNamespace(batch_size=BATCH), restore=None)
    ft = ReplicaGroupsFT(group, ctx=ctx, data=data, cfg=cfg, unit=1, rank=0)  # type: ignore[arg-type]
    tried: list[int] = []
    first = ft.next_step(_step(tried, data))
    second = ft.next_step(_step(tried, data))
    assert tried == [1, 1, 2] and ctx.step == 2 and (first.step, second.step) == (1, 2)
    # the failed try (2 groups) and its retry (3 groups) read from the same position; only commits move it
    assert data.read == [(0, 3), (0, 2), (6, 2)] and data.consumed == 12
    assert group.weights == [0.5, pytest.approx(1 / 3), pytest.approx(1 / 3)]
    assert first.loss == pytest.approx(2.0 / 3) and ft.group == 1
