"""Creating a gang, whole or not at all: place it, create its objects (the scheduler's PodGroup,
the job's Secret and Service, the attempt's ConfigMap, every pod gated, then every gate lifted
at once), finish a creation an operator left half done, and roll back what the API server
refused of it (logic/rejections.py says whether the job fails or waits with the server's
message, never a silent retry)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from railyard.api.trainingjob import TrainingJob, TrainingJobSpec
from railyard.handlers.cycle import Cycle
from railyard.handlers.health import heartbeat_url_for
from railyard.k8s.client import ApiError
from railyard.logic.conditions import format_micro_time
from railyard.logic.gang import GangAssessment, pod_name_of
from railyard.logic.health.window import GroupLayout
from railyard.logic.lifecycle import earlier_attempts, placement_retry_s
from railyard.logic.manifests import (
    build_configmap,
    build_disruption_budget,
    build_dra_objects,
    build_gang_pods,
    build_network_policy,
    build_secret,
    build_service,
    build_trainer_config,
    configmap_name,
    disruption_budget_name,
    network_policy_name,
    owner_reference,
    pod_name,
    secret_name,
    service_name,
    with_addresses,
)
from railyard.logic.placement import (
    Placement,
    Unplaceable,
    build_placement_input,
    job_tolerations,
    plan_placement,
)
from railyard.logic.planned import find_going_nodes
from railyard.logic.rejections import decide_rejection
from railyard.logic.restarts import restore_hint
from railyard.logic.schedulers import (
    GangSchedulingPlan,
    apply_to_pods,
    describe_unavailable,
    group_name,
)
from railyard.logic.status import build_placement_status, placement_status
from railyard.protocol.ranktable import RankTable

log = logging.getLogger(__name__)

#: Seconds between tries to create a PodGroup whose CRD is missing (spec.gang.schedulerName).
PODGROUP_RETRY_S = 10.0


async def _previous_placement(cycle: Cycle) -> RankTable | None:
    """The newest earlier attempt's rank table (a sticky placement starts from it)."""
    for prev in reversed(earlier_attempts(cycle.status.attempt)):
        table = await cycle.io.read_rank_table(cycle.ns, cycle.name, prev)
        if table is not None:
            return table
    return None




def _avoided(cycle: Cycle, job: TrainingJob, nodes: Mapping[str, Mapping[str, Any]]) -> set[str]:
    """Nodes a new gang is not placed on: the quarantined ones, and those announced to go (a
    maintenance label the placement alone would not see: the gang would move again at once)."""
    going = find_going_nodes(
        nodes, signals=cycle.runtime.settings.maintenance_signals, tolerations=job_tolerations(job)
    )
    return {q.node for q in cycle.status.quarantined_nodes} | set(going)


