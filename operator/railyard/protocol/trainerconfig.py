"""The trainer's settings, declared once: the contract between the TrainingJob API and the trainer.

Each setting is written here once, with its wire name (camelCase of the field name), default,
bounds and description, as a field of a frozen stdlib dataclass (:func:`section`,
:func:`setting`). Both sides read these same classes:

- the operator: ``railyard.api.trainingjob`` uses them as the types of ``spec.trainer``,
  ``spec.parallelism``, ``spec.faultTolerance``, ``spec.health`` and ``spec.checkpoint``;
  pydantic validates them (it reads a stdlib dataclass field's metadata, whose keys are
  ``pydantic.Field``'s argument names), the CRD schema and ``kubectl explain`` are generated from
  them, and the operator writes them into the job's ``config.json`` with :func:`to_wire`;
- the trainer, which may not import pydantic: :func:`parse` reads ``config.json`` back into them
  and reports every problem at once, each naming its field path.

``config.json`` itself is declared here too: the attempt's envelope around those sections
(:class:`AttemptEnvelope`: job, namespace, attempt, restore hint, the launcher's restart wait),
and the checkpoint section as the trainer reads it (:class:`CheckpointConfig`: the CRD's tiers
plus the few settings only runs outside the operator give, such as a tier's folder).

The few checks only the API makes (a Kubernetes quantity, a DNS name, the length of each item of
a list) narrow a field's type on the API side; defaults, bounds and descriptions stay here.
Standard library only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Literal

from railyard.protocol.wire import SchemaError, parse, section, setting, to_wire, wire_name

# --------------------------------------------------------------------------- trainer


#: ``trainer.watchdogSeconds`` when the spec leaves it out (also what ``railyard-train lighthouse``
#: derives its join timeout from when it is run by hand).
DEFAULT_WATCHDOG_SECONDS = 60.0


@section
class FaultSpec:
    """One injected fault (tests and demos); applies only in attempt ``attempt``."""

    kind: Literal["crash", "hang", "slow", "bitflip", "exit"] = setting(
        description="What to inject: crash (exception), hang, slow (by factor), bitflip (one high-order bit), exit "
                    "(with code)."
    )
    rank: int = setting(default=0, description="Global rank to inject into.", ge=0)
    step: int = setting(default=1, description="Training step at which to inject.", ge=0)
    factor: float = setting(default=1.5, description="Slow-down factor for kind=slow.", ge=1.0, le=100.0)
    target: Literal["param", "grad"] = setting(
        default="param", description="For kind=bitflip: flip a bit in a parameter or a gradient."
    )
    bit: int = setting(
        default=30,
        description="For kind=bitflip: which bit of the float32 layout to flip (30: the top exponent bit, 23-29 the "
                    "others, 0-22 the mantissa; bf16 flips the same bit of its top 16).",
        ge=0,
        le=30,
    )
    code: int = setting(default=1, description="Exit code for kind=exit.", ge=0, le=255)
    attempt: int = setting(default=0, description="Only inject in this attempt (restarts do not re-inject).", ge=0)
    group: int | None = setting(
        default=None,
        description="faultTolerance ReplicaGroups: only inject in this replica group (rank is then the rank inside "
                    "the group's own world); unset: every group.",
        ge=0,
    )


#: The largest vocabulary the trainer takes (token shards hold uint32 ids; a bound keeps a typo
#: from asking for a terabyte embedding).
MAX_VOCAB = 16_777_216


@section
class Dataset:
    """Training data. ``tokens``: a folder of pre-tokenized shards written by
    ``railyard-train prepare`` (``index.json`` + token files, see docs/trainer.md)."""

    type: Literal["synthetic", "files", "tokens"] = setting(
        default="synthetic",
        description="synthetic: a deterministic learnable language; files: byte-level text from path (vocabulary "
                    "256); tokens: pre-tokenized shards written by `railyard-train prepare` (a folder with index.json "
                    "and uint16/uint32 token files, memory-mapped).",
    )
    path: str | None = setting(
        default=None,
        description="Inside the pod: the folder of shards for type=tokens, the folder or file of text for type=files.",
        max_length=4096,
    )
    shuffle: bool = setting(
        default=True,
        description="type=tokens: visit each epoch's sequences in a seeded random order (resumable exactly); false: "
                    "in file order.",
    )


@section
class Program:
    """The user's program, started by ``railyard-train`` once per local rank with torchrun's
    environment (docs/trainer.md, "Your own program"). Exactly one of ``script``, ``module``
    and ``command``, as torchrun takes a script, ``-m module`` or ``--no-python command``."""

    script: str | None = setting(
        default=None,
        description="A Python file in the image, run as `python SCRIPT ARGS` once per rank (torchrun's positional "
                    "script). A relative path is taken from the container's working directory.",
        min_length=1,
        max_length=4096,
    )
    module: str | None = setting(
        default=None,
        description="A Python module, run as `python -m MODULE ARGS` once per rank (torchrun's -m).",
        min_length=1,
        max_length=512,
    )
    command: tuple[str, ...] | None = setting(
        default=None,
        description="An executable and its first arguments, run as is once per rank (torchrun's --no-python), e.g. a "
                    "wrapper script.",
        min_length=1,
        max_length=64,
    )
    args: tuple[str, ...] = setting(
        default=(), description="Arguments after the script, module or command.", max_length=256
    )

    @property
    def kinds(self) -> tuple[str, ...]:
        """Which of script/module/command are given (exactly one is valid)."""
        return tuple(k for k in ("script", "module", "command") if getattr(self, k) is not None)


@section
class TrainerSettings:
    preset: Literal["tiny", "small", "1b", "8b"] = setting(
        default="tiny", description="Model size preset of the bundled LLaMA-style trainer. tiny runs on CPU."
    )
    vocab_size: int | None = setting(
        default=None,
        description="The model's vocabulary (rows of its embedding and output). Unset: the tokenizer's of the "
                    "prepared shards for dataset type tokens (from their index.json), else the preset's. Set it to "
                    "fix the size, e.g. to resume a checkpoint made with another; it must hold every id of the "
                    "shards' tokenizer.",
        ge=1,
        le=MAX_VOCAB,
    )
    steps: int = setting(default=100, description="Number of optimizer steps to train.", ge=1, le=100_000_000)
    batch_size: int = setting(
        default=8,
        description="Global batch size in sequences per step; must divide evenly over data-parallel ranks and "
                    "microbatches.",
        ge=1,
        le=1_000_000,
    )
    seq_len: int = setting(default=128, description="Sequence length in tokens.", ge=8, le=1_048_576)
    learning_rate: float = setting(default=3e-4, description="Peak AdamW learning rate.", gt=0.0, le=1.0)
    warmup_steps: int = setting(default=10, description="Linear warmup steps before cosine decay.", ge=0)
    weight_decay: float = setting(default=0.1, description="AdamW weight decay.", ge=0.0, le=1.0)
    grad_clip: float = setting(default=1.0, description="Gradient clipping max norm (0 disables).", ge=0.0)
    seed: int = setting(default=0, description="Seed for initialisation and data.", ge=0)
    dataset: Dataset = setting(default=Dataset(), description="Training data.")
    activation_checkpointing: bool = setting(
        default=False, description="Recompute activations in backward to save memory."
    )
    mixed_precision: Literal["auto", "bf16", "fp32"] = setting(
        default="auto", description="auto: bf16 on GPU, fp32 on CPU."
    )
    cpu_offload: bool = setting(
        default=False, description="Offload parameters, gradients and optimizer state to CPU (FSDP2 offload policy)."
    )
    log_every_steps: int = setting(default=1, description="Log metrics every N steps.", ge=1)
    collective_timeout_seconds: float = setting(
        default=120.0,
        description="A collective that takes longer fails the attempt as an infrastructure failure (instead of NCCL's "
                    "30-minute default).",
        gt=0.0,
        le=3600,
    )
    watchdog_seconds: float = setting(
        default=DEFAULT_WATCHDOG_SECONDS,
        description="A rank whose step makes no progress this long reports itself hung; must be below "
                    "collectiveTimeoutSeconds.",
        gt=0.0,
        le=3600,
    )
    faults: tuple[FaultSpec, ...] = setting(
        default=(), description="Fault injection for tests and demos; empty in production.", max_length=32
    )
    program: Program | None = setting(
        default=None,
        description="Run your own training program instead of the bundled trainer: railyard-train starts it once per "
                    "local rank with the environment torchrun gives (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ...) "
                    "and the rank table, and classifies its exit as it does the bundled trainer's. The bundled "
                    "trainer's settings (preset, steps, batchSize, dataset, ...) are then not used; watchdogSeconds "
                    "applies once the program reports steps through the SDK (railyard_trainer.sdk). See "
                    "docs/trainer.md, \"Your own program\".",
    )


@section
class Parallelism:
    tensor: int = setting(
        default=1,
        description="Tensor-parallel degree. A divisor of procsPerNode (a TP group inside one node), or a multiple of "
                    "it: a TP group then spans tensor / procsPerNode nodes of one NVLink domain (rack-scale NVLink "
                    "such as GB200 NVL72; the nodes must carry topology.nvlinkLevel, else the job waits unplaced, "
                    "reason TopologyMismatch).",
        ge=1,
        le=1024,
    )
    pipeline: int = setting(default=1, description="Pipeline-parallel degree (number of stages).", ge=1, le=1024)
    data: int | None = setting(
        default=None,
        description="Data-parallel (FSDP) degree. Leave empty to derive it: nodes x procsPerNode / (tensor x "
                    "pipeline).",
        ge=1,
    )
    data_replicas: int = setting(
        default=1,
        description="HSDP (hybrid sharded data parallel): the data-parallel ranks form this many replica groups, each "
                    "sharding the model over data / dataReplicas ranks; the SDC cross-replica vote compares the "
                    "replicas. 1: plain FSDP over all data-parallel ranks. 0 (with faultTolerance.mode "
                    "ReplicaGroups only): the operator chooses the number of groups from the data-parallel degree, "
                    "the topology's leaf domains and the measured heal and cross-group costs, and records it in "
                    "status.replicaGroups; `railyard plan` shows the choice and why.",
        ge=0,
        le=4096,
    )
    pipeline_schedule: Literal["GPipe", "1F1B", "Interleaved1F1B"] = setting(
        default="1F1B", description="Pipeline schedule used when pipeline > 1."
    )
    microbatches: int | None = setting(
        default=None,
        description="Pipeline microbatches per step. Empty: equal to pipeline (at least 1).",
        ge=1,
        le=4096,
    )


# --------------------------------------------------------------------------- restarts

#: config.json's ``restartWaitSeconds``: how long a launcher whose workers failed waits for word
#: from the operator before it exits (and the pod fails). The operator writes
#: ``max(RESTART_WAIT_FLOOR_SECONDS, 2 x spec.restartPolicy.inPlaceTimeoutSeconds)``: the in-place
#: restart's window, with room for the backoff; this floor is also the default.
RESTART_WAIT_FLOOR_SECONDS = 60.0


def restart_wait_seconds(in_place_timeout_seconds: float) -> float:
    """The launcher's wait for the operator, from ``spec.restartPolicy.inPlaceTimeoutSeconds``."""
    return max(RESTART_WAIT_FLOOR_SECONDS, 2 * in_place_timeout_seconds)


