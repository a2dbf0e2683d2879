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

Restoring (:meth:`CheckpointManager.restore`, before the first step): every pod lists the
committed manifests it can see, the listings are gathered, and
:func:`railyard.protocol.restore.decide_restore` picks the newest complete, SDC-clean step,
fastest tier first. The shards it names are checksum-verified (spread over the ranks that can
read them) before anything is loaded; corrupt copies are dropped and the choice is made again,
so a corrupt checkpoint is never loaded and never retried. Shards held only by a neighbour
(a lost node's memory tier) are streamed to the rank that needs them (from the holder's page
cache into the receiver's file pages), verified as they arrive, and kept in its node's tier.
Node-tier shards are read straight into the tensors being restored (``shardio.ShardReader``).
See docs/checkpoints.md.
"""

from __future__ import annotations

import logging
import os
import pickle
import queue
import shutil
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.tensor import DTensor
from torch.optim.optimizer import register_optimizer_step_pre_hook

from railyard.protocol.exitcodes import ExitCode
from railyard.protocol.heartbeat import CheckpointEvent
from railyard.protocol.manifest import Manifest, ShardInfo
from railyard.protocol.restore import (
    PER_NODE_TIERS,
    SHARED_LOCATION,
    FoundCheckpoint,
    Layout,
    RestoreHint,
    RestoreSource,
    compute_steps_lost,
    decide_restore,
    merge_verified,
    plan_gc,
    pod_location,
)
from railyard_trainer.checkpoint.cpuclass import BackgroundCpu, checkpoint_group, resolve_cpu_class
from railyard_trainer.checkpoint.digest import DEFAULT_ALGORITHM
from railyard_trainer.checkpoint.saveplan import ReusedSavePlanner
from railyard_trainer.checkpoint.settings import CheckpointSettings, TierSettings
from railyard_trainer.checkpoint.shardio import (
    SHARD_FILES,
    ReplicaReceiver,
    ReplicaSender,
    ShardReader,
    ShardWriter,
    receive_files,
    recv_ring,
    send_files,
)
from railyard_trainer.checkpoint.statedict import (
    _defer,
    _jsonable,
    _keep_saved_rng,
    _local,
    _MergedReader,
    _tensors,
    apply_tensor_state,
    files_needed,
    merge_rank_metadata,
    tensor_state,
)
from railyard_trainer.checkpoint.storage import TierStorage
from railyard_trainer.hooks import RestoreResult, TrainContext

log = logging.getLogger("railyard.checkpoint")

#: Fault-injection points (tests): called as hook(tier, step, rank); may raise or block.
FaultHook = Callable[[str, int, int], None]
MAX_EVENTS = 256
#: What a failed ``dcp.save`` / ``dcp.load`` raises: DCP wraps the ranks' errors in a
#: ``CheckpointException``, a ``BaseException``, which ``except Exception`` would let through
#: (and kill the save worker, or the restore instead of falling back).
_DCP_ERRORS = (Exception, CheckpointException)
#: Tiers whose save is skipped (not waited for) when it falls due while a save is in flight.
SKIPPABLE_TIERS = frozenset({"memory"})


class NoVerifiedCheckpoint(RuntimeError):
    """Restore was required (the operator named a checkpoint, or a load was attempted and
    failed) but no complete, verified, SDC-clean checkpoint exists. Exit with ``exit_code``."""

    exit_code = int(ExitCode.NO_VERIFIED_CHECKPOINT)


def rank_dirname(rank: int) -> str:
    return f"rank-{rank:05d}"


@dataclass
class _SaveJob:
    step: int
    tiers: list[TierSettings]
    snapshot: dict[str, Any] | None
    trainer_state: dict[str, Any]
    sdc_passed: bool
    blocked_s: float
    started: float
    error: str = ""
    #: Set on a rank that took no snapshot because its previous save was still running.
    skip: str = ""
    #: The part of the snapshot the worker copies (the parameters and optimizer state).
    capture: _Capture | None = None
    #: When the worker finished that copy (``perf_counter``), and its CPU time.
    captured_at: float | None = None
    capture_cpu_s: float = 0.0


@dataclass
class _Capture:
    """The part of a snapshot copied in the background: the parameters and the optimizer
    state, which only an optimizer step changes. The worker copies them while training runs the
    next step's forward and backward, and the next optimizer step waits until it has
    (:meth:`CheckpointManager._before_optimizer_step`): the pipelined snapshot of CheckFreq
    (FAST '21), and DCP's asynchronous staging. Everything else (buffers, which a forward may
    change; the RNG state) is copied while training waits, as before."""

    step: int
    #: (live tensor, snapshot buffer) pairs, local shards.
    pairs: list[tuple[torch.Tensor, torch.Tensor]]
    #: On a GPU: recorded on training's stream at the save; the copy stream waits for it.
    event: Any = None
    done: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: Training reached an optimizer step before the copy was done, and waits (``stall_s``).
    waiting: bool = False
    accounted: threading.Event = field(default_factory=threading.Event)
    stall_s: float = 0.0
    #: The wait timed out before the copy was done and training went on: the copy may mix two
    #: steps, and the save fails. (``torn`` and ``done`` change under ``lock``: the first wins.)
    torn: bool = False
    error: str = ""

    def finish(self, error: str = "") -> None:
        with self.lock:
            self.error = self.error or error
            self.done.set()

    def stall(self, timeout_s: float) -> float:
        """Training waited this long at its optimizer step for the copy (the worker calls it
        after the copy: a wait that began before it ended is counted once it has)."""
        with self.lock:
            waiting = self.waiting
        if waiting:
            self.accounted.wait(timeout_s)
        return self.stall_s


@dataclass
class SaveRecord:
    """One tier's save as this rank saw it (bench and tests; rank 0 also emits an event)."""

    step: int
    tier: str
    ok: bool
    blocked_s: float
    duration_s: float
    bytes: int
    detail: str = ""
    #: Not written because a rank's previous save was still running (``ok`` is False).
    skipped: bool = False
    #: Where ``duration_s`` went, in order (seconds; see :class:`_Laps`): ``snapshot`` (the
    #: blocking copy, = ``blocked_s``), ``capture`` (the first tier only: the worker's copy of
    #: the parameters and optimizer state, see :class:`_Capture`), ``waited`` (in the queue, or
    #: behind the job's earlier tiers), ``ready`` (directories, then every rank agreeing to write), ``write`` (this
    #: rank's shard: planning, write, hash, replica pieces sent and received meanwhile),
    #: ``drain`` (the replica streams completed), ``agree`` (the ranks' results gathered),
    #: ``commit`` (manifest and GC, on the writer) and ``confirm`` (the commits gathered).
    phases: dict[str, float] = field(default_factory=dict)
    #: CPU time the checkpoint's worker thread spent on this tier (gloo's threads, which move
    #: the replica's bytes, not included): what the save takes from training's cores.
    worker_cpu_s: float = 0.0
    #: This rank worked out DCP's plan for its shard (a node tier's first save of a snapshot
    #: structure); the saves after it reuse that plan (saveplan.py).
    planned: bool = False
    #: Training waited this long at its next optimizer step for the background copy of the
    #: parameters and optimizer state (``capture``; see :class:`_Capture`): blocked time too.
    stall_s: float = 0.0

    @property
    def background_s(self) -> float:
        """The save after its snapshot: what runs beside training."""
        return max(0.0, self.duration_s - self.blocked_s)


class _Laps:
    """Named consecutive intervals of one save, from its start (``perf_counter`` seconds)."""

    def __init__(self, started: float, blocked_s: float) -> None:
        self.phases: dict[str, float] = {"snapshot": blocked_s}
        self._started = started
        self._last = started + blocked_s
        self._cpu0 = time.thread_time()

    def lap(self, name: str, now: float | None = None) -> None:
        """The interval from the last lap to ``now`` (default: this moment) is ``name``'s."""
        now = time.perf_counter() if now is None else now
        self.phases[name] = self.phases.get(name, 0.0) + max(0.0, now - self._last)
        self._last = max(self._last, now)

    @property
    def cpu_s(self) -> float:
        """CPU time of the calling thread since the laps began."""
        return time.thread_time() - self._cpu0

    @property
    def total(self) -> float:
        """From the save's start to the end of the last lap (the phases add up to it)."""
        return self._last - self._started


@dataclass
class _Local:
    """One rank's outcome of writing its part of a tier."""

    error: str = ""
    shards: list[ShardInfo] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)
    #: Replicas this rank received for other ranks that did not arrive intact.
    replica_problems: list[str] = field(default_factory=list)


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
        #: Copy the parameters and optimizer state in the background (:class:`_Capture`); the
        #: SDK turns it off (a program's own loop may change its parameters outside an
        #: optimizer step).
        self.defer_capture = defer_capture
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
        self.pod_of = {r: int(p[0]) for r, p in enumerate(placement)}
        self.local_of = {r: int(p[1]) for r, p in enumerate(placement)}
        self.pod_ranks: dict[int, list[int]] = {}
        for r in range(self.world):
            self.pod_ranks.setdefault(self.pod_of[r], []).append(r)
        self.pod = pod_index
        self.is_pod_leader = self.pod_ranks[pod_index][0] == self.rank
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
        self._buffers: dict[str, Any] | None = None
        self._preparing = False
        self._blocking = False
        self._pending = 0
        #: Saves (and skips) queued or running; buffer preparation is not one (a save waits for it).
        self._saves_pending = 0
        self._pending_cv = threading.Condition()
        self._queue: queue.Queue[_SaveJob | Callable[[], None] | None] = queue.Queue()
        self._last_saved_step = -1
        self._closed = False
        #: The newest save's background copy, which the next optimizer step waits for.
        self._capture: _Capture | None = None
        self._copy_stream: Any = None
        self._step_hook: Any = None
        if defer_capture:
            self._step_hook = register_optimizer_step_pre_hook(_step_guard(weakref.ref(self)))
        self._worker = threading.Thread(target=self._work, name="railyard-ckpt", daemon=True)
        self._worker.start()

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
        elif self._buffers is None and self.tiers and not self._preparing:
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
        job = _SaveJob(
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
            buffers = _create_cpu_state_dict(state, pin_memory=on_gpu)
            for t in _tensors(buffers):
                # Fault the pages in now, not during the first blocking copy.
                (t.to_local() if isinstance(t, DTensor) else t).zero_()
            self._buffers = buffers
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
        capture: _Capture | None = None
        error = ""
        try:
            # The buffers of the previous snapshot are reused: it must be written first.
            if not self.wait(self.settings.timeout_s):
                raise TimeoutError(f"the previous save is still running after {self.settings.timeout_s:.0f}s")
            snapshot, capture = self._snapshot(ctx)
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
        job = _SaveJob(
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

    def _snapshot(self, ctx: TrainContext) -> tuple[dict[str, Any], _Capture | None]:
        """Copy what a forward may change now; the parameters and optimizer state, when they can
        be left to the worker (:class:`_Capture`), are returned as pairs for it to copy."""
        state = tensor_state(ctx)
        on_gpu = any(t.is_cuda for t in _tensors(state))
        live = self._deferrable(ctx)
        if self._buffers is None:
            self._buffers = _create_cpu_state_dict(state, pin_memory=on_gpu)
        try:
            snap, pairs = self._copy_now(state, live, on_gpu)
        except Exception:
            # The state's structure changed (e.g. optimizer state appeared): new buffers.
            self._buffers = _create_cpu_state_dict(state, pin_memory=on_gpu)
            snap, pairs = self._copy_now(state, live, on_gpu)
        event = None
        if on_gpu:
            if pairs:
                event = torch.cuda.Event()
                event.record()  # the copy stream starts after everything training queued so far
            torch.cuda.synchronize()
        return snap, (_Capture(step=ctx.step, pairs=pairs, event=event) if pairs else None)

    def _deferrable(self, ctx: TrainContext) -> set[int] | None:
        """The storages of the parameters, when an optimizer step (and nothing else) changes
        them: the trainer's own loop with a torch optimizer, not a program's own state dict."""
        if not self.defer_capture or callable(ctx.extra.get("state_dict")):
            return None
        if not isinstance(ctx.optimizer, torch.optim.Optimizer):
            return None
        return {_local(p).untyped_storage().data_ptr() for m in ctx.model_parts for p in m.parameters()}

    def _copy_now(
        self, state: dict[str, Any], live: set[int] | None, on_gpu: bool
    ) -> tuple[dict[str, Any], list[tuple[torch.Tensor, torch.Tensor]]]:
        assert self._buffers is not None
        pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        source = state
        if live is not None:
            # The deferred leaves are replaced by their own buffers: copying a tensor onto
            # itself is a no-op, so the copy below takes only the rest.
            source = dict(state)
            source["model"] = _defer(state["model"], self._buffers["model"], live, pairs)
            if "optim" in state:
                source["optim"] = _defer(state["optim"], self._buffers["optim"], None, pairs)
        return _copy_state_dict(source, self._buffers, non_blocking=on_gpu), pairs

    def _run_capture(self, job: _SaveJob) -> None:
        """Worker: copy the job's deferred part into its buffers."""
        cap = job.capture
        assert cap is not None
        cpu0 = time.thread_time()
        error = ""
        try:
            self._fault("before_capture", job.tiers[0].name, job.step)
            if cap.event is not None:
                if self._copy_stream is None:
                    self._copy_stream = torch.cuda.Stream(device=cap.pairs[0][0].device)
                with torch.no_grad(), torch.cuda.stream(self._copy_stream):
                    self._copy_stream.wait_event(cap.event)
                    for src, dst in cap.pairs:
                        dst.copy_(src, non_blocking=True)
                self._copy_stream.synchronize()
            else:
                with torch.no_grad():
                    for src, dst in cap.pairs:
                        dst.copy_(src)
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
            if not isinstance(job, _SaveJob):
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

    def _save_tier(self, job: _SaveJob, tier: TierSettings) -> None:
        storage = self.storages[tier.name]
        per_node = tier.name in PER_NODE_TIERS
        laps = _Laps(job.started, job.blocked_s)
        first = tier is job.tiers[0]
        if first and job.captured_at is not None:
            laps.lap("capture", job.captured_at)
        laps.lap("waited")
        mine = _Local(error=job.error, state=job.trainer_state)
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
        results: list[_Local] = self._gather(mine)
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
        self, job: _SaveJob, tier: TierSettings, skips: list[str], errors: list[str], laps: _Laps
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
            log.warning("checkpoint %s step %d %s (saves do not queue; the next interval saves)", tier.name, job.step, detail)
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
        self, storage: TierStorage, job: _SaveJob, *, replicate: bool, laps: _Laps
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
            shards.append(ShardInfo(path=name, bytes=state[0], sha256=state[1], owner=owner, algorithm=DEFAULT_ALGORITHM))
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

    # ------------------------------------------------------------------ restore

    def restore(self, ctx: TrainContext) -> RestoreResult | None:
        """Load the newest verified checkpoint into ctx. Collective; call before the first step.

        Returns None for a fresh start. Raises :class:`NoVerifiedCheckpoint` when the operator
        named a checkpoint (hint with step >= 0) or a load failed and nothing else is usable.
        Training waits for it: the checkpoint group's threads are out of the idle class.
        """
        with self.cpu.boosting():
            return self._restore(ctx)

    def _restore(self, ctx: TrainContext) -> RestoreResult | None:
        t0 = time.perf_counter()
        self.wait(self.settings.timeout_s)
        hint = _hint(self.settings.restore_hint)
        found = self._list_found()
        home = {r: pod_location(self.pod_of[r]) for r in range(self.world)}
        load_failures: list[str] = []
        for _ in range(4 * (len(found) + 1) + 8):
            decision = decide_restore(found, layout=self.layout, hint=hint, home=home, node_reshard=True)
            if decision.source is None:
                why = decision.reason + "".join(f"; {r}" for r in decision.rejected + tuple(load_failures))
                if load_failures or (hint is not None and hint.step >= 0):
                    raise NoVerifiedCheckpoint(f"restore: {why}")
                log.info("restore: fresh start (%s)", why)
                return None
            if decision.to_verify:
                found = self._verify(decision.source, decision.to_verify, found)
                continue
            nbytes, errors = self._load(ctx, decision.source)
            if not errors:
                return self._restored(ctx, decision.source, t0, nbytes, decision.rejected)
            load_failures.append(f"{decision.source.tier} step {decision.source.step}: load failed: {errors[0]}")
            found = _mark_corrupt(found, decision.source)
        raise NoVerifiedCheckpoint("restore: gave up after too many rounds")  # pragma: no cover

    def open_restore(self, ctx: TrainContext) -> tuple[RestoreResult, str] | None:
        """For a reader that loads the checkpoint itself (the SDK's DCP StorageReader): choose and
        verify the source as :meth:`restore` does, bring the shards a rank needs onto its node
        (a lost node's from the neighbour's replica), and return what was chosen and the folder
        this rank reads: ``step-N/rank-R`` of a node tier (same layout only; another layout
        takes the shared tier) or the shared tier's ``step-N``. Collective; None: fresh start."""
        with self.cpu.boosting():
            return self._open_restore(ctx)

    def _open_restore(self, ctx: TrainContext) -> tuple[RestoreResult, str] | None:
        t0 = time.perf_counter()
        self.wait(self.settings.timeout_s)
        hint = _hint(self.settings.restore_hint)
        found = self._list_found()
        home = {r: pod_location(self.pod_of[r]) for r in range(self.world)}
        failures: list[str] = []
        for _ in range(4 * (len(found) + 1) + 8):
            decision = decide_restore(found, layout=self.layout, hint=hint, home=home, node_reshard=False)
            src = decision.source
            if src is None:
                why = decision.reason + "".join(f"; {r}" for r in decision.rejected + tuple(failures))
                if failures or (hint is not None and hint.step >= 0):
                    raise NoVerifiedCheckpoint(f"restore: {why}")
                return None
            if decision.to_verify:
                found = self._verify(src, decision.to_verify, found)
                continue
            storage = self.storages[src.tier]
            error, nbytes = "", 0
            if src.tier in PER_NODE_TIERS:
                try:
                    nbytes = self._fetch(storage, src)
                except Exception as exc:
                    error = f"rank {self.rank}: fetch: {exc!r}"
            errors = [e for e in self._gather(error) if e]
            if errors:
                failures.append(f"{src.tier} step {src.step}: {errors[0]}")
                found = _mark_corrupt(found, src)
                continue
            ctx.step = src.step
            folder = storage.step_dir(src.step)
            path = folder / rank_dirname(self.rank) if src.tier in PER_NODE_TIERS else folder
            return self._restored(ctx, src, t0, nbytes, decision.rejected), str(path)
        raise NoVerifiedCheckpoint("restore: gave up after too many rounds")  # pragma: no cover

    def _restored(
        self, ctx: TrainContext, src: RestoreSource, t0: float, nbytes: int, rejected: Sequence[str]
    ) -> RestoreResult:
        duration = time.perf_counter() - t0
        hint = self.settings.restore_hint or {}
        last = hint.get("lastStep")
        lost = compute_steps_lost(int(last), src.step) if isinstance(last, int) else -1
        m = src.manifest
        detail = f"step {src.step} from {src.tier}" + (
            f" (resharded from pp={m.pp} dp={m.dp} tp={m.tp}; each rank keeps its own RNG stream)" if src.reshard else ""
        )
        remote = sorted({loc for loc in src.sources.values()} - {SHARED_LOCATION})
        if len(remote) > 1:
            detail += f" (shards from {', '.join(remote)})"
        if rejected:
            detail += "; skipped: " + "; ".join(rejected)
        result = RestoreResult(step=src.step, tier=src.tier, duration_s=duration, detail=detail[:500])
        self.last_restore = result
        self._last_saved_step = src.step
        self._emit(
            CheckpointEvent(
                step=src.step, tier=src.tier, ok=True, duration_s=duration, bytes=nbytes,
                sdc_passed=src.manifest.sdc_passed, detail=result.detail, kind="restore", steps_lost=lost,
            )
        )
        log.info("restored %s in %.2fs", detail, duration)
        note_restore = getattr(ctx.extra.get("health_monitor"), "note_restore", None)
        if callable(note_restore):
            note_restore(src.tier, src.step)
        self.forward_events(ctx)
        return result

    def _list_found(self) -> list[FoundCheckpoint]:
        mine: list[FoundCheckpoint] = []
        for tier in self.tiers:
            storage = self.storages[tier.name]
            if tier.name in PER_NODE_TIERS:
                if not self.is_pod_leader:
                    continue
                location = pod_location(self.pod)
            elif self.rank == 0:
                location = SHARED_LOCATION
            else:
                continue
            try:
                steps = storage.list_steps()
            except OSError:
                continue
            for step in steps:
                m = storage.read_manifest(step)
                if m is None or m.job != self.job:
                    continue
                present = frozenset(s.path for s in m.shards if storage.file_size(step, s.path) == s.bytes)
                mine.append(FoundCheckpoint(manifest=m, location=location, present=present))
        return [f for part in self._gather(mine) for f in part]

    def _readers(self, location: str) -> list[int]:
        if location == SHARED_LOCATION:
            return list(range(self.world))
        return self.pod_ranks[int(location.split("-", 1)[1])]

    def _verify(
        self, src: RestoreSource, to_verify: Sequence[tuple[str, str]], found: list[FoundCheckpoint]
    ) -> list[FoundCheckpoint]:
        """Hash the named copies, spread over the ranks that can read them; merge results."""
        expected = {s.path: s for s in src.manifest.shards}
        storage = self.storages[src.tier]
        counters: dict[str, int] = {}
        mine: list[tuple[str, str, bool]] = []
        for path, location in to_verify:
            readers = self._readers(location)
            i = counters.get(location, 0)
            counters[location] = i + 1
            if readers[i % len(readers)] != self.rank:
                continue
            shard = expected[path]
            state = storage.file_state(src.step, path, shard.algorithm)
            ok = state is not None and state == (shard.bytes, shard.sha256)
            if not ok:
                log.warning("restore: %s step %d %s at %s failed its checksum", src.tier, src.step, path, location)
            mine.append((path, location, ok))
        results = [x for part in self._gather(mine) for x in part]
        return merge_verified(found, src, results)

    def _load(self, ctx: TrainContext, src: RestoreSource) -> tuple[int, list[str]]:
        """Fetch missing shards, load, apply. Collective. Returns (bytes, errors of all ranks)."""
        error = ""
        nbytes = 0
        storage = self.storages[src.tier]
        try:
            template = tensor_state(ctx)
        except Exception as exc:
            error = f"rank {self.rank}: state dict: {exc!r}"
            template = {}
        if src.tier in PER_NODE_TIERS:
            # Every rank must be ready before the point-to-point transfers start.
            ready = [e for e in self._gather(error) if e]
            if ready and not error:
                error = "skipped: " + ready[0]
            if src.reshard:
                # Another layout: the old ranks' checkpoints are read as one (merged metadata),
                # after each node fetched the files its new ranks overlap. Collective.
                loaded, error = self._load_resharded(storage, src, template, error)
                nbytes += loaded
                errors = [error] if error else []
            else:
                if not error:
                    try:
                        nbytes += self._fetch(storage, src)
                    except Exception as exc:
                        error = f"rank {self.rank}: fetch: {exc!r}"
                errors = [e for e in self._gather(error) if e]
                if not errors:
                    try:
                        d = storage.step_dir(src.step) / rank_dirname(self.rank)
                        reader = ShardReader(d)
                        _keep_saved_rng(template, reader.read_metadata())
                        dcp_load(template, storage_reader=reader, no_dist=True)
                        nbytes += sum(s.bytes for s in src.manifest.shards if s.owner == self.rank)
                    except _DCP_ERRORS as exc:
                        error = f"rank {self.rank}: load: {exc!r}"
        else:
            errors = [e for e in self._gather(error) if e]
            if not errors:
                try:
                    shared_reader = FileSystemReader(storage.step_dir(src.step))
                    _keep_saved_rng(template, shared_reader.read_metadata())
                    dcp_load(template, storage_reader=shared_reader, process_group=self.pg)
                    nbytes += sum(s.bytes for s in src.manifest.shards if s.owner in (self.rank, -1))
                except _DCP_ERRORS as exc:
                    error = f"rank {self.rank}: load: {exc!r}"
        if not error and not errors:
            try:
                apply_tensor_state(ctx, template)
                _apply_trainer_state(ctx, src.manifest, self.rank, self.world)
            except Exception as exc:
                error = f"rank {self.rank}: apply: {exc!r}"
        all_errors = [e for e in self._gather(error) if e]
        return (sum(self._gather(nbytes)), all_errors)

    def _load_resharded(self, storage: TierStorage, src: RestoreSource, template: dict[str, Any], error: str) -> tuple[int, str]:
        """Load a node-tier checkpoint written with another layout. Collective.

        1. Every old rank's ``.metadata`` is read once (by a rank that holds a verified copy) and
           shared; merged, they describe the old ranks' files as one DCP checkpoint.
        2. DCP's load planner, run locally on this rank's template, names the old files this
           rank's shards overlap; files a node does not hold are sent to it (one receiver per
           node and file), checked against the manifest and kept in its tier directory.
        3. ``dcp.load(no_dist=True)`` from the node's step directory through the merged metadata.
        """
        nbytes = 0
        meta_paths = sorted(s.path for s in src.manifest.shards if s.path.endswith("/.metadata"))
        mine: list[tuple[str, bytes]] = []
        if not error:
            try:
                for i, path in enumerate(meta_paths):
                    readers = self._readers(src.sources[path])
                    if readers[i % len(readers)] == self.rank:
                        mine.append((path, storage.read_bytes(src.step, path)))
            except Exception as exc:
                error = f"rank {self.rank}: reading shard metadata: {exc!r}"
        parts: list[tuple[str, list[tuple[str, bytes]]]] = self._gather((error, mine))
        errors = [e for e, _ in parts if e]
        needed: set[str] = set()
        merged: Metadata | None = None
        if not errors:
            try:
                metas = {path.rsplit("/", 1)[0]: pickle.loads(blob) for _, got in parts for path, blob in got}
                merged = merge_rank_metadata(metas)
                _keep_saved_rng(template, merged)
                needed = files_needed(template, merged)
            except Exception as exc:
                error = f"rank {self.rank}: planning the reshard: {exc!r}"
        wants: list[tuple[str, list[str]]] = self._gather((error, sorted(needed)))
        errors = [e for e, _ in wants if e]
        if not errors:
            try:
                nbytes += self._fetch_files(storage, src, [set(w) for _, w in wants])
            except Exception as exc:
                error = f"rank {self.rank}: fetch: {exc!r}"
        errors = [e for e in self._gather(error) if e]
        if not errors and merged is not None:
            try:
                reader = _MergedReader(storage.step_dir(src.step), merged)
                dcp_load(template, storage_reader=reader, no_dist=True)
                by_path = {s.path: s.bytes for s in src.manifest.shards}
                nbytes += sum(by_path.get(p, 0) for p in needed)
            except _DCP_ERRORS as exc:
                error = f"rank {self.rank}: load: {exc!r}"
        return nbytes, error or (errors[0] if errors else "")

    def _fetch_files(self, storage: TierStorage, src: RestoreSource, needed: Sequence[set[str]]) -> int:
        """Send every file some rank needs to that rank's node when the node lacks it (the
        first rank of the node that needs it receives and writes it; the others read it)."""
        shard = {s.path: s for s in src.manifest.shards}
        moves: dict[tuple[int, int], list[ShardInfo]] = {}
        taken: set[tuple[int, str]] = set()
        for r in range(self.world):
            here = pod_location(self.pod_of[r])
            for path in sorted(needed[r]):
                loc = src.sources[path]
                if loc == here or (self.pod_of[r], path) in taken:
                    continue
                taken.add((self.pod_of[r], path))
                readers = self._readers(loc)
                sender = next((x for x in readers if self.local_of[x] == self.local_of[r]), readers[0])
                moves.setdefault((sender, r), []).append(shard[path])
        return self._move(storage, src.step, sorted(moves.items()))

    def _fetch(self, storage: TierStorage, src: RestoreSource) -> int:
        """Shards a rank needs that live on another pod's node are sent to it (and kept)."""
        moves: list[tuple[tuple[int, int], list[ShardInfo]]] = []
        for r in range(self.world):
            needed = [s for s in src.manifest.shards if s.owner == r]
            by_loc: dict[str, list[ShardInfo]] = {}
            for s in needed:
                loc = src.sources[s.path]
                if loc != pod_location(self.pod_of[r]):
                    by_loc.setdefault(loc, []).append(s)
            for loc, shards in sorted(by_loc.items()):
                readers = self._readers(loc)
                sender = next((x for x in readers if self.local_of[x] == self.local_of[r]), readers[0])
                moves.append(((sender, r), shards))
        return self._move(storage, src.step, moves)

    def _move(self, storage: TierStorage, step: int, moves: Sequence[tuple[tuple[int, int], list[ShardInfo]]]) -> int:
        """Stream verified shard files between ranks (in the same order on every rank, each
        transfer between its two ranks only); the receiver checks each against the manifest as
        it arrives and keeps it in its node's tier. Returns the bytes this rank received."""
        received = 0
        corrupt: list[str] = []
        step_dir = storage.step_dir(step)
        # Every transfer runs even after one failed: a rank that stopped early would leave the
        # peers of its later transfers waiting for the group timeout.
        for (sender, receiver), shards in moves:
            if self.rank == sender:
                problem = send_files(self.pg, receiver, step_dir, shards)
                if problem:
                    log.warning("restore: sending to rank %d: %s", receiver, problem)
            elif self.rank == receiver:
                for s, ok in receive_files(self.pg, sender, step_dir, shards, fsync=storage.fsync):
                    if ok:
                        received += s.bytes
                    else:
                        corrupt.append(f"{s.path} from pod {self.pod_of[sender]} arrived corrupt")
        if corrupt:
            raise OSError("; ".join(corrupt))
        return received


# ---------------------------------------------------------------------- state helpers


def _data_position(results: Sequence[_Local]) -> dict[str, Any]:
    """The manifest's trainer state: rank 0's, plus every rank's data state if they differ."""
    first = results[0].state
    out: dict[str, Any] = {k: _jsonable(v) for k, v in first.items()}
    datas = [_jsonable(r.state.get("data")) for r in results]
    if any(d != datas[0] for d in datas):
        out["data_per_rank"] = datas
    return out


def _apply_trainer_state(ctx: TrainContext, manifest: Manifest, rank: int, world: int) -> None:
    pos = manifest.data_position
    ctx.step = int(pos.get("step", manifest.step))
    data_state = pos.get("data")
    per_rank = pos.get("data_per_rank")
    if isinstance(per_rank, list) and len(per_rank) == world:
        data_state = per_rank[rank]
    if data_state is not None and ctx.data is not None and hasattr(ctx.data, "load_state_dict"):
        ctx.data.load_state_dict(data_state)
    sched = pos.get("lr_scheduler")
    if sched is not None and ctx.lr_scheduler is not None and hasattr(ctx.lr_scheduler, "load_state_dict"):
        ctx.lr_scheduler.load_state_dict(sched)


def _step_guard(ref: weakref.ReferenceType[CheckpointManager]) -> Callable[..., None]:
    """A global optimizer-step pre-hook for one manager (held weakly)."""

    def hook(optimizer: Any, args: Any, kwargs: Any) -> None:
        manager = ref()
        if manager is not None:
            manager._before_optimizer_step()

    return hook


def _hint(raw: Mapping[str, Any] | None) -> RestoreHint | None:
    if not raw:
        return None
    tier, step, not_after = raw.get("tier"), raw.get("step"), raw.get("notAfter", -1)
    if isinstance(tier, str) and isinstance(step, int):
        return RestoreHint(tier=tier, step=step, not_after=not_after if isinstance(not_after, int) else -1)
    return None


def _mark_corrupt(found: list[FoundCheckpoint], src: RestoreSource) -> list[FoundCheckpoint]:
    """Drop the copies a failed load used, so the next decision picks something else."""
    return merge_verified(found, src, [(path, loc, False) for path, loc in src.sources.items()])

