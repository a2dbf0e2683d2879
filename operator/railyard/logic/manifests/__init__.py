"""Pure builders of the objects a gang is made of: Service, ConfigMap, Secret, Pods, and with
spec.gpuClaim the DRA ResourceClaimTemplate and ComputeDomain; the Lighthouse, the hot spares'
placeholders and the checkpoint cleanup pods.

Everything here is a function of the TrainingJob, the attempt and the rank table, so a repeated
reconcile builds byte-identical objects with identical names and "create" is idempotent
(an AlreadyExists answer means the work was done). One module per seam:

- :mod:`.names`: labels, annotations, object names, ports, paths and owner references;
- :mod:`.dra`: the DRA claim template and ComputeDomain (``spec.gpuClaim``);
- :mod:`.config`: the Service, the heartbeat Secret and the attempt's ConfigMap;
- :mod:`.pod`: a gang member (the pod contract of docs/trainer.md, NCCL defaults, volumes);
- :mod:`.lighthouse`: faultTolerance ReplicaGroups' Lighthouse pod and NetworkPolicy;
- :mod:`.spares`: hot spares' placeholder pods;
- :mod:`.disruption`: the gang's PodDisruptionBudget (training pods only);
- :mod:`.cleanup`: the checkpoint cleanup pods.

Every name is importable from this package, as it was from the one module it was split from.
"""

from __future__ import annotations

from railyard.api.trainingjob import (
    TRAINER_UID,
)
from railyard.logic.manifests.cleanup import (
    CLEANUP_COMMAND,
    CLEANUP_FINALIZER,
    CLEANUP_LABEL,
    build_cleanup_pod,
    cleanup_pod_name,
)
from railyard.logic.manifests.config import (
    build_configmap,
    build_secret,
    build_service,
    build_trainer_config,
    with_addresses,
)
from railyard.logic.manifests.disruption import (
    PDB_API_VERSION,
    build_disruption_budget,
    disruption_budget_differs,
    disruption_budget_name,
)
from railyard.logic.manifests.dra import (
    CHANNEL_CLAIM,
    COMPUTE_DOMAIN_API_VERSION,
    COMPUTE_DOMAIN_PLURAL,
    GPU_CLAIM,
    RESOURCE_API_VERSION,
    RESOURCE_CLAIM_TEMPLATE_PLURAL,
    build_compute_domain,
    build_dra_objects,
    build_gpu_claim_template,
    channel_claim_template_name,
    compute_domain_name,
    gpu_claim_template_name,
    pod_resource_claims,
)
from railyard.logic.manifests.lighthouse import (
    LIGHTHOUSE_COMMAND,
    LIGHTHOUSE_LABEL,
    build_lighthouse_pod,
    build_network_policy,
    is_lighthouse_pod,
    network_policy_name,
)
from railyard.logic.manifests.names import (
    ATTEMPT_LABEL,
    CHECKPOINT_MOUNTS,
    CONFIG_DIR,
    CONFIG_FILE,
    GANG_GATE,
    JOB_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    NODE_ANNOTATION,
    POD_INDEX_LABEL,
    RANK_TABLE_FILE,
    RENDEZVOUS_PORT_BASE,
    RENDEZVOUS_PORT_SPAN,
    TOKEN_KEY,
    check_names,
    configmap_name,
    group_checkpoint_dir,
    group_rank_table_file,
    hostname,
    is_owned_by,
    job_labels,
    lighthouse_address,
    lighthouse_name,
    lighthouse_port,
    owner_reference,
    pod_address,
    pod_name,
    rendezvous_port,
    replica_group_of,
    secret_name,
    service_name,
)
from railyard.logic.manifests.pod import (
    CONTAINER_NAME,
    DEFAULT_COMMAND,
    NCCL_DEFAULTS,
    build_gang_pods,
    build_gate_removal,
    build_pod,
    build_pod_env,
    container_resources,
    control_url_for,
)
from railyard.logic.manifests.spares import (
    SPARE_COMMAND,
    SPARE_LABEL,
    SPARE_UID,
    build_spare_pod,
    is_spare_pod,
    spare_pod_name,
)

__all__ = [
    "ATTEMPT_LABEL",
    "CHANNEL_CLAIM",
    "CHECKPOINT_MOUNTS",
    "CLEANUP_COMMAND",
    "CLEANUP_FINALIZER",
    "CLEANUP_LABEL",
    "COMPUTE_DOMAIN_API_VERSION",
    "COMPUTE_DOMAIN_PLURAL",
    "CONFIG_DIR",
    "CONFIG_FILE",
    "CONTAINER_NAME",
    "DEFAULT_COMMAND",
    "GANG_GATE",
    "GPU_CLAIM",
    "JOB_LABEL",
    "LIGHTHOUSE_COMMAND",
    "LIGHTHOUSE_LABEL",
    "MANAGED_BY",
    "MANAGED_BY_LABEL",
    "NCCL_DEFAULTS",
    "NODE_ANNOTATION",
    "PDB_API_VERSION",
    "POD_INDEX_LABEL",
    "RANK_TABLE_FILE",
    "RENDEZVOUS_PORT_BASE",
    "RENDEZVOUS_PORT_SPAN",
    "RESOURCE_API_VERSION",
    "RESOURCE_CLAIM_TEMPLATE_PLURAL",
    "SPARE_COMMAND",
    "SPARE_LABEL",
    "SPARE_UID",
    "TOKEN_KEY",
    "TRAINER_UID",
    "build_cleanup_pod",
    "build_compute_domain",
    "build_configmap",
    "build_disruption_budget",
    "build_dra_objects",
    "build_gang_pods",
    "build_gate_removal",
    "build_gpu_claim_template",
    "build_lighthouse_pod",
    "build_network_policy",
    "build_pod",
    "build_pod_env",
    "build_secret",
    "build_service",
    "build_spare_pod",
    "build_trainer_config",
    "channel_claim_template_name",
    "check_names",
    "cleanup_pod_name",
    "compute_domain_name",
    "configmap_name",
    "container_resources",
    "control_url_for",
    "disruption_budget_differs",
    "disruption_budget_name",
    "gpu_claim_template_name",
    "group_checkpoint_dir",
    "group_rank_table_file",
    "hostname",
    "is_lighthouse_pod",
    "is_owned_by",
    "is_spare_pod",
    "job_labels",
    "lighthouse_address",
    "lighthouse_name",
    "lighthouse_port",
    "network_policy_name",
    "owner_reference",
    "pod_address",
    "pod_name",
    "pod_resource_claims",
    "rendezvous_port",
    "replica_group_of",
    "secret_name",
    "service_name",
    "spare_pod_name",
    "with_addresses",
]