# --------------------------------------------------------------------------- fault tolerance

#: How often each replica group's torchft Manager tells the Lighthouse it lives (torchft's own
#: default; the beats come from its Rust runtime, not the trainer's Python thread, so a long step
#: does not delay them), and how many missed beats make the Lighthouse drop a group.
LIGHTHOUSE_HEARTBEAT_INTERVAL_MS = 100
LIGHTHOUSE_MISSED_HEARTBEATS = 10


def lighthouse_heartbeat_timeout_ms() -> int:
    """torchft's Lighthouse ``--heartbeat-timeout-ms``: a group silent this long is dead.

    The survivors of a lost group stand for this long: their next quorum waits for every member
    of the last one that still counts as alive, and a lost group counts as alive until its
    heartbeats are this old. torchft's default (5 s) made that pause the largest cost of a lost
    node (bench/replica_groups.py: the whole job stood 6 s, as long as this small job's
    in-place restart). Ten missed beats (1 s) still tolerate a starved or briefly unreachable
    Manager; a live group dropped by mistake is no fault either, only a cost: it finds itself
    behind at its next quorum and heals from a peer (docs/fault-tolerance.md)."""
    return LIGHTHOUSE_HEARTBEAT_INTERVAL_MS * LIGHTHOUSE_MISSED_HEARTBEATS


