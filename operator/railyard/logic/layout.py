"""Rank layout: which pod and local rank every global rank of a ``pp x dp x tp`` mesh runs on.

The arithmetic (:class:`railyard.protocol.mesh.MeshShape`) is shared with the trainer; this
module builds the rank table from it. The mesh order is fixed by the trainer
(``rank == (pp * dp_size + dp) * tp_size + tp``, tp innermost); what we choose is where each rank runs. With ``S =
procs_per_node / tp`` tensor-
parallel groups per pod, TP group ``g = p * dp_size + d`` goes to pod ``g % nodes`` in slot
``g // nodes`` (local ranks ``slot * tp .. slot * tp + tp - 1``). Hence:

- a TP group never leaves a pod when tp divides procs_per_node; when tp is a multiple of it, a
  TP group spans ``tp / procs_per_node`` consecutive pods (a unit, placed inside one NVLink
  domain) and every DP group shares one local GPU index (:class:`~railyard.protocol.mesh.MeshShape`);
- when ``S`` divides ``pp`` every data-parallel group ``(p, t)`` uses one slot, so all its ranks
  share a local GPU index and therefore a rail; the pods then fall into ``nodes / dp`` blocks of
  ``dp`` consecutive pod indices, each hosting whole DP groups, which placement packs into as
  few leaf domains as possible;
- otherwise (e.g. pure data parallelism with several ranks per pod) a DP group spans the fewest
  slots a contiguous run allows, and :func:`compute_rails_per_dp_group` reports how many rails.
"""

from __future__ import annotations

from collections.abc import Sequence

from railyard.protocol.mesh import MeshShape, mesh_rank, pods_of_group, pods_per_group
from railyard.protocol.ranktable import PodEntry, RankEntry, RankTable

__all__ = [
    "MeshShape", "build_rank_table", "build_replica_group_table", "compute_dp_groups", "compute_rails_per_dp_group",
    "ranks_in_order",
]


def compute_rail(local_rank: int, rail_offset: int, gpus: int) -> int:
    """The rail of a local rank: GPU ``i`` of a node is on rail ``(i + offset) % gpus``."""
    return (local_rank + rail_offset) % gpus if gpus > 0 else local_rank


def compute_dp_group_spread(
    shape: MeshShape, *, pod_rail_offset: Sequence[int], pod_gpus: Sequence[int], pod_domain: Sequence[int]
) -> tuple[int, int, int]:
    """Over every data-parallel group: the most rails one uses, the most domains of
    ``pod_domain`` (e.g. leaves) one spans, and the most pods one holds. Computed from the
    layout without building the rank table (placement asks this for every decision)."""
    # Group (p, t) holds TP groups g = p * dp + d (d < dp), on pod g % nodes at local rank
    # (g // nodes) * tp + t: its pods do not depend on t, and its rails only on the distinct
    # (slot base, rail offset, GPUs) of those pods, usually one. So pp x dp steps, not pp x dp x tp.
    # When a TP group spans K pods (tp = K x procs_per_node), rank t of it is on the unit's pod
    # t // procs_per_node: the group's pods depend on that quotient q, so pp x K x dp steps.
    tp, dp = shape.tp, shape.dp
    k = shape.pods_per_tp_group
    span = shape.procs_per_node if k > 1 else tp
    most_rails = most_domains = most_pods = 0
    for p in range(shape.pp):
        for q in range(k):
            pods: set[int] = set()
            wiring: set[tuple[int, int, int]] = set()
            first = p * dp * tp + q * span  # rank q * span of TP group p * dp, then every TP group's
            for pod, base in shape.positions(range(first, first + dp * tp, tp)):
                pods.add(pod)
                wiring.add((base, pod_rail_offset[pod], pod_gpus[pod]))
            for t in range(span):
                rails = {compute_rail(base + t, offset, gpus) for base, offset, gpus in wiring}
                most_rails = max(most_rails, len(rails))
            most_pods = max(most_pods, len(pods))
            most_domains = max(most_domains, len({pod_domain[x] for x in pods}))
    return most_rails, most_domains, most_pods


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
    n = shape.nodes
    if len(pod_nodes) != n:
        raise ValueError(f"pod_nodes: {len(pod_nodes)} nodes for a gang of {n}")
    peers = replica_peers if replica_peers is not None else [-1] * n
    pods = tuple(PodEntry(pod_index=i, node=pod_nodes[i], replica_peer=peers[i]) for i in range(n))
    ranks: list[RankEntry] = []
    append = ranks.append
    for r, pod, local, p, d, t in shape.layout():
        rail = compute_rail(local, pod_rail_offset[pod], pod_gpus[pod])
        append(RankEntry(r, pod_nodes[pod], pod, local, rail, p, d, t))
    return RankTable(
        job=job,
        attempt=attempt,
        pp=shape.pp,
        dp=shape.dp,
        tp=shape.tp,
        procs_per_node=shape.procs_per_node,
        pods=pods,
        ranks=tuple(ranks),
    )


