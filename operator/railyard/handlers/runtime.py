"""The operator's in-memory state: settings, the API client, kopf's indexes, one worker per job.

Nothing here is the source of truth: attempt numbers and restart counts live in each job's
status, pods carry their attempt in a label, the per-attempt ConfigMap holds the rank table. A
restarted operator rebuilds all of this from the cluster (kopf lists every watched object at
start, which refills the indexes and starts a worker per TrainingJob).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from railyard.k8s.client import Kube
from railyard.kubecreds import Connection, Credential, load_connection
from railyard.logic.health import HealthState
from railyard.logic.health.window import HeartbeatStore
from railyard.logic.jitsave import DEFAULT_TIMEOUT_S
from railyard.logic.kueue import FlavorPlacement
from railyard.logic.manifests import CLEANUP_LABEL, LIGHTHOUSE_LABEL, SPARE_LABEL
from railyard.logic.planned import MAINTENANCE_SIGNALS
from railyard.logic.tas import TopologyAssignment
from railyard.logic.topology import TopologyCache
from railyard.observe.checkpoint_metrics import CheckpointMetrics
from railyard.observe.control import ControlBoard
from railyard.observe.health_metrics import HealthMetrics
from railyard.observe.heartbeats import StaticTokens
from railyard.observe.metrics import OperatorMetrics
from railyard.observe.probes import DEFAULT_STUCK_AFTER_S, Probes

log = logging.getLogger(__name__)
Key = tuple[str, str]
#: A job worker that died is restarted after this long (not at once: no restart storm).
WORKER_RESTART_DELAY_S = 1.0


@dataclass
class OperatorSettings:
    #: URL pods post heartbeats to (RAILYARD_HEARTBEAT_URL); empty: derived from the metrics port.
    heartbeat_url: str = ""
    metrics_host: str = "0.0.0.0"
    #: 0 disables the HTTP server (tests that run several operators in one process).
    metrics_port: int = 8080
    kubeconfig: str | None = None
    context: str | None = None
    #: A node NotReady for less than this is not yet a failure (flapping kubelets).
    not_ready_grace_s: float = 2.0
    #: Grace given to pods on healthy nodes when a gang is torn down.
    delete_grace_s: int = 5
    #: A pod still Terminating this long after its deletion on a healthy node is force-deleted.
    stuck_terminating_s: float = 30.0
    #: Coalesce bursts of pod events (a 1,000-pod gang turning Running) into one cycle.
    coalesce_s: float = 0.05
    #: Longest sleep between cycles of an idle job (re-checks health, quarantine releases).
    idle_recheck_s: float = 30.0
    registry: CollectorRegistry | None = None
    #: Extra annotations on every gang pod.
    pod_annotations: dict[str, str] = field(default_factory=dict)
    #: A reconcile cycle running longer than this fails liveness (observe/probes.py).
    stuck_reconcile_s: float = DEFAULT_STUCK_AFTER_S
    #: Node labels/annotations that announce a node's maintenance: a planned move of the gangs
    #: on it (logic/planned.py; ``--maintenance-signal`` adds to the defaults).
    maintenance_signals: tuple[str, ...] = MAINTENANCE_SIGNALS
    #: How long a planned move or a stop on purpose (``spec.suspend``, Kueue's eviction) waits for
    #: the gang's just-in-time save (with ReplicaGroups before a move: the moved groups' leave)
    #: before it deletes the pods anyway (logic/jitsave.py, logic/groupleave.py; ``--save-before-stop-seconds``).
    save_before_stop_s: float = DEFAULT_TIMEOUT_S
    #: Planned moves on (the default): a node announced to go moves the gang's pods off it ahead
    #: of time and a PodDisruptionBudget holds ``kubectl drain`` meanwhile; off (``--no-planned-moves``):
    #: neither, so a drain evicts the pods at once and the job handles it as a failure (the
    #: behaviour before issue 47, kept to measure against: bench/drain.py).
    planned_moves: bool = True


@dataclass
class JobWorker:
    """One TrainingJob's reconcile loop, woken by its pods' and nodes' events."""

    namespace: str
    name: str
    body: dict[str, Any] = field(default_factory=dict)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    #: The status this worker wrote last (the watch may not have delivered it yet).
    status_wire: dict[str, Any] | None = None
    #: pod name -> when we last asked for its deletion (no DELETE storm while it terminates).
    deleting: dict[str, float] = field(default_factory=dict)
    placement_failures: int = 0
    gone: bool = False
    #: Health detection state of the current attempt (kept between cycles).
    health_state: HealthState | None = None
    #: When this operator began judging the job's pods for silence (logic/health/silence.py).
    watching_since: float | None = None
    #: The heartbeat base URL this job's pods carry, learned from them (handlers.health.heartbeat_url_for).
    heartbeat_base: str = ""
    #: node -> until when the job's placements leave it out: the scheduler refused a pod of the
    #: job there for lack of GPUs (logic/pending.py). Lost with the operator: a bounded hint.
    refused_nodes: dict[str, float] = field(default_factory=dict)
    #: Kueue admitted the job's Workload: what its flavors ask of the nodes (read once a worker;
    #: restarts stay inside the admission).
    kueue_flavor: FlavorPlacement | None = None
    #: The admission's Topology-Aware Scheduling assignment, read at every read of the Workload
    #: (Kueue may rewrite it): the gang's placements stay inside it (logic/tas.py).
    kueue_topology: TopologyAssignment | None = None
    #: When the job's Workload was read last (an admitted job looks for an eviction now and then).
    kueue_read_at: float = float("-inf")
    #: The job's end is written on its Workload (Finished).
    kueue_finished: bool = False


