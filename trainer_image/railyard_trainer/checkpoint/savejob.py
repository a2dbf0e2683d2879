"""What one save carries through the checkpoint's worker, and what it records (manager.py).

Plain data: the manager's save path fills them in; bench/checkpoint.py and the tests read the
records (``CheckpointManager.history``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from railyard.protocol.manifest import ShardInfo
from railyard_trainer.checkpoint.settings import TierSettings
from railyard_trainer.checkpoint.snapshot import Capture


@dataclass
class SaveJob:
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
    capture: Capture | None = None
    #: When the worker finished that copy (``perf_counter``), and its CPU time.
    captured_at: float | None = None
    capture_cpu_s: float = 0.0


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
    #: Where ``duration_s`` went, in order (seconds; see :class:`Laps`): ``snapshot`` (the
    #: blocking copy, = ``blocked_s``), ``capture`` (the first tier only: the worker's copy of
    #: the parameters and optimizer state, see :class:`Capture`), ``waited`` (in the queue, or
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
    #: parameters and optimizer state (``capture``; see :class:`Capture`): blocked time too.
    stall_s: float = 0.0

    @property
    def background_s(self) -> float:
        """The save after its snapshot: what runs beside training."""
        return max(0.0, self.duration_s - self.blocked_s)


class Laps:
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
class RankResult:
    """One rank's outcome of writing its part of a tier."""

    error: str = ""
    shards: list[ShardInfo] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)
    #: Replicas this rank received for other ranks that did not arrive intact.
    replica_problems: list[str] = field(default_factory=list)
