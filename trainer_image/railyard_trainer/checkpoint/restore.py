"""Restoring (:meth:`CheckpointManager.restore`, before the first step): the :class:`Restorer`,
an object of its own beside the manager's save path (manager.py).

The two halves share only what the constructor hands the restorer: the settings, the tiers'
storages, the job and its layout, where every rank is (:class:`RankPlacement`, learned once by the
manager) and the checkpoint's process group. The restorer returns what it restored
(:class:`Restored`); the manager records it (the step it must not save again, the restore event).

Every pod lists the committed manifests it can see, the listings are gathered, and
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
import pickle
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

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
    pod_location,
)
from railyard_trainer.checkpoint.settings import CheckpointSettings, TierSettings
from railyard_trainer.checkpoint.shardio import ShardReader
from railyard_trainer.checkpoint.shardstream import receive_files, send_files
from railyard_trainer.checkpoint.statedict import (
    _keep_saved_rng,
    _MergedReader,
    apply_tensor_state,
    files_needed,
    merge_rank_metadata,
    tensor_state,
)
from railyard_trainer.checkpoint.storage import TierStorage
from railyard_trainer.hooks import RestoreResult, TrainContext

log = logging.getLogger("railyard.checkpoint")
#: What a failed ``dcp.save`` / ``dcp.load`` raises: DCP wraps the ranks' errors in a
#: ``CheckpointException``, a ``BaseException``, which ``except Exception`` would let through
#: (and kill the save worker, or the restore instead of falling back).
_DCP_ERRORS = (Exception, CheckpointException)


class NoVerifiedCheckpoint(RuntimeError):
    """Restore was required (the operator named a checkpoint, or a load was attempted and
    failed) but no complete, verified, SDC-clean checkpoint exists. Exit with ``exit_code``."""

    exit_code = int(ExitCode.NO_VERIFIED_CHECKPOINT)


def rank_dirname(rank: int) -> str:
    return f"rank-{rank:05d}"


@dataclass(frozen=True)
class RankPlacement:
    """Where every rank of the checkpoint's process group is: its pod and its local rank there
    (all-gathered once by the manager: construction is collective)."""

    rank: int
    world: int
    #: This rank's pod.
    pod: int
    pod_of: Mapping[int, int]
    local_of: Mapping[int, int]

    @property
    def pod_ranks(self) -> dict[int, list[int]]:
        """The ranks of each pod, in rank order."""
        out: dict[int, list[int]] = {}
        for r in range(self.world):
            out.setdefault(self.pod_of[r], []).append(r)
        return out

    @property
    def is_pod_leader(self) -> bool:
        """This rank writes its pod's node-tier manifests (the pod's first rank)."""
        return self.pod_ranks[self.pod][0] == self.rank


@dataclass(frozen=True)
class Restored:
    """What a restore loaded: the result the train loop gets, and the event the manager emits."""

    result: RestoreResult
    event: CheckpointEvent


class Restorer:
    """Chooses, verifies, fetches and loads a checkpoint. Collective: every rank of ``pg`` calls
    the same methods in the same order. It saves nothing and holds no state between calls."""

    def __init__(self, settings: CheckpointSettings, *, storages: Mapping[str, TierStorage],
                 tiers: Sequence[TierSettings], job: str, layout: Layout, placement: RankPlacement, pg: Any) -> None:
        self.settings, self.storages, self.tiers = settings, dict(storages), list(tiers)
        self.job, self.layout = job, layout
        self.placement, self.pg = placement, pg
        self.rank, self.world = placement.rank, placement.world
        self.pod_of, self.local_of, self.pod_ranks = placement.pod_of, placement.local_of, placement.pod_ranks

    def _gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj, group=self.pg)
        return out

    def restore(self, ctx: TrainContext, *, started: float) -> Restored | None:
        """Load the newest verified checkpoint into ctx (``started``: when the caller began, for
        the duration). None for a fresh start. Raises :class:`NoVerifiedCheckpoint` when the
        operator named a checkpoint (hint with step >= 0) or a load failed and nothing else is
        usable."""
        t0 = started
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

    def open_restore(self, ctx: TrainContext, *, started: float) -> tuple[Restored, str] | None:
        """For a reader that loads the checkpoint itself (the SDK's DCP StorageReader): choose and
        verify the source as :meth:`restore` does, bring the shards a rank needs onto its node
        (a lost node's from the neighbour's replica), and return what was chosen and the folder
        this rank reads: ``step-N/rank-R`` of a node tier (same layout only; another layout
        takes the shared tier) or the shared tier's ``step-N``. Collective; None: fresh start."""
        t0 = started
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
    ) -> Restored:
        duration = time.perf_counter() - t0
        hint = self.settings.restore_hint or {}
        last = hint.get("lastStep")
        lost = compute_steps_lost(int(last), src.step) if isinstance(last, int) else -1
        m = src.manifest
        detail = f"step {src.step} from {src.tier}" + (
            f" (resharded from pp={m.pp} dp={m.dp} tp={m.tp}; each rank keeps its own RNG stream)"
            if src.reshard
            else ""
        )
        remote = sorted({loc for loc in src.sources.values()} - {SHARED_LOCATION})
        if len(remote) > 1:
            detail += f" (shards from {', '.join(remote)})"
        if rejected:
            detail += "; skipped: " + "; ".join(rejected)
        result = RestoreResult(step=src.step, tier=src.tier, duration_s=duration, detail=detail[:500])
        event = CheckpointEvent(
            step=src.step, tier=src.tier, ok=True, duration_s=duration, bytes=nbytes,
            sdc_passed=src.manifest.sdc_passed, detail=result.detail, kind="restore", steps_lost=lost,
        )
        log.info("restored %s in %.2fs", detail, duration)
        return Restored(result=result, event=event)

    def _list_found(self) -> list[FoundCheckpoint]:
        mine: list[FoundCheckpoint] = []
        for tier in self.tiers:
            storage = self.storages[tier.name]
            if tier.name in PER_NODE_TIERS:
                if not self.placement.is_pod_leader:
                    continue
                location = pod_location(self.placement.pod)
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

    def _load_resharded(
        self, storage: TierStorage, src: RestoreSource, template: dict[str, Any], error: str
    ) -> tuple[int, str]:
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


def _hint(raw: Mapping[str, Any] | None) -> RestoreHint | None:
    return RestoreHint.from_wire(raw)


def _mark_corrupt(found: list[FoundCheckpoint], src: RestoreSource) -> list[FoundCheckpoint]:
    """Drop the copies a failed load used, so the next decision picks something else."""
    return merge_verified(found, src, [(path, loc, False) for path, loc in src.sources.items()])
