"""Hot spares that stay spares: one placeholder pod per spare node of the gang.

Without a pod on it, a spare is free for anyone: another job's placement or the scheduler can
take it, and the next failure finds none. A placeholder (logic.manifests.build_spare_pod)
requests what a gang pod requests, at the gang's priority, so the node stays ours; the in-place
restart deletes it right before a replacement takes the node (handlers/inplace.py), and every
placeholder goes as soon as the job is not running (Succeeded, Failed, Suspended) or deleted
(owner references). The count held is ``status.sparesHeld`` (``kubectl get tj`` column Spares)
and the gauge ``railyard_hot_spares{state="held"}``.
"""

from __future__ import annotations

from railyard.api.trainingjob import TrainingJob
from railyard.handlers.cycle import Cycle
from railyard.logic.manifests import build_spare_pod, owner_reference
from railyard.logic.spares import HOLDING, decide_spares
from railyard.logic.tas import tas_pod_labels

#: A placeholder's deletion grace (its sleep has nothing to save; the replacement waits for it).
PLACEHOLDER_GRACE_S = 1


async def reconcile_spares(cycle: Cycle, job: TrainingJob) -> float | None:
    """Make the placeholders match the placement's spares; returns when to look again."""
    runtime = cycle.runtime
    have = runtime.pods_of(cycle.ns, cycle.name, spare=True)
    deleting = cycle.meta.get("deletionTimestamp") or job.spec.suspend
    spares = list(cycle.status.placement.spares) if cycle.status.placement is not None else []
    nodes = runtime.node_map()
    create, delete, held = decide_spares(
        job=cycle.name,
        phase="" if deleting else cycle.status.phase,
        wanted=job.spec.gang.hot_spares,
        spares=spares,
        nodes=nodes,
        have=have,
    )
    if delete:
        await cycle.delete_pods(delete, nodes, grace_seconds=PLACEHOLDER_GRACE_S)
    lr = cycle.status.last_restart
    if create and lr is not None and lr.mode == "InPlace" and lr.attempt == cycle.status.attempt and lr.state != "Done":
        # a restart in place is opening: its replacements and orders first, new spares after
        create = []
    if create:
        owner = owner_reference(cycle.body)
        placeholders = [build_spare_pod(job.spec, job=cycle.name, namespace=cycle.ns, owner=owner, node=n,
                                        annotations=runtime.settings.pod_annotations) for n in create]
        for placeholder in placeholders:  # held GPUs Kueue's TAS counts once, as the gang's (logic/tas.py)
            placeholder["metadata"]["labels"].update(tas_pod_labels(cycle.worker.kueue_topology))
        await cycle.io.create_pods(placeholders)
    if held != cycle.status.spares_held:
        cycle.update(spares_held=held)
    runtime.metrics.set_spares(
        cycle.ns, cycle.name, wanted=job.spec.gang.hot_spares if cycle.status.phase in HOLDING else 0, held=held
    )
    return 1.0 if create else None