#: The Lighthouse's join timeout (faultTolerance ReplicaGroups) as a share of
#: ``trainer.watchdogSeconds``, its floor, and its ceiling as a share of the watchdog.
JOIN_TIMEOUT_SHARE = 0.25
JOIN_TIMEOUT_FLOOR_SECONDS = 5.0
JOIN_TIMEOUT_MAX_SHARE = 0.5


def lighthouse_join_timeout_ms(watchdog_seconds: float) -> int:
    """torchft's Lighthouse ``--join-timeout-ms`` for a job whose trainer watchdog is
    ``watchdog_seconds``. While a member of the last quorum that is alive (it still heartbeats)
    has not asked for the next quorum, the Lighthouse waits this long before forming the quorum
    without it, and every other group stands meanwhile; so it must stay well below the watchdog
    that ends a group standing still (torchft's default, 60 s, equals the default watchdog). A
    quarter of the watchdog, at least 5 s (well above :func:`lighthouse_heartbeat_timeout_ms`: a
    live member that is slow to ask is not dropped sooner than a dead one), at most half the
    watchdog (a very short watchdog wins)."""
    s = min(
        max(watchdog_seconds * JOIN_TIMEOUT_SHARE, JOIN_TIMEOUT_FLOOR_SECONDS),
        watchdog_seconds * JOIN_TIMEOUT_MAX_SHARE,
    )
    return max(int(s * 1000), 1)


