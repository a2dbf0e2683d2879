"""The train loop's fault tolerance, behind one object (as torchtitan's ``components/ft``).

``faultTolerance.mode`` changes five moments of the loop: how training starts (join a quorum,
maybe heal from a live peer instead of restoring a checkpoint tier), how a step is taken (a
step that does not commit is tried again), which samples a step reads, what a step exchanges
with the other replica groups (gradients, the loss, the commit vote), and what the run reports
at its end. :class:`FTManager` names those moments; :class:`NoFT` is a job without replica
groups (one world: a step always commits and reads the next batch), :class:`ReplicaGroupsFT` the
torchft-backed groups of railyard_trainer/replicas.py. ``Trainer.train`` calls the one it was
given and never asks which.

Each step's part is a :class:`StepExchange`, made by the manager for that step: the train step
reads its batch through it, and hands it the gradients and the loss before it may apply them.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

import torch

from railyard.protocol import podenv
from railyard.protocol.heartbeat import HEAL_SOURCE, CheckpointEvent
from railyard.protocol.quorum import rejoin_rounds
from railyard.protocol.restore import decide_replica_group_unrestored
from railyard.protocol.trainerconfig import cross_group_timeout_seconds
from railyard_trainer import hooks
from railyard_trainer.checkpoint.restore import NoVerifiedCheckpoint
from railyard_trainer.config import TrainerConfig
from railyard_trainer.data import ShardedBatches
from railyard_trainer.events import log_event
from railyard_trainer.heal_address import heal_host
from railyard_trainer.replicas import (
    HealState,
    ReplicaGroup,
    Share,
    group_from_env,
    params_crc32,
    params_sha256,
    replica_problems,
)


class StepExchange(Protocol):
    """One step's part in the fault tolerance, in the order the train step calls it."""

    def batch(self, data: ShardedBatches) -> tuple[torch.Tensor, torch.Tensor]:
        """This step's inputs and labels."""
        ...

    def reduce_gradients(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Make the gradients the global batch's (before clipping)."""
        ...

    def reduce_loss(self, loss: float) -> float:
        """The global batch's loss from this world's."""
        ...

    def commit(self, step: int) -> bool:
        """Whether the step may be applied; False: drop its gradients, it is tried again."""
        ...

    def log_fields(self) -> dict[str, Any]:
        """What the ``step`` event says about the exchange."""
        ...


#: The train step the manager runs: (step, its exchange) -> its metrics, None when it did not commit.
TrainStep = Callable[[int, StepExchange], "hooks.StepMetrics | None"]


class FTManager(Protocol):
    """What the train loop asks of the fault tolerance (see the module docstring)."""

    #: This process's replica group; None without replica groups (fault injection targets it).
    group: int | None

    def restore(self, from_tiers: Callable[[], hooks.RestoreResult | None]) -> hooks.RestoreResult | None:
        """Bring the state to where training goes on, before the first step; ``from_tiers``
        restores from the checkpoint tiers (raising :class:`NoVerifiedCheckpoint` when none holds
        the hinted checkpoint)."""
        ...

    def next_step(self, train_step: TrainStep) -> hooks.StepMetrics:
        """Take the next step (as often as it takes to commit) and move ``ctx.step`` to it."""
        ...

    def done_fields(self, parts: Sequence[torch.nn.Module]) -> dict[str, Any]:
        """What the ``done`` event says about the fault tolerance."""
        ...

    def leave(self, step: int) -> bool:
        """Before a planned move, after committing ``step``: leave the other replica groups for
        good (they go on without this one). False: there are none to leave."""
        ...

    def close(self) -> None: ...


class LocalExchange:
    """A step of a job without replica groups: the next batch, nothing to exchange, always applied."""

    def batch(self, data: ShardedBatches) -> tuple[torch.Tensor, torch.Tensor]:
        return data.next_batch()

    def reduce_gradients(self, params: Iterable[torch.nn.Parameter]) -> None:
        return None

    def reduce_loss(self, loss: float) -> float:
        return loss

    def commit(self, step: int) -> bool:
        return True

    def log_fields(self) -> dict[str, Any]:
        return {}


class NoFT:
    """A job without replica groups: one world, which a lost rank stops whole (the operator
    restarts it); training starts from the checkpoint tiers."""

    group: int | None = None

    def __init__(self, ctx: hooks.TrainContext) -> None:
        self.ctx = ctx

    def restore(self, from_tiers: Callable[[], hooks.RestoreResult | None]) -> hooks.RestoreResult | None:
        return from_tiers()

    def next_step(self, train_step: TrainStep) -> hooks.StepMetrics:
        self.ctx.step += 1
        metrics = train_step(self.ctx.step, LocalExchange())
        assert metrics is not None, "a step without replica groups always commits"
        return metrics

    def done_fields(self, parts: Sequence[torch.nn.Module]) -> dict[str, Any]:
        return {}

    def leave(self, step: int) -> bool:
        return False

    def close(self) -> None:
        return None


class ReplicaExchange:
    """A replica group's step: its share of the global batch, whose gradient and loss are summed
    over the participating groups weighted by their shares, applied only when it commits."""

    def __init__(self, group: ReplicaGroup, share: Share, *, batch_size: int, data: ShardedBatches, rank: int) -> None:
        self.group, self.share, self.batch_size, self.data, self.rank = group, share, batch_size, data, rank
        # the global batch's mean gradient: each group's mean weighted by its share
        self.weight = share.count / batch_size

    def batch(self, data: ShardedBatches) -> tuple[torch.Tensor, torch.Tensor]:
        return data.share_batch(self.share.first, self.share.count)

    def reduce_gradients(self, params: Iterable[torch.nn.Parameter]) -> None:
        self.group.reduce_gradients(params, self.weight)

    def reduce_loss(self, loss: float) -> float:
        return self.group.reduce_scalar(torch.tensor(loss), self.weight)

    def commit(self, step: int) -> bool:
        # every rank of the group gets the same answer; the health checks then see only steps
        # that will be applied (a failed step's gradients may be partial)
        if not self.group.commit():
            log_event("step_not_committed", rank=self.rank, step=step, participants=self.share.participants)
            return False
        self.data.advance(self.batch_size)
        return True

    def log_fields(self) -> dict[str, Any]:
        s = self.share
        return {"group": self.group.group, "samples": [s.first, s.first + s.count], "participants": s.participants,
                "quorum_s": round(self.group.quorum_s, 4)}


class ReplicaGroupsFT:
    """``faultTolerance.mode: ReplicaGroups``: this world is one replica group, meeting the
    others through torchft each step (railyard_trainer/replicas.py)."""

    def __init__(self, replicas: ReplicaGroup, *, ctx: hooks.TrainContext, data: ShardedBatches, cfg: TrainerConfig,
                 unit: int, rank: int,
                 paused: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext) -> None:
        self.replicas, self.ctx, self.data, self.cfg, self.unit, self.rank = replicas, ctx, data, cfg, unit, rank
        self.paused = paused
        self.group: int | None = replicas.group
        #: The share of the next step, from a quorum already joined (at the start, or by a heal).
        self.joined: Share | None = None

    def _start_step(self) -> Share:
        heals = self.replicas.heals
        share = self.replicas.start_step(consumed_of=lambda: self.data.consumed,
                                         batch_size=self.cfg.trainer.batch_size, unit=self.unit)
        if self.replicas.heals != heals:
            # the peer's bits are the new state at rest (the bundled trainer's monitor has the hook)
            replaced = getattr(self.ctx.extra.get("health_monitor"), "params_replaced", None)
            if replaced is not None:
                replaced(self.ctx)
            self._report_heal()
        return share

    def _report_heal(self) -> None:
        """Tell the operator (the health monitor's next heartbeat) that this group healed: a
        restore from a live peer, with rank 0's bytes and seconds (``status.restore``, the
        restore metrics; docs/fault-tolerance.md, "Heals")."""
        monitor = self.ctx.extra.get("health_monitor")
        if self.rank != 0 or monitor is None or self.replicas.last_heal is None:
            return
        step, receipt = self.replicas.last_heal
        monitor.note_checkpoint(CheckpointEvent(
            step=step, tier=HEAL_SOURCE, ok=True, kind="restore", steps_lost=0,
            duration_s=receipt.seconds if receipt else 0.0, bytes=receipt.bytes if receipt else 0,
            detail=f"healed from a live peer at {receipt.source}" if receipt else "healed from a live peer"))
        monitor.note_restore(HEAL_SOURCE, step)

    def restore(self, from_tiers: Callable[[], hooks.RestoreResult | None]) -> hooks.RestoreResult | None:
        """Join the quorum first: a group that starts while live peers are ahead heals from them
        and never reads a checkpoint tier; when nobody is ahead (the job starts or restarts
        whole) the tiers restore as always and the quorum takes their step. A group whose own
        tiers cannot restore heals from a peer that did (:meth:`heal_instead_of_restore`)."""
        hold_for_test(0, self.paused)  # step 0: before the first quorum
        self.joined = self._start_step()
        if self.replicas.heals:
            return None
        try:
            restored = from_tiers()
        except NoVerifiedCheckpoint as exc:
            self.heal_instead_of_restore(exc)
            return None
        if self.ctx.step:
            self.replicas.set_step(self.ctx.step)
            self.joined = None  # the data position moved: take the share again
        return restored

    def heal_instead_of_restore(self, exc: NoVerifiedCheckpoint) -> None:
        """After a whole-job restart each group reads only its own tier folders; one that holds
        nothing for the operator's hint (its node was replaced) joins the next quorum, where the
        groups that restored stand at the hinted step, and heals from them. It exits 77 all the
        same when no peer reached the hint (decide_replica_group_unrestored: after two quorums of
        all groups, or the collective timeout while some group stays away)."""
        log_event("restore_from_peer", rank=self.rank, group=self.replicas.group, reason=str(exc)[:500])
        step = (self.cfg.restore or {}).get("step")
        deadline = time.monotonic() + self.cfg.trainer.collective_timeout_seconds
        groups = self.cfg.parallelism.data_replicas
        full_quorums = 0
        while True:
            share = self._start_step()  # heals when a peer is ahead: ctx.step moves
            decision = decide_replica_group_unrestored(
                hint_step=step if isinstance(step, int) else None, quorum_step=self.ctx.step,
                participants=share.participants, groups=groups, full_quorums_before=full_quorums,
                timed_out=time.monotonic() > deadline)
            if decision.action == "train":
                self.joined = share
                return
            if decision.action == "exit":
                raise NoVerifiedCheckpoint(f"{exc}; {decision.reason}") from exc
            if share.participants >= groups:
                full_quorums += 1
            else:
                time.sleep(1.0)  # a group is missing from the quorum: it may still be restoring

    def next_step(self, train_step: TrainStep) -> hooks.StepMetrics:
        """One committed step of a replica group: a step that does not commit (a peer group died
        during it) is retried with the same global batch under the new quorum."""
        hold_for_test(self.ctx.step + 1, self.paused)
        while True:
            share = self.joined or self._start_step()  # may heal: ctx.step and data move
            self.joined = None
            exchange = ReplicaExchange(self.replicas, share, batch_size=self.cfg.trainer.batch_size, data=self.data,
                                       rank=self.rank)
            metrics = train_step(self.ctx.step + 1, exchange)
            if metrics is not None:
                self.ctx.step = metrics.step
                return metrics

    def done_fields(self, parts: Sequence[torch.nn.Module]) -> dict[str, Any]:
        # replica groups must end on identical weights (tests compare them)
        return {"group": self.replicas.group, "heals": self.replicas.heals, "params_sha256": params_sha256(parts),
                "params_crc32": params_crc32(parts)}

    def leave(self, step: int) -> bool:
        self.replicas.leave(step)
        return True

    def close(self) -> None:
        self.replicas.close()


def ft_problems(cfg: TrainerConfig, *, group_dp: int) -> list[str]:
    """What makes this job's fault tolerance impossible before it starts (each names its field)."""
    if cfg.fault_tolerance.mode != "ReplicaGroups":
        return []
    return replica_problems(batch_size=cfg.trainer.batch_size, group_dp=group_dp,
                            data_replicas=cfg.parallelism.data_replicas)


def build_ft_manager(cfg: TrainerConfig, *, ctx: hooks.TrainContext, data: ShardedBatches, state: HealState,
                     unit: int, rank: int, world: int, device: torch.device,
                     paused: Callable[[], AbstractContextManager[None]],
                     add_waiting_probe: Callable[[Callable[[], bool]], None]) -> FTManager:
    """The manager ``faultTolerance.mode`` asks for. ReplicaGroups: built after the group's own
    process group (the torchft Manager shares its TCP store, ``MASTER_ADDR:MASTER_PORT``)."""
    if cfg.fault_tolerance.mode != "ReplicaGroups":
        return NoFT(ctx)
    group, lighthouse = group_from_env()
    t = cfg.trainer
    replicas = ReplicaGroup(
        group=group, data_replicas=cfg.parallelism.data_replicas, min_replicas=cfg.fault_tolerance.min_replicas,
        group_rank=rank, group_world=world, lighthouse=lighthouse, job=cfg.job,
        timeout_s=t.collective_timeout_seconds, state=state, device=device,
        cross_group_timeout_s=cross_group_timeout_seconds(collective_timeout_seconds=t.collective_timeout_seconds,
                                                          watchdog_seconds=t.watchdog_seconds),
        store_addr=os.environ["MASTER_ADDR"], store_port=int(os.environ["MASTER_PORT"]),
        rejoin_rounds=rejoin_rounds(t.watchdog_seconds),
        # resolved once, at the start: a pod without the named interface stops here, naming the field
        heal_host=heal_host(cfg.fault_tolerance.heal_network),
    )
    # waiting for the other groups is not a hang of this one (the operator's hang rule)
    add_waiting_probe(lambda: replicas.waiting)
    return ReplicaGroupsFT(replicas, ctx=ctx, data=data, cfg=cfg, unit=unit, rank=rank, paused=paused)


def hold_for_test(step: int, paused: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext) -> None:
    """Test hook (``RAILYARD_TEST_HOLD=STEP:PATH[,STEP:PATH...]``): before step STEP (0: before a
    replica group's first quorum) wait until PATH exists, so a test can line replica groups up
    (start together in one quorum, or keep survivors from finishing before a replacement joins)
    on conditions it observes, not on timing. Held inside ``paused`` (the SDK session's): a held
    rank is neither hung to the watchdog nor to the operator's hang rule."""
    for item in filter(None, podenv.TEST_HOLD.get(os.environ).split(",")):
        at, _, name = item.partition(":")
        if int(at) != step:
            continue
        path = Path(name)
        log_event("test_hold", step=step, path=str(path))
        with paused():
            while not path.exists():
                time.sleep(0.05)
