"""The TrainingJob API (group ``railyard.dev``, version ``v1alpha1``).

These pydantic models, with the trainer's settings they hold (the sections of the trainer
contract, declared once in ``railyard.protocol.trainerconfig``), are the single source of truth:
the CRD in ``crds/`` is generated from them (``railyard crd``), the operator reads objects
through them, and ``railyard validate`` checks manifests offline with them. Cross-field rules are written once, as CEL,
in
:data:`SPEC_RULES`; the models evaluate the same rules in Python so the API server's verdict and
``railyard validate`` agree.
"""

from __future__ import annotations

import inspect
from dataclasses import field, fields, is_dataclass
from typing import Annotated, Any, Literal, TypeVar, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, model_validator

from railyard import GROUP, VERSION
from railyard.api import corev1
from railyard.api.base import ApiModel, field_rule
from railyard.api.base import DnsSubdomain as DnsSubdomain
from railyard.api.base import EnvVarName as EnvVarName
from railyard.api.base import EnvVarNameOfMap as EnvVarNameOfMap
from railyard.api.base import LabelKey as LabelKey
from railyard.api.base import LabelKeyOfMap as LabelKeyOfMap
from railyard.api.base import LabelValue as LabelValue
from railyard.api.base import ResourceName as ResourceName
from railyard.api.base import ResourceQuantity as ResourceQuantity
from railyard.api.rules import COSCHEDULING_SCHEDULERS as COSCHEDULING_SCHEDULERS
from railyard.api.rules import GROUP_SCHEDULERS as GROUP_SCHEDULERS
from railyard.api.rules import SPEC_RULES as SPEC_RULES
from railyard.api.rules import VOLCANO_SCHEDULER as VOLCANO_SCHEDULER
from railyard.api.status import CheckpointFence as CheckpointFence
from railyard.api.status import CheckpointRef as CheckpointRef
from railyard.api.status import Condition as Condition
from railyard.api.status import LastFailure as LastFailure
from railyard.api.status import LastRestart as LastRestart
from railyard.api.status import PlacementStatus as PlacementStatus
from railyard.api.status import QuarantinedNode as QuarantinedNode
from railyard.api.status import Restarts as Restarts
from railyard.api.status import RestoreStatus as RestoreStatus
from railyard.api.status import StragglerStatus as StragglerStatus
from railyard.api.status import TrainingJobStatus as TrainingJobStatus
from railyard.protocol import trainerconfig as contract
from railyard.protocol.mesh import derive_data_parallel
from railyard.protocol.trainerconfig import Dataset as Dataset
from railyard.protocol.trainerconfig import FaultSpec as FaultSpec
from railyard.protocol.trainerconfig import Health as Health
from railyard.protocol.trainerconfig import LocalTier as LocalTier
from railyard.protocol.trainerconfig import Parallelism as Parallelism
from railyard.protocol.trainerconfig import SdcPolicy as SdcPolicy
from railyard.protocol.trainerconfig import StragglerPolicy as StragglerPolicy
from railyard.protocol.trainerconfig import section

T = TypeVar("T")

KIND = "TrainingJob"
PLURAL = "trainingjobs"
SINGULAR = "trainingjob"
SHORT_NAMES = ["tj"]
API_VERSION = f"{GROUP}/{VERSION}"


DEFAULT_IMAGE = "ghcr.io/railyard-dev/railyard-trainer:0.1.0"
#: The numeric user and group of the Railyard trainer image (trainer_image/Dockerfile ``ARG UID``),
#: under whatever registry name or tag it is pushed: the default of ``spec.securityContext``.
TRAINER_UID = 10001


# --------------------------------------------------------------------------- workload


class EnvVar(ApiModel):
    name: Annotated[EnvVarName, Field(description="Environment variable name (printable ASCII, no '=').")]
    value: Annotated[str, Field(default="", max_length=32768, description="Literal value.")] = ""


class ResourceRequirements(ApiModel):
    requests: Annotated[
        dict[ResourceName, ResourceQuantity],
        Field(
            max_length=32,
            description="Resource requests per pod, as Kubernetes quantities (e.g. cpu: '8', memory: 64Gi).",
        ),
    ] = {}
    limits: Annotated[
        dict[ResourceName, ResourceQuantity],
        Field(
            max_length=32,
            description="Resource limits per pod. nvidia.com/gpu defaults to gpusPerPod (without gpuClaim).",
        ),
    ] = {}

    @model_validator(mode="after")
    def _pods_api_rules(self) -> ResourceRequirements:
        problems = corev1.check_resource_requirements(self.requests, self.limits)
        if problems:
            raise ValueError("; ".join(f"resources.{field}: {message}" for field, message in problems))
        return self