def cross_group_timeout_seconds(*, collective_timeout_seconds: float, watchdog_seconds: float) -> float:
    """The timeout of a replica group's cross-group collectives (torchft's process group), for a
    job with these ``trainer`` settings: the Lighthouse's join timeout, never above the group's
    own collective timeout. A survivor that waits on a peer in the cross-group all-reduce longer
    than the Lighthouse waits for it to join is waiting for a group that is gone or hung: only
    the lost group's direct neighbours in torchft's ring see the connection close, the others
    wait for data from a survivor that has given up the step. Past this timeout the wait fails
    like theirs, the step does not commit and the group asks for the next quorum while the
    Lighthouse still waits for it (docs/fault-tolerance.md)."""
    return min(lighthouse_join_timeout_ms(watchdog_seconds) / 1000, collective_timeout_seconds)



#: How often a replica group's torchft Manager asks a Lighthouse that does not answer again
#: (:func:`lighthouse_quorum_retries`): the longest a group stands once the Lighthouse is back.
LIGHTHOUSE_QUORUM_RETRY_INTERVAL_S = 1.0


def lighthouse_quorum_retries(quorum_timeout_seconds: float) -> int:
    """torchft's ``quorum_retries`` (``TORCHFT_QUORUM_RETRIES``, default 0) for a Manager whose
    quorum timeout is ``quorum_timeout_seconds`` (the group's collective timeout).

    With none, a quorum call that finds the Lighthouse gone (its node failed) fails the group at
    once, so every group stops and the whole gang restarts, for the loss of a pod that needs no
    GPU. torchft 0.2.0 retries a failed call after ``quorum_timeout / (retries + 1)`` (at least
    100 ms) and reconnects first (backing off up to its connect timeout, the same length): the
    retries together span the quorum timeout, which the Python side waits for the call anyway.
    So the retries cover the operator recreating the Lighthouse under the same address (its node
    seen NotReady, the pod created and started: seconds) as long as that takes less than the
    quorum timeout, and a group resumes at most :data:`LIGHTHOUSE_QUORUM_RETRY_INTERVAL_S` after
    the new Lighthouse answers. Longer than the quorum timeout is the trainer's watchdog's
    case, as before (docs/fault-tolerance.md, "The Lighthouse")."""
    slices = math.ceil(quorum_timeout_seconds / LIGHTHOUSE_QUORUM_RETRY_INTERVAL_S)
    return max(slices - 1, 1)


@section
class LighthousePlacement:
    """Where the job's Lighthouse pod runs (the operator's concern; the trainer ignores it)."""

    node_selector: dict[str, str] | None = setting(
        default=None,
        description="Node labels the Lighthouse's node must carry, instead of the job's nodeSelector (unset: the "
                    "job's). It needs no GPU: point it at a CPU pool to keep it off the GPU nodes. Whatever the "
                    "selector, the operator prefers nodes without GPUs and nodes none of the job's training pods use "
                    "(a preference: it still schedules on a cluster of GPU nodes only).",
    )
    tolerations: tuple[dict[str, Any], ...] | None = setting(
        default=None,
        description="Tolerations of the Lighthouse's pod, instead of the job's (unset: the job's, so it may run where "
                    "the job may).",
        max_length=32,
    )


