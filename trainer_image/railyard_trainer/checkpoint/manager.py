"""The checkpoint manager: when to save, what makes a save exist, and what to restore.

Saving (:meth:`CheckpointManager.maybe_save`, after every optimizer step):

1. *Blocking part* (the only time training waits): the model and optimizer state dicts are
   copied into host buffers allocated once and reused (pinned when the model is on a GPU), the
   data position and LR schedule are read.
2. *Background part*, one worker thread per rank, jobs in step order (so every rank issues the
   same collectives in the same order on the checkpoint's own gloo process group). Each tier
   starts with the ranks agreeing that all of them are ready, then:
   - memory / local tiers: each rank writes its shard as a self-contained DCP checkpoint
     (``step-N/rank-RRRRR/``, ``shardio.ShardWriter``: tensors raw, one pass from the snapshot,
     hashed as written); the memory tier streams the same pieces, as they are written, to the
     same local rank on the pod's replica peer, which receives them into its node's memory tier
     and checks the sender's digest at the end;
   - shared tier: one DCP checkpoint over all ranks, ``dcp_save(process_group=<ckpt group>)``,
     which reshards on load;
   - the digests (XXH3-128, ``digest.py``) are all-gathered, and only when every shard is
     written the manifest is committed atomically: by the first rank of each pod into its node's
     tier directory (node tiers) or by rank 0 (shared). Then GC.
   A failed tier is reported as an event and tried again at its next interval; nothing raises
   into the train loop.

**Saves never queue.** When a memory-tier save falls due while this rank's previous save is
still being written, the rank takes no snapshot and queues a *skip*; the ranks learn in the
tier's first collective that one of them skipped, and none writes that step (a ``skip`` event
and ``skipped_saves`` say why). A save of a slower tier (local, shared) or of the run's last step
instead waits for the one in flight (at most one: the buffers are reused). Either way every rank
runs the same jobs in the same order, so the decision needs no extra collective.

Restoring (:meth:`CheckpointManager.restore`, before the first step) is the other half, an
object of its own (:class:`~railyard_trainer.checkpoint.restore.Restorer`, restore.py): the
manager hands it the tiers and where every rank is, and records what it restored.
"""

from __future__ import annotations

import logging
import os
import queue
import shutil
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.optim.optimizer import register_optimizer_step_pre_hook

from railyard.protocol.heartbeat import CheckpointEvent
from railyard.protocol.manifest import Manifest, ShardInfo
from railyard.protocol.restore import (
    PER_NODE_TIERS,
    Layout,
    plan_gc,
)
from railyard_trainer.checkpoint.cpuclass import BackgroundCpu, checkpoint_group, resolve_cpu_class
from railyard_trainer.checkpoint.digest import DEFAULT_ALGORITHM
from railyard_trainer.checkpoint.restore import (
    _DCP_ERRORS,
    RankPlacement,
    Restored,
    Restorer,
    rank_dirname,
)
from railyard_trainer.checkpoint.savejob import Laps, RankResult, SaveJob, SaveRecord
from railyard_trainer.checkpoint.saveplan import ReusedSavePlanner
from railyard_trainer.checkpoint.settings import CheckpointSettings, TierSettings
from railyard_trainer.checkpoint.shardio import ShardWriter
from railyard_trainer.checkpoint.shardstream import (
    SHARD_FILES,
    ReplicaReceiver,
    ReplicaSender,
    recv_ring,
)
from railyard_trainer.checkpoint.snapshot import Capture, HostSnapshot
from railyard_trainer.checkpoint.statedict import (
    _jsonable,
    _tensors,
    tensor_state,
)
from railyard_trainer.checkpoint.storage import TierStorage
from railyard_trainer.hooks import RestoreResult, TrainContext

log = logging.getLogger("railyard.checkpoint")

#: Fault-injection points (tests): called as hook(tier, step, rank); may raise or block.
FaultHook = Callable[[str, int, int], None]
MAX_EVENTS = 256
#: Tiers whose save is skipped (not waited for) when it falls due while a save is in flight.
SKIPPABLE_TIERS = frozenset({"memory"})


