"""One gang member: the trainer container, its contract with the trainer (env vars and mounts, see
docs/trainer.md), its security contexts and checkpoint volumes, gated and pinned to its node.

The NCCL defaults keep each rank's inter-node traffic on the NIC of its own rail. Spare
placeholders, the Lighthouse and the cleanup pods reuse the resources, security and volumes built
here, so every pod of a job asks for and runs as the same.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from railyard.api.trainingjob import TrainingJobSpec
from railyard.logic.manifests.dra import add_pod_claims, pod_resource_claims
from railyard.logic.manifests.names import (
    ATTEMPT_LABEL,
    CHECKPOINT_MOUNTS,
    CONFIG_DIR,
    CONFIG_FILE,
    GANG_GATE,
    NODE_ANNOTATION,
    POD_INDEX_LABEL,
    RANK_TABLE_FILE,
    TOKEN_KEY,
    configmap_name,
    group_checkpoint_dir,
    group_rank_table_file,
    hostname,
    job_labels,
    lighthouse_address,
    object_meta,
    pod_address,
    pod_name,
    rendezvous_port,
    replica_group_of,
    secret_name,
    service_name,
)
from railyard.protocol import podenv
from railyard.protocol.termination import TERMINATION_LOG

CONTAINER_NAME = "trainer"
DEFAULT_COMMAND = ("railyard-train",)

#: NCCL settings that keep rail traffic on its rail; ``spec.nccl`` overrides any of them.
NCCL_DEFAULTS: Mapping[str, str] = {
    # never send a rank's traffic through another rail's NIC
    "NCCL_CROSS_NIC": "0",
    # rings and trees built per rail: let NCCL pick the NIC nearest each GPU
    "NCCL_NET_GDR_LEVEL": "PHB",
    "NCCL_IB_QPS_PER_CONNECTION": "4",
    "NCCL_SOCKET_IFNAME": "^lo,docker",
    "NCCL_ASYNC_ERROR_HANDLING": "1",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
}


def container_resources(spec: TrainingJobSpec) -> dict[str, Any]:
    """The trainer container's requests and limits: the spec's, plus ``spec.gpus`` GPUs (a
    request equal to the limit, as the device plugin requires), or with ``spec.gpuClaim`` the
    pod's DRA claims by name (:func:`pod_resource_claims`). Gang pods and spare placeholders
    ask for exactly the same, so a placeholder's node fits its replacement."""
    requests = dict(spec.resources.requests)
    limits = dict(spec.resources.limits)
    if spec.extended_gpus > 0:
        limits.setdefault("nvidia.com/gpu", str(spec.extended_gpus))
        requests.setdefault("nvidia.com/gpu", limits["nvidia.com/gpu"])
    resources: dict[str, Any] = {}
    if requests:
        resources["requests"] = requests
    if limits:
        resources["limits"] = limits
    claims = pod_resource_claims(spec, "")
    if claims:
        resources["claims"] = [{"name": c["name"]} for c in claims]
    return resources


def security_contexts(spec: TrainingJobSpec) -> tuple[dict[str, Any], dict[str, Any]]:
    """The pod's and the trainer container's security contexts. The user is
    ``spec.securityContext`` (default: the trainer image's user, whatever the image is called);
    every image gets the same rule, so ours pushed under another name behaves as ours."""
    pod_sc: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
    container_sc: dict[str, Any] = {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
    }
    sc = spec.security_context
    pod_sc.update({"runAsUser": sc.run_as_user, "runAsGroup": sc.group, "fsGroup": sc.volume_group})
    if sc.run_as_user != 0:
        # a numeric non-root user: the kubelet can check it (restricted Pod Security)
        pod_sc["runAsNonRoot"] = True
    return pod_sc, container_sc


