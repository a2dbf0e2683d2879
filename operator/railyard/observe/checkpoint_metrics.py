"""Checkpoint and goodput metrics, from the CheckpointEvents that heartbeats carry.

The trainer's rank 0 reports one ``save`` event per tier per save (blocked time, background
duration, bytes written) and one ``restore`` event per attempt (tier, duration); the operator
adds what only it knows: the steps a restart lost, and the job's goodput.

**Goodput** (``railyard_job_goodput_ratio``, :mod:`railyard.logic.goodput`) is the fraction of
the wall time since the job's first gang started that went into training steps that were kept:
``newest step x median step time / (now - status.startTime)``.
"""

from __future__ import annotations

import contextlib

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from railyard.protocol.heartbeat import HEAL_SOURCE, HeartbeatBatch
from railyard.protocol.manifest import TIERS

_SAVE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)
_BLOCKED_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30)
_STEPS_LOST_BUCKETS = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000)


class CheckpointMetrics:
    DOC_NOTES = """
Checkpoint series come from the `CheckpointEvent`s that the trainer's rank 0 puts into its
heartbeats (one `save` event per tier per save, one `restore` event per attempt; with replica
groups, one `restore` from tier `peer` per heal from a live group). Steps lost
are counted by the operator: the newest step the failed attempt reported minus the step the
new attempt restored (also in `status.restore.stepsLost`).

**Goodput** (`railyard_job_goodput_ratio`) is the fraction of the wall time since the job's
first gang started (`status.startTime`) that went into training steps that were kept:

    goodput = status.step x median step time / (now - status.startTime)

Scheduling and start-up of every attempt, the time from a failure to the new gang, steps redone
after a restore, checkpoint saves that block beyond the median step and stragglers holding the
gang back all lower it; 1.0 is a job that never stopped (capped at 1). It is updated while the
job's heartbeats arrive, from the operator's heartbeat window (`railyard.logic.goodput`).
"""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        reg = registry if registry is not None else REGISTRY
        self.save_seconds = Histogram(
            "railyard_checkpoint_save_seconds",
            "Duration of a committed checkpoint save, snapshot start to commit, by tier.",
            ["tier"], buckets=_SAVE_BUCKETS, registry=reg,
        )
        self.blocked_seconds = Histogram(
            "railyard_checkpoint_blocked_seconds",
            "Time training was blocked by a checkpoint save (the snapshot to host memory), by tier.",
            ["tier"], buckets=_BLOCKED_BUCKETS, registry=reg,
        )
        self.bytes_written = Counter(
            "railyard_checkpoint_written_bytes",
            "Bytes written by committed checkpoint saves (replicas excluded), by tier.",
            ["namespace", "job", "tier"], registry=reg,
        )
        self.saves = Counter(
            "railyard_checkpoint_saves",
            "Checkpoint saves reported, by tier and result (ok, failed, skipped: due while the previous save was "
            "still being written).",
            ["tier", "result"],
            registry=reg,
        )
        self.restores = Counter(
            "railyard_checkpoint_restores",
            "Attempts that restored a checkpoint, by the tier it came from (peer: a replica group healed from a live "
            "one).",
            ["tier"], registry=reg,
        )
        self.restore_seconds = Histogram(
            "railyard_checkpoint_restore_seconds",
            "Time to find, verify and load the checkpoint an attempt restored, by tier (peer: a heal's fetch from a "
            "live replica group).",
            ["tier"], buckets=_SAVE_BUCKETS, registry=reg,
        )
        self.steps_lost = Histogram(
            "railyard_restart_steps_lost",
            "Steps trained before a failure that the restarted gang had to redo (newest reported step minus the "
            "restored step).",
            buckets=_STEPS_LOST_BUCKETS,
            registry=reg,
        )
        self.goodput = Gauge(
            "railyard_job_goodput_ratio",
            "Fraction of the wall time since the job's first gang started that went into kept training steps "
            "(docs/metrics.md).",
            ["namespace", "job"],
            registry=reg,
        )
        # Every tier's series exist from the start at 0. A labelled series that appears with its
        # first event already counted is invisible to rate() and increase() (they need a
        # sample before the change): the first restore, the first failed save and the first
        # save's duration would be missing from the dashboard and from alerts.
        for tier in TIERS:
            for result in ("ok", "failed", "skipped"):
                self.saves.labels(tier, result)
            for child in (self.restores, self.save_seconds, self.blocked_seconds, self.restore_seconds):
                child.labels(tier)
        for restore in (self.restores, self.restore_seconds):
            restore.labels(HEAL_SOURCE)

    def observe_batch(self, namespace: str, job: str, batch: HeartbeatBatch) -> None:
        """Count the checkpoint events of one accepted heartbeat batch."""
        for tier in TIERS:  # the job's byte counters, at 0 before its first save (see __init__)
            self.bytes_written.labels(namespace, job, tier)
        for e in batch.checkpoints:
            if e.kind == "restore":
                if e.ok:
                    self.restores.labels(e.tier).inc()
                    self.restore_seconds.labels(e.tier).observe(max(0.0, e.duration_s))
                continue
            if e.kind == "skip":  # nothing was written: no blocked time, no duration
                self.saves.labels(e.tier, "skipped").inc()
                continue
            self.saves.labels(e.tier, "ok" if e.ok else "failed").inc()
            self.blocked_seconds.labels(e.tier).observe(max(0.0, e.blocked_s))
            if e.ok:
                self.save_seconds.labels(e.tier).observe(max(0.0, e.duration_s))
                self.bytes_written.labels(namespace, job, e.tier).inc(max(0, e.bytes))

    def observe_steps_lost(self, steps: int) -> None:
        self.steps_lost.observe(max(0, steps))

    def set_goodput(self, namespace: str, job: str, value: float | None) -> None:
        if value is not None:
            self.goodput.labels(namespace, job).set(value)

    def forget_job(self, namespace: str, job: str) -> None:
        """Drop the job's gauge (counters stay: they are cumulative)."""
        with contextlib.suppress(KeyError):
            self.goodput.remove(namespace, job)
