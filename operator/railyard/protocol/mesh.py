"""The mesh arithmetic of a ``pp x dp x tp`` gang, written once for the operator and the trainer.

The mesh order is ``("pp", "dp", "tp")`` with tp innermost, so
``rank == (pp * dp_size + dp) * tp_size + tp`` (the rank order of
``torch.distributed.device_mesh.init_device_mesh(..., (pp, dp, tp))``). The operator's placement
and rank table (:mod:`railyard.logic.layout`), the API's derived data-parallel degree and the
trainer's ``ParallelDims`` all use these functions, so the two sides cannot disagree on which
rank sits where or which shapes are valid. Standard library only; self-validating like
torchtitan's ``ParallelDims``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

MESH_DIM_NAMES = ("pp", "dp", "tp")


def derive_data_parallel(world_size: int, pp: int, tp: int) -> int:
    """``world_size / (pp x tp)``, or 0 when that does not divide (the shape is invalid)."""
    denom = pp * tp
    if denom < 1 or world_size % denom:
        return 0
    return world_size // denom


def check_mesh(*, world_size: int, procs_per_node: int, pp: int, dp: int, tp: int) -> list[str]:
    """Every inconsistency of a mesh at once, each naming its field and the fix (empty: valid).

    ``dp`` must already be derived (see :func:`derive_data_parallel`)."""
    out: list[str] = []
    for name, value in (
        ("pp", pp),
        ("dp", dp),
        ("tp", tp),
        ("world_size", world_size),
        ("procs_per_node", procs_per_node),
    ):
        if value < 1:
            out.append(f"{name}: must be >= 1, got {value}")
    if out:
        return out
    if pp * dp * tp != world_size:
        fit = derive_data_parallel(world_size, pp, tp)
        out.append(
            f"parallelism: pipeline x data x tensor = {pp}x{dp}x{tp} = {pp * dp * tp}, but the world size is "
            f"{world_size} (nodes x procsPerNode); set parallelism.data to {fit or 'a divisor'} or change nodes"
        )
    if problem := tensor_layout_problem(tp, procs_per_node):
        out.append(f"parallelism.tensor: {problem}")
    return out


def tensor_layout_problem(tp: int, procs_per_node: int) -> str:
    """Why ``tp`` cannot be laid out on nodes of ``procs_per_node`` ranks ("" when it can): a
    tensor-parallel group lies inside one node (``tp`` divides ``procs_per_node``) or spans
    ``tp / procs_per_node`` whole nodes of one NVLink domain (``tp`` a multiple of it)."""
    if procs_per_node % tp and tp % procs_per_node:
        return (
            f"{tp} neither divides procsPerNode {procs_per_node} (a tensor-parallel group "
            "inside one node) nor is a multiple of it (a group spanning tensor / procsPerNode whole nodes of one "
            "NVLink domain); set tensor to a divisor or a multiple of procsPerNode"
        )
    return ""


def mesh_coordinates(rank: int, dp: int, tp: int) -> tuple[int, int, int]:
    """(pp, dp, tp) coordinates of a global rank."""
    g, t = divmod(rank, tp)
    p, d = divmod(g, dp)
    return p, d, t


def mesh_rank(p: int, d: int, t: int, dp: int, tp: int) -> int:
    """The global rank at mesh coordinates (p, d, t)."""
    return (p * dp + d) * tp + t


def pods_per_group(pods: int, replicas: int) -> int:
    """Pods per replica group: a gang of ``pods`` split into ``replicas`` groups of consecutive
    pods (the whole gang for one group; at least 1)."""
    return max(pods // max(replicas, 1), 1)


def group_of_pod_index(pod_index: int, group_pods: int) -> int:
    """The replica group of a pod index: the groups are ``group_pods`` consecutive pods each (the
    one rule; :meth:`MeshShape.group_of_pod`, the operator's recovery and the heartbeat store ask it)."""
    return pod_index // max(group_pods, 1)


def pods_of_group(group: int, group_pods: int) -> range:
    """The pod indices of one replica group (the inverse of :func:`group_of_pod_index`)."""
    return range(group * group_pods, (group + 1) * group_pods)


def job_rank_of_group_rank(rank: int, *, group: int, replicas: int, pp: int, dp: int, tp: int) -> int:
    """The job-wide rank of ``rank`` of replica group ``group`` (faultTolerance ReplicaGroups).

    Each group is a world of its own, ``pp x dp / replicas x tp``, numbered from 0 in that
    order, and holds the job's data indices ``group * dp / replicas ..`` (see
    :class:`MeshShape`); its heartbeats carry ranks of that world. This maps them back to the
    job's ``pp x dp x tp`` mesh, where every rank of every group has its own number."""
    if replicas < 1 or dp % replicas or not 0 <= group < replicas:
        raise ValueError(f"replica group {group} of {replicas} does not split data-parallel size {dp}")
    share = dp // replicas
    if not 0 <= rank < pp * share * tp:
        raise ValueError(f"rank {rank} is outside replica group {group}'s world of {pp * share * tp}")
    p, d, t = mesh_coordinates(rank, share, tp)
    return mesh_rank(p, group * share + d, t, dp, tp)


@dataclass(frozen=True, slots=True)
class MeshShape:
    """A gang's shape: ``nodes`` pods of ``procs_per_node`` ranks split ``pp x dp x tp``.

    Where a rank runs is the operator's choice (:meth:`position`): with ``S = procs_per_node /
    tp`` tensor-parallel groups per pod, TP group ``g = p * dp + d`` goes to pod ``g % nodes``
    in slot ``g // nodes``, so a TP group never leaves a pod and, when ``S`` divides ``pp``,
    every data-parallel group shares one local GPU index (one rail).

    ``tp`` a multiple of ``procs_per_node`` (a rack-scale NVLink domain, e.g. GB200 NVL72):
    each TP group spans ``K = tp / procs_per_node`` consecutive pods, a *unit*; TP group ``g``
    takes unit ``g`` (pods ``g * K .. g * K + K - 1``), its rank ``t`` on pod ``g * K + t //
    procs_per_node`` at local rank ``t % procs_per_node``. Every data-parallel group then shares
    one local GPU index (one rail), and placement keeps each unit inside one NVLink domain.

    ``replicas`` > 1 (``faultTolerance.mode: ReplicaGroups``): the data dimension's outermost
    factor splits the gang into that many replica groups, each its own world of ``nodes /
    replicas`` consecutive pods (group ``r`` holds data indices ``r * dp / replicas ..``); the
    rule above then applies inside each group, so no pod holds ranks of two groups."""

    nodes: int
    procs_per_node: int
    pp: int = 1
    dp: int = 1
    tp: int = 1
    replicas: int = 1

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    def problems(self) -> list[str]:
        """Every inconsistency at once, each naming its field and the fix."""
        if self.nodes < 1:
            return [f"nodes: must be >= 1, got {self.nodes}"]
        out = check_mesh(
            world_size=self.world_size, procs_per_node=self.procs_per_node, pp=self.pp, dp=self.dp, tp=self.tp
        )
        r = self.replicas
        if r < 1:
            out.append(f"parallelism.dataReplicas: must be >= 1, got {r}")
        elif r > 1:
            if self.nodes % r:
                out.append(
                    f"nodes: {self.nodes} is not a multiple of parallelism.dataReplicas {r}; with faultTolerance.mode "
                    "ReplicaGroups every replica group is nodes / dataReplicas whole pods: set nodes to a multiple of "
                    "dataReplicas"
                )
            if self.dp % r:
                out.append(f"parallelism.dataReplicas: {r} does not divide the data-parallel degree {self.dp}")
        return out

    @property
    def group_nodes(self) -> int:
        """Pods per replica group (the whole gang when ``replicas`` is 1)."""
        return self.nodes // self.replicas

    def group_of_pod(self, pod: int) -> int:
        """The replica group of a pod index (0 when ``replicas`` is 1)."""
        return group_of_pod_index(pod, self.group_nodes)

    @property
    def group_shape(self) -> MeshShape:
        """One replica group's own world: ``nodes / replicas`` pods, ``dp / replicas`` data ranks."""
        if self.replicas == 1:
            return self
        return MeshShape(self.group_nodes, self.procs_per_node, self.pp, self.dp // self.replicas, self.tp)

    @property
    def slots_per_node(self) -> int:
        """TP groups per pod (1 when a TP group spans several pods)."""
        return max(self.procs_per_node // self.tp, 1)

    @property
    def pods_per_tp_group(self) -> int:
        """Pods one TP group spans: 1, or ``tp / procs_per_node`` (a unit inside one NVLink domain)."""
        return max(self.tp // self.procs_per_node, 1)

    @property
    def rail_pure(self) -> bool:
        """Whether every DP group can share one local GPU index (rail)."""
        return self.pp % self.slots_per_node == 0

    @property
    def block_nodes(self) -> int:
        """Pods per placement block: with replica groups, one group (placed whole inside the
        fewest domains); else ``dp`` units of :attr:`pods_per_tp_group` pods when layouts are
        rail-pure (each block holds whole DP groups), else 1 (no block structure)."""
        if self.replicas > 1:
            return self.group_nodes
        return self.dp * self.pods_per_tp_group if self.rail_pure else 1

    def position(self, rank: int) -> tuple[int, int]:
        """(pod index, local rank) of a global rank."""
        g, t = divmod(rank, self.tp)
        k = self.pods_per_tp_group
        q, t = divmod(t, self.procs_per_node) if k > 1 else (0, t)
        if self.replicas > 1:
            p, d = divmod(g, self.dp)
            group, gd = divmod(d, self.dp // self.replicas)
            slot, unit = divmod(p * (self.dp // self.replicas) + gd, self.group_nodes // k)
            return group * self.group_nodes + unit * k + q, slot * self.tp + t
        slot, unit = divmod(g, self.nodes // k)
        return unit * k + q, slot * self.tp + t

    def positions(self, ranks: range) -> list[tuple[int, int]]:
        """:meth:`position` of every rank of ``ranks``, with what does not depend on the rank
        worked out once: the placement asks it of every data-parallel group at every decision
        (issue 46: per rank, the calls cost a 1,000-pod gang's decision ~0.3 ms)."""
        tp, ppn, k, r = self.tp, self.procs_per_node, self.pods_per_tp_group, self.replicas
        out: list[tuple[int, int]] = []
        append = out.append
        if r > 1:
            dp, share, group_nodes = self.dp, self.dp // r, self.group_nodes
            units = group_nodes // k
            for rank in ranks:
                g, t = divmod(rank, tp)
                q, t = divmod(t, ppn) if k > 1 else (0, t)
                p, d = divmod(g, dp)
                group, gd = divmod(d, share)
                slot, unit = divmod(p * share + gd, units)
                append((group * group_nodes + unit * k + q, slot * tp + t))
            return out
        units = self.nodes // k
        for rank in ranks:
            g, t = divmod(rank, tp)
            q, t = divmod(t, ppn) if k > 1 else (0, t)
            slot, unit = divmod(g, units)
            append((unit * k + q, slot * tp + t))
        return out

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(pp, dp, tp) coordinates of a global rank."""
        return mesh_coordinates(rank, self.dp, self.tp)

    def rank_of(self, p: int, d: int, t: int) -> int:
        return mesh_rank(p, d, t, self.dp, self.tp)

    def layout(self) -> Iterator[tuple[int, int, int, int, int, int]]:
        """(rank, pod index, local rank, pp, dp, tp) of every rank in rank order: the same
        answers as :meth:`position` and :meth:`coords`, one division per TP group (the rank
        table of a 16,384-rank gang is built per re-placement)."""
        tp, dp, n = self.tp, self.dp, self.group_nodes
        share = dp // self.replicas
        k = self.pods_per_tp_group
        ppn = self.procs_per_node if k > 1 else tp
        for g in range(self.pp * dp):
            p, d = divmod(g, dp)
            group, gd = divmod(d, share)
            slot, unit = divmod(p * share + gd, n // k)
            pod = group * n + unit * k
            base = g * tp
            for t in range(tp):
                q, lt = divmod(t, ppn)
                yield base + t, pod + q, slot * tp + lt, p, d, t
