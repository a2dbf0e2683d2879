"""What is simulated: the cluster, the model, the failure causes and the two policies compared.

Every number here is an assumption with a source or a reason; docs/simulate.md lists them. The
failure causes and their counts are Table 5 of the Llama 3 paper (Dubey et al. 2024, "The Llama 3
Herd of Models", §3.3.4): 419 unexpected interruptions in a 54-day snapshot on 16,384 H100 GPUs,
plus 47 planned ones.

Our policy is a TrainingJob spec (the API's defaults, plus what a 54-day run would set: straggler
action Restart, hot spares, restart limits sized for hundreds of failures); the baseline stands
for today's common setup: shared-storage checkpoints only, on a fixed interval, synchronous;
whole-gang restart after a collective timeout; no quarantine; no straggler handling.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal

from railyard.api.trainingjob import (
    Checkpoint,
    Health,
    LocalTier,
    MemoryTier,
    RestartBudget,
    RestartPolicy,
    SharedTier,
    StragglerPolicy,
)
from railyard.logic.groups import (
    CROSS_GROUP_EXPOSED,
    GROUP_HEAL_FIXED_S,
    GROUP_SURVIVOR_STALL_S,
    HEAL_NETWORK_BYTES_PER_S,
    GroupChoice,
    GroupCosts,
    GroupShape,
    decide_replica_groups,
)
from railyard.logic.intervals import SAVE_STALL_S
from railyard.protocol.mesh import tensor_layout_problem

#: How a fault shows to the control plane: the process exits (a GPU error kills the rank; pod
#: status shows it), the host goes silent (heartbeat timeout), the step stops advancing (hang
#: rule), or wrong numbers (SDC checks).
Detect = Literal["exit", "dead", "hang", "sdc"]

#: Causes whose rates scale with ``Scenario.failure_scale`` are thinned from a stream this many
#: times denser, so a trace at a lower scale is a subset of the trace at a higher one.
MAX_FAILURE_SCALE = 8.0


@dataclass(frozen=True, slots=True)
class Cause:
    name: str
    #: Interruptions in the reference period (Llama 3: 54 days on 16,384 GPUs).
    count: int
    #: Confirmed or suspected hardware (Llama 3 attributes ~78% of the 419 to hardware).
    hardware: bool
    detect: Detect
    #: Evidence kind (a key of railyard.logic.failures.RULES) the operator would see.
    evidence: str


#: Llama 3, Table 5: root causes of the 419 unexpected interruptions (54 days, 16,384 GPUs).
#: ``detect`` and ``evidence`` are our assumptions about how each cause shows (docs/simulate.md).
LLAMA3_CAUSES: tuple[Cause, ...] = (
    Cause("Faulty GPU", 148, True, "exit", "NodeNotReady"),
    Cause("GPU HBM3 memory", 72, True, "exit", "NodeNotReady"),
    Cause("Software bug", 54, False, "exit", "ApplicationExitCode"),
    Cause("Network switch/cable", 35, True, "hang", "HangVerdict"),
    Cause("Host maintenance", 32, False, "dead", "NodeGone"),
    Cause("GPU SRAM memory", 19, True, "exit", "NodeNotReady"),
    Cause("GPU system processor", 17, True, "hang", "HangVerdict"),
    Cause("NIC", 7, True, "hang", "HangVerdict"),
    Cause("NCCL watchdog timeouts", 7, False, "hang", "HangVerdict"),
    Cause("Silent data corruption", 6, True, "sdc", "SDCVerdict"),
    Cause("GPU thermal interface + sensor", 6, True, "exit", "NodeNotReady"),
    Cause("SSD", 3, True, "dead", "NodeNotReady"),
    Cause("Power supply", 3, True, "dead", "NodeGone"),
    Cause("Server chassis", 2, True, "dead", "NodeGone"),
    Cause("IO expansion board", 2, True, "dead", "NodeNotReady"),
    Cause("Dependency", 2, False, "exit", "InfrastructureExitCode"),
    Cause("CPU", 2, True, "dead", "NodeGone"),
    Cause("System memory", 2, True, "dead", "NodeGone"),
)
LLAMA3_DAYS = 54.0
LLAMA3_GPUS = 16_384
LLAMA3_PLANNED = 47
#: "higher than 90% effective training time" (Llama 3, §3.3.4).
LLAMA3_REPORTED_GOODPUT = 0.90

#: Replica-group costs used when no scenario overrides them (see Scenario.group_*), measured by
#: bench/replica_groups.py; declared once in railyard.logic.groups, where the operator's choice of
#: the number of groups reads them too.
#: Not taken from the bench (ideal): on the shared CPU cores the survivors' steps were no slower
#: with a group missing (fewer processes competing), which says nothing about GPUs.
GROUP_DEGRADED_EFFICIENCY = 1.0
#: What ``railyard simulate`` compared before the operator chose the number (Llama 3's 128 data
#: replicas in 8 groups of 16); ``--replica-groups`` now defaults to the choice (Scenario.choose_replica_groups).
DEFAULT_REPLICA_GROUPS = 8
#: Our policy's hot spares (``spec.gang.hotSpares``) unless ``--hot-spares`` says otherwise.
DEFAULT_HOT_SPARES = 32

#: A slow node that eventually fails hard (the baseline waits for that); not in Table 5.
STRAGGLER_CAUSE = Cause("Straggler (slow node)", 0, True, "hang", "StragglerVerdict")
PLANNED_CAUSE = Cause("Planned maintenance", 0, False, "exit", "PodDeleted")


@dataclass(frozen=True, slots=True)
class Scenario:
    """The run: cluster, model, failure rates, bandwidths and restart costs (all in SI units)."""

    gpus: int = LLAMA3_GPUS
    gpus_per_node: int = 8
    days: float = LLAMA3_DAYS
    seed: int = 0
    # Llama 3 405B on 16K GPUs: TP 8, PP 16, DP 128 (Table 4).
    pp: int = 16
    tp: int = 8
    model_params: float = 405e9
    #: Tokens per optimizer step (Llama 3: 16M in the main stage).
    tokens_per_step: float = 16 * 2**20
    #: Achieved BF16 TFLOPs per GPU (Llama 3: 380-430).
    tflops_per_gpu: float = 400.0
    #: Step time override; default 6 x params x tokens / (GPUs x FLOP/s).
    step_time_s: float | None = None
    #: Checkpoint bytes per parameter: bf16 weights 2 + fp32 master 4 + Adam moments 8.
    bytes_per_param: float = 14.0

    causes: tuple[Cause, ...] = LLAMA3_CAUSES
    #: Period the cause counts refer to; rates scale linearly with GPUs.
    reference_days: float = LLAMA3_DAYS
    reference_gpus: int = LLAMA3_GPUS
    failure_scale: float = 1.0
    planned: int = LLAMA3_PLANNED
    #: Fraction of hardware interruptions that hit a node that failed before (a bad node put back
    #: without quarantine). Under quarantine that node is gone, so these never happen.
    repeat_fraction: float = 0.10
    #: Slow-node episodes per day (the node computes ``straggler_slowdown`` x slower until it
    #: fails hard after an exponential lead time of mean ``straggler_lead_h``).
    stragglers_per_day: float = 0.2
    straggler_slowdown: float = 1.3
    straggler_lead_h: float = 6.0
    #: Silent corruptions per day; None: the table's count over its period.
    sdc_per_day: float | None = None
    #: Mean time until an unchecked corruption shows as a loss spike or NaN.
    unchecked_sdc_detect_h: float = 1.0
    #: A quarantined node comes back repaired after this long.
    repair_h: float = 48.0

    # cluster: the job's nodes plus this much free room, leaves of this many nodes
    extra_nodes_fraction: float = 0.125
    nodes_per_leaf: int = 32
    #: Nodes per NVLink domain (0: none, NVLink only inside a node): consecutive nodes of a leaf
    #: share one (an NVL72 rack: 18 trays of 4 GPUs), so ``tp`` may span them.
    nvlink_domain_nodes: int = 0
    leaves_per_spine: int = 8

    # bandwidths, bytes/s
    host_copy_bw_per_gpu: float = 25e9
    peer_bw_per_node: float = 50e9
    nvme_bw_per_node: float = 8e9
    #: Aggregate shared storage bandwidth (Llama 3's Tectonic: 2 TB/s sustained, 7 TB/s peak).
    shared_write_bw: float = 2e12
    shared_read_bw: float = 2e12
    #: What training waits for at a save beyond copying the state to the host: the snapshot of
    #: what a forward may change and the barrier, measured by bench/checkpoint.py (the median
    #: of its memory-tier saves, the figure the operator's interval rule uses: logic/intervals.py).
    save_fixed_stall_s: float = SAVE_STALL_S["memory"].value

    # restart costs, seconds
    eval_period_s: float = 1.0
    pod_exit_detect_s: float = 2.0
    teardown_s: float = 30.0
    #: Pod creation rate for a whole gang (JobSet: ~290 pods/s during recovery at 15k nodes).
    schedule_pods_per_s: float = 290.0
    pod_start_s: float = 60.0
    #: A kept pod's workers started again in place (Python + CUDA context on a GPU node; the
    #: tiny CPU trainer measures 3-6 s from the order to its process group, tests/system).
    process_restart_s: float = 20.0
    #: In-place restart, operator side, measured by bench/inplace.py (2,048-pod gang, embedded
    #: API server): the order published to the last of the 2,047 kept launchers told ...
    control_signal_s: float = 0.5
    #: ... and the node failure to the replacement pod Running on the held spare (the
    #: operator's part: quarantine, placement, the placeholder out of the way, the pod bound).
    replacement_s: float = 1.5
    #: The replacement's container start on a held spare: its placeholder ran the job's image,
    #: so nothing is pulled (vs pod_start_s for a pod on a node that never had the image).
    spare_container_start_s: float = 10.0
    #: NCCL communicator init and warm-up of a 16K-rank job.
    init_s: float = 90.0
    placement_s: float = 1.0
    # replica groups (spec.faultTolerance ReplicaGroups; docs/fault-tolerance.md): the costs of
    # one group lost while the others train on, as bench/replica_groups.py measures them
    # (bench/results/replica_groups.json; docs/simulate.md says which are measured and how they
    # are carried to 16,384 GPUs).
    #: Survivors' pause beyond the one step they redo: the lost peer's collective failing, the
    #: Lighthouse dropping the group (its heartbeat timeout) and a quorum of the rest formed.
    #: Measured on the local cluster; torchft's timeouts, so taken as is at any scale.
    group_survivor_stall_s: float = GROUP_SURVIVOR_STALL_S
    #: The healing group's fixed cost to fetch a live peer's state (quorum join, the recovery
    #: transport's handshake), measured with a tiny model; the bytes (each node's share of a
    #: whole replica, at ``heal_bw_per_node``) are added per scenario (compute_group_heal_s).
    group_heal_fixed_s: float = GROUP_HEAL_FIXED_S
    #: The heal's rate per node: the network ``faultTolerance.healNetwork`` names (one NDR rail).
    heal_bw_per_node: float = HEAL_NETWORK_BYTES_PER_S
    #: Step rate with R-1 groups over the ideal (R-1)/R of the rate with R (the global batch is
    #: split over the survivors); 1.0 = the survivors lose nothing beyond the missing group.
    group_degraded_efficiency: float = GROUP_DEGRADED_EFFICIENCY
    #: The part of the cross-group all-reduce a step waits for (railyard.logic.groups), and the
    #: scale-out bandwidth per GPU it runs on (400 Gb/s).
    cross_group_exposed: float = CROSS_GROUP_EXPOSED
    cross_bw_per_gpu: float = 50e9
    #: Correlated failures: the share of Table 5's "Network switch/cable" interruptions that are
    #: a leaf switch, taking every node under it (the rest: one node's cable or port). Table 5
    #: does not split the two; assumed.
    switch_fraction: float = 0.25
    #: Planned maintenance: each of Llama 3's planned interruptions is a rolling drain of one leaf
    #: domain's nodes (announced together: one planned move, as logic/planned.py merges them);
    #: the drained nodes are back after this long.
    maintenance_h: float = 2.0
    #: When a restart budget is spent the job fails; a person resubmits after this long.
    manual_restart_h: float = 1.0

    def problems(self) -> list[str]:
        out: list[str] = []
        if self.gpus < 1 or self.gpus_per_node < 1 or self.gpus % self.gpus_per_node:
            out.append(
                f"gpus: {self.gpus} must be a positive multiple of gpus_per_node ({self.gpus_per_node})"
            )
        elif self.nodes * self.gpus_per_node % (self.pp * self.tp):
            out.append(
                f"pp x tp = {self.pp * self.tp} must divide gpus ({self.gpus}); set --pp/--tp"
            )
        if problem := tensor_layout_problem(self.tp, self.gpus_per_node):
            out.append(f"tp: {problem.replace('procsPerNode', 'gpus_per_node')}")
        elif self.tp > self.gpus_per_node and self.nvlink_domain_nodes < self.tp // self.gpus_per_node:
            out.append(
                f"tp: {self.tp} spans {self.tp // self.gpus_per_node} nodes, which must lie in one NVLink domain; "
                f"set nvlink_domain_nodes (--nvlink-domain-nodes) to at least {self.tp // self.gpus_per_node}"
            )
        if self.nvlink_domain_nodes < 0 or (
            self.nvlink_domain_nodes and self.nodes_per_leaf % self.nvlink_domain_nodes
        ):
            out.append(
                f"nvlink_domain_nodes: must be 0 (none) or divide nodes_per_leaf ({self.nodes_per_leaf}), "
                f"got {self.nvlink_domain_nodes}"
            )
        if self.days <= 0:
            out.append(f"days: must be > 0, got {self.days}")
        if not 0 <= self.failure_scale <= MAX_FAILURE_SCALE:
            out.append(
                f"failure_scale: must be in [0, {MAX_FAILURE_SCALE:g}], got {self.failure_scale}"
            )
        if not 0 <= self.repeat_fraction < 1:
            out.append(f"repeat_fraction: must be in [0, 1), got {self.repeat_fraction}")
        if self.straggler_slowdown < 1:
            out.append(f"straggler_slowdown: must be >= 1, got {self.straggler_slowdown}")
        for name in (
            "stragglers_per_day",
            "straggler_lead_h",
            "unchecked_sdc_detect_h",
            "repair_h",
            "model_params",
        ):
            if getattr(self, name) < 0:
                out.append(f"{name}: must be >= 0, got {getattr(self, name)}")
        if self.sdc_per_day is not None and self.sdc_per_day < 0:
            out.append(f"sdc_per_day: must be >= 0, got {self.sdc_per_day}")
        if self.group_survivor_stall_s < 0 or self.group_heal_fixed_s < 0:
            out.append("group_survivor_stall_s, group_heal_fixed_s: must be >= 0")
        if not 0 <= self.cross_group_exposed <= 1 or not 0 <= self.switch_fraction <= 1:
            out.append(f"cross_group_exposed, switch_fraction: must be in [0, 1], got {self.cross_group_exposed}, "
                       f"{self.switch_fraction}")
        if self.maintenance_h < 0:
            out.append(f"maintenance_h: must be >= 0, got {self.maintenance_h}")
        if not self.heal_bw_per_node > 0:
            out.append(f"heal_bw_per_node: must be > 0 (bytes/s; --heal-gbps), got {self.heal_bw_per_node}")
        if not 0 < self.group_degraded_efficiency <= 1:
            out.append(f"group_degraded_efficiency: must be in (0, 1], got {self.group_degraded_efficiency}")
        if self.step_time_s is not None and self.step_time_s <= 0:
            out.append(f"step_time_s: must be > 0, got {self.step_time_s}")
        return out

    @property
    def nodes(self) -> int:
        return self.gpus // self.gpus_per_node

    @property
    def dp(self) -> int:
        return self.gpus // (self.pp * self.tp)

    @property
    def wall_s(self) -> float:
        return self.days * 86400.0

    @property
    def step_s(self) -> float:
        if self.step_time_s is not None:
            return self.step_time_s
        return (
            6.0
            * self.model_params
            * self.tokens_per_step
            / (self.gpus * self.tflops_per_gpu * 1e12)
        )

    @property
    def checkpoint_bytes(self) -> float:
        return self.model_params * self.bytes_per_param

    @property
    def bytes_per_node(self) -> float:
        return self.checkpoint_bytes / self.nodes

    @property
    def cluster_nodes(self) -> int:
        """The job's nodes plus free room; a policy's hot spares come on top."""
        return self.nodes + max(1, math.ceil(self.nodes * self.extra_nodes_fraction))

    def in_place_restart_s(self, *, node_lost: bool, on_spare: bool = True) -> float:
        """Kept pods restart their workers in place while the lost node's pod comes up on a held
        spare (its image already there; ``on_spare=False``: on a free node, started as a new pod
        is, ``pod_start_s``); then the communicators are set up again."""
        start = self.spare_container_start_s if on_spare else self.pod_start_s
        replacement = self.replacement_s + start if node_lost else 0.0
        return self.placement_s + self.control_signal_s + max(replacement, self.process_restart_s) + self.init_s

    def group_shape(self) -> GroupShape:
        """The job and the topology as the operator's choice of replica groups reads them."""
        return GroupShape(self.nodes, self.gpus_per_node, self.pp, self.dp, self.tp,
                          leaf_nodes=self.nodes_per_leaf, nvlink_domain_nodes=self.nvlink_domain_nodes)

    def group_costs(self) -> GroupCosts:
        """The scenario's own figures for the choice: its failure rate (every Table 5 cause, as
        the operator's default ``LLAMA3_FAILURES_PER_GPU_DAY`` counts them: a fault of one node
        or process restarts one group, and so does a corruption the other groups outvote), a
        group's outage (detection and an in-place restart onto a spare), its state, its step's
        FLOPs and bandwidths."""
        per_gpu_day = sum(c.count for c in self.causes) / (
            self.reference_days * self.reference_gpus) * self.failure_scale
        return GroupCosts(
            failures_per_gpu_day=per_gpu_day,
            outage_s=self.pod_exit_detect_s + self.in_place_restart_s(node_lost=True),
            survivor_stall_s=self.group_survivor_stall_s,
            heal_fixed_s=self.group_heal_fixed_s,
            state_bytes=self.checkpoint_bytes,
            heal_bw_per_node=self.heal_bw_per_node,
            flops_per_gpu=6.0 * self.model_params * self.tokens_per_step / (self.gpus * self.step_s),
            tokens_per_step=self.tokens_per_step,
            cross_bw_per_gpu=self.cross_bw_per_gpu,
            exposed=self.cross_group_exposed,
        )

    def choose_replica_groups(self) -> GroupChoice:
        """The operator's number of replica groups for this job on this cluster."""
        return decide_replica_groups(self.group_shape(), self.group_costs())

    def with_(self, **changes: object) -> Scenario:
        return replace(self, **changes)  # type: ignore[arg-type]


