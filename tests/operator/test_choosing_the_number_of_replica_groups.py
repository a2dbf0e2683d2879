"""The operator's number of replica groups when the spec leaves it open
(``parallelism.dataReplicas: 0``): logic/groups.py, a table of shapes and costs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from railyard.api.trainingjob import TrainingJob
from railyard.logic.groups import (
    GroupCosts,
    GroupShape,
    build_group_shape,
    compute_group_loss,
    decide_replica_groups,
    resolve_replica_groups,
)
from railyard.logic.topology import build_synthetic_nodes

LLAMA_16K = GroupShape(nodes=2048, procs_per_node=8, pp=16, dp=128, tp=8, leaf_nodes=32)
LLAMA_98K = replace(LLAMA_16K, nodes=12_288, dp=768)
STATE = GroupCosts(state_bytes=405e9 * 14)

ROWS = [
    # id, shape, costs, what the choice must be (a predicate on groups), and why
    ("16k: groups of whole leaves", LLAMA_16K, STATE, lambda r: r in (16, 32, 64) and 2048 // r % 32 == 0),
    ("98k: more groups than at 16k", LLAMA_98K, STATE, lambda r: r > 32 and 12_288 // r % 32 == 0),
    ("no failures: the fewest groups (cross traffic only)", LLAMA_16K, replace(STATE, failures_per_gpu_day=0.0),
     lambda r: r == 2),
    ("no cross-group cost: the most groups of whole leaves", LLAMA_16K, replace(STATE, exposed=0.0),
     lambda r: r == 64),
    ("unknown leaf size: any count that divides", replace(LLAMA_16K, leaf_nodes=0), STATE, lambda r: r > 1),
    ("minReplicas bounds it from below", replace(LLAMA_16K, min_replicas=64), STATE, lambda r: r >= 64),
    ("a TP group of 2 nodes stays in one group", GroupShape(6, 8, 1, 3, 16, leaf_nodes=0), STATE, lambda r: r == 3),
]


@pytest.mark.parametrize(("shape", "costs", "ok"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_the_choice_is_the_cheapest_count_the_shape_allows(shape: GroupShape, costs: GroupCosts, ok: object) -> None:
    choice = decide_replica_groups(shape, costs)
    assert ok(choice.groups), (choice.groups, choice.reason)  # type: ignore[operator]
    assert shape.dp % choice.groups == 0 and shape.nodes % choice.groups == 0
    assert (shape.nodes // choice.groups) % shape.pods_per_tp_group == 0, "a TP group never spans two groups"
    pool = [o for o in choice.options if o.disjoint] or list(choice.options)
    assert choice.chosen in pool and choice.chosen.loss == min(o.loss for o in pool)
    assert choice.chosen.loss == pytest.approx(compute_group_loss(choice.groups, shape, costs))
    assert f"{choice.groups} groups of {shape.nodes // choice.groups} nodes" in choice.reason


def test_more_failures_never_mean_fewer_groups() -> None:
    counts = [decide_replica_groups(LLAMA_98K, replace(STATE, failures_per_gpu_day=STATE.failures_per_gpu_day * k))
              .groups for k in (0.25, 0.5, 1, 2, 4, 8)]
    assert counts == sorted(counts) and counts[0] < counts[-1], counts


def test_groups_share_leaves_only_when_no_count_gives_whole_leaves() -> None:
    shape = GroupShape(nodes=32, procs_per_node=8, pp=1, dp=256, tp=1, leaf_nodes=64)  # the job is half a leaf
    choice = decide_replica_groups(shape, STATE)
    assert choice.groups > 1 and not any(o.disjoint for o in choice.options)
    assert "groups share leaves" in choice.reason


@pytest.mark.parametrize(
    "shape",
    [GroupShape(nodes=7, procs_per_node=8, pp=8, dp=7, tp=1), GroupShape(nodes=4, procs_per_node=8, pp=32, dp=1, tp=1),
     replace(LLAMA_16K, min_replicas=4096)],
    ids=["nodes prime, dp prime but nodes differ", "dp 1", "minReplicas above every count"],
)
def test_no_count_fits_says_which_field_to_set(shape: GroupShape) -> None:
    if shape.nodes == 7:
        shape = replace(shape, dp=5)
    choice = decide_replica_groups(shape, STATE)
    assert choice.groups == 0 and choice.chosen is None
    assert "parallelism.dataReplicas" in choice.reason and str(shape.dp) in choice.reason


def _job(data_replicas: int, mode: str = "ReplicaGroups", **spec: object) -> TrainingJob:
    return TrainingJob.model_validate({"metadata": {"name": "j", "namespace": "ns"}, "spec": {
        "nodes": 256, "procsPerNode": 8, "parallelism": {"tensor": 8, "pipeline": 8, "dataReplicas": data_replicas},
        "faultTolerance": {"mode": mode}, **spec}})


NODES = build_synthetic_nodes(2, 8, 32, 8)  # 512 nodes, leaves of 32


def test_the_job_reads_the_leaf_size_from_its_nodes() -> None:
    shape = build_group_shape(_job(0), NODES)
    assert (shape.nodes, shape.dp, shape.leaf_nodes, shape.pp, shape.tp) == (256, 32, 32, 8, 8)


@pytest.mark.parametrize(
    ("job", "recorded", "groups", "chose"),
    [
        (_job(0), 0, None, True),
        (_job(0), 4, 4, False),
        (_job(2), 0, 2, False),
        (_job(1, "None"), 0, 1, False),
    ],
    ids=["open: chosen now", "open: the recorded choice wins", "named: as is", "no replica groups: as is"],
)
def test_the_operator_fills_in_an_open_count(job: TrainingJob, recorded: int, groups: int | None, chose: bool) -> None:
    resolved, choice = resolve_replica_groups(job, NODES, recorded=recorded)
    assert (choice is not None) is chose
    if choice is not None:
        groups = choice.groups
        assert groups > 1 and (256 // groups) % 32 == 0, "groups of whole leaves"
    assert resolved.spec.parallelism.data_replicas == groups
    assert resolved.spec.replica_groups == (groups if job.spec.fault_tolerance.mode == "ReplicaGroups" else 1)
    assert job.spec.parallelism.data_replicas != 0 or resolved is not job, "the given job is left as it was"
