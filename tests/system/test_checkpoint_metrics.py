"""Checkpoint metrics from heartbeat CheckpointEvents, and the goodput definition."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from railyard.logic.goodput import compute_goodput
from railyard.observe.checkpoint_metrics import CheckpointMetrics
from railyard.protocol.heartbeat import CheckpointEvent, HeartbeatBatch


def _batch(*events: CheckpointEvent) -> HeartbeatBatch:
    return HeartbeatBatch(job="j", attempt=1, pod_index=0, node="n", sent_at=0.0, ranks=(), checkpoints=events)


def test_save_and_restore_events_become_per_tier_series() -> None:
    reg = CollectorRegistry()
    m = CheckpointMetrics(reg)
    m.observe_batch("ns", "j", _batch(
        CheckpointEvent(step=10, tier="memory", ok=True, blocked_s=0.08, duration_s=3.0, bytes=1000),
        CheckpointEvent(step=10, tier="shared", ok=False, blocked_s=0.08, detail="disk full"),
        CheckpointEvent(step=10, tier="memory", ok=True, duration_s=1.5, bytes=500, kind="restore"),
        CheckpointEvent(step=12, tier="memory", ok=False, duration_s=0.01, kind="skip", detail="skipped: rank 1: ..."),
    ))
    m.observe_steps_lost(4)
    g = reg.get_sample_value
    assert g("railyard_checkpoint_save_seconds_sum", {"tier": "memory"}) == 3.0
    assert g("railyard_checkpoint_save_seconds_count", {"tier": "shared"}) == 0, "a failed save has no duration (every tier is exported from 0)"
    assert g("railyard_checkpoint_blocked_seconds_count", {"tier": "shared"}) == 1
    assert g("railyard_checkpoint_written_bytes_total", {"namespace": "ns", "job": "j", "tier": "memory"}) == 1000
    assert g("railyard_checkpoint_saves_total", {"tier": "shared", "result": "failed"}) == 1
    assert g("railyard_checkpoint_saves_total", {"tier": "memory", "result": "skipped"}) == 1
    assert g("railyard_checkpoint_saves_total", {"tier": "memory", "result": "failed"}) == 0, "a skip is not a failure"
    assert g("railyard_checkpoint_blocked_seconds_count", {"tier": "memory"}) == 1, "a skip blocked nothing"
    assert g("railyard_checkpoint_restores_total", {"tier": "memory"}) == 1
    assert g("railyard_checkpoint_restore_seconds_sum", {"tier": "memory"}) == 1.5
    assert g("railyard_restart_steps_lost_sum") == 4
    m.set_goodput("ns", "j", 0.75)
    assert g("railyard_job_goodput_ratio", {"namespace": "ns", "job": "j"}) == 0.75
    m.forget_job("ns", "j")
    assert g("railyard_job_goodput_ratio", {"namespace": "ns", "job": "j"}) is None


@pytest.mark.parametrize(("step", "median", "started", "now", "expected"), [
    (100, 1.0, 0.0, 200.0, 0.5),     # half the wall time went into kept steps
    (100, 1.0, 0.0, 100.0, 1.0),     # never stopped
    (100, 1.1, 0.0, 100.0, 1.0),     # capped
    (0, 1.0, 0.0, 10.0, 0.0),        # started, nothing kept yet
    (10, None, 0.0, 10.0, None),     # no step time yet
    (10, 1.0, None, 10.0, None),     # not started
])
def test_goodput(step: int, median: float | None, started: float | None, now: float, expected: float | None) -> None:
    assert compute_goodput(step, median, started, now) == expected
