"""Heartbeats of a ReplicaGroups job: every group numbers its ranks from 0, the store keys them by
job rank; after a group repair the carried-on groups keep their older attempt, and the store
accepts their beats and keeps their windows, so the rules judge the whole job."""

from __future__ import annotations

import itertools

import pytest

from railyard.logic.health import FaultKind, HealthPolicy, HealthState, PodStatus, decide_health
from railyard.logic.health.window import GroupLayout, HeartbeatStore, IngestResult
from railyard.logic.layout import MeshShape, build_rank_table, build_replica_group_table
from railyard.protocol.heartbeat import HealthResult, HeartbeatBatch, HeartbeatError, RankBeat
from railyard.protocol.mesh import job_rank_of_group_rank

NS, JOB = "ns", "j"


@pytest.mark.parametrize(
    ("nodes", "procs", "pp", "dp", "tp", "replicas"),
    [(2, 2, 1, 4, 1, 2), (4, 4, 2, 4, 2, 2), (4, 2, 1, 8, 1, 4), (6, 4, 2, 6, 2, 3), (2, 8, 2, 4, 2, 2)],
)
def test_a_group_rank_maps_back_to_the_rank_the_job_table_gives_its_slot(nodes: int, procs: int, pp: int, dp: int, tp: int, replicas: int) -> None:
    shape = MeshShape(nodes=nodes, procs_per_node=procs, pp=pp, dp=dp, tp=tp, replicas=replicas)
    table = build_rank_table(job=JOB, attempt=0, shape=shape, pod_nodes=[f"n{i}" for i in range(nodes)],
                             pod_rail_offset=[0] * nodes, pod_gpus=[procs] * nodes)
    job_rank = {(e.pod_index, e.local_rank): e.rank for e in table.ranks}
    seen = []
    for g in range(replicas):
        for e in build_replica_group_table(table, group=g, replicas=replicas, master_port=1).ranks:
            got = job_rank_of_group_rank(e.rank, group=g, replicas=replicas, pp=pp, dp=dp, tp=tp)
            assert got == job_rank[(e.pod_index, e.local_rank)], (g, e)
            seen.append(got)
    assert sorted(seen) == list(range(pp * dp * tp)), "every job rank once"


@pytest.mark.parametrize(("rank", "group"), [(-1, 0), (4, 0), (0, 2), (0, -1)])
def test_a_rank_or_group_outside_the_layout_is_refused(rank: int, group: int) -> None:
    with pytest.raises(ValueError, match=r"replica group|outside"):
        job_rank_of_group_rank(rank, group=group, replicas=2, pp=1, dp=4, tp=2)


# two replica groups of one pod each, two ranks per pod: group ranks 0, 1 on pods 0 and 1
LAYOUT = GroupLayout(replicas=2, pods_per_group=1, pp=1, dp=4, tp=1)


def batch(pod: int, attempt: int, step: int, *, ranks: int = 2, health: tuple[HealthResult, ...] = ()) -> HeartbeatBatch:
    return HeartbeatBatch(JOB, attempt, pod, f"node-{pod}", 0.0,
                          tuple(RankBeat(rank=r, step=step, step_time_s=1.0, compute_s=0.5, health=health if r == 0 else ()) for r in range(ranks)))


def started(attempt: int = 1) -> HeartbeatStore:
    store = HeartbeatStore()
    store.begin_attempt(NS, JOB, attempt, layout=LAYOUT)
    return store


def test_the_groups_ranks_are_kept_apart_by_job_rank() -> None:
    store = started()
    assert store.ingest(NS, JOB, batch(0, 1, 5), 1.0) is IngestResult.ACCEPTED
    assert store.ingest(NS, JOB, batch(1, 1, 5), 1.0) is IngestResult.ACCEPTED
    jw = store.job(NS, JOB)
    assert jw is not None
    assert {r: w.pod_index for r, w in jw.ranks.items()} == {0: 0, 1: 0, 2: 1, 3: 1}


def test_a_suspect_is_named_by_job_rank_and_a_rank_outside_the_group_is_refused_whole() -> None:
    store = started()
    store.ingest(NS, JOB, batch(1, 1, 5, health=(HealthResult("replica_checksum", False, 5, suspect_rank=1),)), 1.0)
    jw = store.job(NS, JOB)
    assert jw is not None
    [ev] = jw.health_events()
    assert (ev.rank, ev.pod_index, ev.result.suspect_rank) == (2, 1, 3)
    with pytest.raises(HeartbeatError, match="outside replica group 0"):
        store.ingest(NS, JOB, batch(0, 1, 6, ranks=3), 2.0)
    assert (sorted(jw.ranks), jw.batches) == ([2, 3], 1), "nothing of the refused batch was stored"


