"""Sticky re-placement: keep every healthy node of the previous placement under the same pod index
(hence the same ranks) and replace only the lost ones, preferring the gang's spares and then the
free node sharing the deepest domain; a tensor-parallel group spanning pods stays inside one
NVLink domain, or moves whole. The spares are topped up afterwards.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from railyard.logic.cost import CostInputs
from railyard.logic.placement.fresh import affinity, excluded_counts, finish_placement, plan_fresh
from railyard.logic.placement.types import GangRequest, Placement, PreviousPlacement, Unplaceable
from railyard.logic.topology import Topology


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


def plan_sticky(
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
        return finish_placement(
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
        excl = excluded_counts(topo, req.gpus_needed)
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
        fresh = plan_fresh(topo, req, cand, cost_inputs, ["every pod lost its node: placed afresh"])
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
    return finish_placement(topo, req, gang, spares, cost_inputs, notes, moved=tuple(lost))


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
                excluded=excluded_counts(topo, req.gpus_needed),
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
    return finish_placement(topo, req, gang, spares, cost_inputs, notes, moved=tuple(sorted(moved)))


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
        key=lambda i: (-affinity(topo, used, i), topo.free_gpus[i], i),
    )
    spares = spares + extra[: req.hot_spares - len(spares)]
    if len(spares) < req.hot_spares:
        notes.append(f"only {len(spares)} of {req.hot_spares} hot spares available")
    return spares