#: One reconcile cycle of a job's worker (handlers.reconcile.reconcile_job); returns when to look again.
Reconcile = Callable[["Runtime", JobWorker], Awaitable["float | None"]]


class Runtime:
    def __init__(self, settings: OperatorSettings, reconcile: Reconcile) -> None:
        self.settings = settings
        self.kube: Kube | None = None
        self._connection: Connection | None = None
        #: What kopf's client was last given (kopf logs in again when it expired or was refused).
        self.kopf_credential: Credential | None = None
        self.metrics = OperatorMetrics(settings.registry)
        self.health_metrics = HealthMetrics(self.metrics.registry)
        self.checkpoint_metrics = CheckpointMetrics(self.metrics.registry)
        self.tokens = StaticTokens()
        self.store = HeartbeatStore()
        #: What each job's launchers are told (the restart control channel) and what they said.
        self.control = ControlBoard(on_report=self.wake)
        self.job_pods: Any = None
        self.nodes: Any = None
        self.bound_pods: Any = None
        #: What the last placement input derived from each Node object of the index (a node's
        #: index entry is a new dict when it changes), so a placement on a big cluster does not
        #: re-derive every node's facts and the domain tree. One per operator, not per job: the
        #: nodes are the same for every job, and a job's first placement is its only one unless
        #: it restarts (per job, every gang start derived all of it afresh: issue 46).
        self.topology_cache = TopologyCache()
        self.workers: dict[Key, JobWorker] = {}
        self.phases: dict[Key, str] = {}
        self.http_runner: Any = None
        self.reconcile = reconcile
        #: node name -> what placement reads of it, as last seen (handlers.nodes)
        self.node_signatures: dict[str, tuple[Any, ...]] = {}
        self.probes = Probes(stuck_after_s=settings.stuck_reconcile_s)
        #: Whether the API server serves scheduling.k8s.io/v1alpha2 Workloads and PodGroups
        #: (None: not asked yet); asked once per process, dropped when creating them is refused.
        self.workload_api: bool | None = None

    def connection(self) -> Connection:
        """The API server and its (renewing) credentials, shared by our client and kopf's."""
        if self._connection is None:
            self._connection = load_connection(self.settings.kubeconfig, self.settings.context)
        return self._connection

    def api(self) -> Kube:
        if self.kube is None:
            self.kube = Kube.for_connection(self.connection())
        return self.kube

    # indexes ------------------------------------------------------------------------------

    def bind_indexes(self, kwargs: dict[str, Any]) -> None:
        # Only event handlers call this, and kopf runs them only once every index is filled.
        self.probes.synced = True
        self.job_pods = kwargs.get("railyard_job_pods", self.job_pods)
        self.nodes = kwargs.get("railyard_nodes", self.nodes)
        self.bound_pods = kwargs.get("railyard_bound_pods", self.bound_pods)

    def pods_of(
        self, namespace: str, job: str, *, cleanup: bool = False, spare: bool = False, lighthouse: bool = False
    ) -> list[dict[str, Any]]:
        """The job's gang pods (``cleanup=True``: its checkpoint-cleanup pods instead;
        ``spare=True``: its hot-spare placeholders instead; ``lighthouse=True``: its
        Lighthouse instead)."""
        if self.job_pods is None:
            return []
        out = []
        for p in self.job_pods.get((namespace, job), []):
            labels = (p.get("metadata") or {}).get("labels") or {}
            if ((labels.get(CLEANUP_LABEL) == "true") == cleanup and (labels.get(SPARE_LABEL) == "true") == spare
                    and (labels.get(LIGHTHOUSE_LABEL) == "true") == lighthouse):
                out.append(dict(p))
        return out

    def node_map(self) -> dict[str, dict[str, Any]]:
        if self.nodes is None:
            return {}
        out: dict[str, dict[str, Any]] = {}
        for name, store in self.nodes.items():
            for node in store:
                out[name] = node
        return out

    def all_bound_pods(self) -> list[dict[str, Any]]:
        if self.bound_pods is None:
            return []
        return [p for store in self.bound_pods.values() for p in store]

    # workers ------------------------------------------------------------------------------

    def upsert_job(self, namespace: str, name: str, body: dict[str, Any]) -> JobWorker:
        key = (namespace, name)
        worker = self.workers.get(key)
        uid = (body.get("metadata") or {}).get("uid")
        old_uid = (worker.body.get("metadata") or {}).get("uid") if worker is not None else None
        if worker is not None and old_uid and uid and old_uid != uid:
            # deleted and recreated under the same name while we missed the deletion
            worker.gone = True
            if worker.task is not None:
                worker.task.cancel()
            worker = None
        if worker is None or worker.gone:
            worker = JobWorker(namespace, name)
            self.workers[key] = worker
        worker.body = body
        if worker.task is None or worker.task.done():
            self._start_worker(worker)
        worker.wake.set()
        return worker

    def _start_worker(self, worker: JobWorker) -> None:
        worker.task = asyncio.create_task(self._loop(worker), name=f"railyard-job-{worker.namespace}/{worker.name}")
        worker.task.add_done_callback(lambda task: self._on_worker_done(worker, task))

    def _on_worker_done(self, worker: JobWorker, task: asyncio.Task[None]) -> None:
        """A job's worker runs until its job is gone; one that ended otherwise is logged and
        restarted at once, so the job is not left unreconciled until its next event."""
        if (
            worker.gone
            or task.cancelled()
            or worker.task is not task
            or self.workers.get((worker.namespace, worker.name)) is not worker
        ):
            return
        exc = task.exception()
        log.error(
            "the worker of %s/%s ended unexpectedly (%r); restarting it in %.0fs",
            worker.namespace,
            worker.name,
            exc,
            WORKER_RESTART_DELAY_S,
            exc_info=exc,
        )
        self.metrics.reconcile_errors.labels(kind="WorkerDied").inc()
        asyncio.get_running_loop().call_later(WORKER_RESTART_DELAY_S, self._restart_worker, worker, task)

    def _restart_worker(self, worker: JobWorker, dead: asyncio.Task[None]) -> None:
        if not worker.gone and worker.task is dead and self.workers.get((worker.namespace, worker.name)) is worker:
            self._start_worker(worker)
            worker.wake.set()

    async def remove_job(self, namespace: str, name: str) -> None:
        worker = self.workers.pop((namespace, name), None)
        self.phases.pop((namespace, name), None)
        self.store.forget_job(namespace, name)
        self.control.forget(namespace, name)
        self.tokens.remove(namespace, name)
        self.metrics.forget_job(namespace, name)
        self.health_metrics.forget_job(namespace, name)
        self.checkpoint_metrics.forget_job(namespace, name)
        self.update_phase_gauge()
        if worker is not None:
            worker.gone = True
            if worker.task is not None:
                worker.task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await worker.task

    def wake(self, namespace: str, name: str) -> None:
        worker = self.workers.get((namespace, name))
        if worker is not None:
            worker.wake.set()

    def wake_jobs(self) -> None:
        for worker in self.workers.values():
            worker.wake.set()

    def set_phase(self, namespace: str, name: str, phase: str) -> None:
        if self.phases.get((namespace, name)) != phase:
            self.phases[(namespace, name)] = phase
            self.update_phase_gauge()
            if phase in ("Succeeded", "Failed"):
                # every launcher still asking is told to stop
                self.control.finish(namespace, name, f"the job is {phase}")
                # A finished job has no live heartbeats, step time, stragglers or placement: its
                # last values would otherwise stay until it is deleted (and keep an alert such as
                # RailyardStragglers firing). Counters and goodput stay.
                self.health_metrics.forget_job(namespace, name)
                self.metrics.forget_job(namespace, name)

    def update_phase_gauge(self) -> None:
        counts: dict[str, int] = {}
        for phase in self.phases.values():
            counts[phase] = counts.get(phase, 0) + 1
        self.metrics.set_phases(counts)

    async def _loop(self, worker: JobWorker) -> None:
        failures = 0
        while not worker.gone:
            worker.wake.clear()
            delay: float | None
            try:
                self.metrics.reconciles.inc()
                self.probes.cycle_started((worker.namespace, worker.name))
                try:
                    delay = await self.reconcile(self, worker)
                finally:
                    self.probes.cycle_finished((worker.namespace, worker.name))
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                kind = type(exc).__name__
                status = getattr(exc, "status", None)
                if status:
                    kind = f"{kind}{status}"
                self.metrics.reconcile_errors.labels(kind=kind).inc()
                delay = min(0.5 * 2 ** min(failures, 6), 30.0)
                log.exception("reconciling %s/%s failed (retry in %.1fs)", worker.namespace, worker.name, delay)
            if worker.gone:
                return
            timeout = self.settings.idle_recheck_s if delay is None else max(delay, 0.0)
            if timeout > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        await worker.wake.wait()
            if self.settings.coalesce_s > 0:
                await asyncio.sleep(self.settings.coalesce_s)

    async def close(self) -> None:
        for key in list(self.workers):
            worker = self.workers.pop(key)
            worker.gone = True
            if worker.task is not None:
                worker.task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await worker.task
        self.control.close()
        if self.http_runner is not None:
            await self.http_runner.cleanup()
            self.http_runner = None
        if self.kube is not None:
            await self.kube.close()
            self.kube = None