class CheckpointManager:
    """Tiered, asynchronous, verified checkpoints (implements ``hooks.Checkpointer``).

    Construction is collective (all ranks, same order): it creates the checkpoint's own gloo
    process group (unless ``process_group`` is given) and learns which pod every rank is in.
    """

    def __init__(
        self,
        settings: CheckpointSettings,
        *,
        storages: Mapping[str, TierStorage],
        job: str,
        attempt: int,
        layout: Layout,
        pod_index: int,
        local_rank: int,
        replica_peers: Mapping[int, int] | None = None,
        process_group: dist.ProcessGroup | None = None,
        faults: Mapping[str, FaultHook] | None = None,
        emit_events: bool | None = None,
        final_step: int | None = None,
        background: BackgroundCpu | None = None,
        defer_capture: bool = True,
    ) -> None:
        self.settings = settings
        #: The host buffers saves copy the state into (snapshot.py); ``defer_capture``: copy the
        #: parameters and optimizer state in the background (the SDK turns it off).
        self.snapshot = HostSnapshot(defer_capture=defer_capture)
        #: The background threads' CPU class; ``background`` is the one ``process_group`` was
        #: made with (checkpoint_group), so that the group's threads are boosted with the writer.
        self.cpu = background or BackgroundCpu(resolve_cpu_class(settings.cpu_class))
        self.tiers = [t for t in settings.active_tiers if t.name in storages]
        self.storages = dict(storages)
        self.job = job
        self.attempt = attempt
        self.layout = layout
        self.faults = dict(faults or {})
        #: The run's last step: every active tier saves there.
        self.final_step = final_step
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.pg = process_group or checkpoint_group(settings.timeout_s, self.cpu)
        placement: list[Any] = [None] * self.world
        with self.cpu.boosting():
            dist.all_gather_object(placement, (pod_index, local_rank), group=self.pg)
        ranks = RankPlacement(rank=self.rank, world=self.world, pod=pod_index,
                              pod_of={r: int(p[0]) for r, p in enumerate(placement)},
                              local_of={r: int(p[1]) for r, p in enumerate(placement)})
        self.pod_of, self.local_of, self.pod_ranks = ranks.pod_of, ranks.local_of, ranks.pod_ranks
        self.pod = pod_index
        self.is_pod_leader = ranks.is_pod_leader
        #: The restore half (restore.py): what it needs is handed to it here, nothing else.
        self.restorer = Restorer(settings, storages=self.storages, tiers=self.tiers, job=job, layout=layout,
                                 placement=ranks, pg=self.pg)
        pods = sorted(self.pod_ranks)
        if replica_peers is None:
            # Default: a ring over the pods. The rank table's replica_peer overrides it.
            replica_peers = {p: pods[(i + 1) % len(pods)] for i, p in enumerate(pods)} if len(pods) > 1 else {}
        self.replica_peer = {p: q for p, q in replica_peers.items() if q != p and q in self.pod_ranks}
        self.emit_events = self.rank == 0 if emit_events is None else emit_events

        self._events: list[CheckpointEvent] = []
        self._events_lock = threading.Lock()
        self.history: list[SaveRecord] = []
        #: Saves not written because a save was still running, per tier (see the module doc).
        self.skipped_saves: dict[str, int] = {}
        #: The step of the newest save handed to the worker (what a skip waits behind).
        self._inflight_step = -1
        #: A save overran its interval: the background threads are boosted until the writer is
        #: idle (BackgroundCpu.boost).
        self._overdue = False
        #: Receive buffers of the replica streams, by source rank (reused: faulted once).
        self._rings: dict[int, list[torch.Tensor]] = {}
        #: Plans a rank's own shard once per snapshot structure (worker thread only; saveplan.py).
        self._planner = ReusedSavePlanner()
        self.last_committed: dict[str, int] = {}
        self.last_restore: RestoreResult | None = None
        self._preparing = False
        self._blocking = False
        self._pending = 0
        #: Saves (and skips) queued or running; buffer preparation is not one (a save waits for it).
        self._saves_pending = 0
        self._pending_cv = threading.Condition()
        self._queue: queue.Queue[SaveJob | Callable[[], None] | None] = queue.Queue()
        self._last_saved_step = -1
        self._closed = False
        #: The newest save's background copy, which the next optimizer step waits for.
        self._capture: Capture | None = None
        self._step_hook: Any = None
        if defer_capture:
            self._step_hook = register_optimizer_step_pre_hook(_step_guard(weakref.ref(self)))
        self._worker = threading.Thread(target=self._work, name="railyard-ckpt", daemon=True)
        self._worker.start()

    # ------------------------------------------------------------------ restoring

    def restore(self, ctx: TrainContext) -> RestoreResult | None:
        """Load the newest verified checkpoint into ctx (:meth:`Restorer.restore`). Collective;
        call before the first step. Training waits for it: the saves in flight finish first, and
        the checkpoint group's threads are out of the idle class."""
        with self.cpu.boosting():
            t0 = time.perf_counter()
            self.wait(self.settings.timeout_s)
            restored = self.restorer.restore(ctx, started=t0)
        return None if restored is None else self._note_restored(ctx, restored)

    def open_restore(self, ctx: TrainContext) -> tuple[RestoreResult, str] | None:
        """For a reader that loads the checkpoint itself (:meth:`Restorer.open_restore`): what
        was chosen and the folder this rank reads. Collective; None: fresh start."""
        with self.cpu.boosting():
            t0 = time.perf_counter()
            self.wait(self.settings.timeout_s)
            opened = self.restorer.open_restore(ctx, started=t0)
        if opened is None:
            return None
        restored, path = opened
        return self._note_restored(ctx, restored), path

    def _note_restored(self, ctx: TrainContext, restored: Restored) -> RestoreResult:
        """The restored step is saved already (no save of it again); the restore's event goes to
        the operator, and the health monitor learns the step."""
        result = restored.result
        self.last_restore = result
        self._last_saved_step = result.step
        self._emit(restored.event)
        note_restore = getattr(ctx.extra.get("health_monitor"), "note_restore", None)
        if callable(note_restore):
            note_restore(result.tier, result.step)
        self.forward_events(ctx)
        return result

    # ------------------------------------------------------------------ hooks.Checkpointer

    def _due_tiers(self, step: int) -> list[TierSettings]:
        if step == self._last_saved_step:
            return []
        final = self.final_step is not None and step == self.final_step
        return [t for t in self.tiers if t.due(step) or (final and step > 0)]

    def due(self, step: int) -> bool:
        """Whether :meth:`maybe_save` at ``step`` saves (the train loop verifies first)."""
        return bool(self._due_tiers(step))

    def maybe_save(self, ctx: TrainContext, *, checks_passed: bool) -> None:
        self.forward_events(ctx)
        due = self._due_tiers(ctx.step)
        if due:
            final = self.final_step is not None and ctx.step == self.final_step
            if self._saves_pending > 0 and not final and all(t.name in SKIPPABLE_TIERS for t in due):
                self._queue_skip(ctx, due)
            else:
                self.save(ctx, tiers=due, checks_passed=checks_passed)
        elif self.snapshot.buffers is None and self.tiers and not self._preparing:
            self.prepare(ctx)

    def _queue_skip(self, ctx: TrainContext, tiers: Sequence[TierSettings]) -> None:
        """No snapshot: the previous save still uses the buffers. The worker still runs the
        job's collectives, so every rank learns that this step is not written."""
        reason = f"rank {self.rank}: the step-{self._inflight_step} save was still running"
        self._last_saved_step = ctx.step
        with self._pending_cv:
            if not self._overdue:  # it overran its interval: let it finish out of the idle class
                self._overdue = True
                self.cpu.boost()
        job = SaveJob(
            step=ctx.step, tiers=list(tiers), snapshot=None, trainer_state={}, sdc_passed=False,
            blocked_s=0.0, started=time.perf_counter(), skip=reason,
        )
        with self._pending_cv:
            self._pending += 1
            self._saves_pending += 1
        self._queue.put(job)

    def prepare(self, ctx: TrainContext) -> None:
        """Allocate (and touch) the snapshot buffers in the background before the first save,
        so the first save's blocked time is a copy, not an allocation. Local only: no collective."""
        self._preparing = True
        try:
            state = tensor_state(ctx)
        except Exception:
            log.exception("checkpoint buffer preparation failed; the first save allocates them")
            return
        if not any(True for _ in _tensors(state.get("optim", {}))) and ctx.optimizer is not None:
            # No optimizer state yet (before the first step): its structure would change.
            self._preparing = False
            return
        on_gpu = any(t.is_cuda for t in _tensors(state))

        def allocate() -> None:
            self.snapshot.allocate(state, on_gpu=on_gpu)
            if any(t.replicate for t in self.tiers):
                for src in self._replica_sources():
                    self._rings.setdefault(src, recv_ring())

        with self._pending_cv:
            self._pending += 1
        self._queue.put(allocate)

    def is_saving(self) -> bool:
        return self._blocking or self._pending > 0

    def drain_events(self) -> list[CheckpointEvent]:
        """Checkpoint events since the last call, oldest first (non-empty on rank 0 only).

        The health package puts them into the next heartbeat's ``checkpoints``.
        """
        with self._events_lock:
            out, self._events = self._events, []
        return out

    def forward_events(self, ctx: TrainContext) -> None:
        """Push pending events to the health monitor when it is in ``ctx.extra["health_monitor"]``
        (its ``note_checkpoint``); without one they wait for drain_events()."""
        monitor = ctx.extra.get("health_monitor")
        note = getattr(monitor, "note_checkpoint", None)
        if not callable(note):
            return
        for event in self.drain_events():
            note(event)

    def close(self, timeout_s: float | None = None) -> None:
        """Wait for in-flight saves (bounded by ``timeout_s``, default the group timeout)."""
        if self._closed:
            return
        self._closed = True
        self.wait(timeout_s if timeout_s is not None else self.settings.timeout_s)
        if self._step_hook is not None:
            self._step_hook.remove()
        self._queue.put(None)
        self._worker.join(timeout=5.0)

    # ------------------------------------------------------------------ saving

    def save(self, ctx: TrainContext, *, tiers: Sequence[TierSettings], checks_passed: bool) -> None:
        """Snapshot now (blocking), write ``tiers`` in the background. Never raises."""
        t0 = time.perf_counter()
        self._blocking = True
        snapshot: dict[str, Any] | None = None
        capture: Capture | None = None
        error = ""
        try:
            # The buffers of the previous snapshot are reused: it must be written first.
            if not self.wait(self.settings.timeout_s):
                raise TimeoutError(f"the previous save is still running after {self.settings.timeout_s:.0f}s")
            snapshot, capture = self.snapshot.take(ctx)
            trainer_state = self._trainer_state(ctx)
        except Exception as exc:  # a failed snapshot must not stop training
            log.exception("checkpoint snapshot at step %d failed", ctx.step)
            error = f"rank {self.rank}: snapshot failed: {exc!r}"
            snapshot, trainer_state, capture = None, {}, None
        finally:
            self._blocking = False
        blocked = time.perf_counter() - t0
        self._last_saved_step = ctx.step
        self._inflight_step = ctx.step
        job = SaveJob(
            step=ctx.step, tiers=list(tiers), snapshot=snapshot, trainer_state=trainer_state,
            sdc_passed=bool(checks_passed), blocked_s=blocked, started=t0, error=error, capture=capture,
        )
        self._capture = capture
        with self._pending_cv:
            self._pending += 1
            self._saves_pending += 1
        self._queue.put(job)

    def wait(self, timeout_s: float = 300.0) -> bool:
        """Block until every queued save finished; False on timeout. While it waits, the
        background threads are out of the idle class (training is not using the CPU now, but
        other work may be)."""
        deadline = time.monotonic() + timeout_s
        with self._pending_cv:
            if self._pending == 0:
                return True
        self.cpu.boost()
        try:
            with self._pending_cv:
                while self._pending > 0:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._pending_cv.wait(left)
            return True
        finally:
            self.cpu.unboost()

    def _run_capture(self, job: SaveJob) -> None:
        """Worker: copy the job's deferred part into its buffers."""
        cap = job.capture
        assert cap is not None
        cpu0 = time.thread_time()
        error = ""
        try:
            self._fault("before_capture", job.tiers[0].name, job.step)
            self.snapshot.copy_deferred(cap)
        except Exception as exc:
            log.exception("checkpoint capture at step %d failed", job.step)
            error = f"rank {self.rank}: snapshot failed: {exc!r}"
        cap.finish(error)
        with cap.lock:
            torn = cap.torn
        job.error = job.error or cap.error or (
            f"rank {self.rank}: snapshot torn: training stepped before the copy finished" if torn else ""
        )
        job.captured_at = time.perf_counter()
        job.capture_cpu_s = time.thread_time() - cpu0

    def _before_optimizer_step(self) -> None:
        """Training is about to change the parameters: the newest save's copy of them must be
        done. Waits (the background threads boosted) if it is not, and counts the wait."""
        cap = self._capture
        if cap is None:
            return
        with cap.lock:
            if cap.done.is_set():
                return
            cap.waiting = True
        t0 = time.perf_counter()
        with self.cpu.boosting():
            done = cap.done.wait(self.settings.timeout_s)
        with cap.lock:
            cap.stall_s = time.perf_counter() - t0
            # Done between the timeout and now: the copy is whole (the step has not run yet).
            done = cap.done.is_set()
            cap.torn = not done
        cap.accounted.set()
        if not done:
            log.error("checkpoint: the step-%d copy did not finish in %.0fs; that save is dropped",
                      cap.step, self.settings.timeout_s)

    def _trainer_state(self, ctx: TrainContext) -> dict[str, Any]:
        out: dict[str, Any] = {"step": ctx.step}
        if ctx.data is not None and hasattr(ctx.data, "state_dict"):
            out["data"] = ctx.data.state_dict()
        if ctx.lr_scheduler is not None and hasattr(ctx.lr_scheduler, "state_dict"):
            out["lr_scheduler"] = ctx.lr_scheduler.state_dict()
        return out

    def _work(self) -> None:
        # Background writes yield the CPU to training (Linux: per-thread scheduling).
        self.cpu.join()
        while True:
            job = self._queue.get()
            if job is None:
                self.cpu.leave()
                return
            if not isinstance(job, SaveJob):
                try:
                    job()
                except Exception:
                    log.exception("checkpoint background task failed")
                finally:
                    with self._pending_cv:
                        self._pending -= 1
                        self._pending_cv.notify_all()
                continue
            try:
                if job.capture is not None:
                    self._run_capture(job)
                for tier in job.tiers:
                    self._save_tier(job, tier)
            except Exception:  # the worker must survive anything
                log.exception("checkpoint worker failed at step %d", job.step)
            finally:
                job.snapshot = None
                if job.capture is not None:
                    job.capture.finish()  # never leave training waiting for a copy that failed
                with self._pending_cv:
                    self._pending -= 1
                    self._saves_pending -= 1
                    if self._overdue and self._saves_pending == 0:
                        self._overdue = False
                        self.cpu.unboost()
                    self._pending_cv.notify_all()

    def _fault(self, point: str, tier: str, step: int) -> None:
        hook = self.faults.get(point)
        if hook is not None:
            hook(tier, step, self.rank)

    def _gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj, group=self.pg)
        return out

    def _save_tier(self, job: SaveJob, tier: TierSettings) -> None:
        storage = self.storages[tier.name]
        per_node = tier.name in PER_NODE_TIERS
        laps = Laps(job.started, job.blocked_s)
        first = tier is job.tiers[0]
        if first and job.captured_at is not None:
            laps.lap("capture", job.captured_at)
        laps.lap("waited")
        mine = RankResult(error=job.error, state=job.trainer_state)
        planned = False
        if not mine.error and not job.skip:
            try:
                self._fault("before_write", tier.name, job.step)
                if per_node:
                    # A step directory left by an older attempt is overwritten: uncommit it first.
                    storage.uncommit(job.step)
                    shutil.rmtree(storage.step_dir(job.step) / rank_dirname(self.rank), ignore_errors=True)
                else:
                    if self.rank == 0:
                        storage.uncommit(job.step)
                    storage.step_dir(job.step).mkdir(parents=True, exist_ok=True)
            except Exception as exc:
                mine.error = f"rank {self.rank}: {exc!r}"
        # Every rank writes (and streams to its replica peer, and enters DCP's collectives) only
        # if every rank is ready to: nobody is left waiting for a rank that skipped or failed.
        ready: list[tuple[str, str]] = self._gather((job.skip, mine.error))
        laps.lap("ready")
        skips = [k for k, _ in ready if k]
        errors = [e for _, e in ready if e]
        if skips or errors:
            self._record_not_written(job, tier, skips, errors, laps)
            return
        try:
            if per_node:
                plans = self._planner.plans_made
                mine.shards, mine.replica_problems = self._write_rank_shard(
                    storage, job, replicate=tier.replicate, laps=laps
                )
                planned = self._planner.plans_made > plans
            else:
                assert job.snapshot is not None
                dcp_save(
                    job.snapshot,
                    storage_writer=FileSystemWriter(storage.step_dir(job.step)),
                    process_group=self.pg,
                )
                self._fault("after_write", tier.name, job.step)
                mine.shards = self._hash_shared_files(storage, job.step)
        except _DCP_ERRORS as exc:
            mine.error = f"rank {self.rank}: {exc!r}"
        laps.lap("write")
        results: list[RankResult] = self._gather(mine)
        laps.lap("agree")
        errors = [r.error for r in results if r.error]
        problems = [p for r in results for p in r.replica_problems]
        replica_note = ("replica: " + "; ".join(problems))[:300] if problems else ""
        committed = False
        commit_error = ""
        if not errors:
            manifest = Manifest(
                job=self.job, step=job.step, tier=tier.name, attempt=self.attempt,
                pp=self.layout.pp, dp=self.layout.dp, tp=self.layout.tp,
                shards=tuple(sorted((s for r in results for s in r.shards), key=lambda s: s.path)),
                data_position=_data_position(results),
                sdc_passed=job.sdc_passed, created_at=time.time(),
            )
            writer = self.is_pod_leader if per_node else self.rank == 0
            if writer:
                try:
                    self._fault("before_commit", tier.name, job.step)
                    storage.commit(job.step, manifest)
                    committed = True
                    self._gc(storage, tier)
                except Exception as exc:
                    commit_error = f"rank {self.rank}: commit failed: {exc!r}"
        laps.lap("commit")
        commits: list[tuple[bool, str]] = self._gather((committed, commit_error))
        laps.lap("confirm")
        commit_errors = [e for _, e in commits if e]
        ok = not errors and not commit_errors and any(c for c, _ in commits)
        nbytes = sum(s.bytes for r in results for s in r.shards)
        detail = "; ".join(errors + commit_errors)[:500] if not ok else replica_note
        if ok:
            self.last_committed[tier.name] = job.step
        stall = job.capture.stall(self.settings.timeout_s) if job.capture is not None and first else 0.0
        record = SaveRecord(
            step=job.step, tier=tier.name, ok=ok, blocked_s=job.blocked_s,
            duration_s=laps.total, bytes=nbytes, detail=detail, phases=laps.phases,
            worker_cpu_s=laps.cpu_s + (job.capture_cpu_s if first else 0.0), planned=planned, stall_s=stall,
        )
        self.history.append(record)
        if not ok:
            log.warning("checkpoint %s step %d failed: %s", tier.name, job.step, detail)
        self._emit(
            CheckpointEvent(
                step=job.step, tier=tier.name, ok=ok, blocked_s=record.blocked_s,
                duration_s=record.duration_s, bytes=nbytes, sdc_passed=job.sdc_passed, detail=detail,
            )
        )

    def _record_not_written(
        self, job: SaveJob, tier: TierSettings, skips: list[str], errors: list[str], laps: Laps
    ) -> None:
        """The tier is not written at this step on any rank: skipped (a rank was still saving)
        or failed before writing (a snapshot or a directory)."""
        skipped = not errors
        detail = ("skipped: " + "; ".join(skips) if skipped else "; ".join(errors))[:500]
        record = SaveRecord(
            step=job.step, tier=tier.name, ok=False, blocked_s=job.blocked_s,
            duration_s=laps.total, bytes=0, detail=detail, skipped=skipped, phases=laps.phases,
            worker_cpu_s=laps.cpu_s,
        )
        self.history.append(record)
        if skipped:
            self.skipped_saves[tier.name] = self.skipped_saves.get(tier.name, 0) + 1
            log.warning(
                "checkpoint %s step %d %s (saves do not queue; the next interval saves)", tier.name, job.step, detail
            )
        else:
            log.warning("checkpoint %s step %d failed: %s", tier.name, job.step, detail)
        self._emit(
            CheckpointEvent(
                step=job.step, tier=tier.name, ok=False, blocked_s=record.blocked_s,
                duration_s=record.duration_s, bytes=0, sdc_passed=job.sdc_passed, detail=detail,
                kind="skip" if skipped else "save",
            )
        )

    def _write_rank_shard(
        self, storage: TierStorage, job: SaveJob, *, replicate: bool, laps: Laps
    ) -> tuple[list[ShardInfo], list[str]]:
        """Write this rank's shard (streamed to its replica target as it is written) and
        receive the replicas sent to this rank. Returns (own shards, replica problems)."""
        assert job.snapshot is not None
        step_dir = storage.step_dir(job.step)
        target = step_dir / rank_dirname(self.rank)
        send_to = self._replica_target(self.rank) if replicate else None
        sources = self._replica_sources() if replicate else []
        sender = ReplicaSender(self.pg, send_to) if send_to is not None else None
        receivers: list[ReplicaReceiver] = []
        for src in sources:
            d = step_dir / rank_dirname(src)
            shutil.rmtree(d, ignore_errors=True)
            receivers.append(ReplicaReceiver(
                self.pg, src, d, fsync=storage.fsync, ring=self._rings.get(src), spare=storage.take_spare,
            ))
        writer = ShardWriter(target, fsync=storage.fsync, replica=sender, receivers=receivers, spare=storage.take_spare)
        error: BaseException | None = None
        try:
            dcp_save(job.snapshot, storage_writer=writer, planner=self._planner, no_dist=True)
            self._fault("after_write", storage.name, job.step)
        except BaseException as exc:
            error = exc
        finally:
            laps.lap("write")
            # Whatever happened here, the peers get every message they were promised and every
            # message promised to this rank is received: nobody waits for a group timeout.
            # (Owed messages go out first; sends complete as the peers receive.)
            if sender is not None:
                sender.seal(len(SHARD_FILES))
            for rx in receivers:
                rx.finish()
                self._rings[rx.src] = rx.ring
            send_problem = sender.wait() if sender is not None else ""
            laps.lap("drain")
        if error is not None:
            raise error
        problems = [p for rx in receivers for p in rx.problems]
        if send_problem:
            problems.append(f"rank {self.rank}: {send_problem}")
        shards = [
            ShardInfo(path=f.rel, bytes=f.size, sha256=f.digest, owner=self.rank, algorithm=f.algorithm)
            for f in writer.files
        ]
        return sorted(shards, key=lambda x: x.path), problems

    def _hash_shared_files(self, storage: TierStorage, step: int) -> list[ShardInfo]:
        prefix = f"__{self.rank}_"
        names = sorted(os.listdir(storage.step_dir(step)))
        mine = [n for n in names if n.startswith(prefix) and n.endswith(".distcp")]
        if self.rank == 0:
            mine.append(".metadata")
        shards = []
        for name in mine:
            state = storage.file_state(step, name, DEFAULT_ALGORITHM)
            if state is None:
                raise OSError(f"{name}: written but unreadable")
            owner = -1 if name == ".metadata" else self.rank
            shards.append(
                ShardInfo(path=name, bytes=state[0], sha256=state[1], owner=owner, algorithm=DEFAULT_ALGORITHM)
            )
        return shards

    # ------------------------------------------------------------------ memory replica

    def _replica_target(self, rank: int) -> int | None:
        """The rank on the replica peer pod with the same local rank (None: no replica)."""
        peer = self.replica_peer.get(self.pod_of[rank])
        if peer is None:
            return None
        local = self.local_of[rank]
        return next((r for r in self.pod_ranks[peer] if self.local_of[r] == local), None)

    def _replica_sources(self) -> list[int]:
        """The ranks whose replicas land on this rank."""
        return [r for r in range(self.world) if self._replica_target(r) == self.rank]

    # ------------------------------------------------------------------ GC

    def _gc(self, storage: TierStorage, tier: TierSettings) -> None:
        manifests = []
        uncommitted = []
        for step in storage.list_steps():
            m = storage.read_manifest(step)
            if m is None:
                uncommitted.append(step)
            else:
                manifests.append(m)
        doomed = plan_gc(manifests, keep=tier.keep, uncommitted_steps=uncommitted)
        # The newest step that goes is kept as spares for the next save (a node tier overwrites
        # its files in place: see storage.py); the others are deleted.
        for step in doomed[:-1]:
            storage.delete(step)
        if doomed:
            storage.retire(doomed[-1])

    # ------------------------------------------------------------------ events

    def _emit(self, event: CheckpointEvent) -> None:
        if not self.emit_events:
            return
        with self._events_lock:
            self._events.append(event)
            del self._events[:-MAX_EVENTS]


# ---------------------------------------------------------------------- state helpers


def _data_position(results: Sequence[RankResult]) -> dict[str, Any]:
    """The manifest's trainer state: rank 0's, plus every rank's data state if they differ."""
    first = results[0].state
    out: dict[str, Any] = {k: _jsonable(v) for k, v in first.items()}
    datas = [_jsonable(r.state.get("data")) for r in results]
    if any(d != datas[0] for d in datas):
        out["data_per_rank"] = datas
    return out




def _step_guard(ref: weakref.ReferenceType[CheckpointManager]) -> Callable[..., None]:
    """A global optimizer-step pre-hook for one manager (held weakly)."""

    def hook(optimizer: Any, args: Any, kwargs: Any) -> None:
        manager = ref()
        if manager is not None:
            manager._before_optimizer_step()

    return hook



