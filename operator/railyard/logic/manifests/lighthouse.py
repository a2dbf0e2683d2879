"""faultTolerance ReplicaGroups: the job's Lighthouse pod (torchft's quorum server) and the
NetworkPolicy that admits only the job's own pods to the groups and to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from railyard import GROUP
from railyard.api.trainingjob import TrainingJobSpec
from railyard.logic.manifests.names import (
    JOB_LABEL,
    job_labels,
    lighthouse_name,
    lighthouse_port,
    object_meta,
    service_name,
)
from railyard.logic.manifests.pod import security_contexts
from railyard.protocol.trainerconfig import (
    lighthouse_heartbeat_timeout_ms,
    lighthouse_join_timeout_ms,
)

#: faultTolerance ReplicaGroups: the job's Lighthouse pod carries this label (and the job's).
LIGHTHOUSE_LABEL = f"{GROUP}/lighthouse"

#: ``railyard-train lighthouse`` (railyard_trainer/replicas.py): torchft's quorum server.
LIGHTHOUSE_COMMAND = ("railyard-train", "lighthouse")


def build_lighthouse_pod(
    spec: TrainingJobSpec,
    *,
    job: str,
    namespace: str,
    owner: Mapping[str, Any],
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The job's Lighthouse: one pod of the job's image running ``railyard-train lighthouse``
    with ``faultTolerance.minReplicas``, a join timeout below the trainer's watchdog
    (:func:`railyard.protocol.trainerconfig.lighthouse_join_timeout_ms`) and a heartbeat timeout
    of ten missed beats (:func:`~railyard.protocol.trainerconfig.lighthouse_heartbeat_timeout_ms`),
    reachable at :func:`lighthouse_address` (hostname and subdomain under the job's headless
    Service, which selects the job label). Not gated and not pinned: it needs no GPU (small CPU
    and memory requests), only to run while the groups train, placed away from the job's
    training nodes (:func:`build_lighthouse_placement`); ``restartPolicy: Always`` restarts a crashed Lighthouse in
    place,
    and the operator recreates a lost one (handlers/lighthouse.py). Owned by the job, so it goes
    with it."""
    pod_sc, container_sc = security_contexts(spec)
    port = lighthouse_port(job, namespace)
    command = [*LIGHTHOUSE_COMMAND, "--min-replicas", str(spec.fault_tolerance.min_replicas), "--bind", f"[::]:{port}",
               "--join-timeout-ms", str(lighthouse_join_timeout_ms(spec.trainer.watchdog_seconds)),
               "--heartbeat-timeout-ms", str(lighthouse_heartbeat_timeout_ms())]
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Always",
        "hostname": lighthouse_name(job),
        "subdomain": service_name(job),
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 5,
        "securityContext": pod_sc,
        "containers": [{
            "name": "lighthouse",
            "image": spec.image,
            "imagePullPolicy": spec.image_pull_policy,
            "command": command,
            "ports": [{"name": "lighthouse", "containerPort": port, "protocol": "TCP"}],
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
            "securityContext": container_sc,
        }],
    }
    pod_spec.update(build_lighthouse_placement(spec, job=job))
    if spec.gang.priority_class_name:
        pod_spec["priorityClassName"] = spec.gang.priority_class_name
    meta = object_meta(lighthouse_name(job), namespace, {**job_labels(job), LIGHTHOUSE_LABEL: "true"}, owner)
    if annotations:
        meta["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec}


#: A node label that says the node has GPUs (NVIDIA's GPU feature discovery; the local cluster's
#: GPU nodes carry it too): the Lighthouse prefers nodes without it.
GPU_NODE_LABEL = "nvidia.com/gpu.present"
#: The weights of the Lighthouse's preferences: away from the nodes the job trains on first (a
#: node failure there would take a group and the Lighthouse at once), then away from GPU nodes.
AWAY_FROM_TRAINING_WEIGHT = 100
AWAY_FROM_GPUS_WEIGHT = 50


def build_lighthouse_placement(spec: TrainingJobSpec, *, job: str) -> dict[str, Any]:
    """The Lighthouse pod's nodeSelector, tolerations and affinity.

    ``faultTolerance.lighthouse.nodeSelector`` / ``tolerations`` replace the job's when given
    (unset: the job's, so it may run where the job may). Whatever they select, the Lighthouse
    *prefers* a node that runs none of the job's training pods and a node without GPUs: it needs
    no GPU, and on a training node it would share that node's failures with a group, which would
    then lose its pod and the quorum server together. Only preferences: a cluster of GPU nodes
    only (and the local cluster) must still schedule it, where a required rule would leave it
    Pending and the groups without a quorum."""
    placement = spec.fault_tolerance.lighthouse
    selector = spec.node_selector if placement.node_selector is None else placement.node_selector
    tolerations = spec.tolerations if placement.tolerations is None else placement.tolerations
    out: dict[str, Any] = {}
    if selector:
        out["nodeSelector"] = dict(selector)
    if tolerations:
        out["tolerations"] = [t.model_dump(by_alias=True, exclude_none=True) for t in tolerations]
    training_pods = {"matchExpressions": [{"key": JOB_LABEL, "operator": "In", "values": [job]},
                                          {"key": LIGHTHOUSE_LABEL, "operator": "DoesNotExist"}]}
    out["affinity"] = {
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": AWAY_FROM_TRAINING_WEIGHT,
            "podAffinityTerm": {"labelSelector": training_pods, "topologyKey": "kubernetes.io/hostname"},
        }]},
        "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": AWAY_FROM_GPUS_WEIGHT,
            "preference": {"matchExpressions": [{"key": GPU_NODE_LABEL, "operator": "DoesNotExist"}]},
        }]},
    }
    return out


def network_policy_name(job: str) -> str:
    return f"{job}-replica-groups"


def build_network_policy(job: str, namespace: str, owner: Mapping[str, Any]) -> dict[str, Any]:
    """faultTolerance ReplicaGroups: the job's pods and its Lighthouse admit connections only
    from the job's own pods (rendezvous, collectives, torchft's quorum and its recovery
    transport, which sends model and optimizer state to whoever asks). Nothing else needs to
    reach them: the launchers call the operator, never the other way round. Ingress only, so DNS
    and the calls to the operator stay open; owned by the job."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": object_meta(network_policy_name(job), namespace, job_labels(job), owner),
        "spec": {
            "podSelector": {"matchLabels": {JOB_LABEL: job}},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": {JOB_LABEL: job}}}]}],
        },
    }


def is_lighthouse_pod(pod: Mapping[str, Any]) -> bool:
    return (((pod.get("metadata") or {}).get("labels") or {}).get(LIGHTHOUSE_LABEL)) == "true"
