"""Deleting a job's checkpoints with the job, when ``spec.checkpoint.cleanupOnDelete`` asks.

The job carries the finalizer ``railyard.dev/checkpoint-cleanup`` only while it asks for this.
On deletion the gang is removed, one cleanup pod runs per node that held the job's last
placements (memory and local tiers, and the shared tier: once for a claim, from every node for
a hostPath), and the finalizer
is removed once they have finished, their node is gone, or a bounded time has passed.
"""

from __future__ import annotations

from collections.abc import Sequence

from railyard.api.corev1 import node_is_ready
from railyard.api.trainingjob import TrainingJob
from railyard.handlers.cycle import Cycle
from railyard.logic.conditions import parse_time
from railyard.logic.gang import pod_name_of
from railyard.logic.lifecycle import earlier_attempts
from railyard.logic.manifests import CLEANUP_FINALIZER, build_cleanup_pod

#: Longest a deletion waits for the cleanup pods.
CLEANUP_TIMEOUT_S = 120.0


async def _nodes_that_held_the_job(cycle: Cycle) -> list[str]:
    nodes: list[str] = list(cycle.status.placement.nodes) if cycle.status.placement else []
    for attempt in [*earlier_attempts(cycle.status.attempt), cycle.status.attempt]:
        table = await cycle.io.read_rank_table(cycle.ns, cycle.name, attempt)
        if table is not None:
            nodes += [p.node for p in table.pods]
    return sorted(set(nodes))


async def cleanup_checkpoints(cycle: Cycle, finalizers: Sequence[str]) -> float | None:
    """One cycle of a deletion with our finalizer; returns when to look again."""
    runtime = cycle.runtime
    nodes = runtime.node_map()
    gang = runtime.pods_of(cycle.ns, cycle.name)
    if gang:
        await cycle.delete_pods(gang, nodes)
    try:
        job: TrainingJob | None = TrainingJob.model_validate(
            {"metadata": {"name": cycle.name, "namespace": cycle.ns}, "spec": cycle.spec}
        )
    except ValueError:
        job = None
    since = parse_time(str(cycle.meta.get("deletionTimestamp") or "")) or cycle.now
    timed_out = cycle.now - since > CLEANUP_TIMEOUT_S
    done = job is None or timed_out
    cleaners = {pod_name_of(p): p for p in runtime.pods_of(cycle.ns, cycle.name, cleanup=True)}
    if job is not None and not done:
        targets = [n for n in await _nodes_that_held_the_job(cycle) if node_is_ready(nodes.get(n))]
        pods = [
            # a shared hostPath is cleaned from every node (it may not really be shared); a
            # claim once
            build_cleanup_pod(job.spec, job=cycle.name, namespace=cycle.ns, index=i, node=n,
                              shared=i == 0 or not job.spec.checkpoint.shared.claim_name)
            for i, n in enumerate(targets)
        ]
        missing = [p for p in pods if pod_name_of(p) not in cleaners]
        if missing:
            await cycle.io.create_pods(missing)
            return 1.0
        finished = [
            p for p in pods
            if ((cleaners.get(pod_name_of(p)) or {}).get("status") or {}).get("phase") in ("Succeeded", "Failed")
        ]
        done = len(finished) == len(pods)
        if not done:
            return 1.0
        cycle.event(
            "Normal",
            "CheckpointsDeleted",
            f"checkpoints deleted on {len(pods)} nodes (spec.checkpoint.cleanupOnDelete)",
        )
    elif timed_out:
        cycle.event(
            "Warning",
            "CheckpointCleanupTimedOut",
            f"checkpoint cleanup did not finish within {CLEANUP_TIMEOUT_S:g}s; some files may remain",
        )
    await cycle.flush_events()
    if cleaners:
        await cycle.io.delete_pods(cycle.ns, list(cleaners), grace_seconds=0)
    rest = [name for name in finalizers if name != CLEANUP_FINALIZER]
    if not await cycle.io.patch_job_finalizers(cycle.ns, cycle.name, rest, cycle.meta.get("resourceVersion")):
        return 0.5
    await cycle.io.delete_owned(cycle.ns, cycle.name)
    return None
