"""Chained builders for placement tests (jobset's testing wrappers, in Python)."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

from railyard.api.corev1 import Toleration
from railyard.logic.placement import GangRequest, Mode, Placement
from railyard.logic.quarantine import QUARANTINE_KEY
from railyard.logic.topology import (
    GPU_RESOURCE,
    JOB_LABEL,
    NVLINK_LABEL,
    RAIL_OFFSET_LABEL,
    Topology,
    build_synthetic_nodes,
    build_topology,
)

SPINE = "railyard.dev/spine"
LEAF = "railyard.dev/leaf"
CLIQUE = NVLINK_LABEL


class Nodes:
    """``make_nodes(spines, leaves, per_leaf).not_ready(name).busy(name, 4).topology()``."""

    def __init__(self, nodes: list[dict[str, Any]]) -> None:
        self.nodes = nodes
        self.pods: list[dict[str, Any]] = []

    def _node(self, name: str) -> dict[str, Any]:
        for n in self.nodes:
            if n["metadata"]["name"] == name:
                return n
        raise KeyError(name)

    def names(self) -> list[str]:
        return [n["metadata"]["name"] for n in self.nodes]

    def not_ready(self, *names: str) -> Nodes:
        for name in names:
            self._node(name)["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
        return self

    def cordon(self, *names: str) -> Nodes:
        for name in names:
            self._node(name)["spec"]["unschedulable"] = True
        return self

    def quarantine(self, *names: str, by: str = "taint") -> Nodes:
        for name in names:
            n = self._node(name)
            if by == "taint":
                n["spec"].setdefault("taints", []).append(
                    {"key": QUARANTINE_KEY, "value": "sdc", "effect": "NoSchedule"}
                )
            else:
                n["metadata"]["labels"][QUARANTINE_KEY] = "true"
        return self

    def taint(self, name: str, key: str, effect: str = "NoSchedule", value: str = "") -> Nodes:
        self._node(name)["spec"].setdefault("taints", []).append(
            {"key": key, "value": value, "effect": effect}
        )
        return self

    def busy(
        self, name: str, gpus: int, *, job: str | None = None, phase: str = "Running"
    ) -> Nodes:
        labels = {JOB_LABEL: job} if job else {}
        self.pods.append(
            {
                "metadata": {"name": f"other-{len(self.pods)}", "labels": labels},
                "spec": {
                    "nodeName": name,
                    "containers": [{"resources": {"requests": {GPU_RESOURCE: str(gpus)}}}],
                },
                "status": {"phase": phase},
            }
        )
        return self

    def rail_offset(self, name: str, offset: int) -> Nodes:
        self._node(name)["metadata"]["labels"][RAIL_OFFSET_LABEL] = str(offset)
        return self

    def without_gpus(self) -> Nodes:
        for n in self.nodes:
            n["status"]["allocatable"].pop(GPU_RESOURCE, None)
        return self

    def copy(self) -> Nodes:
        c = Nodes(copy.deepcopy(self.nodes))
        c.pods = copy.deepcopy(self.pods)
        return c

    def topology(self, job: GangRequest | None = None) -> Topology:
        return build_topology(
            self.nodes,
            self.pods,
            levels=job.levels if job else (SPINE, LEAF),
            tolerations=job.tolerations if job else (),
            ignore_job=job.job if job else None,
            nvlink_level=job.nvlink_level if job else None,
        )

    def unlabel(self, *names: str, key: str = CLIQUE) -> Nodes:
        """Drop a label (e.g. the NVLink domain: a node outside any rack-scale domain)."""
        for name in names:
            self._node(name)["metadata"]["labels"].pop(key, None)
        return self


def make_nodes(spines: int, leaves: int, per_leaf: int, gpus: int = 8) -> Nodes:
    return Nodes(build_synthetic_nodes(spines, leaves, per_leaf, gpus))


def make_nvl_nodes(spines: int, leaves: int, per_leaf: int, *, nvl: int, gpus: int = 4) -> Nodes:
    """Trays of ``gpus`` GPUs; each leaf's nodes form NVLink domains of ``nvl`` consecutive
    nodes (label ``nvidia.com/gpu.clique`` = ``nvl-<spine>-<leaf>-<j>``)."""
    return Nodes(build_synthetic_nodes(spines, leaves, per_leaf, gpus, nvlink_domain=nvl))


def node(spine: int, leaf: int, i: int) -> str:
    return f"node-s{spine}-l{leaf}-n{i}"


class Job:
    """``make_job("j", nodes=4).with_parallelism(tp=2).required(SPINE).obj()``."""

    def __init__(self, req: GangRequest) -> None:
        self.req = req

    def with_parallelism(self, *, tp: int = 1, pp: int = 1, dp: int | None = None) -> Job:
        world = self.req.nodes * self.req.procs_per_node
        d = dp if dp is not None else world // (tp * pp)
        self.req = replace(self.req, tp=tp, pp=pp, dp=d)
        return self

    def on_nvlink(self, key: str = CLIQUE) -> Job:
        """The NVLink-domain level below the leaf, as build_gang_request adds it when tensor
        exceeds procsPerNode."""
        self.req = replace(self.req, levels=(*self.req.levels, key), nvlink_level=key)
        return self

    def with_spares(self, n: int) -> Job:
        self.req = replace(self.req, hot_spares=n)
        return self

    def required(self, level: str = SPINE) -> Job:
        self.req = replace(self.req, mode="Required", required_level=level)
        return self

    def preferred(self, level: str | None = None) -> Job:
        mode: Mode = "Preferred"
        self.req = replace(self.req, mode=mode, required_level=level)
        return self

    def tolerate(self, key: str, operator: str = "Exists", effect: str = "") -> Job:
        self.req = replace(
            self.req,
            tolerations=(
                *self.req.tolerations,
                Toleration(key=key, operator=operator, effect=effect),
            ),
        )
        return self

    def gpus(self, n: int) -> Job:
        self.req = replace(self.req, gpus_per_pod=n)
        return self

    def obj(self) -> GangRequest:
        return self.req


def make_job(name: str = "job", *, nodes: int, procs: int = 8) -> Job:
    return Job(GangRequest(job=name, nodes=nodes, procs_per_node=procs, dp=nodes * procs))


def usable(topo: Topology, req: GangRequest, name: str) -> bool:
    i = topo.index[name]
    return not topo.excluded[i] and topo.free_gpus[i] >= req.gpus_needed


def assert_valid(pl: Placement, topo: Topology, req: GangRequest) -> None:
    """Every rule a returned placement must satisfy, checked from first principles."""
    assert len(pl.nodes) == req.nodes
    assert len(set(pl.nodes)) == req.nodes, "a node hosts two pods of the gang"
    assert len(pl.spares) <= req.hot_spares
    assert not set(pl.spares) & set(pl.nodes), "a spare is also a gang node"
    for name in (*pl.nodes, *pl.spares):
        assert usable(topo, req, name), f"{name} is not usable"
    t = pl.rank_table
    t.validate()
    assert (t.pp, t.dp, t.tp) == (req.pp, req.dp, req.tp)
    assert [p.node for p in t.pods] == list(pl.nodes)
    by_rank = {e.rank: e for e in t.ranks}
    # TP group never crosses a node, or spans tp / procsPerNode pods of one NVLink domain
    k = req.tp_pods
    nv = topo.nvlink_level
    for g in range(req.pp * req.dp):
        pods = {by_rank[g * req.tp + x].pod_index for x in range(req.tp)}
        assert len(pods) == k, f"TP group {g} spans pods {pods}"
        if k > 1 and req.nvlink_level is not None:
            doms = {topo.domain_of[nv][topo.index[pl.nodes[p]]] for p in pods}
            assert len(doms) == 1, f"TP group {g} spans NVLink domains {doms}"
    # every DP group on one rail whenever the shape allows it
    rails = max(
        len({by_rank[(p * req.dp + d) * req.tp + k].rail for d in range(req.dp)})
        for p in range(req.pp)
        for k in range(req.tp)
    )
    assert rails == pl.rails_per_dp_group
    if req.shape.rail_pure and all(topo.rail_offset[topo.index[n]] == 0 for n in pl.nodes):
        assert rails == 1
    if req.mode == "Required" and req.required_level in topo.levels:
        lv = topo.levels.index(req.required_level)
        doms = {topo.domain_of[lv][topo.index[n]] for n in (*pl.nodes, *pl.spares)}
        assert len(doms) == 1, f"gang spans {len(doms)} {req.required_level} domains"


def dp_group_leaves(pl: Placement, topo: Topology) -> list[int]:
    """Number of leaf domains each DP group's nodes span."""
    t = pl.rank_table
    by_rank = {e.rank: e for e in t.ranks}
    out = []
    for p in range(t.pp):
        for k in range(t.tp):
            nodes = {by_rank[(p * t.dp + d) * t.tp + k].node for d in range(t.dp)}
            out.append(len({topo.leaf_of(topo.index[n]) for n in nodes}))
    return out