async def place_and_create(cycle: Cycle, job: TrainingJob, nodes: Mapping[str, Mapping[str, Any]]) -> float | None:
    """Place the gang of ``cycle.status.attempt`` (sticky on the previous attempt's nodes) and create it;
    unplaceable: Placing with the reason (or Failed when it never fits), retried with backoff.
    Returns when to look again."""
    runtime, spec, attempt = cycle.runtime, job.spec, cycle.status.attempt
    # whatever comes of it, this cycle acts on the current spec
    cycle.update(observed_generation=cycle.generation)
    prev = await _previous_placement(cycle)
    t0 = time.perf_counter()
    result = plan_placement(build_placement_input(
        job, nodes=list(nodes.values()), pods=runtime.all_bound_pods(), attempt=attempt,
        previous_nodes=[p.node for p in sorted(prev.pods, key=lambda p: p.pod_index)] if prev is not None else None,
        previous_spares=cycle.status.placement.spares if cycle.status.placement else (),
        failed=_avoided(cycle, job, nodes), cache=runtime.topology_cache,
        refused=cycle.refused_nodes(), admitted=cycle.worker.kueue_topology,
    ))
    runtime.metrics.placement.observe(time.perf_counter() - t0)

    if isinstance(result, Unplaceable):
        cycle.worker.placement_failures += 1
        if result.permanent:
            cycle.phase("Failed", result.condition_reason, result.message)
            return None
        retry = placement_retry_s(cycle.worker.placement_failures)
        inside = cycle.worker.kueue_topology
        # restarts stay inside the admission: the job waits for an assigned node (or a new assignment)
        where = f"; {inside.describe()}, waiting for one of its nodes" if inside is not None else ""
        cycle.phase("Placing", result.condition_reason, f"{result.message}{where}; retrying (and on every node change)")
        return retry
    cycle.worker.placement_failures = 0
    try:
        created = await create_gang(cycle, job, result)
    except GangRefused as refused:
        return await gang_refused(cycle, refused)
    if created is None:
        return PODGROUP_RETRY_S
    pods, plan = created
    placement = placement_status(result, attempt=attempt)
    levels = [k for k in result.cross_bytes_per_step if k not in ("host", "network")]
    spine = levels[-1] if levels else None
    runtime.metrics.set_cross_bytes(cycle.ns, cycle.name, dict(result.cross_bytes_per_step), spine)
    cycle.status = cycle.status.model_copy(
        update={
            "placement": placement,
            "gang_created_time": format_micro_time(cycle.now),
            "time_to_all_ready_seconds": None,
            "observed_generation": cycle.generation,
            "pending_spec_changes": "",
            "next_attempt_time": None,
        }
    )
    cycle.phase(
        "Starting",
        "GangCreated",
        f"attempt {attempt}: {len(pods)} pods created and released together on {placement.summary}",
    )
    await cycle.io.delete_configmaps(
        cycle.ns, [configmap_name(cycle.name, earlier) for earlier in earlier_attempts(attempt)]
    )
    if plan.objects:
        # one PodGroup per attempt: the earlier attempts' groups go with their pods
        earlier = [group_name(cycle.name, older) for older in earlier_attempts(attempt)]
        await cycle.io.delete_podgroups(cycle.ns, plan.objects[0]["apiVersion"], earlier)
    return float(spec.gang.schedule_timeout_seconds)


async def create_gang(
    cycle: Cycle, job: TrainingJob, placed: Placement
) -> tuple[list[dict[str, Any]], GangSchedulingPlan] | None:
    """Create the gang of ``cycle.status.attempt`` on ``placed``: the scheduler's PodGroup, the job's
    Secret and Service, the attempt's ConfigMap, every pod gated, then every gate lifted at once.
    None when the PodGroup kind is unavailable (the job stays Placing).

    Every object the API server may refuse for this gang is created here: a refusal raises
    :class:`GangRefused` (naming the object and what to roll back), which
    :func:`gang_refused` turns into a Failed phase or a waiting condition."""
    runtime, spec, attempt = cycle.runtime, job.spec, cycle.status.attempt
    owner = owner_reference(cycle.body)
    plan = await cycle.plan_gang(spec, attempt=attempt, gang_nodes=placed.nodes)
    pods = build_gang_pods(
        spec,
        job=cycle.name,
        namespace=cycle.ns,
        owner=owner,
        attempt=attempt,
        nodes=placed.nodes,
        heartbeat_url=heartbeat_url_for(runtime, cycle.ns, cycle.name),
        annotations=runtime.settings.pod_annotations,
    )
    pods = apply_to_pods(pods, plan)  # schedulerName, queue/group labels; our gate and node affinity stay
    names = [pod_name_of(p) for p in pods]
    cm = configmap_name(cycle.name, attempt)
    async with _refusals(f"PodGroup {plan.group_name}"):
        if not await _ensure_podgroups(cycle, plan):
            return None
    await _ensure_job_objects(cycle, owner, spec, pods=len(pods))
    table = with_addresses(placed.rank_table, cycle.ns)
    # a new gang: no pod is kept (a memory tier in the pods is gone with them)
    restore = restore_hint(cycle.status, spec, pods_kept=False)
    config = build_trainer_config(spec, job=cycle.name, namespace=cycle.ns, attempt=attempt, restore=restore)
    async with _refusals(f"ConfigMap {cm}"):
        await cycle.io.create_object(
            build_configmap(
                cycle.name,
                cycle.ns,
                owner,
                attempt=attempt,
                rank_table=table,
                config=config,
                replica_groups=spec.replica_groups,
            )
        )
    # the attempt's ConfigMap goes with a refused gang too: a retry may place it elsewhere
    async with _refusals("the gang's pods", pods=names, configmap=cm):
        runtime.metrics.pods_created.inc(await cycle.io.create_pods(pods))
        await cycle.io.lift_gates(pods)
    runtime.store.begin_attempt(cycle.ns, cycle.name, attempt, layout=GroupLayout.of(table, spec.replica_groups))
    members = {i: pod_name(cycle.name, attempt, i) for i in range(len(pods))}
    cycle.after_commit.append(
        lambda: runtime.control.publish(
            cycle.ns,
            cycle.name,
            attempt=attempt,
            members=members,
            table=table,
            restore=restore,
            replica_groups=spec.replica_groups,
        )
    )
    return pods, plan


