"""The job's Lighthouse pod (faultTolerance ReplicaGroups): created while the gang holds its
nodes, recreated when lost, deleted when the job stops running (logic/lighthouse.py decides)."""

from __future__ import annotations

from railyard.api.trainingjob import TrainingJob
from railyard.handlers.cycle import Cycle
from railyard.handlers.spares import delete_placeholders
from railyard.logic.lighthouse import decide_lighthouse
from railyard.logic.manifests import build_lighthouse_pod, owner_reference


async def reconcile_lighthouse(c: Cycle, job: TrainingJob) -> float | None:
    """Make the Lighthouse match the decision; returns when to look again (None: no hurry)."""
    rt = c.rt
    have = rt.pods_of(c.ns, c.name, lighthouse=True)
    nodes = rt.node_map()
    d = decide_lighthouse(replica_groups=job.spec.replica_groups, phase=c.st.phase,
                          deleting=bool(c.meta.get("deletionTimestamp") or job.spec.suspend), have=have, nodes=nodes)
    if d.delete:
        # the same deletion as a placeholder's: force on a dead node, each pod once
        await delete_placeholders(c, d.delete, nodes)
    if d.lost:
        await c.io.create_event(c.body, type_="Warning", reason="LighthouseLost",
                                message=f"{d.lost}; creating it again (the replica groups wait for a quorum meanwhile)", now=c.now)
    if d.create:
        await c.io.create_pods([build_lighthouse_pod(job.spec, job=c.name, namespace=c.ns, owner=owner_reference(c.body),
                                                     annotations=rt.settings.pod_annotations)])
    return 1.0 if d.create or d.delete else None