def _checkpoint_dirs_init(
    spec: TrainingJobSpec, volumes: Sequence[Mapping[str, Any]], mounts: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """For a non-root trainer (``spec.securityContext.runAsUser`` > 0, by default the image's
    10001): an init container that hands the job's hostPath checkpoint folders to that user. The
    kubelet creates a ``DirectoryOrCreate`` folder as root, mode 0755, and ``fsGroup`` does not
    apply to hostPath, so without it the trainer could not write tiers 1 and 2. It runs the job's
    image (which must have ``chown``) as root with only CAP_CHOWN, changes the owner of the
    per-job folders (not recursively: what is inside was written by the trainer) and exits. A
    root trainer (runAsUser 0) writes them as they are: no init container."""
    sc = spec.security_context
    if sc.run_as_user == 0:
        return []
    host = {v["name"] for v in volumes if "hostPath" in v}
    own = [dict(m) for m in mounts if m["name"] in host]
    if not own:
        return []
    return [{
        "name": "checkpoint-dirs",
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["chown", f"{sc.run_as_user}:{sc.group}", *(m["mountPath"] for m in own)],
        "volumeMounts": own,
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "16Mi"}},
        "securityContext": {
            "runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": False,
            "allowPrivilegeEscalation": False, "privileged": False,
            "capabilities": {"drop": ["ALL"], "add": ["CHOWN"]},
        },
    }]


def _memory_volume(spec: TrainingJobSpec, per_job: str) -> dict[str, Any]:
    """The memory tier: a tmpfs hostPath that outlives the pod, or (medium Pod) the pod's own
    memory-backed emptyDir, which an in-place restart keeps and which needs no hostPath."""
    mem = spec.checkpoint.memory
    if mem.medium == "Pod":
        empty: dict[str, Any] = {"medium": "Memory"}
        if mem.size_limit:
            empty["sizeLimit"] = mem.size_limit
        return {"name": "ckpt-memory", "emptyDir": empty}
    return {"name": "ckpt-memory", "hostPath": _host_dir(mem.host_path, per_job)}


def _host_dir(host_path: str, per_job: str) -> dict[str, str]:
    """A tier's per-job folder under its hostPath, created by the kubelet when missing."""
    return {"path": f"{host_path.rstrip('/')}/{per_job}", "type": "DirectoryOrCreate"}


