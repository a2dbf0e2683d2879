"""A ``torch.distributed.checkpoint`` StorageWriter/StorageReader pair backed by Railyard's tiers.

For programs that already checkpoint with DCP, the whole change is where the bytes go::

    dcp.save(state, storage_writer=railyard.storage_writer(step))     # was checkpoint_id=path
    if (reader := railyard.storage_reader()) is not None:             # collective
        dcp.load(state, storage_reader=reader)

**Saving.** The writer does not write DCP's files itself: it hands the state DCP planned
(``planner.state_dict``, DefaultSavePlanner's flattened view, tensors not copied) to the
checkpoint manager, which copies it into host buffers (the only blocking part, as for the
bundled trainer) and writes the tiers due at ``step`` in the background: each rank's own DCP
checkpoint on the node tiers (``step-N/rank-R/``), the memory tier's copy on the replica peer,
one collective DCP checkpoint on the shared tier, each committed by a manifest once every shard
is written and hashed. ``dcp.save`` returns when the copy is made. When no tier is due at
``step``, every active tier saves (an explicit save). Use ``dcp.save``, not ``async_save``.

**Loading.** :func:`open_reader` (collective) picks the newest complete, SDC-clean checkpoint
this layout can read, fastest tier first, checks every shard it needs against the manifest's
checksum, fetches a lost node's shards from its neighbour's replica, and returns a reader of the
folder this rank reads (a ``FileSystemReader`` that also reads the node tiers' raw tensor items,
``checkpoint.shardio.ShardReader``): ``dcp.load`` then reads exactly as from a checkpoint of
one's own, resharding on the shared tier.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult
from torch.futures import Future

from railyard_trainer.checkpoint.shardio import ShardReader

if TYPE_CHECKING:
    from railyard_trainer.checkpoint.manager import CheckpointManager
    from railyard_trainer.sdk.session import RestorePoint, Session


class DcpTiers:
    """The checkpoint manager behind the pair: one per process, made on first use (collective:
    every rank, in the same order, after ``init_process_group``)."""

    def __init__(self, session: Session) -> None:
        from railyard_trainer.checkpoint.manager import CheckpointManager

        self.session = session
        self.ctx = session.train_context(model_parts=[])
        self.checkpoints = session.checkpoints(self.ctx, final_step=None)
        manager = self.checkpoints.inner
        if not isinstance(manager, CheckpointManager):
            raise RuntimeError(
                "railyard_trainer.sdk.storage_writer/storage_reader need the tiered checkpointer; "
                "spec.checkpoint selects the plain one (a flat {path, intervalSteps}) or RAILYARD_PLAIN_CHECKPOINT=1 "
                "is set"
            )
        self.manager: CheckpointManager = manager

    def due(self, step: int) -> bool:
        return self.manager.due(step)

    def save(self, step: int, state: dict[str, Any]) -> None:
        m = self.manager
        tiers = [t for t in m.tiers if t.due(step)] or list(m.tiers)
        self.ctx.step = int(step)
        self.ctx.extra["state_dict"] = lambda: state
        try:
            m.forward_events(self.ctx)
            with self.session.watchdog.paused():
                m.save(self.ctx, tiers=tiers, checks_passed=self.session.checks_passed())
        finally:
            self.ctx.extra.pop("state_dict", None)

    def open(self) -> tuple[RestorePoint, str] | None:
        opened = self.manager.open_restore(self.ctx)
        if opened is None:
            return None
        result, path = opened
        point = self.session.restored(result, step=self.ctx.step)
        assert point is not None
        return point, path

    def close(self) -> None:
        self.manager.forward_events(self.ctx)
        self.checkpoints.close()
        self.manager.forward_events(self.ctx)


class RailyardStorageWriter(StorageWriter):
    """``dcp.save(state, storage_writer=railyard.storage_writer(step))``: the state goes to the
    tiers (see the module's docstring). Needs DCP's DefaultSavePlanner (or a planner that keeps
    the planned state in ``planner.state_dict``)."""

    def __init__(self, tiers: DcpTiers, step: int) -> None:
        super().__init__()
        self.tiers = tiers
        self.step = int(step)

    def reset(self, checkpoint_id: Any = None) -> None:
        return None

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return True

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        return None

    def storage_meta(self) -> StorageMeta | None:
        return None

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return plans

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        state = getattr(planner, "state_dict", None)
        if not isinstance(state, dict):
            raise TypeError(
                f"railyard_trainer.sdk.storage_writer: the planner {type(planner).__name__} keeps no state_dict; "
                "use DCP's DefaultSavePlanner (the default)"
            )
        self.tiers.save(self.step, state)
        fut: Future[list[WriteResult]] = Future()
        fut.set_result([WriteResult(index=item.index, size_in_bytes=0, storage_data=None) for item in plan.items])
        return fut

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        # The manager commits each tier's manifest once its shards are written and hashed.
        return None


class RailyardStorageReader(ShardReader):
    """The verified checkpoint this attempt resumes from, as DCP reads it: this rank's folder
    of a node tier, or the shared tier's checkpoint."""

    def __init__(self, path: str, point: RestorePoint) -> None:
        super().__init__(path)
        self.point = point

    @property
    def step(self) -> int:
        return self.point.step


def open_writer(session: Session, step: int) -> RailyardStorageWriter:
    return RailyardStorageWriter(session.dcp(), step)


def open_reader(session: Session) -> RailyardStorageReader | None:
    opened = session.dcp().open()
    if opened is None:
        return None
    point, path = opened
    return RailyardStorageReader(path, point)
