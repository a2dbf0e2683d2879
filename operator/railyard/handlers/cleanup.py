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
from railyard.logic.lifecycle import earlier_attempts
from railyard.logic.manifests import CLEANUP_FINALIZER, build_cleanup_pod

#: Longest a deletion waits for the cleanup pods.
CLEANUP_TIMEOUT_S = 120.0


async def _nodes_that_held_the_job(c: Cycle) -> list[str]:
    nodes: list[str] = list(c.st.placement.nodes) if c.st.placement else []
    for attempt in [*earlier_attempts(c.st.attempt), c.st.attempt]:
        table = await c.io.read_rank_table(c.ns, c.name, attempt)
        if table is not None:
            nodes += [p.node for p in table.pods]
    return sorted(set(nodes))


async def cleanup_checkpoints(c: Cycle, finalizers: Sequence[str]) -> float | None:
    """One cycle of a deletion with our finalizer; returns when to look again."""
    rt = c.rt
    nodes = rt.node_map()
    gang = rt.pods_of(c.ns, c.name)
    if gang:
        await c.delete_pods(gang, nodes)
    try:
        job: TrainingJob | None = TrainingJob.model_validate({"metadata": {"name": c.name, "namespace": c.ns}, "spec": c.spec})
    except ValueError:
        job = None
    since = parse_time(str(c.meta.get("deletionTimestamp") or "")) or c.now
    timed_out = c.now - since > CLEANUP_TIMEOUT_S
    done = job is None or timed_out
    cleaners = {str((p.get("metadata") or {}).get("name")): p for p in rt.pods_of(c.ns, c.name, cleanup=True)}
    if job is not None and not done:
        targets = [n for n in await _nodes_that_held_the_job(c) if node_is_ready(nodes.get(n))]
        pods = [
            # a shared hostPath is cleaned from every node (it may not really be shared); a
            # claim once
            build_cleanup_pod(job.spec, job=c.name, namespace=c.ns, index=i, node=n,
                              shared=i == 0 or not job.spec.checkpoint.shared.claim_name)
            for i, n in enumerate(targets)
        ]
        missing = [p for p in pods if p["metadata"]["name"] not in cleaners]
        if missing:
            await c.io.create_pods(missing)
            return 1.0
        finished = [
            p for p in pods
            if ((cleaners.get(p["metadata"]["name"]) or {}).get("status") or {}).get("phase") in ("Succeeded", "Failed")
        ]
        done = len(finished) == len(pods)
        if not done:
            return 1.0
        c.event("Normal", "CheckpointsDeleted", f"checkpoints deleted on {len(pods)} nodes (spec.checkpoint.cleanupOnDelete)")
    elif timed_out:
        c.event("Warning", "CheckpointCleanupTimedOut", f"checkpoint cleanup did not finish within {CLEANUP_TIMEOUT_S:g}s; some files may remain")
    await c.flush_events()
    if cleaners:
        await c.io.delete_pods(c.ns, list(cleaners), grace_seconds=0)
    rest = [f for f in finalizers if f != CLEANUP_FINALIZER]
    if not await c.io.patch_job_finalizers(c.ns, c.name, rest, c.meta.get("resourceVersion")):
        return 0.5
    await c.io.delete_owned(c.ns, c.name)
    return None