def pod_volumes(
    spec: TrainingJobSpec, job: str, namespace: str, attempt: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The config and the checkpoint tiers' volumes. A disabled tier gets no volume (a hostPath
    nobody writes would still keep the pods out of the baseline Pod Security Standard)."""
    ck = spec.checkpoint
    per_job = f"{namespace}/{job}"
    volumes: list[dict[str, Any]] = [
        {"name": "railyard-config", "configMap": {"name": configmap_name(job, attempt)}},
        _memory_volume(spec, per_job),
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "railyard-config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "ckpt-memory", "mountPath": CHECKPOINT_MOUNTS["memory"]},
    ]
    if ck.local.enabled:
        volumes.append({"name": "ckpt-local", "hostPath": _host_dir(ck.local.host_path, per_job)})
        mounts.append({"name": "ckpt-local", "mountPath": CHECKPOINT_MOUNTS["local"]})
    if ck.shared.claim_name:
        volumes.append({"name": "ckpt-shared", "persistentVolumeClaim": {"claimName": ck.shared.claim_name}})
        mounts.append({"name": "ckpt-shared", "mountPath": CHECKPOINT_MOUNTS["shared"]})
    elif ck.shared.enabled:
        volumes.append({"name": "ckpt-shared", "hostPath": _host_dir(ck.shared.host_path, per_job)})
        mounts.append({"name": "ckpt-shared", "mountPath": CHECKPOINT_MOUNTS["shared"]})
    return volumes, mounts


def build_pod_env(
    spec: TrainingJobSpec,
    *,
    job: str,
    namespace: str,
    attempt: int,
    pod_index: int,
    heartbeat_url: str,
    control_url: str = "",
) -> list[dict[str, Any]]:
    """The pod contract of docs/trainer.md, then NCCL defaults, ``spec.nccl``, ``spec.env``.
    ``control_url``: the operator's restart control endpoint (default: beside the heartbeat
    ingest, :func:`control_url_for`). With faultTolerance ReplicaGroups the pod's world is its
    replica group: the group's rank table and rendezvous (its first pod), its index, and the
    Lighthouse (docs/fault-tolerance.md)."""
    groups = spec.replica_groups
    group = replica_group_of(spec, pod_index)
    table_file, master_pod = RANK_TABLE_FILE, 0
    if groups > 1:
        table_file, master_pod = group_rank_table_file(group), group * (spec.nodes // groups)
    env: list[dict[str, Any]] = [
        podenv.CONFIG.entry(f"{CONFIG_DIR}/{CONFIG_FILE}"),
        podenv.RANK_TABLE.entry(f"{CONFIG_DIR}/{table_file}"),
        podenv.POD_INDEX.entry(podenv.POD_INDEX.render(pod_index)),
        podenv.POD_NAME.field_entry("metadata.name"),
        podenv.NODE_NAME.field_entry("spec.nodeName"),
        podenv.JOB.entry(job),
        podenv.NAMESPACE.entry(namespace),
        podenv.ATTEMPT.entry(podenv.ATTEMPT.render(attempt)),
        podenv.MASTER_ADDR.entry(pod_address(job, namespace, master_pod)),
        podenv.MASTER_PORT.entry(podenv.MASTER_PORT.render(rendezvous_port(job, namespace, attempt, group))),
        podenv.HEARTBEAT_URL.entry(heartbeat_url),
        podenv.HEARTBEAT_TOKEN.secret_entry(secret_name(job), TOKEN_KEY),
        podenv.CONTROL_URL.entry(control_url or control_url_for(heartbeat_url, namespace, job)),
        *(var.entry(group_checkpoint_dir(tier, groups, group)) for tier, var in podenv.CHECKPOINT_DIRS.items()),
        podenv.TERMINATION_LOG.entry(TERMINATION_LOG),
    ]
    if groups > 1:
        env += [
            podenv.REPLICA_GROUP.entry(podenv.REPLICA_GROUP.render(group)),
            podenv.LIGHTHOUSE.entry(lighthouse_address(job, namespace)),
            # torchft's addresses for the quorum and for healing peers (its default, the
            # short hostname, does not resolve in other pods)
            podenv.POD_IP.field_entry("status.podIP"),
        ]
    nccl = {**NCCL_DEFAULTS, **spec.nccl}
    env += [{"name": k, "value": v} for k, v in sorted(nccl.items())]
    overridden = {x.name for x in spec.env}
    return [e for e in env if e["name"] not in overridden] + [{"name": e.name, "value": e.value} for e in spec.env]


def control_url_for(heartbeat_url: str, namespace: str, job: str) -> str:
    """The restart control endpoint on the operator that serves ``heartbeat_url``
    (``.../v1/heartbeats/<ns>/<job>`` -> ``.../v1/control/<ns>/<job>``)."""
    suffix = f"/v1/heartbeats/{namespace}/{job}"
    base = heartbeat_url[: -len(suffix)] if heartbeat_url.endswith(suffix) else heartbeat_url.rstrip("/")
    return f"{base}/v1/control/{namespace}/{job}"


#: Multus's pod annotation: the networks a pod gets besides the pod network.
MULTUS_NETWORKS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"


def with_heal_network(spec: TrainingJobSpec, annotations: Mapping[str, str]) -> dict[str, str]:
    """``annotations`` with ``faultTolerance.healNetwork.attachment`` asked of Multus as the
    interface the trainer advertises for heals (``interface_name``), after any networks the
    operator's settings already attach (Multus takes a JSON list or ``ns/name@if,...``)."""
    out = dict(annotations)
    heal = spec.fault_tolerance.heal_network
    if spec.replica_groups < 2 or heal.attachment is None or heal.interface_name is None:
        return out
    namespace, _, name = heal.attachment.rpartition("/")
    existing = out.get(MULTUS_NETWORKS_ANNOTATION, "").strip()
    try:
        networks = json.loads(existing) if existing.startswith("[") else None
    except ValueError:  # not ours to fix here: Multus reports it on the pod
        networks = None
    if existing and not isinstance(networks, list):
        out[MULTUS_NETWORKS_ANNOTATION] = f"{existing},{heal.attachment}@{heal.interface_name}"
        return out
    entry = {"name": name, "interface": heal.interface_name, **({"namespace": namespace} if namespace else {})}
    out[MULTUS_NETWORKS_ANNOTATION] = json.dumps([*(networks or []), entry], separators=(",", ":"))
    return out


