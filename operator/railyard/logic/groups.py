"""How many replica groups a ReplicaGroups job gets when its spec leaves it open
(``parallelism.dataReplicas: 0``).

Why a rule and not a constant: the unit a failure restarts is one group, so the GPU-time a node
failure costs is the group's outage times ``1 / R`` of the job; and the failures of a job grow
with its GPUs. More groups shrink that share but add cross-group traffic every step (torchft's
all-reduce of each group's gradient shard over ``R`` peers; the shard grows with ``R`` because a
group is fewer GPUs holding a whole replica). The expected fraction of the run lost is

    lost(R) = failures/s x (outage + heal(R)) / R  +  failures/s x survivors' stall
              + (R - 1) x cross-group cost per extra group (a fraction of each step)

and the rule takes the ``R`` that minimises it among the counts the shape allows (``R`` divides
the data-parallel degree and the nodes, a group holds whole tensor-parallel groups), preferring
counts whose groups are whole leaf domains of the topology, so that a leaf switch, a rack or an
NVLink domain holds at most one group (placement keeps such groups on disjoint leaves).

The operator (handlers/reconcile.py), ``railyard plan`` and ``railyard simulate`` call
:func:`decide_replica_groups`; the simulator also charges :func:`compute_cross_group_fraction`
per step and :func:`compute_group_heal_s` per heal, so what the rule assumes is what the
simulation costs.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from railyard.api.trainingjob import TrainingJob
from railyard.logic.placement.job import matches_node_selector
from railyard.logic.topology import HOST_KEYS, resolve_level_keys, resolve_nvlink_key

__all__ = [
    "CROSS_GROUP_EXPOSED",
    "GROUP_HEAL_FIXED_S",
    "GROUP_OUTAGE_S",
    "GROUP_SURVIVOR_STALL_S",
    "HEAL_NETWORK_BYTES_PER_S",
    "LLAMA3_FAILURES_PER_GPU_DAY",
    "GroupChoice",
    "GroupCosts",
    "GroupOption",
    "GroupShape",
    "build_group_shape",
    "compute_cross_group_fraction",
    "compute_group_heal_s",
    "compute_group_loss",
    "decide_replica_groups",
    "resolve_replica_groups",
]

#: Llama 3 (Dubey et al. 2024, §3.3.4, Table 5): 419 unexpected interruptions in 54 days on
#: 16,384 GPUs. The operator knows no failure rate of its cluster; it assumes this one.
LLAMA3_FAILURES_PER_GPU_DAY = 419 / (54.0 * 16_384)
#: Measured: the survivors' stall beyond the step they redo, bench/results/replica_groups.json
#: (row "sim: survivors' stall beyond the step redone"; tests/sim/test_replica_groups_in_the_sim.py
#: keeps the two equal).
GROUP_SURVIVOR_STALL_S = 1.1
#: Measured there too: the healing group's quorum join -> healed from a live peer (row "replica_groups:
#: healing group, quorum join -> healed from a peer"), a tiny model's, so almost no bytes: the fixed
#: part of a heal; its bytes are added at the model's size over ``heal_bw_per_node``
#: (:func:`compute_group_heal_s`).
GROUP_HEAL_FIXED_S = 0.7
#: A heal's rate per node, bytes/s. torchft's checkpoint transport is HTTP over TCP on the one
#: interface a group advertises (``faultTolerance.healNetwork``), so one rail of the data network:
#: 400 Gb/s per rail for NDR InfiniBand (ConnectX-7, IPoIB) = 50 GB/s, an upper bound (the trainer
#: measures each heal: ``replica_healed``'s ``bytes_per_s``). Over the pod network, its rate instead
#: (``railyard simulate --heal-gbps``; docs/fault-tolerance.md, "Heals").
HEAL_NETWORK_BYTES_PER_S = 400e9 / 8
#: A lost group's outage before it heals, when the caller knows no better: detection (a pod exit,
#: 2 s) and an in-place restart onto a held spare with the communicators set up again (the
#: simulator's figure at 16,384 GPUs: ~112 s, 90 of them NCCL set-up).
GROUP_OUTAGE_S = 115.0
#: The part of the cross-group all-reduce a step waits for. Assumed, not measured: FSDP2 runs
#: each layer's reduction (torchft's all-reduce over the groups included) beside the backward of
#: the layers before it, so what a step waits for is the last layers' share and torchft's commit.
#: bench/replica_groups.py's CPU trainer cannot measure overlap on GPUs (docs/simulate.md).
CROSS_GROUP_EXPOSED = 0.05


@dataclass(frozen=True, slots=True)
class GroupShape:
    """What the choice reads of the job and the cluster."""

    nodes: int
    procs_per_node: int
    pp: int
    dp: int
    tp: int
    #: Nodes under one leaf domain of the topology (0: unknown, no domain preference).
    leaf_nodes: int = 0
    #: Nodes per NVLink domain (0: NVLink only inside a node).
    nvlink_domain_nodes: int = 0
    #: faultTolerance.minReplicas: the choice is never below it.
    min_replicas: int = 1

    @property
    def gpus(self) -> int:
        return self.nodes * self.procs_per_node

    @property
    def pods_per_tp_group(self) -> int:
        return max(self.tp // self.procs_per_node, 1)


@dataclass(frozen=True, slots=True)
class GroupCosts:
    """The costs the choice weighs (seconds, bytes, bytes/s, FLOP/s); defaults are a Llama 3 405B
    style run on H100s, what the operator assumes of a job it knows nothing more about."""

    failures_per_gpu_day: float = LLAMA3_FAILURES_PER_GPU_DAY
    outage_s: float = GROUP_OUTAGE_S
    survivor_stall_s: float = GROUP_SURVIVOR_STALL_S
    heal_fixed_s: float = GROUP_HEAL_FIXED_S
    #: Bytes of one replica's state (weights, master copy, optimizer); 0: unknown (heal bytes
    #: not counted).
    state_bytes: float = 0.0
    #: Node to node bandwidth of a heal (a group's nodes fetch their shares at once).
    heal_bw_per_node: float = HEAL_NETWORK_BYTES_PER_S
    #: For the cross-group all-reduce: achieved FLOP/s per GPU, tokens per step, scale-out
    #: bandwidth per GPU (400 Gb/s), bytes per gradient element (bf16).
    flops_per_gpu: float = 400e12
    tokens_per_step: float = 16 * 2**20
    cross_bw_per_gpu: float = 50e9
    grad_bytes_per_param: float = 2.0
    exposed: float = CROSS_GROUP_EXPOSED


def compute_cross_group_fraction(groups: int, costs: GroupCosts) -> float:
    """The step time the cross-group all-reduce adds, as a fraction of a step.

    A GPU's gradient shard is ``P x R / GPUs`` elements (a group of ``GPUs / R`` holds a whole
    replica); a ring all-reduce over ``R`` groups moves ``2 (R - 1) / R`` of it; a step is
    ``6 P tokens / (GPUs x FLOP/s)``. The model size and the GPUs cancel:
    ``(R - 1) x 2 x bytes/param x FLOP/s / (6 x tokens x bandwidth)``, times the exposed part."""
    if groups <= 1:
        return 0.0
    per_group = 2.0 * costs.grad_bytes_per_param * costs.flops_per_gpu / (
        6.0 * costs.tokens_per_step * costs.cross_bw_per_gpu)
    return costs.exposed * (groups - 1) * per_group


def compute_group_heal_s(groups: int, nodes: int, costs: GroupCosts) -> float:
    """A healing group's fetch of a live peer's state: the fixed cost (measured) and its nodes'
    shares of one replica (``state / (nodes / R)`` each), node to node, all at once."""
    per_node = costs.state_bytes * groups / max(nodes, 1)
    return costs.heal_fixed_s + per_node / costs.heal_bw_per_node


def compute_group_loss(groups: int, shape: GroupShape, costs: GroupCosts) -> float:
    """The expected fraction of the run lost to failures and cross-group traffic with ``groups``."""
    rate = costs.failures_per_gpu_day * shape.gpus / 86_400.0
    outage = costs.outage_s + compute_group_heal_s(groups, shape.nodes, costs)
    return rate * (outage / groups + costs.survivor_stall_s) + compute_cross_group_fraction(groups, costs)


@dataclass(frozen=True, slots=True)
class GroupOption:
    groups: int
    group_nodes: int
    #: Expected fraction of the run lost (:func:`compute_group_loss`).
    loss: float
    #: Every group is whole leaf domains: no leaf, rack or NVLink domain holds two groups.
    disjoint: bool


@dataclass(frozen=True, slots=True)
class GroupChoice:
    #: The number of groups (0: none possible; ``reason`` says why).
    groups: int
    reason: str
    options: tuple[GroupOption, ...] = field(default=())

    @property
    def chosen(self) -> GroupOption | None:
        return next((o for o in self.options if o.groups == self.groups), None)


def _allowed(r: int, shape: GroupShape) -> bool:
    if shape.dp % r or shape.nodes % r or r < shape.min_replicas:
        return False
    return (shape.nodes // r) % shape.pods_per_tp_group == 0


def decide_replica_groups(shape: GroupShape, costs: GroupCosts = GroupCosts()) -> GroupChoice:
    """The number of replica groups for a job whose spec leaves it open (see the module)."""
    counts = [r for r in range(2, min(shape.dp, shape.nodes, 4096) + 1) if _allowed(r, shape)]
    if not counts:
        return GroupChoice(0, (
            f"no count of replica groups fits: it must be > 1 and at least faultTolerance.minReplicas "
            f"({shape.min_replicas}) and divide both the data-parallel degree ({shape.dp}) and nodes ({shape.nodes})"
            f"{' in whole tensor-parallel groups' if shape.pods_per_tp_group > 1 else ''}; set "
            f"parallelism.dataReplicas, or change nodes or parallelism"))
    leaf = shape.leaf_nodes
    options = tuple(
        GroupOption(r, shape.nodes // r, compute_group_loss(r, shape, costs),
                    leaf > 0 and (shape.nodes // r) % leaf == 0)
        for r in counts)
    disjoint = [o for o in options if o.disjoint]
    pool = disjoint or list(options)
    best = min(pool, key=lambda o: (o.loss, o.groups))
    cross = compute_cross_group_fraction(best.groups, costs)
    rate = costs.failures_per_gpu_day * shape.gpus
    where = (
        f"groups of whole leaf domains ({best.group_nodes // leaf} of {leaf} nodes each): a leaf switch, rack or "
        f"NVLink domain holds at most one group" if disjoint else
        f"no count gives groups of whole leaf domains ({leaf} nodes): groups share leaves" if leaf else
        "the topology's leaf size is unknown: no domain preference")
    reason = (
        f"{best.groups} groups of {best.group_nodes} nodes: the fewest GPU-hours lost of the "
        f"{len(pool)} count{'s' if len(pool) != 1 else ''} {'with ' if disjoint else ''}"
        f"{'disjoint domains' if disjoint else 'allowed'} "
        f"(expected {best.loss:.3%} of the run: {rate:.1f} failures a day each costing its group "
        f"{costs.outage_s:.0f} s + heal and every group {costs.survivor_stall_s:g} s, cross-group all-reduce "
        f"{cross:.3%} of each step); {where}")
    return GroupChoice(best.groups, reason, options)


def _common_size(nodes: Sequence[Mapping[str, Any]], key: str | None) -> int:
    """The most common number of nodes per domain of label ``key`` (0: no such label)."""
    if not key:
        return 0
    per = Counter(str(((n.get("metadata") or {}).get("labels") or {}).get(key)) for n in nodes
                  if key in (((n.get("metadata") or {}).get("labels")) or {}))
    sizes = Counter(per.values()).most_common(1)
    return sizes[0][0] if sizes else 0


def build_group_shape(job: TrainingJob, nodes: Sequence[Mapping[str, Any]]) -> GroupShape:
    """The job's shape and the size of the cluster's leaf and NVLink domains (among the nodes its
    selector allows), as :func:`decide_replica_groups` reads them."""
    spec = job.spec
    selector = spec.node_selector
    chosen = [n for n in nodes if matches_node_selector(n, selector)] if selector else list(nodes)
    levels = resolve_level_keys(spec.topology.preset, spec.topology.levels, chosen)
    nvlink = resolve_nvlink_key(spec.topology.preset, spec.topology.nvlink_level, chosen)
    leaf = next((k for k in reversed(levels) if k != nvlink and k not in HOST_KEYS), None)
    return GroupShape(
        nodes=spec.nodes, procs_per_node=spec.procs_per_node, pp=spec.parallelism.pipeline, dp=spec.data_parallel,
        tp=spec.parallelism.tensor, leaf_nodes=_common_size(chosen, leaf),
        nvlink_domain_nodes=_common_size(chosen, nvlink), min_replicas=spec.fault_tolerance.min_replicas)


def resolve_replica_groups(
    job: TrainingJob, nodes: Sequence[Mapping[str, Any]], *, recorded: int = 0, costs: GroupCosts = GroupCosts()
) -> tuple[TrainingJob, GroupChoice | None]:
    """The job with ``parallelism.dataReplicas: 0`` filled in (the operator's choice, or
    ``recorded``: the one ``status.replicaGroups`` kept, so a job never changes its groups while
    it lives), and the choice when one was made now. A job that names its count comes back as is
    (no choice); a choice of 0 groups (none fits) leaves the job open, its reason says why."""
    spec = job.spec
    if spec.fault_tolerance.mode != "ReplicaGroups" or spec.parallelism.data_replicas != 0:
        return job, None
    choice = None if recorded > 0 else decide_replica_groups(build_group_shape(job, nodes), costs)
    groups = recorded if choice is None else choice.groups
    if groups <= 0:
        return job, choice
    parallelism = dataclasses.replace(spec.parallelism, data_replicas=groups)
    return job.model_copy(update={"spec": spec.model_copy(update={"parallelism": parallelism})}), choice