#: A Linux network interface name as ``faultTolerance.healNetwork.interface`` takes it (IFNAMSIZ:
#: at most 15 characters; no slash or whitespace): the CRD's pattern and the trainer's check.
INTERFACE_NAME_PATTERN = r"^[A-Za-z0-9_.:-]{1,15}$"
#: The interface a pod gets for ``faultTolerance.healNetwork.attachment`` when no ``interface`` is
#: named (the operator asks Multus for it under this name; the trainer reads its address).
ATTACHMENT_INTERFACE = "heal0"


def interface_name_problem(name: str) -> str | None:
    """None when ``name`` can name a Linux network interface (:data:`INTERFACE_NAME_PATTERN`), else
    the problem and its fix (the API and the trainer put the field's path before it)."""
    if re.match(INTERFACE_NAME_PATTERN, name) and name not in (".", ".."):
        return None
    return (f"{name!r} is not a network interface name; give the pod's interface as `ip -brief address` lists it "
            "inside the pod (1-15 letters, digits, '_', '.', ':' or '-', e.g. ib0)")


@section
class HealNetwork:
    """Which network a replica group advertises for healing: the address a restarted group
    fetches a live peer's model and optimizer state from (torchft's checkpoint transport, plain
    HTTP over TCP). Unset: the pod IP (the pod network). See docs/fault-tolerance.md, "Heals"."""

    interface: str | None = setting(
        default=None,
        description="The pod's network interface whose address the group advertises for healing, e.g. ib0 (IPoIB on "
                    "an InfiniBand data network) or net1 (a Multus attachment the pods already have). The interface "
                    "must exist in every training pod: the trainer reads its address at start and stops with an "
                    "error naming this field if it is missing. Unset: the pod IP (or, with attachment, heal0).",
        min_length=1,
        max_length=15,
    )
    attachment: str | None = setting(
        default=None,
        description="A Multus NetworkAttachmentDefinition ([namespace/]name) the operator attaches to every "
                    "training pod (annotation k8s.v1.cni.cncf.io/networks) as the interface named by interface "
                    "(default heal0); the group advertises that interface's address for healing. Unset: no "
                    "attachment is added.",
        min_length=1,
        max_length=317,
    )

    @property
    def interface_name(self) -> str | None:
        """The interface whose address is advertised; None: the pod IP."""
        if self.interface is not None:
            return self.interface
        return ATTACHMENT_INTERFACE if self.attachment is not None else None


@section
class FaultTolerance:
    """ReplicaGroups: each HSDP replica group is its own world and the cross-replica gradient
    all-reduce goes through torchft (railyard_trainer/replicas.py, docs/fault-tolerance.md)."""

    mode: Literal["None", "ReplicaGroups"] = setting(
        default="None",
        description="None: a lost rank stops the whole gang, which restarts (in place or from a checkpoint tier). "
                    "ReplicaGroups (needs parallelism.dataReplicas > 1): each HSDP replica group is its own "
                    "torch.distributed world and the cross-replica gradient all-reduce is fault tolerant (torchft): a "
                    "lost group stops only itself, the others keep training, and the group that replaces it heals "
                    "from a live peer. See docs/fault-tolerance.md.",
    )
    min_replicas: int = setting(
        default=1,
        description="ReplicaGroups: the fewest replica groups that may commit a step (1 to parallelism.dataReplicas). "
                    "With fewer live groups the survivors wait (no step commits) until enough groups rejoin; losing "
                    "more than dataReplicas - minReplicas groups at once is the checkpoint tiers' case.",
        ge=1,
        le=4096,
    )
    lighthouse: LighthousePlacement = setting(
        default=LighthousePlacement(),
        description="ReplicaGroups: where the job's Lighthouse (torchft's quorum server, one small CPU pod) runs. Its "
                    "loss restarts no group: the groups retry the quorum while the operator recreates it under the "
                    "same address (docs/fault-tolerance.md).",
    )
    heal_network: HealNetwork = setting(
        default=HealNetwork(),
        description="ReplicaGroups: the network a restarted group heals over (fetches a live peer's parameters and "
                    "optimizer state). Unset: the pod network (the pod IP). On a cluster with a separate data "
                    "network name its interface or a network attachment: a heal of a large model is then seconds "
                    "instead of minutes (docs/fault-tolerance.md, \"Heals\").",
    )


