"""What a placement decision reads and answers: the gang's request, the placement being repaired,
the input, and the answer (a :class:`Placement`, or :class:`Unplaceable` naming the constraint).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

from railyard.api.corev1 import Toleration
from railyard.logic.cost import CostInputs, CostReport, compute_cost
from railyard.logic.layout import MeshShape, build_rank_table
from railyard.logic.topology import LEVEL_PRESETS, NVLINK_LABEL, Topology
from railyard.protocol.ranktable import RankTable

Mode = Literal["Required", "Preferred"]


@dataclass(frozen=True, slots=True)
class GangRequest:
    """What placement needs to know about a TrainingJob."""

    job: str
    nodes: int
    procs_per_node: int
    pp: int = 1
    dp: int = 1
    tp: int = 1
    hot_spares: int = 0
    levels: tuple[str, ...] = LEVEL_PRESETS["railyard"][0]
    mode: Mode = "Preferred"
    required_level: str | None = None
    tolerations: tuple[Toleration, ...] = ()
    #: GPUs each pod needs exclusively; None means procs_per_node; 0 is CPU mode.
    gpus_per_pod: int | None = None
    attempt: int = 0
    #: Replica groups that fail alone (faultTolerance ReplicaGroups); each is placed as a block.
    replicas: int = 1
    #: The label key of the NVLink-domain level (``topology.nvlinkLevel``). A TP group spanning
    #: several pods (tp > procs_per_node) is placed inside one domain of it, the deepest of
    #: ``levels``. None: no NVLink rule, such groups are placed on consecutive nodes of a leaf
    #: (the domain-ignorant reference of bench/nvl72_placement.py; the operator never sets it).
    nvlink_level: str | None = NVLINK_LABEL

    @property
    def shape(self) -> MeshShape:
        return MeshShape(self.nodes, self.procs_per_node, self.pp, self.dp, self.tp, self.replicas)

    @property
    def tp_pods(self) -> int:
        """Pods one tensor-parallel group spans (1: inside one node)."""
        return self.shape.pods_per_tp_group

    @property
    def gpus_needed(self) -> int:
        return self.procs_per_node if self.gpus_per_pod is None else self.gpus_per_pod

    def problems(self) -> list[str]:
        out = self.shape.problems()
        if self.hot_spares < 0:
            out.append(f"gang.hotSpares: must be >= 0, got {self.hot_spares}")
        if self.mode not in ("Required", "Preferred"):
            out.append(f"topology.mode: {self.mode!r}; use Required or Preferred")
        if self.gpus_per_pod is not None and self.gpus_per_pod < 0:
            out.append(f"gpusPerPod: must be >= 0, got {self.gpus_per_pod}")
        return out


@dataclass(frozen=True, slots=True)
class PreviousPlacement:
    """The placement being repaired: node per pod index, the spares held, the nodes that failed."""

    nodes: tuple[str, ...]
    spares: tuple[str, ...] = ()
    failed: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class PlacementInput:
    """Everything one placement decision reads; build it with :func:`build_placement_input`."""

    topology: Topology
    request: GangRequest
    previous: PreviousPlacement | None = None
    cost_inputs: CostInputs | None = None


@dataclass(frozen=True)
class Placement:
    nodes: tuple[str, ...]
    spares: tuple[str, ...]
    #: Pod i's checkpoint replica goes to pod ``replica_peers[i]`` (-1: none).
    replica_peers: tuple[int, ...]
    #: Level key -> names of the domains the gang spans (sorted).
    domains: dict[str, tuple[str, ...]]
    rails_per_dp_group: int
    #: Largest number of leaf domains any DP group spans, and the least it could span.
    dp_leaf_spans: int
    dp_leaf_minimum: int
    #: Pod indices whose node changed (sticky re-placement); empty for a fresh placement.
    moved: tuple[int, ...] = ()
    notes: tuple[str, ...] = ()
    #: With an NVLink-domain level: per TP group (``g = p * dp + d``), the names of the NVLink
    #: domains its pods are in (one each, unless the placement was made without the rule).
    tp_domains: tuple[tuple[str, ...], ...] = ()
    topology: Topology | None = field(default=None, repr=False, compare=False)
    request: GangRequest | None = field(default=None, repr=False, compare=False)
    cost_inputs: CostInputs | None = field(default=None, repr=False, compare=False)

    @property
    def rail_aligned(self) -> bool:
        return self.rails_per_dp_group <= 1

    @cached_property
    def rank_table(self) -> RankTable:
        """The rank table of this placement (built when asked: 16,384 entries for a big gang,
        which a re-placement in the simulator does not need)."""
        if self.topology is None or self.request is None:
            raise ValueError("placement: no topology and request to build the rank table from")
        topo, index = self.topology, self.topology.index
        return build_rank_table(
            job=self.request.job,
            attempt=self.request.attempt,
            shape=self.request.shape,
            pod_nodes=self.nodes,
            pod_rail_offset=[topo.rail_offset[index[n]] for n in self.nodes],
            pod_gpus=[topo.gpus[index[n]] for n in self.nodes],
            replica_peers=self.replica_peers,
        )

    @cached_property
    def cost(self) -> CostReport:
        """Network bytes per step per level (computed when asked: a re-placement in the
        simulator needs the nodes, not the traffic report)."""
        if self.topology is None:
            raise ValueError("placement: no topology to compute the cost on")
        return compute_cost(self.rank_table, self.topology, self.cost_inputs)

    @property
    def tp_groups_by_domain(self) -> dict[str, tuple[int, ...]]:
        """NVLink domain name -> the TP groups inside it (a group split over several domains
        is listed under each); empty without an NVLink-domain level."""
        out: dict[str, list[int]] = {}
        for g, doms in enumerate(self.tp_domains):
            for name in doms:
                out.setdefault(name, []).append(g)
        return {k: tuple(v) for k, v in sorted(out.items())}

    @property
    def domain_counts(self) -> dict[str, int]:
        return {k: len(v) for k, v in self.domains.items()}

    @property
    def cross_bytes_per_step(self) -> dict[str, float]:
        """Bytes per step crossing each level (``host``, ``network``, then the level keys)."""
        return {c.level: c.bytes_per_step for c in self.cost.levels}

    @property
    def replica_groups(self) -> tuple[GroupPlacement, ...]:
        """faultTolerance ReplicaGroups: which pods form each group (the layout's rule,
        :meth:`MeshShape.group_of_pod`, the one the pods' ``RAILYARD_REPLICA_GROUP`` comes from)
        and the leaf domains its nodes lie in. Empty when the gang is one world."""
        if self.request is None or self.topology is None or self.request.replicas <= 1:
            return ()
        shape, topo = self.request.shape, self.topology
        pods: dict[int, list[int]] = {}
        for i in range(len(self.nodes)):
            pods.setdefault(shape.group_of_pod(i), []).append(i)
        out = []
        for g, members in sorted(pods.items()):
            nodes = tuple(self.nodes[i] for i in members)
            leaves = tuple(dict.fromkeys(topo.path(topo.index[n]) for n in nodes))
            out.append(GroupPlacement(g, tuple(members), nodes, leaves, tuple(i for i in members if i in self.moved)))
        return tuple(out)


@dataclass(frozen=True, slots=True)
class GroupPlacement:
    """One replica group of a placement (:attr:`Placement.replica_groups`)."""

    group: int
    pods: tuple[int, ...]
    nodes: tuple[str, ...]
    #: The leaf domains of its nodes, each as its path (broadest level first), in pod order.
    leaves: tuple[tuple[str, ...], ...]
    #: Its pods that moved in a re-placement.
    moved: tuple[int, ...] = ()


def compute_shared_domains(
    groups: Sequence[GroupPlacement], *, leaf_depth: int | None = None
) -> dict[tuple[str, ...], tuple[int, ...]]:
    """The failure domains holding nodes of more than one replica group -> those groups: the
    leaf domains (paths of ``leaf_depth`` levels; default the whole path) and every domain below
    them (an NVLink domain). Empty: a switch, rack or NVLink domain's failure takes at most one
    group."""
    holders: dict[tuple[str, ...], list[int]] = {}
    for g in groups:
        paths = dict.fromkeys(path[:depth] for path in g.leaves
                              for depth in range(leaf_depth or len(path), len(path) + 1))
        for path in paths:
            holders.setdefault(path, []).append(g.group)
    return {path: tuple(gs) for path, gs in holders.items() if len(gs) > 1}


#: Placement constraint -> the reason the operator writes into the Placed condition.
CONDITION_REASONS: Mapping[str, str] = {
    "shape": "InvalidShape",
    "capacity": "NotEnoughNodes",
    "requiredLevel": "NoDomainFits",
    "topology": "TopologyMismatch",
}


@dataclass(frozen=True, slots=True)
class Unplaceable:
    #: "shape", "capacity", "requiredLevel" or "topology".
    constraint: str
    reason: str
    short: int = 0
    domains: tuple[str, ...] = ()
    excluded: dict[str, int] = field(default_factory=dict)

    @property
    def condition_reason(self) -> str:
        return CONDITION_REASONS.get(self.constraint, "Unplaceable")

    @property
    def permanent(self) -> bool:
        """The job's shape can never be placed (not a matter of waiting for capacity)."""
        return self.constraint == "shape"

    @property
    def message(self) -> str:
        """The reason with the shortfall and the unusable nodes, for a condition or Event."""
        where = f" in {', '.join(self.domains[:5])}" if self.domains else ""
        excluded = ", ".join(f"{v} {k}" for k, v in sorted(self.excluded.items()))
        short = f"; {self.short} nodes short{where}" if self.short else ""
        more = f" (excluded: {excluded})" if excluded else ""
        return f"{self.reason}{short}{more}"