class Toleration(ApiModel):
    key: Annotated[
        LabelKey | None,
        Field(
            max_length=316,
            description="Taint key the toleration applies to; empty matches all keys with operator Exists.",
        ),
    ] = None
    operator: Annotated[Literal["Exists", "Equal"], Field(description="Exists or Equal.")] = "Equal"
    value: Annotated[str | None, Field(description="Taint value to match with operator Equal.")] = None
    effect: Annotated[
        Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None,
        Field(description="Taint effect to match; empty matches all effects."),
    ] = None
    toleration_seconds: Annotated[
        int | None, Field(ge=0, description="For NoExecute: how long the pod stays bound after the taint appears.")
    ] = None

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "(has(self.key) && self.key != '') || self.operator == 'Exists'",
                    "message": "an empty key matches every taint only with operator Exists; set a key or use Exists",
                    "fieldPath": ".operator",
                    "reason": "FieldValueInvalid",
                },
                {
                    "rule": "self.operator != 'Exists' || !has(self.value) || self.value == ''",
                    "message": "value must be empty when operator is Exists",
                    "fieldPath": ".value",
                    "reason": "FieldValueInvalid",
                },
                {
                    "rule": "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
                    "message": "tolerationSeconds only applies to effect NoExecute",
                    "fieldPath": ".tolerationSeconds",
                    "reason": "FieldValueInvalid",
                },
            ]
        }
    )

    @model_validator(mode="after")
    def _pods_api_rules(self) -> Toleration:
        problems = corev1.check_toleration(
            self.key or "", self.operator, self.value or "", self.effect or "", self.toleration_seconds
        )
        if problems:
            raise ValueError("; ".join(f"{field}: {message}" for field, message in problems))
        return self


class GpuClaim(ApiModel):
    """GPUs by Dynamic Resource Allocation (``resource.k8s.io/v1``) instead of the extended
    resource ``nvidia.com/gpu``: the operator creates one ResourceClaimTemplate per job and every
    pod gets its own claim from it."""

    device_class_name: Annotated[
        DnsSubdomain,
        Field(
            description="DeviceClass of the GPUs (NVIDIA's DRA driver: gpu.nvidia.com). Each pod claims gpusPerPod "
                        "devices of it (allocationMode ExactCount) through a ResourceClaimTemplate the operator "
                        "creates with the gang, instead of nvidia.com/gpu limits."
        ),
    ] = "gpu.nvidia.com"
    compute_domain: Annotated[
        bool,
        Field(
            description="Also create a ComputeDomain (resource.nvidia.com/v1beta1, NVIDIA's DRA driver) with numNodes "
                        "= nodes, and give every pod its IMEX channel claim: for tensor- or expert-parallel traffic "
                        "over NVLink between the trays of one NVLink domain (GB200/GB300 NVL72). Deleted with the "
                        "job. The driver must be installed."
        ),
    ] = False


# --------------------------------------------------------------------------- the trainer's settings
# spec.trainer, spec.parallelism, spec.faultTolerance, spec.checkpoint and spec.health are the
# trainer contract's sections (railyard.protocol.trainerconfig), where each setting is declared
# once: its default, bounds and description. pydantic validates these stdlib dataclasses as they
# are (it reads the metadata of their fields, the config of the model that holds them: camelCase,
# unknown fields refused) and the CRD is generated from them. Checks that only the API makes
# narrow a field's type here.


def _narrowed(cls: type[T]) -> type[T]:
    """``cls``, a subclass of a contract section that only annotates some of its fields, as a
    section whose annotated fields take the narrower types (checks the trainer does not make:
    Kubernetes names and quantities, the length of each item); every field keeps the contract's
    default, bounds and description. A default that is a section becomes the narrowed section it
    is annotated with."""
    (base,) = cls.__bases__
    annotated = inspect.get_annotations(cls)
    if unknown := set(annotated) - {f.name for f in fields(base)}:
        raise TypeError(f"{cls.__name__}: {', '.join(sorted(unknown))} not in the contract's {base.__name__}")
    narrower = get_type_hints(cls)
    for f in fields(base):
        if f.name not in annotated:
            continue
        default = f.default
        target = narrower[f.name]
        if (
            is_dataclass(default)
            and not isinstance(default, type)
            and isinstance(target, type)
            and issubclass(target, type(default))
        ):
            default = target(**{x.name: getattr(default, x.name) for x in fields(default)})
        setattr(cls, f.name, field(default=default, default_factory=f.default_factory, metadata=f.metadata))
    return section(cls)


