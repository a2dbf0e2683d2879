"""Pure builders of the objects a gang is made of: Service, ConfigMap, Secret, Pods, and with
spec.gpuClaim the DRA ResourceClaimTemplate and ComputeDomain.

Everything here is a function of the TrainingJob, the attempt and the rank table, so a repeated
reconcile builds byte-identical objects with identical names and "create" is idempotent
(an AlreadyExists answer means the work was done). The pod contract (env vars, mounts) is the
trainer's, see docs/trainer.md; the NCCL defaults keep each rank's inter-node traffic on the
NIC of its own rail.
"""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from railyard import GROUP
from railyard.api.trainingjob import API_VERSION, KIND, TrainingJobSpec
from railyard.api.trainingjob import (
    TRAINER_UID as TRAINER_UID,  # the image's user, for callers of this module
)
from railyard.logic.layout import build_replica_group_table
from railyard.logic.topology import CLAIMED_GPUS_ANNOTATION
from railyard.protocol import podenv
from railyard.protocol.mesh import MeshShape
from railyard.protocol.ranktable import PodEntry, RankTable
from railyard.protocol.termination import TERMINATION_LOG
from railyard.protocol.trainerconfig import (
    lighthouse_heartbeat_timeout_ms,
    lighthouse_join_timeout_ms,
    restart_wait_seconds,
    to_wire,
)

# labels, annotations, names ------------------------------------------------------------------
JOB_LABEL = f"{GROUP}/job"
ATTEMPT_LABEL = f"{GROUP}/attempt"
POD_INDEX_LABEL = f"{GROUP}/pod-index"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "railyard"
GANG_GATE = f"{GROUP}/gang"
NODE_ANNOTATION = f"{GROUP}/node"
CONFIG_DIR = "/etc/railyard"
CONFIG_FILE = "config.json"
RANK_TABLE_FILE = "ranktable.json"
TOKEN_KEY = "token"
#: Rendezvous ports are drawn from this range per job and attempt (see rendezvous_port). It
#: stays below Linux's ephemeral range (ip_local_port_range, 32768-60999 by default) and
#: Kubernetes' NodePort range (30000-32767): a port in the ephemeral range may be the local end
#: of any outgoing connection of the pod (gloo's, an HTTP client's), and the new attempt's
#: TCPStore then fails with EADDRINUSE (found by the CI stability runs: a restart in place that
#: failed again at once, exit 70).
RENDEZVOUS_PORT_BASE = 20000
RENDEZVOUS_PORT_SPAN = 10000
CONTAINER_NAME = "trainer"
DEFAULT_COMMAND = ("railyard-train",)

CHECKPOINT_MOUNTS = {"memory": "/railyard/checkpoints/memory", "local": "/railyard/checkpoints/local", "shared": "/railyard/checkpoints/shared"}

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


#: faultTolerance ReplicaGroups: the job's Lighthouse pod carries this label (and the job's).
LIGHTHOUSE_LABEL = f"{GROUP}/lighthouse"


def pod_name(job: str, attempt: int, pod_index: int) -> str:
    return f"{job}-a{attempt}-{pod_index}"


def hostname(job: str, pod_index: int) -> str:
    return f"{job}-{pod_index}"


def service_name(job: str) -> str:
    return job


def configmap_name(job: str, attempt: int) -> str:
    return f"{job}-a{attempt}"


def secret_name(job: str) -> str:
    return f"{job}-heartbeat"


def pod_address(job: str, namespace: str, pod_index: int) -> str:
    """The stable DNS name of a pod: ``<job>-<i>.<job>.<ns>.svc``."""
    return f"{hostname(job, pod_index)}.{service_name(job)}.{namespace}.svc"


def check_names(job: str, nodes: int, *, lighthouse: bool = False) -> list[str]:
    """Problems with a job name as the stem of pod hostnames (DNS labels of <= 63 chars);
    ``lighthouse``: the job also runs ``<job>-lighthouse`` (faultTolerance ReplicaGroups)."""
    longest = len(hostname(job, max(nodes - 1, 0)))
    if lighthouse:
        longest = max(longest, len(lighthouse_name(job)))
    longest_pod = len(pod_name(job, 9999, max(nodes - 1, 0)))
    problems = []
    if longest > 63:
        problems.append(f"metadata.name: {job!r} is too long: pod hostnames <name>-<index> must fit 63 characters; use a name of at most {63 - (longest - len(job))} characters")
    if longest_pod > 253:
        problems.append("metadata.name: too long for pod names")
    return problems


