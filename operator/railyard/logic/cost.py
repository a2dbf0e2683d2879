"""Cost model: bytes per training step that cross each topology level, and the time they take.

Used to score placements, to report in the TrainingJob status and in a metric, and by the
benchmark to compare against baselines. The collectives come from the layout:

- data parallel (FSDP): reduce-scatter of gradients plus all-gather of parameters, as a ring over
  the group's ranks in dp order; each hop carries ``2 * (k - 1) / k * X`` bytes, where ``X`` is
  the group's share of the parameters (``param_bytes / (pp * tp)``);
- pipeline parallel: point-to-point activations forward and their gradients backward,
  ``2 * microbatches * activation_bytes / tp`` per rank pair between adjacent stages;
- tensor parallel: an all-reduce ring of ``tp_bytes_per_step`` per TP group.

A hop between two ranks on the same node counts as ``host`` (NVLink inside the node). When the
topology has an NVLink-domain level (``Topology.nvlink_key``: a rack-scale NVLink fabric such as
a GB200 NVL72), a hop between two nodes of one domain counts as ``nvlink`` (it never touches the
network). Every other hop counts as ``network``, and also under each switch level key whose
domains differ for the two nodes (cumulative: a hop that crosses a spine also crosses a leaf;
the NVLink level itself is not listed, the bytes leaving a domain are the ``network`` row). A
network hop between different rails counts in ``cross_rail`` as well. Time per level is the
busiest sender's bytes at that level over the level's bandwidth (each rank sends on its own
rail's NIC, and over its own GPU's NVLink ports for ``nvlink``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from railyard.logic.layout import ranks_in_order
from railyard.logic.topology import Topology
from railyard.protocol.ranktable import RankTable

HOST = "host"
NVLINK = "nvlink"
NETWORK = "network"

#: NVLink bandwidth per node (bytes/s, ~900 GB/s on H100/H200 HGX).
DEFAULT_HOST_BW = 900e9
#: One 400 Gb/s NIC per rail (bytes/s).
DEFAULT_NIC_BW = 400e9 / 8
#: NVLink 5 per GPU across an NVLink domain (bytes/s one way: 1.8 TB/s bidirectional, GB200 NVL72).
DEFAULT_NVLINK_DOMAIN_BW = 900e9


@dataclass(frozen=True, slots=True)
class CostInputs:
    """Model sizes and link speeds. Defaults: an 8B-parameter model in bf16."""

    param_bytes: float = 16e9
    #: Activation bytes sent from one stage to the next per microbatch per DP replica.
    activation_bytes: float = 64 * 2**20
    microbatches: int = 8
    #: Bytes all-reduced per TP group per step.
    tp_bytes_per_step: float = 0.0
    host_bandwidth: float = DEFAULT_HOST_BW
    nic_bandwidth: float = DEFAULT_NIC_BW
    #: Per GPU between the nodes of one NVLink domain.
    nvlink_bandwidth: float = DEFAULT_NVLINK_DOMAIN_BW
    #: Per level key (bytes/s per rail): a slower value models an oversubscribed tier.
    level_bandwidth: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class LevelCost:
    level: str
    bytes_per_step: float
    seconds: float


@dataclass(frozen=True, slots=True)
class CostReport:
    #: ``host``, ``nvlink`` (with an NVLink-domain level), ``network``, then each switch level
    #: key from the leaf up to the broadest.
    levels: tuple[LevelCost, ...]
    cross_rail_bytes: float

    @property
    def nvlink_bytes(self) -> float:
        """Bytes per step between nodes of one NVLink domain (0 without such a level)."""
        return self.bytes_at(NVLINK)

    def bytes_at(self, level: str) -> float:
        return next((c.bytes_per_step for c in self.levels if c.level == level), 0.0)

    @property
    def bottleneck_seconds(self) -> float:
        return max((c.seconds for c in self.levels), default=0.0)

    def as_dict(self) -> dict[str, float]:
        out = {c.level: c.bytes_per_step for c in self.levels}
        out["cross_rail"] = self.cross_rail_bytes
        return out


def compute_cost(table: RankTable, topo: Topology, inputs: CostInputs | None = None) -> CostReport:
    """The per-step traffic of ``table`` (whose nodes are in ``topo``) per topology level."""
    ci = inputs or CostInputs()
    ranks = ranks_in_order(table)
    n_lv = len(topo.levels)
    # Per pod: domain ids broadest first; -1 node index for nodes unknown to the topology (they
    # then count as crossing every level).
    pod_doms: list[tuple[int, ...]] = []
    for pe in table.pods:
        i = topo.index.get(pe.node, -1)
        pod_doms.append(
            tuple(topo.domain_of[lv][i] for lv in range(n_lv))
            if i >= 0
            else tuple([-1 - pe.pod_index] * n_lv)
        )
    pods_by_index = {pe.pod_index: k for k, pe in enumerate(table.pods)}
    rank_pod = [pods_by_index[e.pod_index] for e in ranks]
    rank_rail = [e.rail for e in ranks]

    # depth d in 0..n_lv-1: first level whose domain differs; n_lv: same leaf, other node.
    exclusive = [0.0] * (n_lv + 2)  # [..levels.., same-leaf network, host]
    sender: dict[tuple[int, int], list[float]] = {}
    cross_rail = 0.0
    depth_cache: dict[tuple[int, int], int] = {}
    # network hops: depth <= net (with an NVLink level, depth n_lv is inside one domain: NVLink)
    net = n_lv - 1 if topo.nvlink_key else n_lv

    def hop(a: int, b: int, nbytes: float) -> None:
        nonlocal cross_rail
        pa, pb = rank_pod[a], rank_pod[b]
        if pa == pb:
            exclusive[n_lv + 1] += nbytes
            key = (pa, -1)
            vec = sender.get(key)
            if vec is None:
                vec = sender[key] = [0.0] * (n_lv + 2)
            vec[n_lv + 1] += nbytes
            return
        k = (pa, pb)
        depth = depth_cache.get(k)
        if depth is None:
            da, db = pod_doms[pa], pod_doms[pb]
            depth = n_lv
            for lv in range(n_lv):
                if da[lv] != db[lv]:
                    depth = lv
                    break
            depth_cache[k] = depth
        exclusive[depth] += nbytes
        if rank_rail[a] != rank_rail[b] and depth <= net:
            cross_rail += nbytes
        key = (pa, rank_rail[a])
        vec = sender.get(key)
        if vec is None:
            vec = sender[key] = [0.0] * (n_lv + 2)
        vec[depth] += nbytes

    pp, dp, tp = table.pp, table.dp, table.tp
    if dp > 1 and ci.param_bytes > 0:
        per_hop = 2.0 * (dp - 1) / dp * ci.param_bytes / (pp * tp)
        for p in range(pp):
            for t in range(tp):
                base = p * dp * tp + t
                prev = base + (dp - 1) * tp
                for d in range(dp):
                    cur = base + d * tp
                    hop(prev, cur, per_hop)
                    prev = cur
    if pp > 1 and ci.activation_bytes > 0:
        per_pair = 2.0 * ci.microbatches * ci.activation_bytes / tp
        stride = dp * tp
        for r in range((pp - 1) * stride):
            hop(r, r + stride, per_pair)
    if tp > 1 and ci.tp_bytes_per_step > 0:
        per_hop = 2.0 * (tp - 1) / tp * ci.tp_bytes_per_step
        for g in range(pp * dp):
            base = g * tp
            for t in range(tp):
                hop(base + t, base + (t + 1) % tp, per_hop)

    levels: list[LevelCost] = []
    host_max = max((v[n_lv + 1] for v in sender.values()), default=0.0)
    levels.append(LevelCost(HOST, exclusive[n_lv + 1], host_max / ci.host_bandwidth))
    if topo.nvlink_key:
        nvl_max = max((v[n_lv] for v in sender.values()), default=0.0)
        levels.append(LevelCost(NVLINK, exclusive[n_lv], nvl_max / ci.nvlink_bandwidth))
    # cumulative network bytes at "depth <= lv"
    net_bytes = sum(exclusive[: net + 1])
    net_max = max((sum(v[: net + 1]) for v in sender.values()), default=0.0)
    levels.append(LevelCost(NETWORK, net_bytes, net_max / ci.nic_bandwidth))
    for lv in range(net - 1 if topo.nvlink_key else n_lv - 1, -1, -1):
        key = topo.levels[lv]
        b = sum(exclusive[: lv + 1])
        m = max((sum(v[: lv + 1]) for v in sender.values()), default=0.0)
        bw = ci.level_bandwidth.get(key, ci.nic_bandwidth)
        levels.append(LevelCost(key, b, m / bw))
    return CostReport(levels=tuple(levels), cross_rail_bytes=cross_rail)
