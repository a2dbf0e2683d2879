"""The names, labels, annotations, ports and paths every object of a gang is found by.

Each is a function of the job (and the attempt, pod index or replica group), so a repeated
reconcile finds the objects it made, and the trainer, the operator and ``railyard plan`` agree on
them. Ports are drawn per job and attempt from a range that no other program of the node uses.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any

from railyard import GROUP
from railyard.api.trainingjob import API_VERSION, KIND, TrainingJobSpec
from railyard.protocol.mesh import MeshShape

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
CHECKPOINT_MOUNTS = {
    "memory": "/railyard/checkpoints/memory",
    "local": "/railyard/checkpoints/local",
    "shared": "/railyard/checkpoints/shared",
}


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
        problems.append(
            f"metadata.name: {job!r} is too long: pod hostnames <name>-<index> must fit 63 characters; "
            f"use a name of at most {63 - (longest - len(job))} characters"
        )
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


def object_meta(name: str, namespace: str, labels: Mapping[str, str], owner: Mapping[str, Any]) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": dict(labels), "ownerReferences": [dict(owner)]}


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
