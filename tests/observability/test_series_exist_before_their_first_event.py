"""Counters and histograms over a known label set are exported from 0, before their first event.

Prometheus's ``increase()`` and ``rate()`` need a sample before a change: a series that first
appears with its first event already counted reads as no increase. Without these zeros the
first restart of a class, the first corruption verdict of a job (so RailyardSilentDataCorruption
never fired) and the first detection of a fault kind were invisible to alerts and dashboards.
The live check of the same is the scraping test (the corruption alert fires on real series)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from tests.health.sim import JOB, NS, SimJob

from railyard.logic.failures import RULES
from railyard.logic.health import FaultKind
from railyard.observe.checkpoint_metrics import CheckpointMetrics
from railyard.observe.health_metrics import HealthMetrics
from railyard.observe.metrics import OperatorMetrics
from railyard.protocol.exitcodes import FailureClass
from railyard.protocol.heartbeat import HEAL_SOURCE, CheckpointEvent, HeartbeatBatch
from railyard.protocol.manifest import TIERS


def test_restarts_and_failures_of_every_class_and_kind_start_at_zero() -> None:
    reg = CollectorRegistry()
    OperatorMetrics(reg)
    for cls in FailureClass:
        value = reg.get_sample_value("railyard_restarts_total", {"class": cls.value})
        # never restarted (Permanent), or counted apart (Planned: railyard_planned_moves)
        assert value == (None if cls in (FailureClass.PERMANENT, FailureClass.PLANNED) else 0.0), cls
    assert reg.get_sample_value("railyard_planned_moves_total") == 0.0
    for kind, rule in RULES.items():
        assert reg.get_sample_value("railyard_failures_total", {"class": rule.cls.value, "kind": kind}) == 0.0, kind


def test_a_jobs_verdict_counters_start_at_zero_with_its_first_decision() -> None:
    reg = CollectorRegistry()
    m = HealthMetrics(reg)
    for kind in FaultKind:
        assert reg.get_sample_value("railyard_fault_detection_seconds_count", {"kind": kind.value}) == 0.0, kind
    sim = SimJob(world=4, ranks_per_pod=2, seed=1)
    sim.run_steps(3)
    assert sim.decisions and not sim.verdicts()
    m.observe_decision(NS, JOB, sim.decisions[0])
    for name in ("railyard_sdc_detected_total", "railyard_hangs_detected_total", "railyard_dead_ranks_detected_total",
                 "railyard_stragglers_flagged_total"):
        assert reg.get_sample_value(name, {"namespace": NS, "job": JOB}) == 0.0, name


def test_checkpoint_series_of_every_tier_start_at_zero() -> None:
    reg = CollectorRegistry()
    m = CheckpointMetrics(reg)
    for tier in TIERS:
        for result in ("ok", "failed", "skipped"):
            assert reg.get_sample_value("railyard_checkpoint_saves_total", {"tier": tier, "result": result}) == 0.0
        assert reg.get_sample_value("railyard_checkpoint_restores_total", {"tier": tier}) == 0.0
        assert reg.get_sample_value("railyard_checkpoint_restore_seconds_count", {"tier": tier}) == 0.0
    m.observe_batch(NS, JOB, HeartbeatBatch(job=JOB, attempt=0, pod_index=0, node="n", sent_at=0.0, ranks=(), checkpoints=()))
    for tier in TIERS:
        assert reg.get_sample_value("railyard_checkpoint_written_bytes_total", {"namespace": NS, "job": JOB, "tier": tier}) == 0.0


def test_heals_from_a_live_peer_are_restores_from_tier_peer_counted_from_zero() -> None:
    reg = CollectorRegistry()
    m = CheckpointMetrics(reg)
    assert reg.get_sample_value("railyard_checkpoint_restores_total", {"tier": HEAL_SOURCE}) == 0.0
    heal = CheckpointEvent(step=9, tier=HEAL_SOURCE, ok=True, kind="restore", duration_s=0.25, bytes=2_000_000)
    m.observe_batch(NS, JOB, HeartbeatBatch(job=JOB, attempt=1, pod_index=2, node="n", sent_at=0.0, ranks=(), checkpoints=(heal,)))
    assert reg.get_sample_value("railyard_checkpoint_restores_total", {"tier": HEAL_SOURCE}) == 1.0
    assert reg.get_sample_value("railyard_checkpoint_restore_seconds_sum", {"tier": HEAL_SOURCE}) == 0.25
    assert reg.get_sample_value("railyard_checkpoint_saves_total", {"tier": HEAL_SOURCE, "result": "ok"}) is None