Tier = Literal["memory", "local", "shared"]


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """One side of the comparison."""

    name: str
    checkpoint: Checkpoint
    #: Saves block training only for the GPU-to-host snapshot (else for the whole write).
    async_save: bool
    #: heartbeat: Railyard's health rules (dead, hang) from spec.health; timeout: the gang
    #: learns of a silent or hung rank only from the collective timeout.
    detection: Literal["heartbeat", "timeout"]
    #: Re-place sticky: failed pods on hot spares, the rest on their nodes (memory tier there).
    sticky: bool
    quarantine: bool
    straggler_restart: bool
    sdc_checks: bool
    #: Restore only checkpoints whose SDC checks passed (decide_restore skips the others).
    verified_restore: bool
    hot_spares: int
    restart_policy: RestartPolicy
    health: Health = field(default_factory=Health)
    collective_timeout_s: float = 600.0
    #: Baseline: a pod failure seen by the job controller (JobSet failure policy).
    exit_detect_s: float = 30.0
    #: Restart in place (spec.restartPolicy.inPlace): the kept pods' launchers restart their
    #: workers; only the pods that must move are new. Else every restart recreates the gang.
    in_place: bool = False
    #: spec.faultTolerance ReplicaGroups with this many groups (parallelism.dataReplicas);
    #: 0: off. A fault on one node restarts only its group; the others train on (Scenario.group_*).
    replica_groups: int = 0

    def intervals(self) -> dict[Tier, int | None]:
        """Enabled tiers -> the save interval the spec sets, in steps (None: chosen by the
        operator's rule, railyard.sim.checkpoints)."""
        out: dict[Tier, int | None] = {}
        c = self.checkpoint
        if c.memory.enabled:
            out["memory"] = c.memory.interval_steps
        if c.local.enabled:
            out["local"] = c.local.interval_steps
        if c.shared.enabled:
            out["shared"] = c.shared.interval_steps
        return out