def world_parallelism(p: Parallelism, ft: FaultTolerance) -> Parallelism:
    """The parallelism of one torch.distributed world: the job's, or with ReplicaGroups one
    replica group's (a world of its own: data / dataReplicas data-parallel ranks, no replicas
    inside; the groups meet through torchft)."""
    if ft.mode != "ReplicaGroups":
        return p
    # dataReplicas 0 (the operator's choice) is resolved before a config.json is written
    return replace(p, data=None if p.data is None else p.data // max(p.data_replicas, 1), data_replicas=1)


# --------------------------------------------------------------------------- health


@section
class StragglerPolicy:
    threshold: float = setting(
        default=0.9,
        description="Flag a rank whose speed score (peers' median compute time / its own) stays below this. 0.9 flags "
                    "ranks >= ~10% slower.",
        gt=0.0,
        le=1.0,
    )
    window_steps: int = setting(default=20, description="Steps in the scoring window.", ge=3, le=10000)
    action: Literal["Report", "Restart"] = setting(
        default="Report",
        description="Report (status, event, metric) or Restart (quarantine the node, restart sticky on a spare).",
    )


@section
class SdcPolicy:
    interval_steps: int = setting(
        default=50, description="Run the SDC checks every N steps (and before the first step).", ge=1
    )
    action: Literal["Report", "Restart"] = setting(
        default="Restart",
        description="Report, or Restart: quarantine the node and resume from the newest checkpoint that passed its "
                    "checks.",
    )
    replay_on_spike: bool = setting(
        default=True,
        description="Replay a step whose loss or gradient norm spikes to confirm corruption before acting.",
    )


@section
class Health:
    heartbeat_interval_seconds: float = setting(
        default=2.0, description="How often each pod posts its ranks' heartbeats.", ge=0.1, le=300
    )
    heartbeat_timeout_seconds: float = setting(
        default=10.0, description="A rank with no heartbeat for this long while its pod runs is dead.", ge=1, le=3600
    )
    hang_timeout_seconds: float = setting(
        default=10.0,
        description="Floor of the hang timeout: a rank whose step does not advance within max(hangP99Multiplier x p99 "
                    "step time, this) is hung.",
        ge=1,
        le=86400,
    )
    hang_p99_multiplier: float = setting(
        default=3.0, description="Multiplier of the p99 step time for hang detection.", ge=1, le=100
    )
    straggler: StragglerPolicy = setting(default=StragglerPolicy(), description="Straggler detection.")
    sdc: SdcPolicy = setting(default=SdcPolicy(), description="Silent-data-corruption checks.")


# --------------------------------------------------------------------------- checkpoint tiers

#: Unset in the spec: the operator chooses it (railyard.logic.intervals); config.json always has one.
_INTERVAL_DESCRIPTION = (
    "Save every N steps. Unset: chosen by the operator from the save's stall and the rate of the failures this tier "
    "is restored after (Young/Daly; railyard plan prints it and why; docs/checkpoints.md)."
)


@section
class MemoryTier:
    enabled: bool = setting(
        default=True,
        description="Save to node RAM (a hostPath on tmpfs that outlives the pod, or the pod's own memory volume).",
    )
    interval_steps: int | None = setting(default=None, description=_INTERVAL_DESCRIPTION, ge=1)
    keep: int = setting(default=2, description="Keep the newest K checkpoints of this tier.", ge=1, le=100)
    replicate: bool = setting(
        default=True,
        description="Also keep a replica of each pod's shard in a neighbour node's memory tier (survives the loss of "
                    "one node).",
    )
    medium: Literal["HostPath", "Pod"] = setting(
        default="HostPath",
        description="HostPath: a tmpfs folder on the node (hostPath), which outlives the pod. Pod: an emptyDir of "
                    "medium Memory in the pod, which lives as long as the pod: an in-place restart keeps it, a "
                    "replaced pod gets its shard back from its neighbour's replica, a full restart loses the tier "
                    "(local/shared tiers remain); no hostPath, so the pods pass the baseline Pod Security Standard "
                    "(with local disabled and shared on a claim).",
    )
    size_limit: str | None = setting(
        default=None,
        min_length=1,
        max_length=64,
        description="With medium Pod: the emptyDir's sizeLimit (counts against the pod's memory; e.g. 64Gi). Empty: "
                    "no limit.",
    )
    host_path: str = setting(
        default="/dev/shm/railyard",
        description="With medium HostPath: the folder on the node (tmpfs).",
        min_length=1,
        max_length=4096,
    )


@section
class LocalTier:
    enabled: bool = setting(default=True, description="Save to node-local disk.")
    interval_steps: int | None = setting(default=None, description=_INTERVAL_DESCRIPTION, ge=1)
    keep: int = setting(default=2, description="Keep the newest K checkpoints of this tier.", ge=1, le=100)
    host_path: str = setting(
        default="/var/lib/railyard/checkpoints",
        description="Folder on the node's local disk.",
        min_length=1,
        max_length=4096,
    )


@section
class SharedTier:
    enabled: bool = setting(
        default=True, description="Save to shared storage (durable; supports resuming on a different world size)."
    )
    interval_steps: int | None = setting(default=None, description=_INTERVAL_DESCRIPTION, ge=1)
    keep: int = setting(default=3, description="Keep the newest K checkpoints of this tier.", ge=1, le=100)
    #: The operator checks it is a DNS subdomain; the trainer never reads it.
    claim_name: str | None = setting(
        default=None, max_length=253, description="PersistentVolumeClaim (ReadWriteMany) for the shared tier."
    )
    host_path: str = setting(
        default="/mnt/railyard-shared",
        description="Without claimName: a folder mounted on every node (e.g. NFS).",
        min_length=1,
        max_length=4096,
    )


@section
class Checkpoint:
    memory: MemoryTier = setting(default=MemoryTier(), description="Tier 1: node RAM with a peer replica.")
    local: LocalTier = setting(default=LocalTier(), description="Tier 2: node-local disk.")
    shared: SharedTier = setting(default=SharedTier(), description="Tier 3: shared storage.")
    cleanup_on_delete: bool = setting(
        default=False, description="Delete this job's checkpoints when the TrainingJob is deleted."
    )


# --------------------------------------------------------------------------- config.json

#: The trainer-only settings below are never in the CRD: the operator gives a tier's folder by the
#: pod's environment (RAILYARD_CHECKPOINT_<TIER>_DIR); tests, benches and runs by hand name it here.
_DIR_DESCRIPTION = "Trainer only: the tier's folder, instead of the pod's RAILYARD_CHECKPOINT_<TIER>_DIR."


# The interval as the trainer reads it: the operator always writes the one it chose; a run by
# hand without one saves at these (the CRD's defaults before the rule; same description and bounds).
@section
class MemoryTierConfig(MemoryTier):
    interval_steps: int = setting(default=10, description=_INTERVAL_DESCRIPTION, ge=1)
    dir: str | None = setting(default=None, description=_DIR_DESCRIPTION, max_length=4096)


@section
class LocalTierConfig(LocalTier):
    interval_steps: int = setting(default=50, description=_INTERVAL_DESCRIPTION, ge=1)
    dir: str | None = setting(default=None, description=_DIR_DESCRIPTION, max_length=4096)


@section
class SharedTierConfig(SharedTier):
    interval_steps: int = setting(default=100, description=_INTERVAL_DESCRIPTION, ge=1)
    dir: str | None = setting(default=None, description=_DIR_DESCRIPTION, max_length=4096)


@section
class CheckpointConfig(Checkpoint):
    """config.json's ``checkpoint`` as the trainer reads it: ``spec.checkpoint`` (what the
    operator writes) and the trainer-only settings."""

    memory: MemoryTierConfig = setting(default=MemoryTierConfig(), description="Tier 1: node RAM with a peer replica.")
    local: LocalTierConfig = setting(default=LocalTierConfig(), description="Tier 2: node-local disk.")
    shared: SharedTierConfig = setting(default=SharedTierConfig(), description="Tier 3: shared storage.")
    timeout_seconds: float = setting(
        default=300.0, gt=0.0, description="Trainer only: the timeout of the checkpoint's background process group."
    )


@section
class AttemptEnvelope:
    """config.json's own fields around the sections: which job and attempt it is for, where
    to restore from, and how long the launcher waits for the operator (written by the operator's
    ``build_trainer_config``, read by ``railyard_trainer.config``)."""

    job: str = setting(default="local", min_length=1, description="The TrainingJob's name (checkpoints live under it).")
    namespace: str = setting(default="default", description="The TrainingJob's namespace.")
    attempt: int = setting(default=0, ge=0, description="The attempt this config is for (faults, checkpoints).")
    restore: dict[str, Any] | None = setting(
        default=None,
        description="The operator's restore hint ({tier, step, lastStep, notAfter, abandonedBefore}: "
        "railyard.protocol.restore.RestoreHint); null: the newest verified checkpoint.",
    )
    restart_wait_seconds: float = setting(
        default=RESTART_WAIT_FLOOR_SECONDS, ge=0.0,
        description="How long a launcher whose workers failed waits for word from the operator (restart_wait_seconds).",
    )


#: config.json's top-level fields: the envelope's and the sections'.
SECTIONS = ("trainer", "parallelism", "checkpoint", "health", "faultTolerance")
TOP_LEVEL = ("job", "namespace", "attempt", *SECTIONS, "restore", "restartWaitSeconds")


# --------------------------------------------------------------------------- cross-field rules


def trainer_rule_problems(t: TrainerSettings) -> list[str]:
    """The CEL rules of ``railyard.api.rules.SPEC_RULES`` that concern only
    ``spec.trainer``, for configs that never passed an API server (``railyard-train`` by hand).
    A test evaluates both on the same table of cases."""
    out = []
    if t.program is not None and len(t.program.kinds) != 1:
        given = ", ".join(t.program.kinds) or "none"
        out.append(
            "trainer.program: name exactly one of script (a Python file), module (python -m) or command (an "
            f"executable); got {given}"
        )
    if t.dataset.type != "synthetic" and t.dataset.path is None:
        out.append(
            f"trainer.dataset.path: required when trainer.dataset.type is {t.dataset.type}; name the folder (or file) "
            "of the data"
        )
    if not t.watchdog_seconds < t.collective_timeout_seconds:
        out.append(
            f"trainer.watchdogSeconds: {t.watchdog_seconds} must be below trainer.collectiveTimeoutSeconds "
            f"({t.collective_timeout_seconds}) so a hung rank reports itself before its peers time out"
        )
    return out


#: ``faultTolerance.minReplicas`` at most ``parallelism.dataReplicas``, declared once: the CRD
#: carries the CEL (``railyard.api.rules.SPEC_RULES``, which ``railyard validate``
#: evaluates), the trainer checks a config.json with :func:`min_replicas_problems`; a test
#: evaluates both on one table.
MIN_REPLICAS_RULE: Mapping[str, str] = {
    "rule": "self.parallelism.dataReplicas == 0 || self.faultTolerance.minReplicas <= self.parallelism.dataReplicas",
    "message": "faultTolerance.minReplicas must be at most parallelism.dataReplicas (the number of replica groups).",
    "fieldPath": ".faultTolerance.minReplicas",
    "reason": "FieldValueInvalid",
}


def min_replicas_problems(fault_tolerance: FaultTolerance, parallelism: Parallelism) -> list[str]:
    """:data:`MIN_REPLICAS_RULE` for a config that never passed an API server."""
    if parallelism.data_replicas == 0 or fault_tolerance.min_replicas <= parallelism.data_replicas:
        return []
    return [f"faultTolerance.minReplicas: {fault_tolerance.min_replicas} is more than parallelism.dataReplicas "
            f"({parallelism.data_replicas}); set it between 1 and the number of replica groups"]


__all__ = [
    "MIN_REPLICAS_RULE",
    "RESTART_WAIT_FLOOR_SECONDS",
    "SECTIONS",
    "TOP_LEVEL",
    "AttemptEnvelope",
    "Checkpoint",
    "CheckpointConfig",
    "Dataset",
    "FaultSpec",
    "FaultTolerance",
    "HealNetwork",
    "Health",
    "LighthousePlacement",
    "LocalTier",
    "LocalTierConfig",
    "MemoryTier",
    "MemoryTierConfig",
    "Parallelism",
    "Program",
    "SchemaError",
    "SdcPolicy",
    "SharedTier",
    "SharedTierConfig",
    "StragglerPolicy",
    "TrainerSettings",
    "interface_name_problem",
    "min_replicas_problems",
    "parse",
    "restart_wait_seconds",
    "section",
    "setting",
    "to_wire",
    "trainer_rule_problems",
    "wire_name",
    "world_parallelism",
]
