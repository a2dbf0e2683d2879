"""Hot spares: a placeholder pod per spare node that holds what a gang pod asks for, so the node is
free (and its image pulled) when a replacement comes.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any

from railyard import GROUP
from railyard.api.trainingjob import TrainingJobSpec
from railyard.logic.manifests.dra import add_pod_claims
from railyard.logic.manifests.names import NODE_ANNOTATION, job_labels, object_meta
from railyard.logic.manifests.pod import container_resources

SPARE_LABEL = f"{GROUP}/spare"

#: The placeholder's command: it holds the node's resources and does nothing (our image, and any
#: image with coreutils, has sleep; on the local cluster any command runs as a process).
SPARE_COMMAND = ("sleep", "infinity")

#: An unprivileged user for the placeholder whatever the image (restricted Pod Security).
SPARE_UID = 65534


def spare_pod_name(job: str, node: str) -> str:
    """A placeholder's name: one per (job, spare node), whatever the node's name length."""
    return f"{job}-spare-{zlib.crc32(node.encode()):08x}"


def build_spare_pod(
    spec: TrainingJobSpec,
    *,
    job: str,
    namespace: str,
    owner: Mapping[str, Any],
    node: str,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A placeholder that holds a hot spare for the gang: pinned to ``node``, requesting what a
    gang pod requests (GPUs included), so no other pod is scheduled there and no other job's
    placement counts the node free, at the gang's own priority (another job of the same
    priority cannot preempt it). It runs the job's image, so the image is already on the node
    when a replacement comes. The operator deletes it right before a replacement takes the
    node (the replacement's gate is lifted once the placeholder is gone, as a preemptor waits
    for its victims), and when the job ends."""
    resources = container_resources(spec)
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Always",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        # not 0: a pod whose grace is 0 is removed from the API at once, before its kubelet has
        # stopped it and released its devices; the replacement must wait for that
        "terminationGracePeriodSeconds": 1,
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}},
        "securityContext": {
            "runAsNonRoot": True, "runAsUser": SPARE_UID, "runAsGroup": SPARE_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [{
            "name": "placeholder",
            "image": spec.image,
            "imagePullPolicy": spec.image_pull_policy,
            "command": list(SPARE_COMMAND),
            "resources": resources,
            "securityContext": {
                "allowPrivilegeEscalation": False, "privileged": False, "capabilities": {"drop": ["ALL"]},
            },
        }],
    }
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod_spec["tolerations"] = [t.model_dump(by_alias=True, exclude_none=True) for t in spec.tolerations]
    if spec.gang.scheduler_name:
        pod_spec["schedulerName"] = spec.gang.scheduler_name
    if spec.gang.priority_class_name:
        pod_spec["priorityClassName"] = spec.gang.priority_class_name
    meta = object_meta(spare_pod_name(job, node), namespace, {**job_labels(job), SPARE_LABEL: "true"}, owner)
    meta["annotations"] = {**dict(annotations or {}), NODE_ANNOTATION: node}
    add_pod_claims(spec, job, pod_spec, meta)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec}


def is_spare_pod(pod: Mapping[str, Any]) -> bool:
    return (((pod.get("metadata") or {}).get("labels") or {}).get(SPARE_LABEL)) == "true"
