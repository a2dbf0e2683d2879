"""Unusable nodes are never chosen; partially used nodes are respected; capacity is all-or-nothing."""

from __future__ import annotations

import pytest

from railyard.api.trainingjob import TrainingJob
from railyard.logic.placement import (
    Placement,
    PlacementInput,
    Unplaceable,
    build_placement_input,
    plan_placement,
)
from railyard.logic.topology import GPU_RESOURCE

from .placement_builders import assert_valid, make_job, make_nodes, node

BAD = node(0, 0, 0)


@pytest.mark.parametrize(
    "spoil",
    [
        pytest.param(lambda n: n.not_ready(BAD), id="NotReady"),
        pytest.param(lambda n: n.cordon(BAD), id="cordoned"),
        pytest.param(lambda n: n.quarantine(BAD), id="quarantine-taint"),
        pytest.param(lambda n: n.quarantine(BAD, by="label"), id="quarantine-label"),
        pytest.param(lambda n: n.taint(BAD, "gpu-maintenance"), id="NoSchedule-taint"),
        pytest.param(lambda n: n.taint(BAD, "gpu-maintenance", "NoExecute"), id="NoExecute-taint"),
        pytest.param(lambda n: n.busy(BAD, 1), id="one-gpu-used"),
    ],
)
def test_unusable_nodes_are_never_chosen(spoil):
    nodes = make_nodes(1, 2, 4)
    spoil(nodes)
    # 7 usable nodes, the gang needs all 7: the bad one must be left out
    req = make_job(nodes=7, procs=8).with_parallelism(tp=8).obj()
    topo = nodes.topology(req)
    pl = plan_placement(PlacementInput(topo, req))
    assert isinstance(pl, Placement), pl
    assert BAD not in pl.nodes
    assert_valid(pl, topo, req)
    # and one more node than usable is refused, with the count
    bigger = make_job(nodes=8, procs=8).with_parallelism(tp=8).obj()
    out = plan_placement(PlacementInput(nodes.topology(bigger), bigger))
    assert isinstance(out, Unplaceable)
    assert out.constraint == "capacity" and out.short == 1
    assert "1 short" in out.reason


def test_taint_with_matching_toleration_is_usable():
    nodes = make_nodes(1, 1, 2).taint(node(0, 0, 0), "dedicated", value="training")
    req = make_job(nodes=2, procs=8).with_parallelism(tp=8).tolerate("dedicated").obj()
    pl = plan_placement(PlacementInput(nodes.topology(req), req))
    assert isinstance(pl, Placement)
    assert node(0, 0, 0) in pl.nodes


def test_prefer_no_schedule_taint_does_not_exclude():
    nodes = make_nodes(1, 1, 2).taint(node(0, 0, 0), "soft", effect="PreferNoSchedule")
    req = make_job(nodes=2, procs=8).with_parallelism(tp=8).obj()
    assert isinstance(plan_placement(PlacementInput(nodes.topology(req), req)), Placement)


def test_quarantine_is_not_tolerated_away():
    nodes = make_nodes(1, 1, 2).quarantine(node(0, 0, 0))
    req = make_job(nodes=2, procs=8).with_parallelism(tp=8).tolerate("", "Exists").obj()
    out = plan_placement(PlacementInput(nodes.topology(req), req))
    assert isinstance(out, Unplaceable)
    assert out.excluded == {"Quarantined": 1}


@pytest.mark.parametrize(
    ("used", "gpus_per_pod", "chosen"),
    [
        pytest.param(4, 8, False, id="half-used-node-cannot-host-8"),
        pytest.param(4, 4, True, id="half-used-node-hosts-4-and-is-preferred"),
        pytest.param(8, 4, False, id="full-node-never"),
    ],
)
def test_partially_used_nodes_are_respected(used, gpus_per_pod, chosen):
    nodes = make_nodes(1, 1, 4).busy(node(0, 0, 2), used)
    req = make_job(nodes=1, procs=gpus_per_pod).with_parallelism(tp=gpus_per_pod).obj()
    pl = plan_placement(PlacementInput(nodes.topology(req), req))
    assert isinstance(pl, Placement)
    assert (node(0, 0, 2) in pl.nodes) is chosen


def test_finished_pods_and_the_jobs_own_pods_do_not_use_gpus():
    nodes = (
        make_nodes(1, 1, 2)
        .busy(node(0, 0, 0), 8, phase="Succeeded")
        .busy(node(0, 0, 1), 8, job="job")
    )
    req = make_job("job", nodes=2, procs=8).with_parallelism(tp=8).obj()
    pl = plan_placement(PlacementInput(nodes.topology(req), req))
    assert isinstance(pl, Placement)