@_narrowed
class Program(contract.Program):
    command: tuple[Annotated[str, Field(min_length=1, max_length=4096)], ...] | None
    args: tuple[Annotated[str, Field(max_length=32768)], ...]


@_narrowed
class TrainerSettings(contract.TrainerSettings):
    program: Program | None


@_narrowed
class MemoryTier(contract.MemoryTier):
    size_limit: ResourceQuantity | None


@_narrowed
class SharedTier(contract.SharedTier):
    claim_name: DnsSubdomain | None


@_narrowed
class Checkpoint(contract.Checkpoint):
    memory: MemoryTier
    shared: SharedTier


@_narrowed
class LighthousePlacement(contract.LighthousePlacement):
    node_selector: dict[LabelKeyOfMap, LabelValue] | None
    tolerations: tuple[Toleration, ...] | None  # type: ignore[assignment]


def _check_network_attachment(value: str) -> str | None:
    """None when ``value`` names a NetworkAttachmentDefinition as Multus takes it
    (``[namespace/]name``), else the problem."""
    namespace, slash, name = value.rpartition("/")
    if slash and (len(namespace) > 63 or corev1.check_dns_subdomain(namespace) is not None or "." in namespace):
        return (f"{value!r}: the namespace before '/' must be a namespace name (lowercase alphanumerics and '-', e.g. "
                "'networks'); or leave it out for the job's namespace")
    if (problem := corev1.check_dns_subdomain(name)) is not None:
        return f"{value!r}: the NetworkAttachmentDefinition's name {problem.partition(': ')[2]}"
    return None


_NAMESPACE_PATTERN = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"


@_narrowed
class HealNetwork(contract.HealNetwork):
    interface: Annotated[
        str,
        field_rule(contract.interface_name_problem),
        Field(json_schema_extra={"pattern": contract.INTERFACE_NAME_PATTERN}),
    ] | None
    attachment: Annotated[
        str,
        field_rule(_check_network_attachment),
        Field(json_schema_extra={"pattern": rf"^({_NAMESPACE_PATTERN}/)?{corev1.DNS_SUBDOMAIN_PATTERN[1:]}"}),
    ] | None


@_narrowed
class FaultTolerance(contract.FaultTolerance):
    lighthouse: LighthousePlacement
    heal_network: HealNetwork


# --------------------------------------------------------------------------- topology and gang


class Topology(ApiModel):
    preset: Annotated[
        Literal["railyard", "topograph", "gke", "eks"],
        Field(
            description="Label convention naming the network levels, used when levels is empty: railyard "
                        "(railyard.dev/spine, railyard.dev/leaf), topograph (fabric.topograph.run/tier-N, or the "
                        "older network.topology.nvidia.com/*), gke (cloud.google.com/gce-topology-*), eks "
                        "(topology.k8s.aws/network-node-layer-*)."
        ),
    ] = "railyard"
    levels: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=316)]] | None,
        Field(
            max_length=8,
            description="Node label keys naming the levels, broadest first, ending with the host level "
                        "(kubernetes.io/hostname). Overrides preset.",
        ),
    ] = None
    mode: Annotated[
        Literal["Required", "Preferred"],
        Field(
            description="Required: the gang must fit inside one domain of requiredLevel, else it waits. Preferred: "
                        "pack as tightly as possible, never wait for topology."
        ),
    ] = "Preferred"
    required_level: Annotated[
        str | None,
        Field(
            max_length=316,
            description="With mode Required: the label key of the level one domain of which must hold the whole gang "
                        "(e.g. railyard.dev/spine).",
        ),
    ] = None
    nvlink_level: Annotated[
        str | None,
        Field(
            min_length=1,
            max_length=316,
            description="Node label key naming the NVLink domain (a rack-scale NVLink fabric: nodes with the same "
                        "value reach each other over NVLink, e.g. the 18 trays of a GB200 NVL72 rack). Used as a "
                        "level below the leaf when parallelism.tensor exceeds procsPerNode: every tensor-parallel "
                        "group is placed inside one domain. Empty: nvidia.com/gpu.clique (NVIDIA GPU feature "
                        "discovery); with preset topograph, Topograph's accelerator label "
                        "(accelerator.topograph.run/domain, or network.topology.nvidia.com/accelerator) when nodes "
                        "carry it.",
        ),
    ] = None