class GangRefused(Exception):
    """The API server refused one of the gang's own objects (``what``); ``pods`` and
    ``configmap`` are what this attempt may already have created of the gang."""

    def __init__(self, what: str, error: ApiError, pods: Sequence[str] = (), configmap: str | None = None) -> None:
        super().__init__(f"{what}: {error}")
        self.what = what
        self.error = error
        self.pods = list(pods)
        self.configmap = configmap


@contextlib.asynccontextmanager
async def _refusals(what: str, *, pods: Sequence[str] = (), configmap: str | None = None) -> AsyncIterator[None]:
    try:
        yield
    except ApiError as exc:
        raise GangRefused(what, exc, pods, configmap) from exc


async def gang_refused(cycle: Cycle, refused: GangRefused) -> float | None:
    """Roll back what this attempt created of the gang (no half gang waits or runs), then fail
    the job (a refusal that cannot pass) or wait and create it again (one that can), with the
    server's message in the condition and its Event."""
    exc = refused.error
    message = exc.body.get("message", "") if isinstance(exc.body, dict) else str(exc.body or "")
    decision = decide_rejection(exc.status, exc.reason, str(message), what=refused.what)
    log.warning("%s/%s: %s", cycle.ns, cycle.name, decision.message)
    if refused.pods:
        for n in refused.pods:
            cycle.worker.deleting[n] = cycle.now
        await cycle.io.delete_pods(cycle.ns, refused.pods, grace_seconds=0)  # gated, never bound: gone at once
    if refused.configmap:
        await cycle.io.delete_configmaps(cycle.ns, [refused.configmap])
    cycle.status = cycle.status.model_copy(update={"observed_generation": cycle.generation, "gang_created_time": None})
    if decision.permanent:
        cycle.phase("Failed", decision.reason, decision.message)
        return None
    cycle.status = cycle.status.model_copy(
        update={"next_attempt_time": format_micro_time(cycle.now + decision.retry_after_s)}
    )
    cycle.phase("Placing", decision.reason, decision.message)
    return decision.retry_after_s


async def _ensure_podgroups(cycle: Cycle, plan: GangSchedulingPlan) -> bool:
    """Create the gang scheduler's PodGroup before any pod (idempotent). False, with the job
    kept Placing and the reason in its status, when the API server does not serve the kind."""
    if not plan.objects:
        return True
    try:
        await cycle.io.create_podgroups(plan.objects)
    except ApiError as exc:
        if exc.status not in (403, 404):
            raise
        cycle.drop_detected(plan, exc.status)
        cycle.phase("Placing", "PodGroupUnavailable", describe_unavailable(plan, exc.status, retry_s=PODGROUP_RETRY_S))
        return False
    return True


