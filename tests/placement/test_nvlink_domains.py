"""Rack-scale NVLink domains (issue 38): a tensor-parallel group larger than a node spans
``tensor / procsPerNode`` nodes of one NVLink domain (node label ``nvidia.com/gpu.clique``, a
level below the leaf), never two; the cost model counts that traffic as NVLink, not network."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from railyard.api.trainingjob import TrainingJob
from railyard.api.validation import validate_manifest
from railyard.logic.cost import NETWORK, NVLINK, CostInputs, compute_cost
from railyard.logic.layout import build_rank_table
from railyard.logic.placement import (
    Placement,
    PlacementInput,
    PreviousPlacement,
    Unplaceable,
    build_placement_input,
    plan_placement,
)
from railyard.protocol.mesh import MeshShape

from .placement_builders import (
    CLIQUE,
    LEAF,
    SPINE,
    Nodes,
    assert_valid,
    make_job,
    make_nvl_nodes,
    node,
)

TP_ONLY = CostInputs(param_bytes=0, activation_bytes=0, tp_bytes_per_step=1e9)


def _domain(topo: Any, name: str) -> str:
    nv = topo.nvlink_level
    return str(topo.domain_names[nv][topo.domain_of[nv][topo.index[name]]])


# ---------------------------------------------------------------------------- the layout


@pytest.mark.parametrize(
    "shape",
    [
        MeshShape(nodes=8, procs_per_node=4, pp=1, dp=4, tp=8),
        MeshShape(nodes=16, procs_per_node=4, pp=2, dp=2, tp=16),
        MeshShape(nodes=8, procs_per_node=4, pp=1, dp=4, tp=8, replicas=2),
    ],
    ids=["tp8-on-4", "tp16-pp2", "tp8-replica-groups"],
)
def test_a_tp_group_takes_consecutive_pods_and_dp_groups_share_a_rail(shape: MeshShape) -> None:
    k = shape.pods_per_tp_group
    assert shape.problems() == []
    table = build_rank_table(
        job="j", attempt=0, shape=shape, pod_nodes=[f"n{i}" for i in range(shape.nodes)],
        pod_rail_offset=[0] * shape.nodes, pod_gpus=[shape.procs_per_node] * shape.nodes,
    )
    by_rank = {e.rank: e for e in table.ranks}
    for e in table.ranks:
        assert shape.position(e.rank) == (e.pod_index, e.local_rank)
    for g in range(shape.pp * shape.dp):
        pods = sorted({by_rank[g * shape.tp + t].pod_index for t in range(shape.tp)})
        assert len(pods) == k and pods == list(range(pods[0], pods[0] + k)) and pods[0] % k == 0
    for p in range(shape.pp):
        for t in range(shape.tp):
            assert len({by_rank[(p * shape.dp + d) * shape.tp + t].rail for d in range(shape.dp)}) == 1


@pytest.mark.parametrize(
    ("tp", "procs", "ok"),
    [(8, 4, True), (16, 4, True), (2, 4, True), (6, 4, False), (12, 8, False)],
)
def test_tensor_must_divide_or_be_a_multiple_of_procs_per_node(tp: int, procs: int, ok: bool) -> None:
    nodes = 2 * max(tp // procs, 1)
    manifest = {
        "apiVersion": "railyard.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "j"},
        "spec": {"nodes": nodes, "procsPerNode": procs, "parallelism": {"tensor": tp}, "trainer": {"batchSize": 8}},
    }
    problems = validate_manifest(manifest)
    assert (problems == []) == ok, problems
    if not ok:
        assert any(p.path == "spec.parallelism.tensor" and "multiple of procsPerNode" in p.message for p in problems)
        assert any("tensor" in m for m in MeshShape(nodes, procs, dp=1, tp=tp).problems())


# ---------------------------------------------------------------------------- placing


@pytest.mark.parametrize(
    ("nodes", "busy", "job_nodes", "tp", "groups_per_domain"),
    [
        # 1 leaf of 8 trays = 2 NVLink domains of 4: one TP=8 group on two trays of one domain
        pytest.param(make_nvl_nodes(1, 1, 8, nvl=4), [], 2, 8, {1}, id="two-trays-one-domain"),
        # a busy tray leaves domain 0 three free trays: the TP=16 group goes to domain 1
        pytest.param(make_nvl_nodes(1, 1, 8, nvl=4), [node(0, 0, 1)], 4, 16, {1}, id="busy-tray-other-domain"),
        # NVL72-like: 18 trays hold 4 groups of 4 trays; 2 racks, 8 groups
        pytest.param(make_nvl_nodes(1, 2, 18, nvl=18), [], 32, 16, {4}, id="four-groups-per-rack"),
        # domains of 6 hold one group of 4 each (2 trays left), 2 groups over 2 leaves
        pytest.param(make_nvl_nodes(2, 1, 6, nvl=6), [], 8, 16, {1}, id="one-group-per-small-domain"),
    ],
)
def test_tp_groups_stay_inside_one_nvlink_domain(
    nodes: Nodes, busy: list[str], job_nodes: int, tp: int, groups_per_domain: set[int]
) -> None:
    for name in busy:
        nodes.busy(name, 1)
    req = make_job(nodes=job_nodes, procs=4).with_parallelism(tp=tp).on_nvlink().obj()
    topo = nodes.topology(req)
    assert topo.nvlink_key == CLIQUE
    pl = plan_placement(PlacementInput(topo, req, cost_inputs=TP_ONLY))
    assert isinstance(pl, Placement), pl
    assert_valid(pl, topo, req)
    assert all(len(d) == 1 for d in pl.tp_domains) and len(pl.tp_domains) == job_nodes * 4 // tp
    assert {len(g) for g in pl.tp_groups_by_domain.values()} == groups_per_domain
    assert not set(busy) & set(pl.nodes)
    # TP traffic only: all of it inside nodes or over NVLink between trays, none on the network
    assert pl.cost.bytes_at(NVLINK) > 0 and pl.cost.bytes_at(NETWORK) == 0


@pytest.mark.parametrize(
    ("nodes", "unlabel", "job_nodes", "tp", "constraint", "words"),
    [
        pytest.param(make_nvl_nodes(1, 1, 8, nvl=4), False, 8, 32, "topology", ["largest NVLink domain", "at most 16"], id="group-bigger-than-a-domain"),
        pytest.param(make_nvl_nodes(1, 1, 8, nvl=4), True, 2, 8, "topology", ["no candidate node carries", CLIQUE], id="no-domain-label"),
        pytest.param(make_nvl_nodes(1, 2, 6, nvl=6), False, 12, 16, "capacity", ["3 tensor-parallel groups of 4 nodes", "1 groups short"], id="domains-too-fragmented"),
    ],
)
def test_refused_when_tp_groups_do_not_fit_a_domain(
    nodes: Nodes, unlabel: bool, job_nodes: int, tp: int, constraint: str, words: list[str]
) -> None:
    if unlabel:
        nodes.unlabel(*nodes.names())
    req = make_job(nodes=job_nodes, procs=4).with_parallelism(tp=tp).on_nvlink().obj()
    out = plan_placement(PlacementInput(nodes.topology(req), req))
    assert isinstance(out, Unplaceable), out
    assert out.constraint == constraint and not out.permanent
    assert "parallelism.tensor" in out.reason or "tensor-parallel" in out.reason
    for w in words:
        assert w in out.reason


def _job(nodes: int, procs: int, tp: int, **topology: Any) -> TrainingJob:
    return TrainingJob.model_validate({
        "apiVersion": "railyard.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "j"},
        "spec": {"nodes": nodes, "procsPerNode": procs, "parallelism": {"tensor": tp}, "trainer": {"batchSize": 8},
                 "topology": topology},
    })


def test_mixed_cluster_places_tp_groups_on_labelled_trays_only() -> None:
    # leaf 0: two NVLink domains of 4 trays; leaf 1: 8 plain nodes without the label
    cluster = make_nvl_nodes(1, 2, 8, nvl=4)
    plain = [node(0, 1, i) for i in range(8)]
    cluster.unlabel(*plain)
    inp = build_placement_input(_job(4, 4, 8), nodes=cluster.nodes)
    assert inp.request.levels == (SPINE, LEAF, CLIQUE) and inp.topology.nvlink_key == CLIQUE
    pl = plan_placement(inp)
    assert isinstance(pl, Placement), pl
    assert_valid(pl, inp.topology, inp.request)
    assert not set(pl.nodes) & set(plain)
    assert sorted(len(d) for d in pl.tp_domains) == [1, 1]
    # the same cluster, a job whose TP stays in a node: placed as without NVLink domains
    small = build_placement_input(_job(8, 4, 4), nodes=cluster.nodes)
    assert small.request.levels == (SPINE, LEAF) and small.topology.nvlink_key == ""
    again = plan_placement(small)
    assert isinstance(again, Placement) and again.tp_domains == ()
    # more TP groups than the labelled trays hold: refused, though 16 nodes are free
    big = plan_placement(build_placement_input(_job(12, 4, 8), nodes=cluster.nodes))
    assert isinstance(big, Unplaceable) and big.constraint == "capacity"


def test_topograph_preset_finds_its_accelerator_label() -> None:
    cluster = make_nvl_nodes(1, 1, 8, nvl=4)
    for n in cluster.nodes:
        labels = n["metadata"]["labels"]
        labels["accelerator.topograph.run/domain"] = labels.pop(CLIQUE)
        labels["fabric.topograph.run/tier-0"] = labels.pop(LEAF)
        labels["fabric.topograph.run/tier-1"] = labels.pop(SPINE)
    inp = build_placement_input(_job(4, 4, 8, preset="topograph"), nodes=cluster.nodes)
    assert inp.request.nvlink_level == "accelerator.topograph.run/domain"
    assert inp.topology.nvlink_key == "accelerator.topograph.run/domain"
    pl = plan_placement(inp)
    assert isinstance(pl, Placement) and [len(d) for d in pl.tp_domains] == [1, 1]


# ---------------------------------------------------------------------------- re-placement


@pytest.mark.parametrize(
    ("spares", "fill_domain", "moved_whole"),
    [
        pytest.param(1, False, False, id="spare-in-the-same-domain"),
        pytest.param(0, False, False, id="free-tray-in-the-same-domain"),
        pytest.param(0, True, True, id="domain-full-the-group-moves-whole"),
    ],
)
def test_a_lost_tray_is_replaced_inside_its_groups_domain(spares: int, fill_domain: bool, moved_whole: bool) -> None:
    cluster = make_nvl_nodes(1, 2, 6, nvl=6)  # 2 domains of 6 trays: one group of 4 + 2 free each
    req = make_job(nodes=4, procs=4).with_parallelism(tp=16).with_spares(spares).on_nvlink().obj()
    first = plan_placement(PlacementInput(cluster.topology(req), req))
    assert isinstance(first, Placement)
    home = _domain(first.topology, first.nodes[0])
    if fill_domain:
        for n in cluster.names():
            if n not in first.nodes and _domain(first.topology, n) == home:
                cluster.busy(n, 4)
    cluster.not_ready(first.nodes[1])
    topo = cluster.topology(req)
    again = plan_placement(PlacementInput(topo, req, previous=PreviousPlacement(first.nodes, first.spares)))
    assert isinstance(again, Placement), again
    assert_valid(again, topo, req)
    if moved_whole:
        assert again.moved == (0, 1, 2, 3)
        assert {_domain(topo, n) for n in again.nodes} != {home}
        assert any("moved whole" in n for n in again.notes)
    else:
        assert again.moved == (1,)
        assert _domain(topo, again.nodes[1]) == home
        if spares:
            assert again.nodes[1] in first.spares


# ---------------------------------------------------------------------------- cost


def test_ignoring_the_domains_sends_tp_traffic_over_the_network() -> None:
    """The same planner without the NVLink level (nvlink_level None: groups on consecutive
    trays of a leaf) lets groups straddle racks; priced on the real topology, their TP ring
    then crosses the network, ours never does."""
    cluster = make_nvl_nodes(1, 1, 18, nvl=6)  # a leaf of 3 domains of 6 trays
    cluster.busy(node(0, 0, 0), 1)
    aware = make_job(nodes=8, procs=4).with_parallelism(tp=16).on_nvlink().obj()
    blind = replace(aware, levels=(SPINE, LEAF), nvlink_level=None)
    full = cluster.topology(aware)
    ours = plan_placement(PlacementInput(full, aware, cost_inputs=TP_ONLY))
    theirs = plan_placement(PlacementInput(cluster.topology(blind), blind))
    assert isinstance(ours, Placement) and isinstance(theirs, Placement)
    theirs_cost = compute_cost(theirs.rank_table, full, TP_ONLY)
    assert ours.cost.bytes_at(NETWORK) == 0
    assert theirs_cost.bytes_at(NETWORK) > 0 and theirs_cost.bytes_at(NVLINK) < ours.cost.bytes_at(NVLINK)
    host = ours.cost.bytes_at("host")
    assert host + ours.cost.bytes_at(NVLINK) == pytest.approx(
        theirs_cost.bytes_at("host") + theirs_cost.bytes_at(NVLINK) + theirs_cost.bytes_at(NETWORK)
    )


# ---------------------------------------------------------------------------- properties

STATES = ["ok", "ok", "ok", "notready", "busy2", "unlabelled"]


@st.composite
def nvl_cases(draw: st.DrawFn) -> tuple[Nodes, dict[str, str], Any]:
    nvl = draw(st.integers(2, 4))
    nodes = make_nvl_nodes(draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(2, 6)), nvl=nvl)
    state = {}
    for name in nodes.names():
        state[name] = s = draw(st.sampled_from(STATES))
        if s == "notready":
            nodes.not_ready(name)
        elif s == "busy2":
            nodes.busy(name, 2)
        elif s == "unlabelled":
            nodes.unlabel(name)
    k = draw(st.sampled_from([2, 3]))
    units = draw(st.integers(1, 4))
    pp = draw(st.sampled_from([p for p in (1, 2) if units % p == 0]))
    job = make_job(nodes=units * k, procs=4).with_parallelism(tp=4 * k, pp=pp).with_spares(draw(st.integers(0, 2)))
    if draw(st.booleans()):
        job.required(SPINE)
    return nodes, state, job.on_nvlink().obj()


def _feasible(nodes: Nodes, state: dict[str, str], req: Any) -> bool:
    """From the labels: some domain of the required level (or the cluster) holds the units, each
    inside one NVLink domain, and the gang plus spares in all."""
    labels = {n["metadata"]["name"]: n["metadata"]["labels"] for n in nodes.nodes}
    usable = [n for n, s in state.items() if s in ("ok", "unlabelled")]
    scopes: dict[str, list[str]] = {}
    for n in usable:
        scopes.setdefault(labels[n][SPINE] if req.mode == "Required" else "", []).append(n)
    k = req.tp_pods
    for members in scopes.values():
        cliques: dict[str, int] = {}
        for n in members:
            if CLIQUE in labels[n]:
                key = f"{labels[n][LEAF]}/{labels[n][CLIQUE]}"
                cliques[key] = cliques.get(key, 0) + 1
        if sum(c // k for c in cliques.values()) * k >= req.nodes and len(members) >= req.nodes + req.hot_spares:
            return True
    return False


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=nvl_cases(), data=st.data())
def test_nvlink_placement_is_valid_or_truly_impossible_and_repairs_in_place(case: Any, data: st.DataObject) -> None:
    nodes, state, req = case
    topo = nodes.topology(req)
    out = plan_placement(PlacementInput(topo, req))
    if not isinstance(out, Placement):
        assert isinstance(out, Unplaceable) and out.constraint in ("capacity", "requiredLevel", "topology")
        assert out.short > 0 or "no candidate node carries" in out.reason
        assert not _feasible(nodes, state, req), out.reason
        return
    assert _feasible(nodes, state, req)
    assert_valid(out, topo, req)
    failed = data.draw(st.sets(st.sampled_from(out.nodes), min_size=1, max_size=2))
    nodes.not_ready(*failed)
    topo = nodes.topology(req)
    again = plan_placement(PlacementInput(topo, req, previous=PreviousPlacement(out.nodes, out.spares)))
    if isinstance(again, Placement):
        assert_valid(again, topo, req)
        k = req.tp_pods
        for i, name in enumerate(out.nodes):
            if name in failed:
                assert i in again.moved
            elif i in again.moved:  # only when its whole group moved
                assert set(range(i // k * k, i // k * k + k)) <= set(again.moved)
            else:
                assert again.nodes[i] == name
