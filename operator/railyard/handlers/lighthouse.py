"""The job's Lighthouse pod (faultTolerance ReplicaGroups): created while the gang holds its
nodes, recreated when lost, deleted when the job stops running (logic/lighthouse.py decides)."""

from __future__ import annotations

from railyard.api.trainingjob import TrainingJob
from railyard.handlers.cycle import Cycle
from railyard.handlers.spares import PLACEHOLDER_GRACE_S
from railyard.logic.lighthouse import decide_lighthouse
from railyard.logic.manifests import build_lighthouse_pod, owner_reference


async def reconcile_lighthouse(cycle: Cycle, job: TrainingJob) -> float | None:
    """Make the Lighthouse match the decision; returns when to look again (None: no hurry)."""
    runtime = cycle.runtime
    have = runtime.pods_of(cycle.ns, cycle.name, lighthouse=True)
    nodes = runtime.node_map()
    d = decide_lighthouse(
        replica_groups=job.spec.replica_groups,
        phase=cycle.status.phase,
        deleting=bool(cycle.meta.get("deletionTimestamp") or job.spec.suspend),
        have=have,
        nodes=nodes,
    )
    if d.delete:
        # a placeholder's short grace: the Lighthouse has nothing to save
        await cycle.delete_pods(d.delete, nodes, grace_seconds=PLACEHOLDER_GRACE_S)
    if d.lost:
        await cycle.io.create_event(
            cycle.body,
            type_="Warning",
            reason="LighthouseLost",
            message=f"{d.lost}; creating it again (the replica groups wait for a quorum meanwhile)",
            now=cycle.now,
        )
    if d.create:
        await cycle.io.create_pods(
            [
                build_lighthouse_pod(
                    job.spec,
                    job=cycle.name,
                    namespace=cycle.ns,
                    owner=owner_reference(cycle.body),
                    annotations=runtime.settings.pod_annotations,
                )
            ]
        )
    return 1.0 if d.create or d.delete else None