def our_policy(*, hot_spares: int = DEFAULT_HOT_SPARES, restart_limit: int = 10_000, in_place: bool = True,
               replica_groups: int = 0) -> PolicyConfig:
    """The TrainingJob defaults (tier intervals by the operator's rule, heartbeats, SDC checks
    every 50 steps, restarts in place), with straggler action Restart, hot spares, and budgets sized for
    a 54-day run. ``in_place=False``: the same, with every restart recreating the whole gang.
    ``replica_groups`` R > 1: faultTolerance ReplicaGroups with R groups."""
    name = "railyard" if in_place else "railyard, full restarts"
    return PolicyConfig(
        name=f"railyard, {replica_groups} replica groups" if replica_groups > 1 else name,
        replica_groups=replica_groups,
        in_place=in_place,
        checkpoint=Checkpoint(),
        async_save=True,
        detection="heartbeat",
        sticky=True,
        quarantine=True,
        straggler_restart=True,
        sdc_checks=True,
        verified_restore=True,
        hot_spares=hot_spares,
        restart_policy=RestartPolicy(
            infrastructure=RestartBudget(limit=restart_limit, backoff_seconds=0.0),
            application=RestartBudget(limit=restart_limit, backoff_seconds=10.0),
            sdc=RestartBudget(limit=restart_limit, backoff_seconds=0.0),
            straggler=RestartBudget(limit=restart_limit, backoff_seconds=0.0),
        ),
        health=Health(straggler=StragglerPolicy(action="Restart")),
    )


def baseline_policy(
    *, interval_steps: int = 200, collective_timeout_s: float = 600.0
) -> PolicyConfig:
    """Shared-storage checkpoints only, synchronous, every ``interval_steps`` (200 x 6.2 s ~ 21
    min), the newest 100 kept; whole-gang restart; a silent or hung rank is found by the collective timeout
    (PyTorch's NCCL default: 10 min); no quarantine, straggler handling or SDC checks."""
    return PolicyConfig(
        name="baseline",
        checkpoint=Checkpoint(
            memory=MemoryTier(enabled=False),
            local=LocalTier(enabled=False),
            shared=SharedTier(interval_steps=interval_steps, keep=100),
        ),
        async_save=False,
        detection="timeout",
        sticky=False,
        quarantine=False,
        straggler_restart=False,
        sdc_checks=False,
        verified_restore=False,
        hot_spares=0,
        restart_policy=RestartPolicy(
            infrastructure=RestartBudget(limit=10_000),
            application=RestartBudget(limit=10_000),
            sdc=RestartBudget(limit=10_000),
            straggler=RestartBudget(limit=10_000),
            max_backoff_seconds=0.0,
        ),
        collective_timeout_s=collective_timeout_s,
    )