def test_all_or_nothing_includes_hot_spares():
    nodes = make_nodes(1, 2, 4)
    req = make_job(nodes=6, procs=8).with_parallelism(tp=8).with_spares(3).obj()
    out = plan_placement(PlacementInput(nodes.topology(req), req))
    assert isinstance(out, Unplaceable) and out.short == 1
    fits = make_job(nodes=6, procs=8).with_parallelism(tp=8).with_spares(2).obj()
    pl = plan_placement(PlacementInput(nodes.topology(fits), fits))
    assert isinstance(pl, Placement) and len(pl.spares) == 2


def test_spares_sit_next_to_the_gang():
    nodes = make_nodes(2, 2, 4)
    req = make_job(nodes=3, procs=8).with_parallelism(tp=8).with_spares(1).obj()
    topo = nodes.topology(req)
    pl = plan_placement(PlacementInput(topo, req))
    assert isinstance(pl, Placement)
    assert {topo.leaf_of(topo.index[n]) for n in pl.nodes} == {
        topo.leaf_of(topo.index[pl.spares[0]])
    }


def test_cpu_mode_uses_nodes_without_gpus():
    nodes = make_nodes(1, 2, 2, gpus=0)
    req = make_job(nodes=4, procs=2).with_parallelism(tp=1).gpus(0).obj()
    pl = plan_placement(PlacementInput(nodes.topology(req), req))
    assert isinstance(pl, Placement)
    assert len(pl.nodes) == 4
    gpu_req = make_job(nodes=4, procs=2).with_parallelism(tp=1).obj()
    out = plan_placement(PlacementInput(nodes.topology(gpu_req), gpu_req))
    assert isinstance(out, Unplaceable) and out.excluded == {"NotEnoughFreeGPUs": 4}


def test_best_fit_fills_the_most_used_leaf_first():
    # leaf 0 has 2 nodes taken, leaf 1 is empty: a 2-node gang goes to leaf 0, leaf 1 stays whole
    nodes = make_nodes(1, 2, 4).busy(node(0, 0, 0), 8).busy(node(0, 0, 1), 8)
    req = make_job(nodes=2, procs=8).with_parallelism(tp=8).obj()
    topo = nodes.topology(req)
    pl = plan_placement(PlacementInput(topo, req))
    assert isinstance(pl, Placement)
    assert set(pl.nodes) == {node(0, 0, 2), node(0, 0, 3)}


def test_best_fit_keeps_whole_spines_free():
    nodes = make_nodes(2, 2, 4).busy(node(1, 0, 0), 8)
    req = make_job(nodes=6, procs=8).with_parallelism(tp=8).obj()
    topo = nodes.topology(req)
    pl = plan_placement(PlacementInput(topo, req))
    assert isinstance(pl, Placement)
    assert pl.domains["railyard.dev/spine"] == ("spine-1",)


def _training_job(nodes: int) -> TrainingJob:
    return TrainingJob.model_validate({
        "apiVersion": "railyard.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": "job", "namespace": "team-a"},
        "spec": {"nodes": nodes, "procsPerNode": 8, "parallelism": {"tensor": 8}, "trainer": {"batchSize": 8}},
    })


@pytest.mark.parametrize(
    ("seen", "refused", "left_out"),
    [
        pytest.param(False, (), set(), id="nothing-held"),
        # an operator watching every namespace: another namespace's pod holds the node's GPUs
        pytest.param(True, (), {BAD}, id="held-by-another-namespace"),
        # a namespaced operator does not see that pod; the scheduler refused ours there
        pytest.param(False, (BAD,), {BAD}, id="refused-by-the-scheduler"),
        pytest.param(True, (BAD, node(0, 0, 1)), {BAD, node(0, 0, 1)}, id="both"),
    ],
)
def test_gpus_held_where_the_placement_looks_are_never_chosen(seen, refused, left_out):
    nodes = make_nodes(1, 2, 4)
    if seen:
        nodes.pods.append({"metadata": {"name": "their-trainer", "namespace": "team-b", "labels": {}},
                           "spec": {"nodeName": BAD, "containers": [{"resources": {"limits": {GPU_RESOURCE: "8"}}}]},
                           "status": {"phase": "Running"}})
    job = _training_job(4)
    pl = plan_placement(build_placement_input(job, nodes=nodes.nodes, pods=nodes.pods, refused=refused))
    assert isinstance(pl, Placement), pl
    assert not left_out & set(pl.nodes)
    if not left_out:
        assert BAD in pl.nodes  # the first leaf, unless something holds its GPUs
    # every usable node is needed: refused ones make the gang wait, and the message says why
    out = plan_placement(build_placement_input(_training_job(8), nodes=nodes.nodes, pods=nodes.pods, refused=refused))
    if left_out:
        assert isinstance(out, Unplaceable) and out.short == len(left_out)
        assert ("RefusedByScheduler" in out.message) is bool(refused)
