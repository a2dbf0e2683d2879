"""Rank layout: which pod and local rank every global rank of a ``pp x dp x tp`` mesh runs on.

The mesh order is fixed by the trainer (``rank == (pp * dp_size + dp) * tp_size + tp``, tp
innermost); what we choose is where each rank runs. With ``S = procs_per_node / tp`` tensor-
parallel groups per pod, TP group ``g = p * dp_size + d`` goes to pod ``g % nodes`` in slot
``g // nodes`` (local ranks ``slot * tp .. slot * tp + tp - 1``). Hence:

- a TP group never leaves a pod (tp divides procs_per_node);
- when ``S`` divides ``pp`` every data-parallel group ``(p, t)`` uses one slot, so all its ranks
  share a local GPU index and therefore a rail; the pods then fall into ``nodes / dp`` blocks of
  ``dp`` consecutive pod indices, each hosting whole DP groups, which placement packs into as
  few leaf domains as possible;
- otherwise (e.g. pure data parallelism with several ranks per pod) a DP group spans the fewest
  slots a contiguous run allows, and :func:`compute_rails_per_dp_group` reports how many rails.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from railyard.protocol.ranktable import PodEntry, RankEntry, RankTable


@dataclass(frozen=True, slots=True)
class MeshShape:
    """The gang's shape; self-validating like torchtitan's ParallelDims."""

    nodes: int
    procs_per_node: int
    pp: int = 1
    dp: int = 1
    tp: int = 1

    def problems(self) -> list[str]:
        """Every inconsistency at once, each naming its field and the fix."""
        out: list[str] = []
        for name in ("nodes", "procs_per_node", "pp", "dp", "tp"):
            if getattr(self, name) < 1:
                out.append(f"{name}: must be >= 1, got {getattr(self, name)}")
        if out:
            return out
        world = self.nodes * self.procs_per_node
        if self.pp * self.dp * self.tp != world:
            out.append(
                f"parallelism: pipeline x data x tensor = {self.pp}x{self.dp}x{self.tp} = "
                f"{self.pp * self.dp * self.tp} but nodes x procsPerNode = {world}; "
                f"set parallelism.data to {world // (self.pp * self.tp) if world % (self.pp * self.tp) == 0 else 'a divisor'} or change nodes"
            )
        if self.procs_per_node % self.tp:
            out.append(
                f"parallelism.tensor: {self.tp} does not divide procsPerNode {self.procs_per_node}; "
                "a tensor-parallel group must stay inside one node"
            )
        return out

    @property
    def slots_per_node(self) -> int:
        return self.procs_per_node // self.tp

    @property
    def rail_pure(self) -> bool:
        """Whether every DP group can share one local GPU index (rail)."""
        return self.pp % self.slots_per_node == 0

    @property
    def block_nodes(self) -> int:
        """Pods per placement block: ``dp`` when layouts are rail-pure (each block holds whole
        DP groups), else 1 (no block structure)."""
        return self.dp if self.rail_pure else 1

    def position(self, rank: int) -> tuple[int, int]:
        """(pod index, local rank) of a global rank."""
        g, t = divmod(rank, self.tp)
        slot, pod = divmod(g, self.nodes)
        return pod, slot * self.tp + t

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(pp, dp, tp) coordinates of a global rank."""
        g, t = divmod(rank, self.tp)
        p, d = divmod(g, self.dp)
        return p, d, t

    def rank_of(self, p: int, d: int, t: int) -> int:
        return (p * self.dp + d) * self.tp + t


def build_rank_table(
    *,
    job: str,
    attempt: int,
    shape: MeshShape,
    pod_nodes: Sequence[str],
    pod_rail_offset: Sequence[int],
    pod_gpus: Sequence[int],
    replica_peers: Sequence[int] | None = None,
) -> RankTable:
    """The rank table for pods placed on ``pod_nodes`` (pod index -> node name)."""
    n, tp, dp = shape.nodes, shape.tp, shape.dp
    if len(pod_nodes) != n:
        raise ValueError(f"pod_nodes: {len(pod_nodes)} nodes for a gang of {n}")
    peers = replica_peers if replica_peers is not None else [-1] * n
    pods = tuple(PodEntry(pod_index=i, node=pod_nodes[i], replica_peer=peers[i]) for i in range(n))
    ranks: list[RankEntry] = []
    append = ranks.append
    world = n * shape.procs_per_node
    for r in range(world):
        g, t = divmod(r, tp)
        slot, pod = divmod(g, n)
        p, d = divmod(g, dp)
        local = slot * tp + t
        gp = pod_gpus[pod]
        rail = (local + pod_rail_offset[pod]) % gp if gp > 0 else local
        append(RankEntry(r, pod_nodes[pod], pod, local, rail, p, d, t))
    return RankTable(
        job=job,
        attempt=attempt,
        pp=shape.pp,
        dp=dp,
        tp=tp,
        procs_per_node=shape.procs_per_node,
        pods=pods,
        ranks=tuple(ranks),
    )


def ranks_in_order(table: RankTable) -> tuple[RankEntry, ...]:
    """The table's entries indexed by global rank."""
    ranks = table.ranks
    if all(e.rank == i for i, e in enumerate(ranks)):
        return ranks
    return tuple(sorted(ranks, key=lambda e: e.rank))


def compute_dp_groups(table: RankTable) -> list[list[int]]:
    """Ranks of every data-parallel group ``(p, t)``, each in ring (dp) order."""
    tp, dp = table.tp, table.dp
    return [[(p * dp + d) * tp + t for d in range(dp)] for p in range(table.pp) for t in range(tp)]


def compute_rails_per_dp_group(table: RankTable) -> int:
    """The largest number of distinct rails any data-parallel group uses (1 = rail-aligned)."""
    ranks = ranks_in_order(table)
    return max((len({ranks[r].rail for r in grp}) for grp in compute_dp_groups(table)), default=0)