class Gang(ApiModel):
    schedule_timeout_seconds: Annotated[
        int,
        Field(
            ge=10,
            le=86400,
            description="If the whole gang is not Running within this time, tear it down and re-place it.",
        ),
    ] = 300
    scheduler_name: Annotated[
        DnsSubdomain | None,
        Field(description="Scheduler to bind the pods (e.g. volcano, scheduler-plugins). Empty: the cluster default."),
    ] = None
    queue_name: Annotated[
        LabelValue | None,
        Field(
            description="Kueue LocalQueue (kueue.x-k8s.io/queue-name) or Volcano queue for admission; a label value "
                        "(<= 63 characters)."
        ),
    ] = None
    hot_spares: Annotated[
        int,
        Field(
            ge=0,
            le=1024,
            description="Spare nodes reserved next to the gang (same domains) to replace a failed node without "
                        "re-placing the rest.",
        ),
    ] = 0
    priority_class_name: Annotated[DnsSubdomain | None, Field(description="PriorityClass for the gang's pods.")] = None
    scheduler: Annotated[
        Literal["auto", "kubernetes", "none"],
        Field(
            description="Gang scheduling by Kubernetes itself (scheduling.k8s.io/v1alpha2 Workload and PodGroup; "
                        "kube-apiserver and kube-scheduler v1.36 with the GenericWorkload and GangScheduling feature "
                        "gates): every attempt gets a Workload and a PodGroup whose gang minCount is the pod count, "
                        "with a topology constraint at the level the placement chose, and kube-scheduler binds all of "
                        "the gang or none (on the nodes the placement chose). kubernetes: always (the job waits, "
                        "reason PodGroupUnavailable, while the API server does not serve it); auto: when the API "
                        "server serves scheduling.k8s.io/v1alpha2 and neither queueName nor a Volcano or "
                        "scheduler-plugins schedulerName is set; none: never."
        ),
    ] = "auto"


# --------------------------------------------------------------------------- restarts


class RestartBudget(ApiModel):
    limit: Annotated[
        int, Field(ge=0, le=10000, description="Restarts allowed for this failure class before the job fails.")
    ]
    backoff_seconds: Annotated[
        float,
        Field(
            ge=0,
            le=86400,
            description="Delay before the first restart of this class; doubles each time up to maxBackoffSeconds.",
        ),
    ] = 0.0


class RestartPolicy(ApiModel):
    infrastructure: Annotated[
        RestartBudget, Field(description="Node lost or NotReady, eviction, preemption, collective timeouts.")
    ] = RestartBudget(limit=20, backoff_seconds=0.0)
    application: Annotated[
        RestartBudget, Field(description="The trainer crashed (non-zero exit not otherwise classified).")
    ] = RestartBudget(limit=3, backoff_seconds=10.0)
    sdc: Annotated[RestartBudget, Field(description="Silent data corruption confirmed.")] = RestartBudget(
        limit=5, backoff_seconds=0.0
    )
    straggler: Annotated[RestartBudget, Field(description="Hangs, and stragglers with action Restart.")] = (
        RestartBudget(limit=5, backoff_seconds=0.0)
    )
    max_backoff_seconds: Annotated[
        float, Field(ge=0, le=86400, description="Upper bound of the exponential backoff.")
    ] = 300.0
    reset_after_seconds: Annotated[
        float,
        Field(
            ge=0,
            le=30 * 86400,
            description="A gang that has run with every pod Running this long clears the restart streak: backoff "
                        "starts again from backoffSeconds and each class gets its whole limit again (status.restarts "
                        "keeps the totals). 0: never reset.",
        ),
    ] = 600.0
    in_place: Annotated[
        bool,
        Field(
            description="Restart in place: pods on healthy nodes stay (same pod, same node, memory tier intact) and "
                        "their launchers restart the workers for the new attempt; only pods that must move are "
                        "replaced. false: every restart deletes and recreates the whole gang."
        ),
    ] = True
    in_place_timeout_seconds: Annotated[
        float,
        Field(
            ge=1,
            le=3600,
            description="A kept pod's launcher that has not restarted its workers this long after being told turns "
                        "the restart into a full restart.",
        ),
    ] = 30.0


# --------------------------------------------------------------------------- who the trainer runs as


