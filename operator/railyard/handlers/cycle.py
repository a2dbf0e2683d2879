"""The reconcile cycle as a typed object, and the one seam through which it touches the cluster.

A :class:`Cycle` is what one reconcile of one TrainingJob works on: the job as read, the status
being built (``status``, replaced, never mutated, by the pure functions of :mod:`railyard.logic`),
the Events to write, and :class:`GangIO`, every call to the Kubernetes API the cycle may make.
:class:`KubeGangIO` is that seam over :mod:`railyard.k8s.gang`; tests fake it
(tests/operator/fake_cluster.py) and run the whole state machine in-process.

The seam is where later work plugs in: an in-place restart adds an I/O call here and a decision
in logic/; a 4xx from the API server on the gang's own objects surfaces from these calls as
:class:`railyard.k8s.client.ApiError` (see ``create_gang`` in handlers/creation.py, the one
place a gang's objects are created).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from pydantic import ValidationError

from railyard.api.trainingjob import QuarantinedNode, TrainingJobSpec, TrainingJobStatus
from railyard.handlers.runtime import JobWorker, Runtime
from railyard.k8s import gang as ops
from railyard.k8s import kueue as kueue_ops
from railyard.k8s.client import Kube
from railyard.logic.conditions import format_time
from railyard.logic.failures import Failure
from railyard.logic.gang import plan_pod_deletions
from railyard.logic.manifests import owner_reference
from railyard.logic.restarts import restart_update
from railyard.logic.schedulers import (
    GangSchedulingPlan,
    Integration,
    decide_integration,
    decide_resumed_workload_api,
    group_name,
    needs_workload_api,
    plan_gang_scheduling,
    topology_key_for,
)
from railyard.logic.status import (
    apply_phase,
    build_status_patch,
    build_transition_events,
    status_to_wire,
)
from railyard.logic.tas import tas_pod_labels
from railyard.protocol.ranktable import RankTable

log = logging.getLogger(__name__)

Obj = Mapping[str, Any]


class GangIO(Protocol):
    """Every API call a reconcile cycle makes (idempotent, as :mod:`railyard.k8s.gang`)."""

    async def create_object(self, obj: Obj) -> bool: ...
    async def create_pods(self, pods: Sequence[Obj]) -> int: ...
    async def lift_gates(self, pods: Sequence[Obj]) -> int: ...
    async def delete_pods(self, namespace: str, names: Iterable[str], *, grace_seconds: int | None = None) -> int: ...
    async def delete_owned(self, namespace: str, job: str) -> None: ...
    async def delete_configmaps(self, namespace: str, names: Iterable[str]) -> None: ...
    async def ensure_disruption_budget(self, budget: Obj) -> str: ...
    async def create_podgroups(self, objects: Sequence[Obj]) -> int: ...
    async def delete_podgroups(self, namespace: str, api_version: str, names: Iterable[str]) -> int: ...
    async def serves_workload_api(self) -> bool: ...
    async def read_podgroup_condition(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    async def read_rank_table(self, namespace: str, job: str, attempt: int) -> RankTable | None: ...
    async def read_attempt_config(self, namespace: str, job: str, attempt: int) -> dict[str, Any] | None: ...
    async def read_token(self, namespace: str, job: str) -> str | None: ...
    async def ensure_secret(self, secret: Obj) -> str: ...
    def new_token(self) -> str: ...
    async def quarantine_node(self, node: str, *, reason: str, job: str, now: float) -> bool: ...
    async def release_node(self, node: str) -> bool: ...
    async def patch_job_status(self, namespace: str, name: str, status_patch: Obj) -> dict[str, Any] | None: ...
    async def patch_job_finalizers(
        self, namespace: str, name: str, finalizers: Sequence[str], resource_version: str | None
    ) -> bool: ...
    async def create_event(self, involved: Obj, *, type_: str, reason: str, message: str, now: float) -> None: ...
    # the job's Kueue Workload (handlers/kueue.py)
    async def read_kueue_workload(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    async def create_kueue_workload(self, workload: Obj) -> bool: ...
    async def finish_kueue_workload(self, apply: Obj) -> bool: ...
    async def delete_kueue_workload(self, namespace: str, name: str) -> bool: ...
    async def read_priority_value(self, name: str, *, workload_class: bool) -> int | None: ...
    async def read_resource_flavor(self, name: str) -> dict[str, Any] | None: ...
    async def acknowledge_eviction(self, namespace: str, name: str, patch: Obj) -> bool: ...


class KubeGangIO:
    """:class:`GangIO` on the real API (:mod:`railyard.k8s.gang` with one client)."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube

    async def create_object(self, obj: Obj) -> bool:
        return await ops.create_object(self.kube, obj)

    async def create_pods(self, pods: Sequence[Obj]) -> int:
        return await ops.create_pods(self.kube, pods)

    async def lift_gates(self, pods: Sequence[Obj]) -> int:
        return await ops.lift_gates(self.kube, pods)

    async def delete_pods(self, namespace: str, names: Iterable[str], *, grace_seconds: int | None = None) -> int:
        return await ops.delete_pods(self.kube, namespace, names, grace_seconds=grace_seconds)

    async def delete_owned(self, namespace: str, job: str) -> None:
        await ops.delete_owned(self.kube, namespace, job)

    async def delete_configmaps(self, namespace: str, names: Iterable[str]) -> None:
        await ops.delete_configmaps(self.kube, namespace, names)

    async def ensure_disruption_budget(self, budget: Obj) -> str:
        return await ops.ensure_disruption_budget(self.kube, budget)

    async def create_podgroups(self, objects: Sequence[Obj]) -> int:
        return await ops.create_podgroups(self.kube, objects)

    async def delete_podgroups(self, namespace: str, api_version: str, names: Iterable[str]) -> int:
        return await ops.delete_podgroups(self.kube, namespace, api_version, names)

    async def serves_workload_api(self) -> bool:
        return await ops.serves_workload_api(self.kube)

    async def read_podgroup_condition(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await ops.read_podgroup_condition(self.kube, namespace, name)

    async def read_rank_table(self, namespace: str, job: str, attempt: int) -> RankTable | None:
        return await ops.read_rank_table(self.kube, namespace, job, attempt)

    async def read_attempt_config(self, namespace: str, job: str, attempt: int) -> dict[str, Any] | None:
        return await ops.read_attempt_config(self.kube, namespace, job, attempt)

    async def read_token(self, namespace: str, job: str) -> str | None:
        return await ops.read_token(self.kube, namespace, job)

    async def ensure_secret(self, secret: Obj) -> str:
        return await ops.ensure_secret(self.kube, secret)

    def new_token(self) -> str:
        return ops.new_token()

    async def quarantine_node(self, node: str, *, reason: str, job: str, now: float) -> bool:
        return await ops.quarantine_node(self.kube, node, reason=reason, job=job, now=now)

    async def release_node(self, node: str) -> bool:
        return await ops.release_node(self.kube, node)

    async def patch_job_status(self, namespace: str, name: str, status_patch: Obj) -> dict[str, Any] | None:
        return await ops.patch_job_status(self.kube, namespace, name, status_patch)

    async def patch_job_finalizers(
        self, namespace: str, name: str, finalizers: Sequence[str], resource_version: str | None
    ) -> bool:
        return await ops.patch_job_finalizers(self.kube, namespace, name, finalizers, resource_version)

    async def create_event(self, involved: Obj, *, type_: str, reason: str, message: str, now: float) -> None:
        await ops.create_event(self.kube, involved, type_=type_, reason=reason, message=message, now=now)

    async def read_kueue_workload(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await kueue_ops.read_kueue_workload(self.kube, namespace, name)

    async def create_kueue_workload(self, workload: Obj) -> bool:
        return await kueue_ops.create_kueue_workload(self.kube, workload)

    async def finish_kueue_workload(self, apply: Obj) -> bool:
        return await kueue_ops.finish_kueue_workload(self.kube, apply)

    async def delete_kueue_workload(self, namespace: str, name: str) -> bool:
        return await kueue_ops.delete_kueue_workload(self.kube, namespace, name)

    async def read_priority_value(self, name: str, *, workload_class: bool) -> int | None:
        return await kueue_ops.read_priority_value(self.kube, name, workload_class=workload_class)

    async def read_resource_flavor(self, name: str) -> dict[str, Any] | None:
        return await kueue_ops.read_resource_flavor(self.kube, name)

    async def acknowledge_eviction(self, namespace: str, name: str, patch: Obj) -> bool:
        return await kueue_ops.acknowledge_eviction(self.kube, namespace, name, patch)


class Cycle:
    """The state one reconcile cycle works on, and its deferred writes (one status patch and
    the Events, at :meth:`commit`)."""

    def __init__(
        self, runtime: Runtime, worker: JobWorker, now: float, io: GangIO, clock: Callable[[], float] | None = None
    ) -> None:
        self.runtime = runtime
        self.worker = worker
        self.io = io
        self.body: dict[str, Any] = worker.body
        self.meta: Mapping[str, Any] = self.body.get("metadata") or {}
        self.ns = worker.namespace
        self.name = worker.name
        self.generation = int(self.meta.get("generation") or 0)
        self.now = now
        self.iso = format_time(now)
        #: The time as the cycle goes on (``now`` is when it began; its writes take a while on a
        #: loaded server): for the stamps that say when something happened, such as when the kept
        #: launchers were told to restart. Tests that pass ``now`` get ``now``.
        self.clock: Callable[[], float] = clock if clock is not None else (lambda: now)
        body_status = dict(self.body.get("status") or {})
        # our own last write wins over a watch event that has not caught up with it yet
        self.old_wire: dict[str, Any] = worker.status_wire if worker.status_wire is not None else body_status
        try:
            self.status = TrainingJobStatus.model_validate(self.old_wire)
        except ValidationError:
            log.warning("%s/%s: unreadable status, rebuilding from the cluster", self.ns, self.name)
            self.status = TrainingJobStatus()
        self.old_status = self.status  # what the Events compare against (updates replace it, never mutate it)
        self.extra_events: list[tuple[str, str, str]] = []
        #: Run once the status is written (what must not happen before it is durable: telling
        #: launchers to restart for an attempt the status does not yet name).
        self.after_commit: list[Callable[[], None]] = []

    @property
    def spec(self) -> Mapping[str, Any]:
        return self.body.get("spec") or {}

    def record_restart(
        self, failure: Failure, *, attempt: int, backoff_s: float, quarantined: list[QuarantinedNode], in_place: bool,
        **fields: Any,
    ) -> None:
        """The status of a restart: what every restart writes (:func:`railyard.logic.restarts.restart_update`)
        and the executor's own ``fields`` (snake_case names of :class:`TrainingJobStatus`)."""
        update = restart_update(self.status, failure, attempt=attempt, now=self.now, now_iso=self.iso,
                                backoff_s=backoff_s, quarantined=quarantined, in_place=in_place)
        self.status = self.status.model_copy(update={**update, **fields})

    def refused_nodes(self) -> list[str]:
        """Nodes the job's placements leave out now: the scheduler refused a pod of the job there
        for lack of GPUs the operator's count did not explain (logic/pending.py)."""
        return [node for node, until in self.worker.refused_nodes.items() if until > self.now]

    def phase(self, phase: str, reason: str, message: str) -> None:
        self.status = apply_phase(
            self.status,
            phase,
            reason=reason,
            message=message,
            now=self.iso,
            generation=self.status.observed_generation or None,
        )
        self.runtime.set_phase(self.ns, self.name, phase)

    def update(self, **fields: Any) -> None:
        """Replace status fields (snake_case names of :class:`TrainingJobStatus`)."""
        self.status = self.status.model_copy(update=fields)

    def event(self, type_: str, reason: str, message: str) -> None:
        self.extra_events.append((type_, reason, message))

    async def flush_events(self) -> None:
        for type_, reason, message in self.extra_events:
            await self.io.create_event(self.body, type_=type_, reason=reason, message=message, now=self.now)
        self.extra_events.clear()

    async def commit(self) -> None:
        """Write the status once (the merge patch of what changed), then the Events."""
        new_wire = status_to_wire(self.status)
        patch = build_status_patch(self.old_wire, new_wire)
        if patch:
            got = await self.io.patch_job_status(self.ns, self.name, patch)
            if got is None:
                return
            self.worker.status_wire = new_wire
        for hook in self.after_commit:
            hook()
        self.after_commit.clear()
        self.runtime.set_phase(self.ns, self.name, self.status.phase)
        for type_, reason, message in build_transition_events(self.old_status, self.status):
            await self.io.create_event(self.body, type_=type_, reason=reason, message=message, now=self.now)
        await self.flush_events()

    async def plan_gang(
        self, spec: TrainingJobSpec, *, attempt: int, gang_nodes: Sequence[str], begun: Sequence[Obj] = ()
    ) -> GangSchedulingPlan:
        """What the gang scheduler expects for the pods of ``attempt`` on ``gang_nodes`` (a whole
        gang, or the pods an in-place restart replaces): :mod:`railyard.logic.schedulers`, with
        the topology level those nodes share and, for ``spec.gang.scheduler: auto``, whether the
        API server serves Kubernetes' gang scheduling (asked once per operator process), or,
        resuming a creation an operator began (``begun``: the pods it created), whether it used it."""
        served = False
        if needs_workload_api(spec) and begun:
            served = decide_resumed_workload_api(begun, group_name(self.name, attempt))
        elif needs_workload_api(spec):
            if self.runtime.workload_api is None:
                self.runtime.workload_api = await self.io.serves_workload_api()
                log.info(
                    "scheduling.k8s.io/v1alpha2 Workloads and PodGroups %s",
                    "served: gang.scheduler auto uses them" if self.runtime.workload_api else "not served",
                )
            served = self.runtime.workload_api
        key = None
        if decide_integration(spec, workload_api=served) is Integration.KUBERNETES:
            key = topology_key_for(spec, gang_nodes, self.runtime.node_map())
        plan = plan_gang_scheduling(
            spec,
            job=self.name,
            namespace=self.ns,
            attempt=attempt,
            owner=owner_reference(self.body),
            gang_size=len(gang_nodes),
            workload_api=served,
            topology_key=key,
        )
        tas = tas_pod_labels(self.worker.kueue_topology)  # Kueue counts the pods once (logic/tas.py)
        return dataclasses.replace(plan, pod_labels={**plan.pod_labels, **tas}) if tas else plan

    def drop_detected(self, plan: GangSchedulingPlan, status: int) -> bool:
        """``spec.gang.scheduler: auto`` found Kubernetes' gang scheduling, but creating its
        objects was refused (403: not granted, 404: no longer served): this operator stops
        using it (the next plan has no group). True when it did."""
        if plan.detected and status in (403, 404):
            self.runtime.workload_api = False
            return True
        return False

    async def delete_pods(
        self, pods: Sequence[Obj], nodes: Mapping[str, Obj], *, grace_seconds: int | None = None
    ) -> int:
        """Delete pods, once each: with ``grace_seconds`` (default: the operator's
        ``delete_grace_s``), forced on dead nodes and when stuck Terminating. Returns how many
        were asked for."""
        s = self.runtime.settings
        normal, force = plan_pod_deletions(
            pods, nodes, now=self.now, asked=self.worker.deleting, stuck_terminating_s=s.stuck_terminating_s
        )
        for n in normal + force:
            self.worker.deleting[n] = self.now
        if normal:
            await self.io.delete_pods(
                self.ns, normal, grace_seconds=s.delete_grace_s if grace_seconds is None else grace_seconds
            )
        if force:
            await self.io.delete_pods(self.ns, force, grace_seconds=0)
        return len(pods)
