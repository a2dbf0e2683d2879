"""The operator's Prometheus metrics and its HTTP server (/metrics, /healthz, /readyz, heartbeat ingest).

Names follow Prometheus conventions: ``railyard_`` prefix, base units (seconds, bytes),
``_total`` for counters (prometheus-client appends it). Label sets stay small: per job only
where a person needs to tell jobs apart, never per pod or per rank.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from railyard.logic.failures import RULES
from railyard.logic.inplace import FALLBACKS
from railyard.observe.probes import Verdict
from railyard.protocol.exitcodes import FailureClass

log = logging.getLogger(__name__)

PHASES = ("Pending", "Queued", "Placing", "Starting", "Running", "Restarting", "Suspended", "Succeeded", "Failed")
_START_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800)
_RESTART_BUCKETS = (0.5, 1, 2, 5, 10, 15, 20, 30, 45, 60, 120, 300, 600)
_PLACEMENT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5)


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        reg = registry if registry is not None else REGISTRY
        self.registry = reg
        self.jobs = Gauge("railyard_jobs", "TrainingJobs by phase.", ["phase"], registry=reg)
        self.gang_ready = Histogram(
            "railyard_gang_ready_seconds",
            "Time from a gang's pods being created to all of them Running, per attempt.",
            buckets=_START_BUCKETS, registry=reg,
        )
        self.job_start = Histogram(
            "railyard_job_start_seconds",
            "Time from a TrainingJob's creation to its first gang all Running.",
            buckets=_START_BUCKETS, registry=reg,
        )
        self.restarts = Counter(
            "railyard_restarts",
            "Gang restarts by failure class (planned moves apart: railyard_planned_moves).",
            ["class"],
            registry=reg,
        )
        self.planned_moves = Counter(
            "railyard_planned_moves",
            "Planned moves: the gang's pods moved ahead of nodes announced to go (cordoned, tainted by someone else, "
            "maintenance announced); one per move, however many nodes it covers. No restart budget spent.",
            registry=reg,
        )
        self.failures = Counter(
            "railyard_failures", "Gang failures detected, by class and kind.", ["class", "kind"], registry=reg
        )
        self.restart_duration = Histogram(
            "railyard_failure_to_restarted_seconds",
            "Time from detecting a gang failure to the replacement gang all Running.",
            buckets=_RESTART_BUCKETS, registry=reg,
        )
        self.placement = Histogram(
            "railyard_placement_decision_seconds", "Time to compute one gang placement.",
            buckets=_PLACEMENT_BUCKETS, registry=reg,
        )
        self.cross_bytes = Gauge(
            "railyard_cross_level_bytes_per_step",
            "Bytes per training step crossing each topology level (spine-crossing traffic at the broadest level).",
            ["namespace", "job", "level"], registry=reg,
        )
        self.spine_bytes = Gauge(
            "railyard_spine_crossing_bytes_per_step",
            "Bytes per training step crossing the broadest switch level of the job's placement.",
            ["namespace", "job"], registry=reg,
        )
        self.quarantined = Gauge("railyard_quarantined_nodes", "Nodes quarantined by railyard.", registry=reg)
        self.reconcile_errors = Counter(
            "railyard_reconcile_errors", "Reconcile cycles that failed, by kind.", ["kind"], registry=reg
        )
        self.reconciles = Counter("railyard_reconciles", "Reconcile cycles run.", registry=reg)
        self.pods_created = Counter("railyard_pods_created", "Pods created for gangs.", registry=reg)
        self.hot_spares = Gauge(
            "railyard_hot_spares",
            "Hot spare nodes per job: wanted (spec.gang.hotSpares while the job runs) and held by a placeholder pod.",
            ["namespace", "job", "state"],
            registry=reg,
        )
        self.restart_modes = Counter(
            "railyard_restart_modes",
            "Gang restarts by how they were done: InPlace, or Full with the reason an in-place restart was not "
            "possible (None: no in-place restart was tried).",
            ["mode", "reason"],
            registry=reg,
        )
        self.pods_replaced = Counter(
            "railyard_pods_replaced", "Pods replaced by in-place restarts (the rest of each gang stayed).", registry=reg
        )
        self.replica_group_restarts = Counter(
            "railyard_replica_group_restarts",
            "Replica groups restarted alone while the job's other groups carried on (faultTolerance ReplicaGroups).",
            registry=reg,
        )
        self.replica_groups = Gauge(
            "railyard_replica_groups",
            "Replica groups per job: wanted (parallelism.dataReplicas with faultTolerance ReplicaGroups; 1 otherwise, "
            "the whole gang being one world) and training (taking steps now: fewer while groups restart or wait for a "
            "node; 0 while the whole gang restarts).",
            ["namespace", "job", "state"],
            registry=reg,
        )
        self.in_place_restart = Histogram(
            "railyard_in_place_restart_seconds",
            "Time from telling the kept launchers to restart to every one of them running the new attempt.",
            buckets=_RESTART_BUCKETS, registry=reg,
        )
        for phase in PHASES:
            self.jobs.labels(phase=phase).set(0)
        # Labelled counters over a known set start at 0: a series that appears with its first
        # restart already counted is invisible to increase() (RailyardRestartsTooFrequent, the
        # dashboard's per-hour panels), so the first restart of each class would never count.
        for cls in FailureClass:
            if cls not in (FailureClass.PERMANENT, FailureClass.PLANNED):  # never restarted / counted apart
                self.restarts.labels(**{"class": cls.value})
        for kind, rule in RULES.items():
            self.failures.labels(**{"class": rule.cls.value, "kind": kind})
        self.restart_modes.labels(mode="InPlace", reason="None")  # not "": a scrape drops empty labels
        self.restart_modes.labels(mode="Full", reason="None")
        for reason in FALLBACKS:
            self.restart_modes.labels(mode="Full", reason=reason)

    def count_restart(self, cls: FailureClass) -> None:
        """One gang restart of ``cls``; a planned move is not a restart after a failure (it has
        its own counter, and a rolling drain must not look like a crash loop to the alerts)."""
        if cls is not FailureClass.PLANNED:
            self.restarts.labels(**{"class": cls.value}).inc()

    def set_phases(self, counts: dict[str, int]) -> None:
        for phase in PHASES:
            self.jobs.labels(phase=phase).set(counts.get(phase, 0))

    def set_cross_bytes(self, namespace: str, job: str, per_level: dict[str, float], spine_level: str | None) -> None:
        for level, value in per_level.items():
            self.cross_bytes.labels(namespace=namespace, job=job, level=level).set(value)
        if spine_level is not None:
            self.spine_bytes.labels(namespace=namespace, job=job).set(per_level.get(spine_level, 0.0))

    def set_spares(self, namespace: str, job: str, *, wanted: int, held: int) -> None:
        self.hot_spares.labels(namespace=namespace, job=job, state="wanted").set(wanted)
        self.hot_spares.labels(namespace=namespace, job=job, state="held").set(held)

    def set_replica_groups(self, namespace: str, job: str, *, wanted: int, training: int) -> None:
        self.replica_groups.labels(namespace=namespace, job=job, state="wanted").set(wanted)
        self.replica_groups.labels(namespace=namespace, job=job, state="training").set(training)

    def forget_job(self, namespace: str, job: str) -> None:
        for metric in (self.cross_bytes, self.spine_bytes, self.hot_spares, self.replica_groups):
            for labels in list(metric._metrics):  # prometheus-client keeps children by label tuple
                if labels[:2] == (namespace, job):
                    metric.remove(*labels)


def _always_ok() -> Verdict:
    return Verdict(True, "ok")


def build_http_app(
    registry: CollectorRegistry,
    *,
    healthy: Callable[[], Verdict] = _always_ok,
    ready: Callable[[], Verdict] = _always_ok,
    extra_routes: Callable[[web.Application], Any] | None = None,
) -> web.Application:
    """/metrics (Prometheus text), /healthz (liveness) and /readyz (readiness), each 200 or 503
    with its reason as the body (``observe/probes.py`` says what they mean), plus
    ``extra_routes`` (heartbeat ingest)."""

    async def metrics(_: web.Request) -> web.Response:
        body = generate_latest(registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    def answer(verdict: Verdict) -> web.Response:
        return web.Response(status=200 if verdict.ok else 503, text=verdict.reason + "\n")

    async def healthz(_: web.Request) -> web.Response:
        return answer(healthy())

    async def readyz(_: web.Request) -> web.Response:
        return answer(ready())

    app = web.Application(client_max_size=512 * 1024)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    if extra_routes is not None:
        extra_routes(app)
    return app


async def start_http_server(app: web.Application, host: str, port: int) -> web.AppRunner:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    log.info("operator HTTP server on %s:%d (/metrics, /healthz, /readyz)", host, port)
    return runner
