"""Rail-aware gang placement: choose every node of the gang at once, or say why not.

Policy (issue 4, docs/placement.md):

- All or nothing: the gang's pods plus its hot spares all get a node, or the answer is
  :class:`Unplaceable` naming the constraint, how many nodes are short and where.
- ``Required`` with a level: the whole gang plus spares fits inside one domain of that level
  (best fit: the fullest domain that still fits), as Kueue's podset-required-topology does.
  ``Preferred`` tries the same and falls back to the whole cluster.
- Blocks: with a rail-pure layout (see :mod:`railyard.logic.layout`) the pods form blocks of
  ``dp`` pods that each host whole data-parallel groups. Blocks are packed so that each lies in
  the fewest leaf domains: in one leaf when it fits in one (``dp <= leaf size``), else in whole
  leaves of one domain of the deepest level that can hold it. If aligned capacity runs out, pods
  are placed node by node and blocks cut across leaves as well as possible (reported).
- Best fit at every level: fill the most-used domains that still fit, whole domains stay free;
  inside a leaf prefer partially used nodes with just enough free GPUs.
- Sticky re-placement: keep every healthy node of the previous placement with the same pod
  index (hence the same ranks); replace only failed, quarantined or otherwise unusable ones,
  preferring the gang's spares, and among those the ones sharing the deepest domain.

One entry point, one input: :func:`build_placement_input` makes a :class:`PlacementInput` from a
TrainingJob and the cluster (Node and Pod dicts: nodeSelector, tolerations, readiness, cordons,
quarantine marks, GPUs in use, the previous attempt's nodes and hot spares, the nodes that
failed), and :func:`plan_placement` decides from it. The operator (handlers/reconcile.py),
``railyard plan`` and ``railyard simulate`` all call these two, so they show the same answer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

from railyard.api.corev1 import Toleration, labels_match
from railyard.api.trainingjob import TrainingJob
from railyard.logic.cost import CostInputs, CostReport, compute_cost
from railyard.logic.layout import MeshShape, build_rank_table, compute_dp_group_spread
from railyard.logic.topology import (
    BUSY,
    LEVEL_PRESETS,
    NVLINK_LABEL,
    Topology,
    TopologyCache,
    build_topology,
    resolve_level_keys,
    resolve_nvlink_key,
)
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


# --------------------------------------------------------------------------- helpers


class _Tree:
    """Per-decision candidate counts over the domain tree."""

    def __init__(self, topo: Topology, cand: Sequence[bool], unit: int = 1) -> None:
        """``unit``: pods per TP group; the deepest level then counts whole units of that many
        of its nodes (``free`` and ``total`` are in units; ``nfree`` is always in nodes)."""
        self.topo = topo
        n_lv = len(topo.levels)
        self.n_lv = n_lv
        self.children: list[list[list[int]]] = []
        for lv in range(n_lv - 1):
            ch: list[list[int]] = [[] for _ in topo.domain_names[lv]]
            for d, par in enumerate(topo.parent[lv + 1]):
                ch[par].append(d)
            self.children.append(ch)
        free_gpus = topo.free_gpus
        # candidates per leaf, best fit first (fewest free GPUs), then tree order
        self.leaf_cands: list[list[int]] = [
            sorted((i for i in nodes if cand[i]), key=lambda i: (free_gpus[i], i))
            for nodes in topo.leaf_nodes
        ]
        self.free: list[list[int]] = []
        self.total: list[list[int]] = []
        self.nfree: list[list[int]] = []
        if n_lv:
            self.free = [[] for _ in range(n_lv)]
            self.total = [[] for _ in range(n_lv)]
            self.nfree = [[] for _ in range(n_lv)]
            self.free[n_lv - 1] = [len(c) // unit for c in self.leaf_cands]
            self.total[n_lv - 1] = [len(c) // unit for c in topo.leaf_nodes]
            self.nfree[n_lv - 1] = [len(c) for c in self.leaf_cands]
            for lv in range(n_lv - 2, -1, -1):
                f = [0] * len(topo.domain_names[lv])
                t = [0] * len(topo.domain_names[lv])
                nf = [0] * len(topo.domain_names[lv])
                for d, p in enumerate(topo.parent[lv + 1]):
                    f[p] += self.free[lv + 1][d]
                    t[p] += self.total[lv + 1][d]
                    nf[p] += self.nfree[lv + 1][d]
                self.free[lv] = f
                self.total[lv] = t
                self.nfree[lv] = nf

    def kids(self, lv: int, d: int) -> list[int]:
        return self.children[lv][d]

    def leaves_under(self, lv: int, d: int) -> list[int]:
        doms = [d]
        for level in range(lv, self.n_lv - 1):
            doms = [c for x in doms for c in self.children[level][x]]
        return doms


def _split(
    doms: Sequence[int],
    cap: Callable[[int], int],
    need: int,
    free: Callable[[int], int] | None = None,
) -> list[tuple[int, int]]:
    """Best-fit split of ``need`` units over domains: one domain if any fits (the one with the
    least capacity that fits), else largest first with the remainder in the best-fitting one.
    Ties go to the domain with fewer free nodes (``free``), then to tree order. Returns
    (domain, units) in domain order; the units may sum to less than ``need``."""
    if need <= 0:
        return []
    caps = {d: cap(d) for d in doms}
    frees = {d: free(d) for d in doms} if free is not None else caps
    fit = [d for d in doms if caps[d] >= need]
    if fit:
        return [(min(fit, key=lambda d: (caps[d], frees[d], d)), need)]
    pool = sorted((d for d in doms if caps[d] > 0), key=lambda d: (-caps[d], frees[d], d))
    out: list[tuple[int, int]] = []
    remaining = need
    for idx, d in enumerate(pool):
        if caps[d] >= remaining:
            best = min(
                (x for x in pool[idx:] if caps[x] >= remaining),
                key=lambda x: (caps[x], frees[x], x),
            )
            out.append((best, remaining))
            remaining = 0
            break
        out.append((d, caps[d]))
        remaining -= caps[d]
    return sorted(out)


def _cut_blocks(segments: list[list[int]], size: int, count: int) -> list[list[int]]:
    """Cut per-leaf node lists into ``count`` blocks of ``size`` nodes touching few leaves."""
    segs = [list(s) for s in segments if s]
    blocks: list[list[int]] = []
    for s in segs:
        while len(s) >= size and len(blocks) < count:
            blocks.append(s[:size])
            del s[:size]
    rest = [s for s in segs if s]
    while len(blocks) < count and rest:
        need = size
        blk: list[int] = []
        while need > 0 and rest:
            # the last piece from the segment that best fits it; before that whole segments in
            # tree order, so that no block is left with only scraps
            fitting = [s for s in rest if len(s) >= need]
            s = min(fitting, key=len) if fitting else rest[0]
            take = min(need, len(s))
            blk.extend(s[:take])
            del s[:take]
            need -= take
            rest = [x for x in rest if x]
        blocks.append(blk)
    return blocks


class _Planner:
    """Counts in *units*: a TP group's pods (``req.tp_pods``, 1 when TP stays in a node), which
    the deepest level keeps together; blocks are ``block`` units."""

    def __init__(self, topo: Topology, req: GangRequest, cand: list[bool]) -> None:
        self.topo = topo
        self.req = req
        self.cand = cand
        self.unit = req.tp_pods
        self.tree = _Tree(topo, cand, self.unit)
        shape = req.shape
        self.block = shape.block_nodes // self.unit
        self.blocks = req.nodes // shape.block_nodes
        n_lv = self.tree.n_lv
        # Deepest level with a domain big enough to hold a block: blocks are kept inside it.
        self.block_level = -1
        for lv in range(n_lv - 1, -1, -1):
            if max(self.tree.total[lv], default=0) >= self.block:
                self.block_level = lv
                break
        self.capb: list[list[int]] = [[] for _ in range(n_lv)]
        for lv in range(n_lv - 1, -1, -1):
            if lv >= self.block_level:
                self.capb[lv] = [f // self.block for f in self.tree.free[lv]]
            else:
                c = [0] * len(self.tree.free[lv])
                for d, p in enumerate(self.topo.parent[lv + 1]):
                    c[p] += self.capb[lv + 1][d]
                self.capb[lv] = c

    # -- node mode
    def nodes_in(self, lv: int, doms: Sequence[int], need: int) -> list[list[int]]:
        """Pick ``need`` units of candidate nodes best-fit under ``doms`` (level ``lv``);
        per-leaf lists (of whole units)."""
        tree = self.tree
        out: list[list[int]] = []
        for d, k in _split(doms, lambda x: tree.free[lv][x], need):
            if lv == tree.n_lv - 1:
                out.append(sorted(tree.leaf_cands[d][: k * self.unit]))
            else:
                out.extend(self.nodes_in(lv + 1, tree.kids(lv, d), k))
        return out

    # -- block mode
    def blocks_in(self, lv: int, doms: Sequence[int], need: int) -> list[list[int]]:
        out: list[list[int]] = []
        for d, u in _split(doms, lambda x: self.capb[lv][x], need, lambda x: self.tree.free[lv][x]):
            if lv >= self.block_level:
                segs = self.nodes_in(lv, [d], u * self.block)
                out.extend(_cut_blocks(segs, self.block * self.unit, u))
            else:
                out.extend(self.blocks_in(lv + 1, self.tree.kids(lv, d), u))
        return out

    def gang(self, lv: int, doms: Sequence[int]) -> tuple[list[int], bool]:
        """Gang nodes in pod-index order, and whether blocks are leaf-aligned. Segments are
        whole units and blocks whole units, so no unit is cut across leaves."""
        n = self.req.nodes // self.unit
        if self.block > 1 and sum(self.capb[lv][d] for d in doms) >= self.blocks:
            blocks = self.blocks_in(lv, doms, self.blocks)
            return [i for b in blocks for i in b], True
        segs = self.nodes_in(lv, doms, n)
        blocks = _cut_blocks(segs, self.block * self.unit, self.blocks)
        return [i for b in blocks for i in b], self.block == 1


def _affinity(topo: Topology, used: list[set[int]], i: int) -> int:
    """How many levels, broadest first, node ``i`` shares a domain with the gang."""
    a = 0
    for lv in range(len(topo.levels)):
        if topo.domain_of[lv][i] in used[lv]:
            a = lv + 1
    return a


def _shared_depth(topo: Topology, a: int, b: int) -> int:
    depth = 0
    for lv in range(len(topo.levels)):
        if topo.domain_of[lv][a] != topo.domain_of[lv][b]:
            break
        depth = lv + 1
    return depth


class _NearestFree:
    """The free node closest to a lost one (sharing the deepest domain), best fit (fewest free
    GPUs), then tree order, from a pool that shrinks as nodes are taken: what a scan of the
    whole pool per lost pod finds, without the scan. Nodes sharing depth >= l + 1 with ``old``
    are exactly those of ``old``'s domain at level l (domains are keyed by their whole path), so
    the answer is the best node of the deepest of ``old``'s domains that still has one. Each
    domain's candidates are sorted once, when first asked for, and consumed from the front
    (nodes taken through another domain are skipped), so n lost pods cost about
    n x levels + the sizes of the domains they touch, not n x the pool."""

    def __init__(self, topo: Topology, pool: set[int]) -> None:
        self.topo = topo
        self.pool = pool
        self.n_lv = len(topo.levels)
        self._members: list[list[list[int]] | None] = [None] * self.n_lv
        self._queues: dict[tuple[int, int], list[int]] = {}
        self._heads: dict[tuple[int, int], int] = {}

    def _domain_nodes(self, lv: int, d: int) -> Sequence[int]:
        if lv == self.n_lv - 1:
            return self.topo.leaf_nodes[d]
        members = self._members[lv]
        if members is None:
            members = [[] for _ in self.topo.domain_names[lv]]
            for i, dom in enumerate(self.topo.domain_of[lv]):
                members[dom].append(i)
            self._members[lv] = members
        return members[d]

    def _best_in(self, key: tuple[int, int]) -> int:
        """The best node of domain ``key`` (level, domain; level -1: everywhere) still in the
        pool, or -1."""
        queue = self._queues.get(key)
        if queue is None:
            lv, d = key
            nodes = range(self.topo.size) if lv < 0 else self._domain_nodes(lv, d)
            free, size = self.topo.free_gpus, self.topo.size
            queue = sorted((i for i in nodes if i in self.pool), key=lambda i: free[i] * size + i)
            self._queues[key] = queue
            self._heads[key] = 0
        head = self._heads[key]
        while head < len(queue) and queue[head] not in self.pool:
            head += 1
        self._heads[key] = head
        return queue[head] if head < len(queue) else -1

    def take(self, old: int) -> int:
        """The node to replace ``old`` (-1: unknown node, no locality); the caller removes it
        from the pool. The pool must not be empty."""
        if old >= 0:
            for lv in range(self.n_lv - 1, -1, -1):
                best = self._best_in((lv, self.topo.domain_of[lv][old]))
                if best >= 0:
                    return best
        best = self._best_in((-1, 0))
        if best < 0:
            raise ValueError("re-placement: the pool of free nodes is empty")
        return best


def _replica_peers(topo: Topology, nodes: Sequence[int]) -> list[int]:
    """Pod i's checkpoint replica goes to pod ``(i + k) % n`` for the smallest uniform shift ``k``
    that puts every pair in different leaves (a permutation: each pod holds one replica)."""
    n = len(nodes)
    if n < 2:
        return [-1] * n
    leaf = [topo.network_leaf_of(i) for i in nodes]
    for k in range(1, n):
        if all(leaf[i] != leaf[(i + k) % n] for i in range(n)):
            return [(i + k) % n for i in range(n)]
        if k > 64:
            break
    return [(i + 1) % n for i in range(n)]


def _excluded_counts(topo: Topology, need_gpus: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for i, why in enumerate(topo.excluded):
        if not why and topo.free_gpus[i] < need_gpus:
            why = BUSY
        if why:
            out[why] = out.get(why, 0) + 1
    return out


def _finish(
    topo: Topology,
    req: GangRequest,
    gang: list[int],
    spares: list[int],
    cost_inputs: CostInputs | None,
    notes: list[str],
    moved: tuple[int, ...] = (),
) -> Placement:
    shape = req.shape
    domains = {
        key: tuple(sorted({topo.domain_names[lv][topo.domain_of[lv][i]] for i in gang}))
        for lv, key in enumerate(topo.levels)
    }
    rails, spans, widest = compute_dp_group_spread(
        shape,
        pod_rail_offset=[topo.rail_offset[i] for i in gang],
        pod_gpus=[topo.gpus[i] for i in gang],
        pod_domain=[topo.network_leaf_of(i) for i in gang],
    )
    spans = max(spans, 1)
    minimum = 1
    nlv = topo.network_leaf_level
    if nlv >= 0:
        # how many of a DP group's pods one leaf can hold: a DP group has one pod in each of
        # its units (TP groups of k pods, 1 when TP stays in a node), a leaf holds the whole
        # units of its deepest domains (its NVLink domains, or itself)
        k = shape.pods_per_tp_group
        per_leaf: dict[int, int] = {}
        for members in topo.leaf_nodes:
            leaf = topo.domain_of[nlv][members[0]]
            per_leaf[leaf] = per_leaf.get(leaf, 0) + len(members) // k
        minimum = max(1, -(-widest // max(max(per_leaf.values()), 1)))
    if rails > 1:
        notes.append(
            f"data-parallel groups span up to {rails} rails: procsPerNode/tensor = {shape.slots_per_node} "
            f"does not divide pipeline = {shape.pp}"
        )
    if spans > minimum:
        notes.append(
            f"a data-parallel group spans {spans} leaf domains (least possible on an empty cluster: {minimum})"
        )
    tp_domains: tuple[tuple[str, ...], ...] = ()
    nv = topo.nvlink_level
    if nv >= 0:
        names, dom_of, k = topo.domain_names[nv], topo.domain_of[nv], shape.pods_per_tp_group
        span = shape.procs_per_node if k > 1 else shape.tp
        tp_domains = tuple(
            tuple(sorted({names[dom_of[gang[shape.position(g * shape.tp + q * span)[0]]]] for q in range(k)}))
            for g in range(shape.pp * shape.dp)
        )
    return Placement(
        nodes=tuple(topo.names[i] for i in gang),
        spares=tuple(topo.names[i] for i in spares),
        replica_peers=tuple(_replica_peers(topo, gang)),
        domains=domains,
        rails_per_dp_group=rails,
        dp_leaf_spans=spans,
        dp_leaf_minimum=minimum,
        moved=moved,
        notes=tuple(notes),
        tp_domains=tp_domains,
        topology=topo,
        request=req,
        cost_inputs=cost_inputs,
    )


# --------------------------------------------------------------------------- entry point


def plan_placement(inp: PlacementInput) -> Placement | Unplaceable:
    """Place the gang (or repair ``inp.previous``) on ``inp.topology``. Deterministic for the
    same input.

    The topology must be built with this job's tolerations and ``ignore_job=req.job`` so that
    the job's own pods do not make its kept nodes look busy (:func:`build_placement_input` does).
    """
    topo, req, previous, cost_inputs = inp.topology, inp.request, inp.previous, inp.cost_inputs
    problems = req.problems()
    if problems:
        return Unplaceable("shape", "; ".join(problems))
    need_gpus = req.gpus_needed
    cand = [
        not why and free >= need_gpus
        for why, free in zip(topo.excluded, topo.free_gpus, strict=True)
    ]
    notes: list[str] = []
    if req.required_level is not None and req.required_level not in topo.levels:
        try:
            topo.level_index(req.required_level)
        except ValueError as exc:
            if req.mode == "Required":
                return Unplaceable("topology", str(exc))
            notes.append(f"ignored (Preferred): {exc}")
    refusal = _nvlink_refusal(topo, req)
    if refusal is not None:
        return refusal
    if previous is not None and len(previous.nodes) == req.nodes:
        return _replace(topo, req, previous, cand, cost_inputs)
    if previous is not None:
        notes.append(
            f"previous placement has {len(previous.nodes)} pods, the gang {req.nodes}: placed afresh"
        )
    return _place(topo, req, cand, cost_inputs, notes)


def _nvlink_refusal(topo: Topology, req: GangRequest) -> Unplaceable | None:
    """A TP group spanning pods needs the NVLink-domain level on the cluster and one domain
    that can hold it; else the reason, naming the field and the fix."""
    k = req.tp_pods
    if k == 1 or req.nvlink_level is None:
        return None
    what = (
        f"parallelism.tensor {req.tp} spans {k} nodes of procsPerNode {req.procs_per_node} and needs them "
        f"inside one NVLink domain (node label {req.nvlink_level}, topology.nvlinkLevel)"
    )
    if topo.nvlink_key != req.nvlink_level:
        return Unplaceable(
            "topology",
            f"{what}, but no candidate node carries that label; set tensor to a divisor of procsPerNode, "
            "or label each NVLink domain's nodes (NVIDIA GPU feature discovery sets nvidia.com/gpu.clique on "
            "GB200/GB300 NVL trays; name another key in topology.nvlinkLevel)",
        )
    nv = topo.nvlink_level
    largest = max(len(x) for x in topo.leaf_nodes) if topo.leaf_nodes else 0
    if largest < k:
        biggest = max(range(len(topo.leaf_nodes)), key=lambda d: (len(topo.leaf_nodes[d]), -d))
        return Unplaceable(
            "topology",
            f"{what}, but the largest NVLink domain ({topo.domain_names[nv][biggest]}) has {largest} nodes; "
            f"set tensor to at most {largest * req.procs_per_node} (a multiple or a divisor of procsPerNode)",
            short=k - largest,
        )
    return None


def _place(
    topo: Topology,
    req: GangRequest,
    cand: list[bool],
    cost_inputs: CostInputs | None,
    notes: list[str],
) -> Placement | Unplaceable:
    total = req.nodes + req.hot_spares
    available = sum(cand)
    what = f"{req.nodes} nodes + {req.hot_spares} hot spares with {req.gpus_needed} free GPUs each"
    if available < total:
        excl = _excluded_counts(topo, req.gpus_needed)
        detail = ", ".join(f"{k}: {v}" for k, v in sorted(excl.items()))
        return Unplaceable(
            "capacity",
            f"needs {what}; {available} usable nodes ({total - available} short; excluded: {detail or 'none'})",
            short=total - available,
            excluded=excl,
        )
    if not topo.levels:
        order = sorted(
            (i for i in range(topo.size) if cand[i]), key=lambda i: (topo.free_gpus[i], i)
        )
        gang = sorted(order[: req.nodes])
        spares = order[req.nodes : total]
        return _finish(topo, req, gang, spares, cost_inputs, notes)

    planner = _Planner(topo, req, cand)
    tree = planner.tree
    k = planner.unit
    units = req.nodes // k
    if k > 1 and sum(tree.free[0]) < units:
        room = sum(tree.free[0])
        where = "NVLink domain" if topo.nvlink_key else "leaf"
        return Unplaceable(
            "capacity",
            f"needs {units} tensor-parallel groups of {k} nodes, each inside one {where}; the usable nodes hold "
            f"{room} ({units - room} groups short; a domain holds its usable nodes // {k} groups)",
            short=(units - room) * k,
            excluded=_excluded_counts(topo, req.gpus_needed),
        )
    start_lv, doms = 0, list(range(len(topo.domain_names[0])))
    if req.required_level is not None and req.required_level in topo.levels:
        rl = topo.levels.index(req.required_level)
        fitting = [
            d for d in range(len(topo.domain_names[rl]))
            if tree.free[rl][d] >= units and tree.nfree[rl][d] >= total
        ]
        if fitting:
            best = min(
                fitting, key=lambda d: (planner.capb[rl][d] < planner.blocks, tree.nfree[rl][d], d)
            )
            start_lv, doms = rl, [best]
        elif req.mode == "Required":
            # nodes short per domain: for the gang plus spares, and (TP groups across nodes)
            # for the whole units its NVLink domains hold
            lack = [
                max(total - tree.nfree[rl][d], (units - tree.free[rl][d]) * k)
                for d in range(len(topo.domain_names[rl]))
            ]
            ranked = sorted(range(len(lack)), key=lambda d: (lack[d], -tree.nfree[rl][d], d))
            most = tree.nfree[rl][ranked[0]] if ranked else 0
            short = lack[ranked[0]] if ranked else total
            top = tuple(
                f"{topo.domain_names[rl][d]} ({tree.nfree[rl][d]} usable"
                + (f", {tree.free[rl][d]} TP groups of {k})" if k > 1 else ")")
                for d in ranked[:3]
            )
            unit_note = f" and {units} tensor-parallel groups of {k} nodes, each inside one NVLink domain" if k > 1 else ""
            return Unplaceable(
                "requiredLevel",
                f"topology.requiredLevel {req.required_level}: no single domain holds {what}{unit_note}; "
                f"the closest has {most} usable nodes ({short} short): {', '.join(top)}",
                short=short,
                domains=top,
            )
        else:
            notes.append(
                f"no single {req.required_level} domain holds the gang: spread over several (Preferred)"
            )
    gang, aligned = planner.gang(start_lv, doms)
    if not aligned:
        notes.append(
            "not enough room for whole data-parallel blocks in single leaves: blocks cut across leaves"
        )
    # spares: closest to the gang, best fit
    in_gang = set(gang)
    scope = {i for d in doms for lf in tree.leaves_under(start_lv, d) for i in tree.leaf_cands[lf]}
    used = [{topo.domain_of[lv][i] for i in gang} for lv in range(len(topo.levels))]
    rest = sorted(
        (i for i in scope if i not in in_gang),
        key=lambda i: (-_affinity(topo, used, i), topo.free_gpus[i], i),
    )
    spares = rest[: req.hot_spares]
    return _finish(topo, req, gang, spares, cost_inputs, notes)


def _replace(
    topo: Topology,
    req: GangRequest,
    prev: PreviousPlacement,
    cand: list[bool],
    cost_inputs: CostInputs | None,
) -> Placement | Unplaceable:
    notes: list[str] = []
    cand = list(cand)
    for name in prev.failed:
        if name in topo.index:
            cand[topo.index[name]] = False
    gang: list[int] = []
    lost: list[int] = []
    for p, name in enumerate(prev.nodes):
        i = topo.index.get(name, -1)
        if i >= 0 and cand[i] and name not in prev.failed:
            gang.append(i)
        else:
            gang.append(-1)
            lost.append(p)
    if not lost:
        kept_spares = [
            topo.index[s]
            for s in prev.spares
            if s in topo.index and cand[topo.index[s]] and s not in prev.failed
        ]
        return _finish(
            topo, req, gang, _top_up(topo, req, gang, kept_spares, cand, notes), cost_inputs, notes
        )
    taken = {i for i in gang if i >= 0}
    spare_set = {topo.index[s] for s in prev.spares if s in topo.index and s not in prev.failed}
    if req.mode == "Required" and req.required_level in topo.levels:
        # replacements and spares stay in the gang's required domain
        rl = topo.levels.index(req.required_level)
        kept_doms = {topo.domain_of[rl][i] for i in taken}
        if len(kept_doms) == 1:
            cand = [c and topo.domain_of[rl][i] in kept_doms for i, c in enumerate(cand)]
    pool = [i for i in range(topo.size) if cand[i] and i not in taken]
    if len(pool) < len(lost):
        excl = _excluded_counts(topo, req.gpus_needed)
        return Unplaceable(
            "capacity",
            f"re-placement needs {len(lost)} replacement nodes for pods {lost}; {len(pool)} usable "
            f"({len(lost) - len(pool)} short)",
            short=len(lost) - len(pool),
            excluded=excl,
        )
    pool_set = set(pool)
    if req.tp_pods > 1 and not taken:
        # nothing kept: every TP group moves whole, a fresh placement (required level, spares)
        fresh = _place(topo, req, cand, cost_inputs, ["every pod lost its node: placed afresh"])
        if isinstance(fresh, Placement):
            return dataclasses.replace(fresh, moved=tuple(range(req.nodes)))
        return fresh
    if req.tp_pods > 1:
        old_nodes = [topo.index.get(name, -1) for name in prev.nodes]
        return _replace_units(topo, req, gang, lost, old_nodes, pool_set, spare_set, cand, cost_inputs)
    nearest = _NearestFree(topo, pool_set)
    spares_left = sorted(spare_set & pool_set)
    for p in lost:
        old = topo.index.get(prev.nodes[p], -1)
        if spares_left:
            # a spare first: the one sharing the deepest domain, then best fit, then tree order
            depth = {i: _shared_depth(topo, old, i) if old >= 0 else 0 for i in spares_left}
            best = min(spares_left, key=lambda i: (-depth[i], topo.free_gpus[i], i))
            spares_left.remove(best)
        else:
            best = nearest.take(old)
        pool_set.discard(best)
        gang[p] = best
    kept_spares = spares_left
    notes.append(f"re-placed pods {lost}; {req.nodes - len(lost)} pods kept their nodes")
    spares = _top_up(topo, req, gang, kept_spares, cand, notes)
    return _finish(topo, req, gang, spares, cost_inputs, notes, moved=tuple(lost))


def _replace_units(
    topo: Topology,
    req: GangRequest,
    gang: list[int],
    lost: list[int],
    old_nodes: list[int],
    pool: set[int],
    spare_set: set[int],
    cand: list[bool],
    cost_inputs: CostInputs | None,
) -> Placement | Unplaceable:
    """Sticky re-placement when a TP group spans ``k`` pods: a lost pod's replacement must be
    in the NVLink domain of its group's kept pods (a spare there first, then the best-fitting
    free node there). When that domain has too few, the whole group moves to the domain
    nearest its old one with room for ``k`` (its kept pods' nodes are freed); the other
    groups keep their nodes."""
    k, cl = req.tp_pods, topo.leaf_level
    members: dict[int, list[int]] = {}

    def free_in(d: int) -> list[int]:
        """The pool's nodes of domain ``d``: spares first, then best fit, then tree order."""
        got = members.get(d)
        if got is None:
            got = members[d] = sorted(
                (i for i in topo.leaf_nodes[d] if i in pool),
                key=lambda i: (i not in spare_set, topo.free_gpus[i], i),
            )
        got[:] = [i for i in got if i in pool]
        return got

    notes: list[str] = []
    moved: set[int] = set(lost)
    for u in sorted({p // k for p in lost}):
        pods = range(u * k, u * k + k)
        kept = [gang[p] for p in pods if gang[p] >= 0]
        missing = [p for p in pods if gang[p] < 0]
        doms = {topo.domain_of[cl][i] for i in kept}
        if len(doms) == 1:
            here = free_in(doms.pop())
            if len(here) >= len(missing):
                for p, i in zip(missing, here, strict=False):
                    gang[p] = i
                    pool.discard(i)
                continue
        # the whole group moves: to the domain sharing the most levels with its old one
        old = kept[0] if kept else next((old_nodes[p] for p in pods if old_nodes[p] >= 0), -1)
        for p in pods:
            if gang[p] >= 0:
                pool.add(gang[p])
                members.pop(topo.domain_of[cl][gang[p]], None)
                gang[p] = -1
        rooms = [d for d in range(len(topo.leaf_nodes)) if len(free_in(d)) >= k]
        if not rooms:
            return Unplaceable(
                "capacity",
                f"re-placement: tensor-parallel group {u} (pods {list(pods)}) needs {k} usable nodes inside one "
                f"{'NVLink domain' if topo.nvlink_key else 'leaf'}; none has that many free",
                short=k,
                excluded=_excluded_counts(topo, req.gpus_needed),
            )
        best = min(
            rooms,
            key=lambda d: (
                -_shared_depth(topo, old, topo.leaf_nodes[d][0]) if old >= 0 else 0,
                len(free_in(d)),
                d,
            ),
        )
        for p, i in zip(pods, free_in(best)[:k], strict=True):
            gang[p] = i
            pool.discard(i)
        moved.update(pods)
        notes.append(
            f"tensor-parallel group {u} moved whole to {topo.domain_names[cl][best]}: its domain had no free node"
        )
    kept_spares = sorted(spare_set & pool)
    notes.insert(0, f"re-placed pods {sorted(moved)}; {req.nodes - len(moved)} pods kept their nodes")
    spares = _top_up(topo, req, gang, kept_spares, cand, notes)
    return _finish(topo, req, gang, spares, cost_inputs, notes, moved=tuple(sorted(moved)))


def _top_up(
    topo: Topology,
    req: GangRequest,
    gang: list[int],
    spares: list[int],
    cand: list[bool],
    notes: list[str],
) -> list[int]:
    in_gang = set(gang)
    spares = [i for i in spares if i not in in_gang][: req.hot_spares]
    if len(spares) >= req.hot_spares:
        return spares
    taken = in_gang | set(spares)
    used = [{topo.domain_of[lv][i] for i in gang} for lv in range(len(topo.levels))]
    extra = sorted(
        (i for i in range(topo.size) if cand[i] and i not in taken),
        key=lambda i: (-_affinity(topo, used, i), topo.free_gpus[i], i),
    )
    spares = spares + extra[: req.hot_spares - len(spares)]
    if len(spares) < req.hot_spares:
        notes.append(f"only {len(spares)} of {req.hot_spares} hot spares available")
    return spares


def build_gang_request(
    job: TrainingJob, *, nodes: Sequence[Mapping[str, Any]] = (), attempt: int = 0
) -> GangRequest:
    """The GangRequest for a TrainingJob. ``nodes`` resolves a preset with several label
    families (topograph) to the one the cluster carries. A job whose tensor-parallel group
    spans nodes (tensor > procsPerNode) gets the NVLink-domain level below its leaf."""
    spec = job.spec
    topo = spec.topology
    levels = resolve_level_keys(topo.preset, topo.levels, nodes)
    nvlink = resolve_nvlink_key(topo.preset, topo.nvlink_level, nodes)
    if spec.parallelism.tensor > spec.procs_per_node:
        levels = (*(k for k in levels if k != nvlink), nvlink)  # the deepest level
    return GangRequest(
        job=job.metadata.name or "",
        nodes=spec.nodes,
        procs_per_node=spec.procs_per_node,
        pp=spec.parallelism.pipeline,
        dp=spec.data_parallel,
        tp=spec.parallelism.tensor,
        hot_spares=spec.gang.hot_spares,
        levels=levels,
        mode=topo.mode,
        required_level=topo.required_level
        if topo.mode == "Required" or topo.required_level
        else None,
        tolerations=job_tolerations(job),
        gpus_per_pod=spec.gpus_per_pod,
        attempt=attempt,
        replicas=spec.replica_groups,
        nvlink_level=nvlink,
    )


def job_tolerations(job: TrainingJob) -> tuple[Toleration, ...]:
    """The tolerations of the job's pods (``spec.tolerations``), as placement matches them."""
    return tuple(Toleration.from_dict(t.model_dump(exclude_none=True)) for t in job.spec.tolerations)


def matches_node_selector(node: Mapping[str, Any], selector: Mapping[str, str]) -> bool:
    """Whether the Node's labels carry every ``key: value`` of ``spec.nodeSelector`` (the rule is
    :func:`railyard.api.corev1.labels_match`, the local scheduler's too)."""
    return labels_match(selector, (node.get("metadata") or {}).get("labels") or {})


def build_placement_input(
    job: TrainingJob,
    *,
    nodes: Sequence[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]] = (),
    attempt: int = 0,
    previous_nodes: Sequence[str] | None = None,
    previous_spares: Sequence[str] = (),
    failed: Iterable[str] = (),
    cost_inputs: CostInputs | None = None,
    cache: TopologyCache | None = None,
) -> PlacementInput:
    """The one place a placement decision's input is made, from the job and the cluster.

    ``nodes``: Node dicts (kopf's index, ``kubectl get nodes -o yaml``, a generated cluster);
    only those matching ``spec.nodeSelector`` are candidates, and readiness, cordons, taints
    against ``spec.tolerations`` and our quarantine marks exclude nodes. ``pods``: pods bound
    to nodes (their GPUs are in use; this job's own are not counted). ``previous_nodes``: the
    last attempt's nodes by pod index, ``previous_spares`` its hot spares, ``failed`` the nodes
    to move off (the job's quarantined nodes): sticky re-placement. ``cache``: what the last
    call derived from the same Node objects (:class:`~railyard.logic.topology.TopologyCache`),
    for callers that decide again and again on one cluster; the answer is the same without."""
    selector = job.spec.node_selector
    selected = [n for n in nodes if matches_node_selector(n, selector)] if selector else list(nodes)
    req = build_gang_request(job, nodes=selected, attempt=attempt)
    topo = build_topology(
        selected, pods, levels=req.levels, tolerations=req.tolerations, ignore_job=req.job, cache=cache,
        nvlink_level=req.nvlink_level,
    )
    previous = None
    if previous_nodes:
        previous = PreviousPlacement(tuple(previous_nodes), tuple(previous_spares), frozenset(failed))
    return PlacementInput(topo, req, previous, cost_inputs)