def build_replica_group_table(table: RankTable, *, group: int, replicas: int, master_port: int) -> RankTable:
    """The rank table of replica group ``group`` of ``replicas`` (faultTolerance ReplicaGroups):
    a world of its own, cut from the job's table (laid out by a ``MeshShape`` with
    ``replicas``, so the group's ranks sit on its own pods ``group * n / replicas ..``). Its ranks
    are renumbered ``0 .. world / replicas - 1`` in the group's ``pp x dp / replicas x tp``
    order; pods keep their global index (``RAILYARD_POD_INDEX``), nodes, local ranks and rails;
    a checkpoint replica peer outside the group is dropped (-1: the launcher of one world knows
    only its own pods). The rendezvous is the group's first pod on ``master_port``."""
    if replicas < 1 or len(table.pods) % replicas or table.dp % replicas or not 0 <= group < replicas:
        raise ValueError(
            f"replica group {group} of {replicas}: does not split {len(table.pods)} pods and data-parallel size "
            f"{table.dp}"
        )
    share = table.dp // replicas
    group_pods = pods_of_group(group, pods_per_group(len(table.pods), replicas))
    pods = sorted(table.pods, key=lambda p: p.pod_index)[group_pods.start:group_pods.stop]
    mine = {p.pod_index for p in pods}
    ranks = sorted(
        (
            RankEntry(
                mesh_rank(e.pp, e.dp - group * share, e.tp, share, table.tp),
                e.node,
                e.pod_index,
                e.local_rank,
                e.rail,
                e.pp,
                e.dp - group * share,
                e.tp,
            )
            for e in table.ranks
            if e.dp // share == group
        ),
        key=lambda e: e.rank,
    )
    if {e.pod_index for e in ranks} != mine:
        raise ValueError(
            f"replica group {group}: the table's ranks of this group are not on its pods {sorted(mine)}; lay it out "
            f"with MeshShape(replicas={replicas})"
        )
    return RankTable(
        job=table.job,
        attempt=table.attempt,
        pp=table.pp,
        dp=share,
        tp=table.tp,
        procs_per_node=table.procs_per_node,
        pods=tuple(
            PodEntry(p.pod_index, p.node, p.address, p.replica_peer if p.replica_peer in mine else -1) for p in pods
        ),
        ranks=tuple(ranks),
        master_addr=pods[0].address,
        master_port=master_port,
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
    step = mesh_rank(0, 1, 0, dp, tp)
    return [
        list(range(mesh_rank(p, 0, t, dp, tp), mesh_rank(p, dp, t, dp, tp), step))
        for p in range(table.pp)
        for t in range(tp)
    ]


def compute_rails_per_dp_group(table: RankTable) -> int:
    """The largest number of distinct rails any data-parallel group uses (1 = rail-aligned)."""
    ranks = ranks_in_order(table)
    return max((len({ranks[r].rail for r in grp}) for grp in compute_dp_groups(table)), default=0)