class SecurityContext(ApiModel):
    run_as_user: Annotated[
        int,
        Field(
            ge=0,
            le=2147483647,
            description="UID of the trainer's processes, which also owns the job's hostPath checkpoint folders (an "
                        "init container hands them to it: the kubelet creates them root-owned). Default 10001: the "
                        "user of the Railyard trainer image, whatever registry or tag it is pushed under, and of "
                        "images built FROM it. A custom image sets its own user's UID, or 0 for an image that must "
                        "run as root (then nothing is chowned and runAsNonRoot is not set).",
        ),
    ] = TRAINER_UID
    run_as_group: Annotated[
        int | None,
        Field(
            ge=0,
            le=2147483647,
            description="GID of the trainer's processes and of its checkpoint folders. Empty: runAsUser.",
        ),
    ] = None
    fs_group: Annotated[
        int | None,
        Field(
            ge=0,
            le=2147483647,
            description="The pod's fsGroup (group of the volumes that support it; hostPath does not). Empty: "
                        "runAsGroup.",
        ),
    ] = None

    @property
    def group(self) -> int:
        return self.run_as_user if self.run_as_group is None else self.run_as_group

    @property
    def volume_group(self) -> int:
        return self.group if self.fs_group is None else self.fs_group


# --------------------------------------------------------------------------- finished jobs


class Cleanup(ApiModel):
    pods: Annotated[
        Literal["Keep", "KeepFailed", "Delete"],
        Field(
            description="What happens to the pods when the job finishes (Succeeded or Failed). Pods still running are "
                        "always deleted, and so are held spares and pods of earlier attempts. Keep (Kubeflow's "
                        "cleanPodPolicy Running): the finished pods of the last attempt stay, so kubectl logs and "
                        "their exit codes remain; their containers have exited, so they hold no GPUs and block no "
                        "placement. KeepFailed: keep them only when the job Failed. Delete (cleanPodPolicy All): "
                        "delete every pod at once."
        ),
    ] = "Keep"
    ttl_seconds_after_finished: Annotated[
        int,
        Field(
            ge=0,
            le=31_536_000,
            description="How long kept pods stay after the job finished (counted from status.completionTime), as "
                        "Job's ttlSecondsAfterFinished but for the pods only: the TrainingJob and its status stay. 0 "
                        "deletes them at once. Deleting the TrainingJob deletes them too.",
        ),
    ] = 86_400


# --------------------------------------------------------------------------- spec


