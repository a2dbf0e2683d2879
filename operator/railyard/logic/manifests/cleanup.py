"""Checkpoint cleanup: the pods that delete a deleted job's checkpoints on its nodes (and on the
shared tier) while the job waits on our finalizer.
"""

from __future__ import annotations

from typing import Any

from railyard import GROUP
from railyard.api.trainingjob import TrainingJobSpec
from railyard.logic.manifests.names import CHECKPOINT_MOUNTS, job_labels
from railyard.logic.manifests.pod import pod_volumes, security_contexts
from railyard.protocol import podenv

CLEANUP_FINALIZER = f"{GROUP}/checkpoint-cleanup"
CLEANUP_LABEL = f"{GROUP}/cleanup"
CLEANUP_COMMAND = ("python", "-m", "railyard_trainer.checkpoint.cleanup")


def cleanup_pod_name(job: str, index: int) -> str:
    return f"{job}-cleanup-{index}"


def build_cleanup_pod(
    spec: TrainingJobSpec,
    *,
    job: str,
    namespace: str,
    index: int,
    node: str,
    shared: bool,
) -> dict[str, Any]:
    """A pod that deletes the job's checkpoints on ``node`` (memory and local tiers) and, when
    ``shared``, on the shared tier (``python -m railyard_trainer.checkpoint.cleanup``). Not owned
    by the job: it runs while the job waits on our finalizer, and the operator deletes it."""
    pod_sc, container_sc = security_contexts(spec)
    volumes, mounts = pod_volumes(spec, job, namespace, 0)
    volumes = [v for v in volumes if v["name"] != "railyard-config"]
    mounts = [m for m in mounts if m["name"] != "railyard-config"]
    if not shared:
        volumes = [v for v in volumes if v["name"] != "ckpt-shared"]
        mounts = [m for m in mounts if m["name"] != "ckpt-shared"]
    env = [
        var.entry(CHECKPOINT_MOUNTS[tier] if shared or tier != "shared" else "")
        for tier, var in podenv.CHECKPOINT_DIRS.items()
    ]
    labels = {**job_labels(job), CLEANUP_LABEL: "true"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": cleanup_pod_name(job, index), "namespace": namespace, "labels": labels},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 5,
            "nodeName": node,
            "tolerations": [{"operator": "Exists"}],
            "securityContext": pod_sc,
            "containers": [{
                "name": "cleanup",
                "image": spec.image,
                "imagePullPolicy": spec.image_pull_policy,
                "command": [*CLEANUP_COMMAND, "--job", job],
                "env": env,
                "volumeMounts": mounts,
                "securityContext": container_sc,
                "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
            }],
            "volumes": volumes,
        },
    }