def build_pod(
    spec: TrainingJobSpec,
    *,
    job: str,
    namespace: str,
    owner: Mapping[str, Any],
    attempt: int,
    pod_index: int,
    node: str,
    heartbeat_url: str,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """One gang member, gated (``railyard.dev/gang``) and pinned to ``node``. ``annotations``:
    extra pod annotations from the operator's settings (e.g. sidecar-injection opt-outs)."""
    labels = {**job_labels(job), ATTEMPT_LABEL: str(attempt), POD_INDEX_LABEL: str(pod_index)}
    pod_sc, container_sc = security_contexts(spec)
    volumes, mounts = pod_volumes(spec, job, namespace, attempt)
    resources = container_resources(spec)
    port = rendezvous_port(job, namespace, attempt, replica_group_of(spec, pod_index))
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": list(spec.command) if spec.command else list(DEFAULT_COMMAND),
        "env": build_pod_env(
            spec, job=job, namespace=namespace, attempt=attempt, pod_index=pod_index, heartbeat_url=heartbeat_url
        ),
        "ports": [{"name": "rendezvous", "containerPort": port, "protocol": "TCP"}],
        "resources": resources,
        "volumeMounts": mounts,
        "securityContext": container_sc,
        # the failing rank's last words: what the launcher writes there, else (any other
        # program) the tail of the log, survive the pod in state.terminated.message
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if spec.args:
        container["args"] = list(spec.args)
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "hostname": hostname(job, pod_index),
        "subdomain": service_name(job),
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 10,
        "schedulingGates": [{"name": GANG_GATE}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                    ]
                }
            }
        },
        "securityContext": pod_sc,
        "containers": [container],
        "volumes": volumes,
    }
    init = _checkpoint_dirs_init(spec, volumes, mounts)
    if init:
        pod_spec["initContainers"] = init
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod_spec["tolerations"] = [t.model_dump(by_alias=True, exclude_none=True) for t in spec.tolerations]
    if spec.service_account_name:
        pod_spec["serviceAccountName"] = spec.service_account_name
    if spec.gang.scheduler_name:
        pod_spec["schedulerName"] = spec.gang.scheduler_name
    if spec.gang.priority_class_name:
        pod_spec["priorityClassName"] = spec.gang.priority_class_name
    meta = object_meta(pod_name(job, attempt, pod_index), namespace, labels, owner)
    meta["annotations"] = {**with_heal_network(spec, annotations or {}), NODE_ANNOTATION: node}
    add_pod_claims(spec, job, pod_spec, meta)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec}


def build_gang_pods(
    spec: TrainingJobSpec,
    *,
    job: str,
    namespace: str,
    owner: Mapping[str, Any],
    attempt: int,
    nodes: Sequence[str],
    heartbeat_url: str,
    annotations: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    return [
        build_pod(spec, job=job, namespace=namespace, owner=owner, attempt=attempt, pod_index=i, node=n,
                  heartbeat_url=heartbeat_url, annotations=annotations)
        for i, n in enumerate(nodes)
    ]


def build_gate_removal(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    """Strategic-merge patch lifting our gate and no other, or None when ours is not there.

    The server applies it to its current list (``schedulingGates`` merges by ``name``), so a
    gate a webhook added after we built the pod (Kueue's ``kueue.x-k8s.io/admission``) stays:
    a list computed from the pod as we built or cached it would delete that gate too."""
    gates = (pod.get("spec") or {}).get("schedulingGates") or ()
    if not any(g.get("name") == GANG_GATE for g in gates):
        return None
    return {"spec": {"schedulingGates": [{"$patch": "delete", "name": GANG_GATE}]}}