class TrainingJobSpec(ApiModel):
    suspend: Annotated[
        bool, Field(description="true deletes the gang's pods and keeps checkpoints; false re-places it and resumes.")
    ] = False
    image: Annotated[str, Field(min_length=1, max_length=1024, description="Container image of the trainer.")] = (
        DEFAULT_IMAGE
    )
    image_pull_policy: Annotated[
        Literal["Always", "IfNotPresent", "Never"], Field(description="Image pull policy.")
    ] = "IfNotPresent"
    command: Annotated[
        list[str] | None,
        Field(
            max_length=64,
            description="Replace the container's entry point, railyard-train, and with it the launcher: no rank-table "
                        "layout, heartbeats, exit-code classes or checkpoint tiers unless your command provides them. "
                        "To run your own program under the launcher, use trainer.program instead.",
        ),
    ] = None
    args: Annotated[
        list[str] | None,
        Field(max_length=256, description="Arguments to the command (to railyard-train by default, e.g. --steps 20)."),
    ] = None
    security_context: Annotated[
        SecurityContext,
        Field(
            description="The user the trainer runs as and that owns its checkpoint folders (default: the trainer "
                        "image's user, 10001, for any image)."
        ),
    ] = SecurityContext()
    env: Annotated[list[EnvVar], Field(max_length=128, description="Extra environment variables for every pod.")] = []
    resources: Annotated[ResourceRequirements, Field(description="Compute resources per pod (one pod per node).")] = (
        ResourceRequirements()
    )
    nodes: Annotated[int, Field(ge=1, le=100_000, description="Number of nodes, one pod per node.")] = 1
    procs_per_node: Annotated[
        int, Field(ge=1, le=64, description="Training processes (ranks) per pod, usually one per GPU.")
    ] = 1
    gpus_per_pod: Annotated[
        int | None,
        Field(
            ge=0,
            le=64,
            description="GPUs each pod uses (nvidia.com/gpu, or the devices of gpuClaim); 0 for CPU-only nodes. "
                        "Empty: procsPerNode.",
        ),
    ] = None
    gpu_claim: Annotated[
        GpuClaim | None,
        Field(
            description="Ask for the gpusPerPod GPUs by Dynamic Resource Allocation (resource.k8s.io/v1 "
                        "ResourceClaims of a DeviceClass, optionally with a ComputeDomain) instead of the "
                        "nvidia.com/gpu extended resource. Empty: nvidia.com/gpu. Placement, quarantine and spares "
                        "count the GPUs the same way."
        ),
    ] = None
    node_selector: Annotated[
        dict[LabelKeyOfMap, LabelValue],
        Field(max_length=64, description="Only place on nodes with these labels (label keys and values)."),
    ] = {}
    tolerations: Annotated[
        list[Toleration],
        Field(max_length=32, description="Tolerations for the gang's pods (placement honours them too)."),
    ] = []
    service_account_name: Annotated[
        DnsSubdomain | None,
        Field(description="ServiceAccount of the pods (default: the namespace's default, with no token mounted)."),
    ] = None
    parallelism: Annotated[Parallelism, Field(description="How the world is split: pipeline x data x tensor.")] = (
        Parallelism()
    )
    fault_tolerance: Annotated[
        FaultTolerance,
        Field(
            description="Train through failures: with HSDP, a lost replica group stops only itself (mode "
                        "ReplicaGroups)."
        ),
    ] = FaultTolerance()
    trainer: Annotated[
        TrainerSettings,
        Field(description="Model and training settings of the bundled trainer, or your own program (trainer.program)."),
    ] = TrainerSettings()
    topology: Annotated[Topology, Field(description="Network topology used for rail-aware placement.")] = Topology()
    gang: Annotated[Gang, Field(description="Gang scheduling.")] = Gang()
    checkpoint: Annotated[Checkpoint, Field(description="Checkpoint tiers.")] = Checkpoint()
    health: Annotated[Health, Field(description="Heartbeats, hang, straggler and SDC detection.")] = Health()
    restart_policy: Annotated[RestartPolicy, Field(description="Restart budgets per failure class and backoff.")] = (
        RestartPolicy()
    )
    nccl: Annotated[
        dict[EnvVarNameOfMap, Annotated[str, Field(max_length=32768)]],
        Field(
            max_length=128,
            description="NCCL environment overrides (defaults keep each rank's inter-node traffic on its rail, e.g. "
                        "NCCL_CROSS_NIC=0).",
        ),
    ] = {}
    cleanup: Annotated[
        Cleanup,
        Field(
            description="What stays of a finished job's pods, and for how long (for debugging: kubectl logs, exit "
                        "codes, termination messages)."
        ),
    ] = Cleanup()

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": list[Any](SPEC_RULES)})

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    @property
    def data_parallel(self) -> int:
        """The data-parallel degree, given or derived (0 when the shape is inconsistent)."""
        if self.parallelism.data is not None:
            return self.parallelism.data
        return derive_data_parallel(self.world_size, self.parallelism.pipeline, self.parallelism.tensor)

    @property
    def replica_groups(self) -> int:
        """How many replica groups fail alone: ``parallelism.dataReplicas`` with
        ``faultTolerance.mode: ReplicaGroups``, else 1 (the whole gang is one world)."""
        return self.parallelism.data_replicas if self.fault_tolerance.mode == "ReplicaGroups" else 1

    @property
    def gpus(self) -> int:
        """GPUs per pod, given or derived (one per process)."""
        return self.procs_per_node if self.gpus_per_pod is None else self.gpus_per_pod

    @property
    def extended_gpus(self) -> int:
        """GPUs per pod asked as the extended resource ``nvidia.com/gpu``: :attr:`gpus`, or 0
        when ``gpuClaim`` asks for them by Dynamic Resource Allocation."""
        return self.gpus if self.gpu_claim is None else 0

    @property
    def claimed_gpus(self) -> int:
        """GPUs per pod asked by ``gpuClaim`` (0 without it): the other half of :attr:`gpus`."""
        return self.gpus - self.extended_gpus

    @property
    def microbatches(self) -> int:
        return self.parallelism.microbatches or max(self.parallelism.pipeline, 1)


class ObjectMeta(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str | None = None
    namespace: str | None = None


class TrainingJob(ApiModel):
    api_version: Annotated[Literal["railyard.dev/v1alpha1"], Field(description="railyard.dev/v1alpha1")] = (
        "railyard.dev/v1alpha1"
    )
    kind: Annotated[Literal["TrainingJob"], Field(description="TrainingJob")] = "TrainingJob"
    metadata: ObjectMeta = ObjectMeta()
    spec: TrainingJobSpec = TrainingJobSpec()
    status: TrainingJobStatus | None = None
