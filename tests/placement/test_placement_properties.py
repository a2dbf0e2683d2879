"""Property tests: any returned placement is valid; "unplaceable" only when brute force agrees."""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from railyard.logic.placement import (
    Placement,
    PlacementInput,
    PreviousPlacement,
    Unplaceable,
    plan_placement,
)

from .placement_builders import LEAF, SPINE, Nodes, assert_valid, make_job, make_nodes

GPUS = 4
STATES = [
    "ok",
    "ok",
    "ok",
    "notready",
    "quarantined",
    "tainted",
    "cordoned",
    "busy1",
    "busy2",
    "busy4",
]


@st.composite
def clusters(draw: st.DrawFn) -> tuple[Nodes, dict[str, str]]:
    spines = draw(st.integers(1, 2))
    leaves = draw(st.integers(1, 3))
    per_leaf = draw(st.integers(1, 3))
    nodes = make_nodes(spines, leaves, per_leaf, gpus=GPUS)
    state = {}
    for name in nodes.names():
        s = draw(st.sampled_from(STATES))
        state[name] = s
        if s == "notready":
            nodes.not_ready(name)
        elif s == "quarantined":
            nodes.quarantine(name)
        elif s == "tainted":
            nodes.taint(name, "maintenance")
        elif s == "cordoned":
            nodes.cordon(name)
        elif s.startswith("busy"):
            nodes.busy(name, int(s[4:]))
    return nodes, state


@st.composite
def jobs(draw: st.DrawFn):
    procs = draw(st.sampled_from([1, 2, 4]))
    tp = draw(st.sampled_from([t for t in (1, 2, 4) if procs % t == 0]))
    n = draw(st.integers(1, 5))
    groups = n * procs // tp
    pp = draw(st.sampled_from([p for p in range(1, groups + 1) if groups % p == 0]))
    job = (
        make_job(nodes=n, procs=procs)
        .with_parallelism(tp=tp, pp=pp)
        .with_spares(draw(st.integers(0, 2)))
    )
    mode = draw(st.sampled_from(["none", "req-spine", "req-leaf", "pref-spine"]))
    if mode == "req-spine":
        job.required(SPINE)
    elif mode == "req-leaf":
        job.required(LEAF)
    elif mode == "pref-spine":
        job.preferred(SPINE)
    return job.obj()


def _usable_by_state(state: str, need: int) -> bool:
    if state in ("notready", "quarantined", "tainted", "cordoned"):
        return False
    used = int(state[4:]) if state.startswith("busy") else 0
    return GPUS - used >= need


def _brute_force_feasible(nodes: Nodes, state: dict[str, str], req) -> bool:
    """Is there any set of nodes for gang + spares satisfying exclusions and the required level?"""
    labels = {n["metadata"]["name"]: n["metadata"]["labels"] for n in nodes.nodes}
    usable = [name for name, s in state.items() if _usable_by_state(s, req.gpus_needed)]
    total = req.nodes + req.hot_spares
    for subset in itertools.combinations(usable, total):
        if (
            req.mode == "Required"
            and req.required_level
            and len({labels[x][req.required_level] for x in subset}) != 1
        ):
            continue
        return True
    return False


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=clusters(), req=jobs())
def test_placement_is_valid_or_truly_impossible(cluster, req):
    nodes, state = cluster
    topo = nodes.topology(req)
    out = plan_placement(PlacementInput(topo, req))
    event(f"{type(out).__name__} {getattr(out, 'constraint', '')}")
    if isinstance(out, Placement):
        assert_valid(out, topo, req)
        for name in (*out.nodes, *out.spares):
            assert _usable_by_state(state[name], req.gpus_needed)
        assert out == plan_placement(PlacementInput(nodes.topology(req), req)), "deterministic"
    else:
        assert isinstance(out, Unplaceable)
        assert out.constraint in ("capacity", "requiredLevel")
        assert out.short > 0
        assert not _brute_force_feasible(nodes, state, req), out.reason


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=clusters(), req=jobs(), data=st.data())
def test_sticky_replacement_keeps_every_healthy_node(cluster, req, data):
    nodes, state = cluster
    first = plan_placement(PlacementInput(nodes.topology(req), req))
    if not isinstance(first, Placement):
        return
    failed = data.draw(st.sets(st.sampled_from(first.nodes), min_size=1, max_size=len(first.nodes)))
    nodes.not_ready(*failed)
    for name in failed:
        state[name] = "notready"
    topo = nodes.topology(req)
    again = plan_placement(PlacementInput(topo, req, previous=PreviousPlacement(first.nodes, first.spares)))
    lost = sorted(i for i, n in enumerate(first.nodes) if n in failed)
    if isinstance(again, Placement):
        assert again.moved == tuple(lost)
        for i, name in enumerate(first.nodes):
            if name not in failed:
                assert again.nodes[i] == name
            else:
                assert _usable_by_state(state[again.nodes[i]], req.gpus_needed)
        assert len(set(again.nodes)) == req.nodes
        again.rank_table.validate()
    else:
        kept = set(first.nodes) - failed
        pool = [
            n for n, s in state.items() if n not in kept and _usable_by_state(s, req.gpus_needed)
        ]
        if req.mode == "Required" and req.required_level and kept:
            labels = {n["metadata"]["name"]: n["metadata"]["labels"] for n in nodes.nodes}
            doms = {labels[n][req.required_level] for n in kept}
            pool = [n for n in pool if labels[n][req.required_level] in doms]
        assert len(pool) < len(lost), again.reason