def owner_reference(job: Mapping[str, Any]) -> dict[str, Any]:
    meta = job.get("metadata") or {}
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": meta.get("name"),
        "uid": meta.get("uid"),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def is_owned_by(obj: Mapping[str, Any], uid: str | None) -> bool:
    """Whether ``obj`` belongs to the job of ``uid``: its controller reference names that uid
    (an object without owner references, or a job without a uid, is not told apart). A pod of
    a deleted job of the same name, not yet garbage-collected, is not the new job's."""
    refs = [r for r in (obj.get("metadata") or {}).get("ownerReferences") or () if r.get("controller")]
    if not refs or not uid:
        return True
    return any(r.get("uid") == uid for r in refs)


def job_labels(job: str) -> dict[str, str]:
    return {JOB_LABEL: job, MANAGED_BY_LABEL: MANAGED_BY}


def _meta(name: str, namespace: str, labels: Mapping[str, str], owner: Mapping[str, Any]) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": dict(labels), "ownerReferences": [dict(owner)]}


# objects --------------------------------------------------------------------------------------


def rendezvous_port(job: str, namespace: str, attempt: int, group: int = 0) -> int:
    """The rendezvous (TCPStore) port of one attempt: deterministic, so a re-run of a handler
    builds the same pods, and different per job and attempt, so gangs that share a host's port
    space (the local cluster, hostNetwork pods) or a lingering process of the previous attempt
    never collide on it. ``group``: a replica group's own world (faultTolerance ReplicaGroups)
    gets the next port, so groups sharing a host never collide either."""
    digest = zlib.crc32(f"{namespace}/{job}/{attempt}".encode())
    return RENDEZVOUS_PORT_BASE + (digest + group) % RENDEZVOUS_PORT_SPAN


def lighthouse_name(job: str) -> str:
    """The Lighthouse pod's name and hostname (``<job>-lighthouse``, beside ``<job>-<i>``)."""
    return f"{job}-lighthouse"


def lighthouse_port(job: str, namespace: str) -> int:
    """The Lighthouse's port: one per job (it outlives attempts), drawn from the rendezvous
    range like :func:`rendezvous_port` so jobs sharing a host's port space do not collide."""
    digest = zlib.crc32(f"{namespace}/{job}/lighthouse".encode())
    return RENDEZVOUS_PORT_BASE + digest % RENDEZVOUS_PORT_SPAN


def lighthouse_address(job: str, namespace: str) -> str:
    """``TORCHFT_LIGHTHOUSE`` of every replica group: the Lighthouse pod's stable DNS name under
    the job's headless Service."""
    return f"http://{lighthouse_name(job)}.{service_name(job)}.{namespace}.svc:{lighthouse_port(job, namespace)}"


def replica_group_of(spec: TrainingJobSpec, pod_index: int) -> int:
    """The replica group of a pod (0 when the job is one world)."""
    return MeshShape(spec.nodes, spec.procs_per_node, replicas=spec.replica_groups).group_of_pod(pod_index)


def group_checkpoint_dir(tier: str, groups: int, group: int) -> str:
    """Where a pod's checkpoint tier lives: the tier's mount, or with replica groups a folder
    per group under it. Each group is its own world whose ranks are numbered from 0, so the
    groups' files would collide on a shared tier (and on a node's tiers shared by two groups'
    pods); the job-wide cleanup removes the group folders with the rest."""
    base = CHECKPOINT_MOUNTS[tier]
    return f"{base}/group-{group}" if groups > 1 else base


def group_rank_table_file(group: int) -> str:
    """The ConfigMap key (and file under CONFIG_DIR) of one replica group's rank table."""
    return f"ranktable-group-{group}.json"


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


# GPUs by Dynamic Resource Allocation (spec.gpuClaim) ------------------------------------------

RESOURCE_API_VERSION = "resource.k8s.io/v1"
#: NVIDIA's DRA driver: the ComputeDomain CRD, and the DeviceClass of its IMEX channels.
COMPUTE_DOMAIN_API_VERSION = "resource.nvidia.com/v1beta1"
COMPUTE_DOMAIN_PLURAL = "computedomains"
RESOURCE_CLAIM_TEMPLATE_PLURAL = "resourceclaimtemplates"
#: The pod's claim names (``spec.resourceClaims[].name``, ``resources.claims[].name``).
GPU_CLAIM = "gpus"
CHANNEL_CLAIM = "channel"