def test_after_a_group_repair_the_carried_on_group_is_heard_and_the_restarted_groups_old_attempt_is_not() -> None:
    store = started()
    for pod in (0, 1):
        store.ingest(NS, JOB, batch(pod, 1, 10), 1.0)
    before = store.job(NS, JOB)
    assert before is not None
    kept = before.ranks[0]
    # group 1 restarts as attempt 2; group 0 (pod 0, created in attempt 1) carries on
    jw = store.begin_attempt(NS, JOB, 2, layout=LAYOUT, carry_on={0: 1})
    assert jw.ranks == {0: kept, 1: before.ranks[1]}, "the carried-on ranks' windows go on"
    assert jw.max_step == 10
    assert store.ingest(NS, JOB, batch(0, 1, 11), 2.0) is IngestResult.ACCEPTED
    assert store.ingest(NS, JOB, batch(1, 1, 11), 2.0) is IngestResult.STALE_ATTEMPT, "the restarted group's old launcher"
    assert store.ingest(NS, JOB, batch(0, 0, 11), 2.0) is IngestResult.STALE_ATTEMPT, "older than the carried-on pod"
    assert store.ingest(NS, JOB, batch(1, 2, 11), 3.0) is IngestResult.ACCEPTED
    assert {r: (w.pod_index, w.step) for r, w in jw.ranks.items()} == {0: (0, 11), 1: (0, 11), 2: (1, 11), 3: (1, 11)}
    assert kept.step_advanced_at == 2.0
    # a later repair of group 1 again: group 0 still runs attempt 1
    jw = store.begin_attempt(NS, JOB, 3, carry_on={0: 1})
    assert jw.layout == LAYOUT, "the layout stays with the job"
    assert store.ingest(NS, JOB, batch(0, 1, 12), 4.0) is IngestResult.ACCEPTED
    assert store.ingest(NS, JOB, batch(1, 2, 12), 4.0) is IngestResult.STALE_ATTEMPT


def test_a_new_attempts_beat_first_then_the_operator_says_what_carries_on() -> None:
    store = started()
    store.ingest(NS, JOB, batch(0, 1, 10), 1.0)
    assert store.ingest(NS, JOB, batch(1, 2, 10), 2.0) is IngestResult.ACCEPTED
    assert store.ingest(NS, JOB, batch(0, 1, 11), 2.0) is IngestResult.STALE_ATTEMPT
    store.begin_attempt(NS, JOB, 2, carry_on={0: 1})
    assert store.ingest(NS, JOB, batch(0, 1, 11), 3.0) is IngestResult.ACCEPTED
    # a full restart carries nothing on
    jw = store.begin_attempt(NS, JOB, 3)
    assert jw.ranks == {} and jw.carried == {}
    assert store.ingest(NS, JOB, batch(0, 1, 12), 4.0) is IngestResult.STALE_ATTEMPT


def test_the_rules_see_the_whole_job_after_a_repair() -> None:
    """A carried-on group that stops advancing is hung; the restarted group that advances is not."""
    policy = HealthPolicy()
    pods = {i: PodStatus(i, "Running", f"node-{i}", 0.0) for i in (0, 1)}
    store = started()
    now = 1.0
    for step in range(1, 6):
        now += 1.0
        for pod in (0, 1):
            store.ingest(NS, JOB, batch(pod, 1, step), now)
    jw = store.begin_attempt(NS, JOB, 2, carry_on={0: 1})
    state = HealthState()
    hung = []
    for step in itertools.count(6):
        now += 1.0
        store.ingest(NS, JOB, batch(0, 1, 6), now)  # group 0 stuck at step 6, beating
        store.ingest(NS, JOB, batch(1, 2, step), now)
        d = decide_health(jw, pods, state, policy, now)
        state = d.state
        assert not [v for v in d.verdicts if v.kind is FaultKind.DEAD], "no group is silent"
        hung = [v for v in d.verdicts if v.kind is FaultKind.HANG]
        if hung or now > 10 * policy.hang_timeout_floor_s:
            break
    assert [(v.pod_index, v.rank) for v in hung] == [(0, 0)], "the carried-on group's stall is seen"
