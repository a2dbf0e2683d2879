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

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from railyard import GROUP, VERSION
from railyard.api import corev1
from railyard.api.quantity import NON_NEGATIVE_QUANTITY_PATTERN, parse_quantity
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

#: ``spec.gang.schedulerName`` values of the gang schedulers that bring their own PodGroup
#: (Volcano, then the names scheduler-plugins installs under); railyard.logic.schedulers.
VOLCANO_SCHEDULER = "volcano"
COSCHEDULING_SCHEDULERS = ("scheduler-plugins-scheduler", "scheduler-plugins", "coscheduling")
GROUP_SCHEDULERS = (VOLCANO_SCHEDULER, *COSCHEDULING_SCHEDULERS)

DEFAULT_IMAGE = "ghcr.io/railyard-dev/railyard-trainer:0.1.0"
#: The numeric user and group of the Railyard trainer image (trainer_image/Dockerfile ``ARG UID``),
#: under whatever registry name or tag it is pushed: the default of ``spec.securityContext``.
TRAINER_UID = 10001


class _Model(BaseModel):
    """camelCase on the wire (Kubernetes convention), snake_case in Python; unknown fields are
    errors, as with ``kubectl apply --validate=strict``."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_default=True,
    )


def _desc(text: str) -> Any:
    return Field(description=text)


# --------------------------------------------------------------------------- Kubernetes field rules
# Fields passed through to the pods are checked as the pods' API checks them (railyard.api.corev1),
# and the CRD carries the same rule as a schema pattern, so the API server refuses at apply time
# what a pod create would refuse later.


def _rule(check: Any) -> Any:
    def run(value: str) -> str:
        problem = check(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    return AfterValidator(run)


def _quantity(value: str) -> str:
    if parse_quantity(value) < 0:  # QuantityError is a ValueError naming the value and the fix
        raise ValueError(f"{value!r}: must be greater than or equal to 0")
    return value


ResourceQuantity = Annotated[
    str,
    AfterValidator(_quantity),
    Field(min_length=1, max_length=64, json_schema_extra={"pattern": NON_NEGATIVE_QUANTITY_PATTERN}),
]
DnsSubdomain = Annotated[
    str,
    _rule(corev1.check_dns_subdomain),
    Field(max_length=253, json_schema_extra={"pattern": corev1.DNS_SUBDOMAIN_PATTERN}),
]
LabelKey = Annotated[
    str, _rule(corev1.check_qualified_name), Field(json_schema_extra={"pattern": corev1.QUALIFIED_NAME_PATTERN})
]
# Map keys: the same rules without a schema pattern (pydantic would turn a keyed pattern into
# patternProperties, which a structural schema does not allow; the CRD cannot check map keys).
LabelKeyOfMap = Annotated[str, _rule(corev1.check_qualified_name)]
EnvVarNameOfMap = Annotated[str, _rule(corev1.check_env_var_name)]
ResourceName = Annotated[str, _rule(corev1.check_resource_name)]
LabelValue = Annotated[
    str,
    _rule(corev1.check_label_value),
    Field(max_length=63, json_schema_extra={"pattern": corev1.LABEL_VALUE_PATTERN}),
]
EnvVarName = Annotated[
    str,
    _rule(corev1.check_env_var_name),
    Field(min_length=1, max_length=256, json_schema_extra={"pattern": corev1.ENV_VAR_NAME_PATTERN}),
]


# --------------------------------------------------------------------------- workload


class EnvVar(_Model):
    name: Annotated[EnvVarName, Field(description="Environment variable name (printable ASCII, no '=').")]
    value: Annotated[str, Field(default="", max_length=32768, description="Literal value.")] = ""


class ResourceRequirements(_Model):
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


class Toleration(_Model):
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


class GpuClaim(_Model):
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


@_narrowed
class FaultTolerance(contract.FaultTolerance):
    lighthouse: LighthousePlacement


# --------------------------------------------------------------------------- topology and gang


class Topology(_Model):
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


class Gang(_Model):
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


class RestartBudget(_Model):
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


class RestartPolicy(_Model):
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


class SecurityContext(_Model):
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


class Cleanup(_Model):
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


#: Cross-field rules, written once as CEL (enforced by the API server through the CRD) and
#: mirrored in Python by :func:`railyard.api.validation.check_rules`. ``fieldPath`` is relative
#: to the spec.
SPEC_RULES: list[dict[str, str]] = [
    {
        "rule": "self.procsPerNode % self.parallelism.tensor == 0 || self.parallelism.tensor % self.procsPerNode == 0",
        "message": "parallelism.tensor must divide procsPerNode (a tensor-parallel group inside one node) or be a "
                   "multiple of it (a group spanning tensor / procsPerNode nodes of one NVLink domain, "
                   "topology.nvlinkLevel). Set tensor to a divisor or a multiple of procsPerNode.",
        "fieldPath": ".parallelism.tensor",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": "(self.procsPerNode % self.parallelism.tensor != 0 && self.parallelism.tensor % self.procsPerNode != "
                "0) || (self.nodes * self.procsPerNode) % (self.parallelism.tensor * self.parallelism.pipeline) == 0",
        "message": "parallelism.tensor x parallelism.pipeline must divide the world size (nodes x procsPerNode).",
        "fieldPath": ".parallelism.pipeline",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": "!has(self.parallelism.data) || (self.nodes * self.procsPerNode) % (self.parallelism.tensor * "
                "self.parallelism.pipeline) != 0 || self.parallelism.tensor * self.parallelism.pipeline * "
                "self.parallelism.data == self.nodes * self.procsPerNode",
        "message": "parallelism.tensor x pipeline x data must equal nodes x procsPerNode. Leave data empty to derive "
                   "it.",
        "fieldPath": ".parallelism.data",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": "has(self.trainer.program) || (self.nodes * self.procsPerNode) % (self.parallelism.tensor * "
                "self.parallelism.pipeline) != 0 || self.trainer.batchSize % ((self.nodes * self.procsPerNode) / "
                "(self.parallelism.tensor * self.parallelism.pipeline)) == 0",
        "message": "trainer.batchSize must be a multiple of the data-parallel degree (nodes x procsPerNode / (tensor "
                   "x pipeline)).",
        "fieldPath": ".trainer.batchSize",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": "self.parallelism.pipeline == 1 || !has(self.parallelism.microbatches) || "
                "self.parallelism.microbatches >= self.parallelism.pipeline",
        "message": "parallelism.microbatches must be at least parallelism.pipeline so every stage has work.",
        "fieldPath": ".parallelism.microbatches",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": "self.parallelism.pipelineSchedule != 'Interleaved1F1B' || self.parallelism.pipeline > 1",
        "message": "parallelism.pipelineSchedule Interleaved1F1B needs pipeline > 1.",
        "fieldPath": ".parallelism.pipelineSchedule",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": "double(self.trainer.watchdogSeconds) < double(self.trainer.collectiveTimeoutSeconds)",
        "message": "trainer.watchdogSeconds must be below trainer.collectiveTimeoutSeconds, so a hung rank reports "
                   "itself before its peers time out.",
        "fieldPath": ".trainer.watchdogSeconds",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": "!has(self.trainer.program) || (has(self.trainer.program.script) ? 1 : 0) + "
                "(has(self.trainer.program.module) ? 1 : 0) + (has(self.trainer.program.command) ? 1 : 0) == 1",
        "message": "trainer.program must name exactly one of script (a Python file), module (python -m) or command "
                   "(an executable).",
        "fieldPath": ".trainer.program",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": "self.topology.mode != 'Required' || has(self.topology.requiredLevel)",
        "message": "topology.requiredLevel must be set when topology.mode is Required (e.g. railyard.dev/spine).",
        "fieldPath": ".topology.requiredLevel",
        "reason": "FieldValueRequired",
    },
    {
        "rule": "!has(self.topology.levels) || !has(self.topology.requiredLevel) || self.topology.requiredLevel in "
                "self.topology.levels",
        "message": "topology.requiredLevel must be one of topology.levels.",
        "fieldPath": ".topology.requiredLevel",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": "self.parallelism.dataReplicas <= 1 || (self.nodes * self.procsPerNode) % (self.parallelism.tensor * "
                "self.parallelism.pipeline) != 0 || ((self.nodes * self.procsPerNode) / (self.parallelism.tensor * "
                "self.parallelism.pipeline)) % self.parallelism.dataReplicas == 0",
        "message": "parallelism.dataReplicas must divide the data-parallel degree (nodes x procsPerNode / (tensor x "
                   "pipeline)).",
        "fieldPath": ".parallelism.dataReplicas",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": "self.faultTolerance.mode == 'None' || self.parallelism.dataReplicas != 1",
        "message": "faultTolerance.mode ReplicaGroups needs parallelism.dataReplicas > 1: the replica groups are the "
                   "units that fail alone. Set dataReplicas (HSDP), 0 to let the operator choose, or use mode None.",
        "fieldPath": ".faultTolerance.mode",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": "self.faultTolerance.mode == 'None' || self.parallelism.dataReplicas == 0 || "
                "self.nodes % self.parallelism.dataReplicas == 0",
        "message": "faultTolerance.mode ReplicaGroups needs nodes to be a multiple of parallelism.dataReplicas: every "
                   "replica group is nodes / dataReplicas whole pods (a pod never holds ranks of two groups).",
        "fieldPath": ".nodes",
        "reason": "FieldValueInvalid",
    },
    dict(contract.MIN_REPLICAS_RULE),  # the trainer checks the same rule (protocol/trainerconfig.py)
    {
        "rule": "self.parallelism.dataReplicas != 0 || self.faultTolerance.mode == 'ReplicaGroups'",
        "message": "parallelism.dataReplicas 0 (the operator chooses the number of replica groups) needs "
                   "faultTolerance.mode ReplicaGroups; set dataReplicas to 1 (plain FSDP) or a number of HSDP "
                   "replicas.",
        "fieldPath": ".parallelism.dataReplicas",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": "self.trainer.dataset.type == 'synthetic' || has(self.trainer.dataset.path)",
        "message": "trainer.dataset.path is required when trainer.dataset.type is files or tokens.",
        "fieldPath": ".trainer.dataset.path",
        "reason": "FieldValueRequired",
    },
    {
        "rule": "self.gang.scheduler != 'kubernetes' || (!has(self.gang.queueName) && (!has(self.gang.schedulerName) "
                "|| !(self.gang.schedulerName in "
        + "["
        + ", ".join(f"'{n}'" for n in GROUP_SCHEDULERS)
        + "])))",
        "message": "gang.scheduler kubernetes cannot be combined with gang.queueName or a Volcano or "
                   "scheduler-plugins gang.schedulerName: each of them schedules the gang. Set gang.scheduler to auto "
                   "or none, or remove the other.",
        "fieldPath": ".gang.scheduler",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": "!has(self.gpuClaim) || !has(self.gpusPerPod) || self.gpusPerPod > 0",
        "message": "gpuClaim needs GPUs: gpusPerPod 0 claims none. Set gpusPerPod to at least procsPerNode (or leave "
                   "it empty), or remove gpuClaim for a CPU-only job.",
        "fieldPath": ".gpuClaim",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": "!has(self.gpuClaim) || !has(self.resources) || ((!has(self.resources.limits) || !('nvidia.com/gpu' "
                "in self.resources.limits)) && (!has(self.resources.requests) || !('nvidia.com/gpu' in "
                "self.resources.requests)))",
        "message": "gpuClaim asks for the GPUs by Dynamic Resource Allocation: remove nvidia.com/gpu from "
                   "resources.limits and resources.requests (the count is gpusPerPod), or remove gpuClaim to use the "
                   "extended resource.",
        "fieldPath": ".gpuClaim",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": "!has(self.gpusPerPod) || self.gpusPerPod == 0 || self.gpusPerPod >= self.procsPerNode",
        "message": "gpusPerPod must be 0 (CPU) or at least procsPerNode (one GPU per process).",
        "fieldPath": ".gpusPerPod",
        "reason": "FieldValueInvalid",
    },
]


class TrainingJobSpec(_Model):
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


# --------------------------------------------------------------------------- status


class Condition(_Model):
    type: Annotated[
        str,
        Field(
            description="Admitted (Kueue admitted the job's Workload; False with Kueue's reason while Queued), "
                        "Placed, GangReady, Running, Restarting, Degraded, Blind (Running pods the operator has heard "
                        "nothing from: no heartbeat, no launcher report), Succeeded, Failed or Suspended."
        ),
    ]
    status: Annotated[Literal["True", "False", "Unknown"], Field(description="True, False or Unknown.")]
    reason: Annotated[str, Field(description="CamelCase reason.")] = ""
    message: Annotated[str, Field(description="Human-readable detail.")] = ""
    last_transition_time: Annotated[str | None, Field(description="RFC 3339 time of the last status change.")] = None
    observed_generation: Annotated[int | None, Field(description="Generation the condition was set for.")] = None


class PlacementStatus(_Model):
    attempt: Annotated[
        int,
        Field(
            description="The attempt this placement was made for (status.attempt moves on at a restart before the "
                        "next gang is placed)."
        ),
    ] = 0
    moved: Annotated[
        list[int],
        Field(description="Pod indices whose node changed from the previous attempt (sticky re-placement), first 64."),
    ] = []
    nodes: Annotated[
        list[str], Field(description="Nodes of the gang by pod index (first 64 shown for large gangs).")
    ] = []
    node_count: Annotated[int, Field(description="Number of nodes in the gang.")] = 0
    spares: Annotated[list[str], Field(description="Hot spare nodes held for the gang.")] = []
    domains: Annotated[dict[str, int], Field(description="Domains spanned per topology level.")] = {}
    cross_bytes_per_step: Annotated[
        dict[str, float], Field(description="Bytes per training step crossing each topology level.")
    ] = {}
    rail_aligned: Annotated[bool, Field(description="Every data-parallel group is on a single rail.")] = False
    summary: Annotated[str, Field(description="One-line summary.")] = ""


class CheckpointRef(_Model):
    step: Annotated[int, Field(description="Training step of the checkpoint.")]
    tier: Annotated[str, Field(description="memory, local or shared.")]
    time: Annotated[str | None, Field(description="RFC 3339 time it was committed.")] = None


class CheckpointFence(_Model):
    step: Annotated[int, Field(description="No checkpoint newer than this step written before `attempt` is restored.")]
    attempt: Annotated[
        int,
        Field(
            description="The attempt that restarted from at most `step`; its checkpoints and later attempts' are on "
                        "the run's timeline again."
        ),
    ]


class Restarts(_Model):
    total: Annotated[
        int, Field(description="All restarts after failures (planned moves are counted apart, in planned).")
    ] = 0
    infrastructure: Annotated[int, Field(description="Restarts after infrastructure failures.")] = 0
    application: Annotated[int, Field(description="Restarts after application failures.")] = 0
    sdc: Annotated[int, Field(description="Restarts after silent data corruption.")] = 0
    straggler: Annotated[int, Field(description="Restarts after hangs or stragglers.")] = 0
    planned: Annotated[
        int,
        Field(
            description="Planned moves: the gang's pods moved off nodes announced to go (cordoned, tainted by someone "
                        "else, maintenance announced), ahead of time. Not a failure: no restart budget is spent, the "
                        "streak is not extended."
        ),
    ] = 0
    last_reason: Annotated[str, Field(description="Why the last restart happened.")] = ""
    last_time: Annotated[str | None, Field(description="When the last restart happened.")] = None
    streak: Annotated[
        dict[str, int] | None,
        Field(
            description="Restarts per class since the gang last ran healthy for restartPolicy.resetAfterSeconds; "
                        "budgets and backoff count these (absent: the totals above)."
        ),
    ] = None


class StragglerStatus(_Model):
    rank: Annotated[int, Field(description="Global rank.")]
    node: Annotated[str, Field(description="Node of the rank.")]
    score: Annotated[float, Field(description="Peers' median compute time over this rank's (1.0 = typical).")]
    since: Annotated[str | None, Field(description="When it was first flagged.")] = None


class QuarantinedNode(_Model):
    node: Annotated[str, Field(description="Node name.")]
    reason: Annotated[str, Field(description="Why it was quarantined.")]
    time: Annotated[str | None, Field(description="When.")] = None


class RestoreStatus(_Model):
    tier: Annotated[str, Field(description="Tier the attempt restored from (empty: fresh start).")] = ""
    step: Annotated[int, Field(description="Step restored.")] = -1
    steps_lost: Annotated[int, Field(description="Steps trained before the failure that were lost.")] = 0


class LastRestart(_Model):
    attempt: Annotated[int, Field(description="The attempt this restart started.")] = 0
    mode: Annotated[
        Literal["InPlace", "Full"],
        Field(
            description="InPlace: pods on healthy nodes kept, only the others replaced; Full: the whole gang recreated."
        ),
    ] = "Full"
    state: Annotated[
        Literal["Pending", "Started", "Done", "Waiting"],
        Field(
            description="Pending: waiting for backoff and the replacements' placement; Started: replacements created, "
                        "launchers told; Done: every pod runs the attempt. Waiting (faultTolerance ReplicaGroups): "
                        "the replica groups in waitingGroups found no node; the others train on, and the waiting ones "
                        "are placed and started (a new attempt) once a node is usable."
        ),
    ] = "Pending"
    reason: Annotated[
        str,
        Field(
            description="For a Full restart after an in-place one was wanted: why (InPlaceDisabled, SpecChanged, "
                        "NoControlChannel, NothingToKeep, NotPlaceable, RestartNotAnswered). For an in-place one: "
                        "ReplicaGroupReplaced when only the replica groups the failure touched restarted "
                        "(faultTolerance ReplicaGroups)."
        ),
    ] = ""
    message: Annotated[str, Field(description="Which pods stayed, which moved where, and why.")] = ""
    kept: Annotated[int, Field(description="Pods kept on their nodes.")] = 0
    replaced: Annotated[list[int], Field(description="Pod indices replaced (first 64).")] = []
    carried_on: Annotated[
        list[int],
        Field(
            description="faultTolerance ReplicaGroups (reason ReplicaGroupReplaced): pod indices of the replica "
                        "groups the failure did not touch, whose workers carried on untouched (never told to restart)."
        ),
    ] = []
    waiting_groups: Annotated[
        list[int],
        Field(
            description="faultTolerance ReplicaGroups, state Waiting: the replica groups that wait for a node while "
                        "the others train."
        ),
    ] = []
    started_time: Annotated[str | None, Field(description="When the kept launchers were told to restart.")] = None


class LastFailure(_Model):
    attempt: Annotated[int, Field(description="The attempt that failed.")] = 0
    reason: Annotated[
        str,
        Field(
            description="The failure's kind (the Restarting or Failed condition's reason), e.g. ApplicationExitCode, "
                        "NodeNotReady, HangVerdict."
        ),
    ] = ""
    pod: Annotated[
        str, Field(description="The first failing pod (empty when no pod is to blame, e.g. a hang verdict).")
    ] = ""
    pod_index: Annotated[int | None, Field(description="That pod's index in the gang.")] = None
    node: Annotated[str, Field(description="The node it ran on.")] = ""
    exit_code: Annotated[
        int | None, Field(description="Exit code of its trainer container (empty when it had not exited).")
    ] = None
    message: Annotated[
        str,
        Field(
            description="The tail of its termination message: what the trainer wrote to /dev/termination-log, else "
                        "the last lines of its log (terminationMessagePolicy FallbackToLogsOnError). Kept across "
                        "restarts, when the pod itself is gone."
        ),
    ] = ""
    time: Annotated[str | None, Field(description="When the operator saw the failure.")] = None


class TrainingJobStatus(_Model):
    model_config = ConfigDict(extra="ignore")

    phase: Annotated[
        Literal[
            "Pending", "Queued", "Placing", "Starting", "Running", "Restarting", "Suspended", "Succeeded", "Failed"
        ],
        Field(
            description="Pending, Queued (waiting for Kueue to admit its Workload: no pod exists), Placing, Starting, "
                        "Running, Restarting, Suspended, Succeeded or Failed."
        ),
    ] = "Pending"
    conditions: Annotated[list[Condition], Field(description="Kubernetes-style conditions.")] = []
    observed_generation: Annotated[int, Field(description="The spec generation this status reflects.")] = 0
    attempt: Annotated[int, Field(description="Current attempt (0 for the first gang, +1 per restart).")] = 0
    replica_groups: Annotated[int, Field(
        description="faultTolerance ReplicaGroups with parallelism.dataReplicas 0: the number of replica groups the "
                    "operator chose for the job (kept for its life; 0: not chosen).")] = 0
    message: Annotated[str, Field(description="What is happening now, for a person.")] = ""
    placement: Annotated[PlacementStatus | None, Field(description="Where the gang runs.")] = None
    step: Annotated[int, Field(description="Newest training step reported by the gang.")] = 0
    loss: Annotated[float | None, Field(description="Newest loss.")] = None
    tokens_per_second: Annotated[float, Field(description="Training throughput of the whole gang.")] = 0.0
    last_checkpoint: Annotated[
        CheckpointRef | None, Field(description="Newest verified checkpoint over all tiers.")
    ] = None
    checkpoints: Annotated[list[CheckpointRef], Field(description="Newest verified checkpoint per tier.")] = []
    checkpoint_fence: Annotated[
        CheckpointFence | None,
        Field(
            description="faultTolerance ReplicaGroups: the replica groups' states differed after `step` and no "
                        "majority named the bad one, so the run went back to at most that step; the checkpoints the "
                        "earlier attempts wrote after it are never restored (every restart's hint says so)."
        ),
    ] = None
    restore: Annotated[RestoreStatus | None, Field(description="What the current attempt resumed from.")] = None
    restarts: Annotated[Restarts, Field(description="Restarts by failure class.")] = Restarts()
    stragglers: Annotated[list[StragglerStatus], Field(description="Ranks currently flagged as stragglers.")] = []
    quarantined_nodes: Annotated[list[QuarantinedNode], Field(description="Nodes this job quarantined.")] = []
    pending_spec_changes: Annotated[str, Field(description="Spec changes that take effect at the next restart.")] = ""
    start_time: Annotated[str | None, Field(description="When the first gang started running.")] = None
    completion_time: Annotated[str | None, Field(description="When the job succeeded or failed.")] = None
    time_to_all_ready_seconds: Annotated[
        float | None, Field(description="Seconds from gang creation to all pods Running in the current attempt.")
    ] = None
    gang_created_time: Annotated[
        str | None,
        Field(description="When the current attempt's pods were created (the gang schedule timeout counts from here)."),
    ] = None
    failure_time: Annotated[
        str | None, Field(description="When the failure that ended the previous attempt was detected.")
    ] = None
    next_attempt_time: Annotated[
        str | None, Field(description="Restart backoff: the next gang is not placed before this time.")
    ] = None
    pods_since_attempt: Annotated[
        int | None,
        Field(
            description="The attempt of the last full gang creation: the current attempt's pods are, per pod index, "
                        "the newest pod created since then (in-place restarts keep pods of earlier attempts). Empty: "
                        "the current attempt."
        ),
    ] = None
    last_restart: Annotated[
        LastRestart | None, Field(description="How the current attempt was started from the previous one.")
    ] = None
    spares_held: Annotated[
        int, Field(description="Hot spare nodes held by a placeholder pod (gang.hotSpares wanted).")
    ] = 0
    last_failure: Annotated[
        LastFailure | None,
        Field(
            description="The failure that ended the last failed attempt: its first failing pod, node, exit code and "
                        "last words."
        ),
    ] = None


class ObjectMeta(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str | None = None
    namespace: str | None = None


class TrainingJob(_Model):
    api_version: Annotated[Literal["railyard.dev/v1alpha1"], Field(description="railyard.dev/v1alpha1")] = (
        "railyard.dev/v1alpha1"
    )
    kind: Annotated[Literal["TrainingJob"], Field(description="TrainingJob")] = "TrainingJob"
    metadata: ObjectMeta = ObjectMeta()
    spec: TrainingJobSpec = TrainingJobSpec()
    status: TrainingJobStatus | None = None