def _gpu_request(spec: TrainingJobSpec) -> dict[str, Any]:
    claim = spec.gpu_claim
    device_class = claim.device_class_name if claim is not None else ""
    return {"name": GPU_CLAIM, "exactly": {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": spec.claimed_gpus}}


def gpu_claim_template_name(spec: TrainingJobSpec, job: str) -> str:
    """``<job>-gpus-<hash of the request>``: a template's spec cannot change, so a spec edit of the
    count or the class (taking effect at the next restart) makes a new one, which the new pods
    name; the old one goes with the job."""
    digest = zlib.crc32(json.dumps(_gpu_request(spec), sort_keys=True).encode())
    return f"{job}-gpus-{digest:08x}"


def compute_domain_name(spec: TrainingJobSpec, job: str) -> str:
    """``<job>-nvlink-<nodes>``: one ComputeDomain per gang size (``numNodes``), for the same
    reason as :func:`gpu_claim_template_name`."""
    return f"{job}-nvlink-{spec.nodes}"


def channel_claim_template_name(spec: TrainingJobSpec, job: str) -> str:
    """The ResourceClaimTemplate NVIDIA's driver creates for the ComputeDomain's IMEX channel
    (the name is ours: ``spec.channel.resourceClaimTemplate.name``)."""
    return f"{compute_domain_name(spec, job)}-channel"


def pod_resource_claims(spec: TrainingJobSpec, job: str) -> list[dict[str, str]]:
    """``spec.resourceClaims`` of a gang pod or placeholder: one claim per pod from the job's GPU
    template and, with a ComputeDomain, from its channel template; empty without gpuClaim."""
    claim = spec.gpu_claim
    if claim is None or spec.claimed_gpus == 0:
        return []
    out = [{"name": GPU_CLAIM, "resourceClaimTemplateName": gpu_claim_template_name(spec, job)}]
    if claim.compute_domain:
        out.append({"name": CHANNEL_CLAIM, "resourceClaimTemplateName": channel_claim_template_name(spec, job)})
    return out


def build_gpu_claim_template(spec: TrainingJobSpec, *, job: str, namespace: str, owner: Mapping[str, Any]) -> dict[str, Any] | None:
    """The job's ResourceClaimTemplate: ``spec.gpus`` devices of ``gpuClaim.deviceClassName``
    per pod (allocationMode ExactCount); None without gpuClaim. Owned by the job."""
    claim = spec.gpu_claim
    if claim is None or spec.claimed_gpus == 0:
        return None
    return {
        "apiVersion": RESOURCE_API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": _meta(gpu_claim_template_name(spec, job), namespace, job_labels(job), owner),
        "spec": {"metadata": {"labels": job_labels(job)}, "spec": {"devices": {"requests": [_gpu_request(spec)]}}},
    }


def build_compute_domain(spec: TrainingJobSpec, *, job: str, namespace: str, owner: Mapping[str, Any]) -> dict[str, Any] | None:
    """The job's ComputeDomain (``gpuClaim.computeDomain``): one IMEX domain over the gang's
    ``spec.nodes`` nodes, whose channel template the pods claim from; None otherwise. Owned by
    the job, so it goes with it."""
    claim = spec.gpu_claim
    if claim is None or not claim.compute_domain or spec.claimed_gpus == 0:
        return None
    return {
        "apiVersion": COMPUTE_DOMAIN_API_VERSION,
        "kind": "ComputeDomain",
        "metadata": _meta(compute_domain_name(spec, job), namespace, job_labels(job), owner),
        "spec": {"numNodes": spec.nodes, "channel": {"resourceClaimTemplate": {"name": channel_claim_template_name(spec, job)}}},
    }


def build_dra_objects(spec: TrainingJobSpec, *, job: str, namespace: str, owner: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The per-job DRA objects, in creation order (before any pod): the GPU claim template, then
    the ComputeDomain; empty without gpuClaim."""
    built = (
        build_gpu_claim_template(spec, job=job, namespace=namespace, owner=owner),
        build_compute_domain(spec, job=job, namespace=namespace, owner=owner),
    )
    return [o for o in built if o is not None]


def _with_claims(spec: TrainingJobSpec, job: str, pod_spec: dict[str, Any], meta: dict[str, Any]) -> None:
    """Give a pod (gang member or placeholder) its DRA claims and the annotation placement
    counts them by."""
    claims = pod_resource_claims(spec, job)
    if claims:
        pod_spec["resourceClaims"] = claims
        meta["annotations"][CLAIMED_GPUS_ANNOTATION] = str(spec.claimed_gpus)


def build_service(job: str, namespace: str, owner: Mapping[str, Any]) -> dict[str, Any]:
    """Headless, publishing not-ready addresses: rendezvous must resolve before pods are Ready."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(service_name(job), namespace, job_labels(job), owner),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {JOB_LABEL: job},
            # Headless: DNS only, no proxying, so the per-attempt rendezvous port needs no entry.
            "ports": [{"name": "rendezvous", "port": RENDEZVOUS_PORT_BASE, "protocol": "TCP"}],
        },
    }


def build_secret(job: str, namespace: str, owner: Mapping[str, Any], token: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": _meta(secret_name(job), namespace, job_labels(job), owner),
        "data": {TOKEN_KEY: base64.b64encode(token.encode()).decode()},
    }


def build_trainer_config(
    spec: TrainingJobSpec,
    *,
    job: str,
    namespace: str,
    attempt: int,
    restore: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``config.json`` as the trainer reads it (railyard_trainer.config)."""
    return {
        "job": job,
        "namespace": namespace,
        "attempt": attempt,
        "trainer": to_wire(spec.trainer),
        # with the data degree resolved
        "parallelism": {**to_wire(spec.parallelism, keep_none=True), "data": spec.data_parallel or None},
        "checkpoint": to_wire(spec.checkpoint),
        "health": to_wire(spec.health),
        "faultTolerance": to_wire(spec.fault_tolerance),
        "restore": None if restore is None else dict(restore),
        "restartWaitSeconds": restart_wait_seconds(spec.restart_policy.in_place_timeout_seconds),
    }


def build_configmap(
    job: str,
    namespace: str,
    owner: Mapping[str, Any],
    *,
    attempt: int,
    rank_table: RankTable,
    config: Mapping[str, Any],
    replica_groups: int = 1,
) -> dict[str, Any]:
    """The attempt's config and rank table. With ``replica_groups`` > 1 (faultTolerance
    ReplicaGroups) also one rank table per group (:func:`group_rank_table_file`), each its own
    world with its own rendezvous: what that group's pods read. The job's table stays (the
    operator's view of every rank)."""
    labels = {**job_labels(job), ATTEMPT_LABEL: str(attempt)}
    data = {
        RANK_TABLE_FILE: rank_table.to_json(),
        CONFIG_FILE: json.dumps(config, sort_keys=True, separators=(",", ":")),
    }
    if replica_groups > 1:
        for g in range(replica_groups):
            port = rendezvous_port(job, namespace, attempt, g)
            data[group_rank_table_file(g)] = build_replica_group_table(rank_table, group=g, replicas=replica_groups, master_port=port).to_json()
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(configmap_name(job, attempt), namespace, labels, owner),
        "data": data,
    }


def with_addresses(table: RankTable, namespace: str) -> RankTable:
    """The rank table with each pod's stable DNS name and the rendezvous address filled in."""
    pods = tuple(
        PodEntry(p.pod_index, p.node, pod_address(table.job, namespace, p.pod_index), p.replica_peer)
        for p in table.pods
    )
    return RankTable(
        job=table.job, attempt=table.attempt, pp=table.pp, dp=table.dp, tp=table.tp,
        procs_per_node=table.procs_per_node, pods=pods, ranks=table.ranks,
        master_addr=pod_address(table.job, namespace, 0), master_port=rendezvous_port(table.job, namespace, table.attempt),
    )


def _security(spec: TrainingJobSpec) -> tuple[dict[str, Any], dict[str, Any]]:
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


def _checkpoint_dirs_init(spec: TrainingJobSpec, volumes: Sequence[Mapping[str, Any]], mounts: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
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
    return {"name": "ckpt-memory", "hostPath": {"path": f"{mem.host_path.rstrip('/')}/{per_job}", "type": "DirectoryOrCreate"}}


def _volumes(spec: TrainingJobSpec, job: str, namespace: str, attempt: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
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
        volumes.append({"name": "ckpt-local", "hostPath": {"path": f"{ck.local.host_path.rstrip('/')}/{per_job}", "type": "DirectoryOrCreate"}})
        mounts.append({"name": "ckpt-local", "mountPath": CHECKPOINT_MOUNTS["local"]})
    if ck.shared.claim_name:
        volumes.append({"name": "ckpt-shared", "persistentVolumeClaim": {"claimName": ck.shared.claim_name}})
        mounts.append({"name": "ckpt-shared", "mountPath": CHECKPOINT_MOUNTS["shared"]})
    elif ck.shared.enabled:
        volumes.append({"name": "ckpt-shared", "hostPath": {"path": f"{ck.shared.host_path.rstrip('/')}/{per_job}", "type": "DirectoryOrCreate"}})
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
    pod_sc, container_sc = _security(spec)
    volumes, mounts = _volumes(spec, job, namespace, attempt)
    resources = container_resources(spec)
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": list(spec.command) if spec.command else list(DEFAULT_COMMAND),
        "env": build_pod_env(spec, job=job, namespace=namespace, attempt=attempt, pod_index=pod_index, heartbeat_url=heartbeat_url),
        "ports": [{"name": "rendezvous", "containerPort": rendezvous_port(job, namespace, attempt, replica_group_of(spec, pod_index)), "protocol": "TCP"}],
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
                    "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
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
    meta = _meta(pod_name(job, attempt, pod_index), namespace, labels, owner)
    meta["annotations"] = {**dict(annotations or {}), NODE_ANNOTATION: node}
    _with_claims(spec, job, pod_spec, meta)
    if spec.gang.queue_name:
        meta["labels"]["kueue.x-k8s.io/queue-name"] = spec.gang.queue_name
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
    """Merge patch lifting our gate (keeping foreign gates), or None when ours is not there."""
    gates = list((pod.get("spec") or {}).get("schedulingGates") or ())
    if not any(g.get("name") == GANG_GATE for g in gates):
        return None
    rest = [g for g in gates if g.get("name") != GANG_GATE]
    return {"spec": {"schedulingGates": rest or None}}


# the Lighthouse (faultTolerance ReplicaGroups) ------------------------------------------------

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
    of ten missed beats (:func:`~railyard.protocol.trainerconfig.lighthouse_heartbeat_timeout_ms`), reachable at :func:`lighthouse_address` (hostname and
    subdomain under the job's headless Service, which selects the job label). Not gated and not
    pinned: it needs no GPU, only to run while the groups train; ``restartPolicy: Always``
    restarts a crashed Lighthouse in place, and the operator recreates a lost one
    (handlers/lighthouse.py). Owned by the job, so it goes with it."""
    pod_sc, container_sc = _security(spec)
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
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod_spec["tolerations"] = [t.model_dump(by_alias=True, exclude_none=True) for t in spec.tolerations]
    if spec.gang.priority_class_name:
        pod_spec["priorityClassName"] = spec.gang.priority_class_name
    meta = _meta(lighthouse_name(job), namespace, {**job_labels(job), LIGHTHOUSE_LABEL: "true"}, owner)
    if annotations:
        meta["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec}


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
        "metadata": _meta(network_policy_name(job), namespace, job_labels(job), owner),
        "spec": {
            "podSelector": {"matchLabels": {JOB_LABEL: job}},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": {JOB_LABEL: job}}}]}],
        },
    }


def is_lighthouse_pod(pod: Mapping[str, Any]) -> bool:
    return (((pod.get("metadata") or {}).get("labels") or {}).get(LIGHTHOUSE_LABEL)) == "true"


# hot spares ------------------------------------------------------------------------------------

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
        "securityContext": {"runAsNonRoot": True, "runAsUser": SPARE_UID, "runAsGroup": SPARE_UID, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{
            "name": "placeholder",
            "image": spec.image,
            "imagePullPolicy": spec.image_pull_policy,
            "command": list(SPARE_COMMAND),
            "resources": resources,
            "securityContext": {"allowPrivilegeEscalation": False, "privileged": False, "capabilities": {"drop": ["ALL"]}},
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
    meta = _meta(spare_pod_name(job, node), namespace, {**job_labels(job), SPARE_LABEL: "true"}, owner)
    meta["annotations"] = {**dict(annotations or {}), NODE_ANNOTATION: node}
    _with_claims(spec, job, pod_spec, meta)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec}


def is_spare_pod(pod: Mapping[str, Any]) -> bool:
    return (((pod.get("metadata") or {}).get("labels") or {}).get(SPARE_LABEL)) == "true"


# checkpoint cleanup ---------------------------------------------------------------------------

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
    pod_sc, container_sc = _security(spec)
    volumes, mounts = _volumes(spec, job, namespace, 0)
    volumes = [v for v in volumes if v["name"] != "railyard-config"]
    mounts = [m for m in mounts if m["name"] != "railyard-config"]
    if not shared:
        volumes = [v for v in volumes if v["name"] != "ckpt-shared"]
        mounts = [m for m in mounts if m["name"] != "ckpt-shared"]
    env = [var.entry(CHECKPOINT_MOUNTS[tier] if shared or tier != "shared" else "") for tier, var in podenv.CHECKPOINT_DIRS.items()]
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