async def finish_creation(
    cycle: Cycle, job: TrainingJob, current: Sequence[Mapping[str, Any]], assessment: GangAssessment
) -> float | None:
    """Resume a gang whose creation was interrupted: same names, same nodes (from the
    attempt's ConfigMap), then lift every gate."""
    runtime = cycle.runtime
    table = await cycle.io.read_rank_table(cycle.ns, cycle.name, cycle.status.attempt)
    if table is None:
        # nothing says where the rest goes: start this attempt over
        await cycle.delete_pods(current, runtime.node_map())
        cycle.status = cycle.status.model_copy(update={"attempt": cycle.status.attempt + 1, "gang_created_time": None})
        return 0.5
    nodes = [p.node for p in sorted(table.pods, key=lambda p: p.pod_index)]
    owner = owner_reference(cycle.body)
    pods = build_gang_pods(
        job.spec,
        job=cycle.name,
        namespace=cycle.ns,
        owner=owner,
        attempt=cycle.status.attempt,
        nodes=nodes,
        heartbeat_url=heartbeat_url_for(runtime, cycle.ns, cycle.name),
        annotations=runtime.settings.pod_annotations,
    )
    plan = await cycle.plan_gang(job.spec, attempt=cycle.status.attempt, gang_nodes=nodes, begun=current)
    names = [pod_name_of(p) for p in pods]
    try:
        async with _refusals(f"PodGroup {plan.group_name}"):
            if not await _ensure_podgroups(cycle, plan):
                return PODGROUP_RETRY_S
        pods = apply_to_pods(pods, plan)
        missing = [pods[i] for i in assessment.missing if i < len(pods)]
        async with _refusals("the gang's pods", pods=names, configmap=configmap_name(cycle.name, cycle.status.attempt)):
            if missing:
                runtime.metrics.pods_created.inc(await cycle.io.create_pods(missing))
        await _ensure_job_objects(cycle, owner, job.spec, pods=len(pods))
        async with _refusals("the gang's pods", pods=names, configmap=configmap_name(cycle.name, cycle.status.attempt)):
            await cycle.io.lift_gates(pods)
    except GangRefused as refused:
        # the rest of this gang exists already: it goes too
        refused.pods = names
        refused.configmap = configmap_name(cycle.name, cycle.status.attempt)
        return await gang_refused(cycle, refused)
    update: dict[str, Any] = {}
    if cycle.status.gang_created_time is None:
        update["gang_created_time"] = format_micro_time(cycle.now)
    if (
        cycle.status.placement is None
        or cycle.status.placement.attempt != cycle.status.attempt
        or cycle.status.placement.node_count != len(nodes)
    ):
        update["placement"] = build_placement_status(nodes, attempt=cycle.status.attempt)
    if update:
        cycle.status = cycle.status.model_copy(update=update)
    if cycle.status.phase != "Starting":
        cycle.phase(
            "Starting",
            "GangResumed",
            f"attempt {cycle.status.attempt}: finished creating {len(missing)} missing pods and released the gang",
        )
    return 1.0


async def _ensure_job_objects(cycle: Cycle, owner: Mapping[str, Any], spec: TrainingJobSpec, *, pods: int) -> None:
    """The per-job Secret (heartbeat token), headless Service and PodDisruptionBudget over its
    ``pods`` training pods (and with replica groups the job's NetworkPolicy, with spec.gpuClaim
    its ResourceClaimTemplate and ComputeDomain); idempotent, and the token is re-read after an
    operator restart so heartbeats authenticate against the same one. One budget per job: a new
    attempt of another size replaces it (logic/manifests/disruption.py)."""
    runtime = cycle.runtime
    if runtime.tokens(cycle.ns, cycle.name) is None:
        async with _refusals(f"Secret {secret_name(cycle.name)}"):
            token = await cycle.io.ensure_secret(build_secret(cycle.name, cycle.ns, owner, cycle.io.new_token()))
        runtime.tokens.set(cycle.ns, cycle.name, token)
    async with _refusals(f"Service {service_name(cycle.name)}"):
        await cycle.io.create_object(build_service(cycle.name, cycle.ns, owner))
    if runtime.settings.planned_moves:  # off: no budget holds a drain (nothing would move the pods)
        async with _refusals(f"PodDisruptionBudget {disruption_budget_name(cycle.name)}"):
            # before the pods: a drain that starts as the gang does finds them covered
            await cycle.io.ensure_disruption_budget(build_disruption_budget(cycle.name, cycle.ns, owner, pods=pods))
    for obj in build_dra_objects(spec, job=cycle.name, namespace=cycle.ns, owner=owner):
        # before the pods that claim from them (a pod whose template is missing stays Pending)
        async with _refusals(f"{obj['kind']} {obj['metadata']['name']}"):
            await cycle.io.create_object(obj)
    if spec.replica_groups > 1:
        # the Lighthouse and torchft's recovery transport: reachable from the job's pods only
        async with _refusals(f"NetworkPolicy {network_policy_name(cycle.name)}"):
            await cycle.io.create_object(build_network_policy(cycle.name, cycle.ns, owner))
