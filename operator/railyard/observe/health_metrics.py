"""Prometheus metrics of heartbeats and health decisions.

No per-rank series: at 16,384 ranks that is a cardinality explosion. Per job we export the
aggregate step time and only the few slowest ranks (their label set is replaced each update).
"""

from __future__ import annotations

import contextlib

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from railyard.logic.health import FaultKind, HealthDecision
from railyard.protocol.heartbeat import HeartbeatBatch

_JOB = ("namespace", "job")
_DETECTION_BUCKETS = (0.5, 1, 2, 5, 10, 15, 20, 30, 45, 60, 120, 300, 600)
#: Step time percentiles. Not ``quantile``: Prometheus reserves that label for summaries
#: (``promtool check metrics`` flags it on a gauge).
_PERCENTILES = ("50", "99")


class HealthMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        reg = registry if registry is not None else REGISTRY
        self.requests = Counter(
            "railyard_heartbeat_requests", "Heartbeat POSTs by HTTP status code.", ["code"], registry=reg
        )
        self.rank_beats = Counter(
            "railyard_heartbeat_rank_beats", "Rank heartbeats accepted (a batch carries several).", registry=reg
        )
        self.heartbeat_age = Gauge(
            "railyard_heartbeat_age_seconds",
            "Age of the stalest heartbeat among the job's running ranks.",
            _JOB,
            registry=reg,
        )
        self.step_time = Gauge(
            "railyard_step_time_seconds",
            "Job step time over recent steps, by percentile (50, 99).",
            [*_JOB, "percentile"],
            registry=reg,
        )
        self.hang_timeout = Gauge(
            "railyard_hang_timeout_seconds", "Current hang timeout: max(k x p99 step time, floor).", _JOB, registry=reg
        )
        self.slowest_compute = Gauge(
            "railyard_slowest_rank_compute_seconds",
            "Median compute time of the job's slowest ranks only.",
            [*_JOB, "rank"],
            registry=reg,
        )
        self.straggler_score = Gauge(
            "railyard_straggler_score",
            "Straggler score (peers' median / own; 1 = typical) of the slowest ranks only.",
            [*_JOB, "rank"],
            registry=reg,
        )
        self.stragglers_current = Gauge(
            "railyard_stragglers_flagged_current", "Ranks currently flagged as stragglers.", _JOB, registry=reg
        )
        self.stragglers_flagged = Counter(
            "railyard_stragglers_flagged", "Ranks newly flagged as stragglers.", _JOB, registry=reg
        )
        self.silent_pods = Gauge(
            "railyard_silent_pods",
            "Running pods of the job the operator has heard nothing from (no heartbeat, no launcher report) past the "
            "silence bound: the job is Blind.",
            _JOB,
            registry=reg,
        )
        self.hangs = Counter("railyard_hangs_detected", "Hangs detected (one per pod).", _JOB, registry=reg)
        self.dead = Counter(
            "railyard_dead_ranks_detected", "Heartbeat timeouts detected (one per pod).", _JOB, registry=reg
        )
        self.sdc_checks = Counter(
            "railyard_sdc_checks",
            "SDC checks reported by ranks (failed ones included).",
            [*_JOB, "check"],
            registry=reg,
        )
        self.sdc_checks_failed = Counter(
            "railyard_sdc_checks_failed", "SDC checks that failed.", [*_JOB, "check"], registry=reg
        )
        self.sdc_detected = Counter(
            "railyard_sdc_detected", "Confirmed silent data corruption verdicts.", _JOB, registry=reg
        )
        self.detection = Histogram(
            "railyard_fault_detection_seconds",
            "Time from a fault's estimated onset to its detection, by kind.",
            ["kind"],
            buckets=_DETECTION_BUCKETS,
            registry=reg,
        )
        for kind in FaultKind:  # from 0, or rate() misses the first detection of each kind
            self.detection.labels(kind.value)
        self._rank_labels: dict[tuple[str, str], set[str]] = {}

    def count_request(self, code: int) -> None:
        self.requests.labels(str(code)).inc()

    def count_beats(self, namespace: str, job: str, batch: HeartbeatBatch) -> None:
        self.rank_beats.inc(len(batch.ranks))
        for b in batch.ranks:
            for h in b.health:
                self.sdc_checks.labels(namespace, job, h.kind).inc()
                # exported at 0 from the first check on: increase() and rate() cannot see the
                # first failure of a series that appears already at 1
                failed = self.sdc_checks_failed.labels(namespace, job, h.kind)
                if not h.ok:
                    failed.inc()

    def observe_decision(self, namespace: str, job: str, d: HealthDecision) -> None:
        # the job's verdict counters start at 0 (see count_beats): the first hang, dead rank,
        # straggler or corruption of a job must move increase(), which alerts are built on
        for counter in (self.stragglers_flagged, self.hangs, self.dead, self.sdc_detected):
            counter.labels(namespace, job)
        if d.max_heartbeat_age_s is not None:
            self.heartbeat_age.labels(namespace, job).set(d.max_heartbeat_age_s)
        if d.p50_step_time_s is not None:
            self.step_time.labels(namespace, job, "50").set(d.p50_step_time_s)
        if d.p99_step_time_s is not None:
            self.step_time.labels(namespace, job, "99").set(d.p99_step_time_s)
        self.hang_timeout.labels(namespace, job).set(d.hang_timeout_s)
        self.stragglers_current.labels(namespace, job).set(len(d.stragglers))
        ranks = {str(s.rank) for s in d.slowest}
        for stale in self._rank_labels.get((namespace, job), set()) - ranks:
            self.slowest_compute.remove(namespace, job, stale)
            self.straggler_score.remove(namespace, job, stale)
        for s in d.slowest:
            self.slowest_compute.labels(namespace, job, str(s.rank)).set(s.median_compute_s)
            self.straggler_score.labels(namespace, job, str(s.rank)).set(s.score)
        self._rank_labels[(namespace, job)] = ranks
        for v in d.verdicts:
            if v.kind is FaultKind.STRAGGLER:
                self.stragglers_flagged.labels(namespace, job).inc()
            elif v.kind is FaultKind.HANG:
                self.hangs.labels(namespace, job).inc()
            elif v.kind is FaultKind.DEAD:
                self.dead.labels(namespace, job).inc()
            elif v.kind is FaultKind.SDC:
                self.sdc_detected.labels(namespace, job).inc()
            self.detection.labels(v.kind.value).observe(max(0.0, v.detected_at - v.fault_at))

    def set_silent_pods(self, namespace: str, job: str, count: int) -> None:
        self.silent_pods.labels(namespace, job).set(count)

    def forget_job(self, namespace: str, job: str) -> None:
        """Drop the job's gauges (counters stay: they are cumulative by definition)."""
        for g in (self.heartbeat_age, self.hang_timeout, self.stragglers_current, self.silent_pods):
            with contextlib.suppress(KeyError):
                g.remove(namespace, job)
        for q in _PERCENTILES:
            with contextlib.suppress(KeyError):
                self.step_time.remove(namespace, job, q)
        for r in self._rank_labels.pop((namespace, job), set()):
            self.slowest_compute.remove(namespace, job, r)
            self.straggler_score.remove(namespace, job, r)
