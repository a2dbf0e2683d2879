"""The tree planner of a fresh placement: candidate counts over the domain tree, best-fit splits
of the gang over domains, and blocks of whole data-parallel groups kept inside the fewest leaves.

It counts in *units*: a tensor-parallel group's pods (1 when TP stays in a node), which the
deepest level keeps together.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from railyard.logic.placement.types import GangRequest
from railyard.logic.topology import Topology


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


class TreePlanner:
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
