"""Dead and hung ranks, on synthetic streams through the real store."""

from __future__ import annotations

import dataclasses
import re

import pytest

from railyard.logic.health import Action, FaultKind, HealthPolicy, PodStatus, decide_health

from .sim import JOB, NS, SimJob


def _first(sim: SimJob, kind: FaultKind) -> tuple[float, int] | None:
    for d in sim.decisions:
        for v in d.verdicts:
            if v.kind is kind:
                return v.detected_at, v.pod_index
    return None


def test_a_silent_pod_is_dead_after_the_timeout_and_reported_once() -> None:
    sim = SimJob(world=16)
    sim.run_steps(10)
    sim.silent_pods = {1}
    silent_from = sim.now
    sim.idle(sim.policy.heartbeat_timeout_s - 1)
    assert _first(sim, FaultKind.DEAD) is None
    sim.idle(2 * sim.policy.heartbeat_interval_s + 1)
    found = _first(sim, FaultKind.DEAD)
    assert found is not None
    at, pod = found
    assert pod == 1
    assert at - silent_from <= sim.policy.heartbeat_timeout_s + sim.policy.heartbeat_interval_s
    [v] = [v for d in sim.decisions for v in d.verdicts if v.kind is FaultKind.DEAD]
    assert (v.rank, v.node, v.action) == (8, "node-1", Action.RESTART)
    assert sim.decisions[-1].active[0].kind is FaultKind.DEAD, "still active, but reported once"


def test_a_pod_that_is_not_running_is_not_dead() -> None:
    sim = SimJob(world=16)
    sim.run_steps(5)
    job = sim.store.job(NS, JOB)
    assert job is not None
    pods = {0: PodStatus(0, "Running", "node-0"), 1: PodStatus(1, "Succeeded", "node-1")}
    now = sim.now + 60
    sim.store.ingest(NS, JOB, _batch_for_pod0(sim, now), now)
    d = decide_health(job, pods, sim.state, sim.policy, now)
    assert [v.pod_index for v in d.verdicts if v.kind is FaultKind.DEAD] == []


def _batch_for_pod0(sim: SimJob, now: float):  # type: ignore[no-untyped-def]
    from railyard.protocol.heartbeat import HeartbeatBatch, RankBeat

    ranks = tuple(RankBeat(rank=r, step=sim.step + 1, step_time_s=1.0) for r in range(8))
    return HeartbeatBatch(JOB, 0, 0, "node-0", now, ranks)


def test_a_running_pod_that_never_beats_is_dead_after_the_first_heartbeat_timeout() -> None:
    sim = SimJob(world=8)
    job = sim.store.job(NS, JOB)
    assert job is not None
    pods = {0: PodStatus(0, "Running", "node-0", running_since=100.0)}
    limit = sim.policy.first_heartbeat_timeout_s
    assert decide_health(job, pods, sim.state, sim.policy, 100.0 + limit - 1).verdicts == ()
    [v] = decide_health(job, pods, sim.state, sim.policy, 100.0 + limit + 1).verdicts
    assert (v.kind, v.reason, v.node) == (FaultKind.DEAD, "NoFirstHeartbeat", "node-0")


@pytest.mark.parametrize("compute_s", [0.3, 5.0])
def test_a_hang_is_detected_within_max_of_3_p99_and_the_floor(compute_s: float) -> None:
    sim = SimJob(world=16, compute_s=compute_s)
    sim.run_steps(40)
    p99 = sim.decisions[-1].p99_step_time_s
    assert p99 is not None
    bound = max(3 * p99, sim.policy.hang_timeout_floor_s)
    stalled_at = sim.store.job(NS, JOB).ranks[0].step_advanced_at  # type: ignore[union-attr]
    sim.idle(bound - 2 * sim.policy.heartbeat_interval_s)
    assert _first(sim, FaultKind.HANG) is None, "fired before the hang timeout"
    sim.idle(4 * sim.policy.heartbeat_interval_s)
    found = _first(sim, FaultKind.HANG)
    assert found is not None
    assert found[0] - stalled_at <= bound + sim.policy.heartbeat_interval_s
    assert _first(sim, FaultKind.DEAD) is None, "heartbeats arrive: hung, not dead"
    hangs = [v for d in sim.decisions for v in d.verdicts if v.kind is FaultKind.HANG]
    assert sorted(v.pod_index for v in hangs) == [0, 1]
    assert all(v.action is Action.RESTART for v in hangs)
    # the verdict names how long the step stood still and the timeout, never less than it
    m = re.search(r"for ([0-9.]+)s \(hang timeout ([0-9.]+)s\)", hangs[0].message)
    assert m and float(m.group(2)) >= sim.policy.hang_timeout_floor_s and float(m.group(1)) >= float(m.group(2)), hangs[0].message


def test_long_checkpoint_saves_never_look_like_hangs() -> None:
    sim = SimJob(world=16)
    for _ in range(3):
        sim.run_steps(30)
        sim.saving = True
        sim.idle(120)  # a save 12x longer than the hang timeout
        sim.saving = False
        sim.idle(sim.policy.hang_timeout_floor_s - 2 * sim.policy.heartbeat_interval_s)
    assert [v for v in sim.verdicts() if v.kind is FaultKind.HANG] == []


def test_the_hang_clock_restarts_when_the_save_ends() -> None:
    sim = SimJob(world=8)
    sim.run_steps(30)
    sim.saving = True
    sim.idle(30)
    sim.saving = False
    sim.idle(sim.policy.hang_timeout_floor_s + 2 * sim.policy.heartbeat_interval_s)
    assert [v.kind for v in sim.verdicts()] == [FaultKind.HANG]


def test_before_the_first_step_the_first_step_timeout_applies() -> None:
    policy = dataclasses.replace(HealthPolicy(), first_step_timeout_s=120.0)
    sim = SimJob(world=8, policy=policy)
    sim.beat()
    sim.idle(100)
    assert sim.verdicts() == []
    sim.idle(30)
    assert [v.kind for v in sim.verdicts()] == [FaultKind.HANG]


def test_a_new_attempt_starts_from_a_clean_slate() -> None:
    sim = SimJob(world=8)
    sim.run_steps(10)
    sim.idle(30)
    assert [v.kind for v in sim.verdicts()] == [FaultKind.HANG]
    sim.attempt = 1
    sim.store.begin_attempt(NS, JOB, 1)
    sim.decisions.clear()
    sim.run_steps(10)
    assert sim.verdicts() == []
    assert sim.state.attempt == 1 and sim.state.open == frozenset()


@dataclasses.dataclass(frozen=True)
class _Rank:
    """One rank's signals, as the store keeps them (logic.health.model.RankSignals)."""

    step: int
    last_seen_at: float
    step_advanced_at: float
    rank: int = 0
    pod_index: int = 0
    node: str = "node-0"
    saving: bool = False
    last_saving_at: float = float("-inf")
    progress: bool = True
    waiting_for_groups: bool = False
    last_waiting_at: float = float("-inf")

    def recent_compute(self, n: int) -> list[float]:
        return []


@pytest.mark.parametrize(
    ("step", "final_step", "silent_for", "stalled_for", "expect"),
    [
        # a rank that trained its last step is finishing (final save, exit while its peers finish)
        (60, 60, 0.0, 30.0, set()),
        (60, 60, 30.0, 30.0, set()),
        (60, 60, 0.0, 700.0, {FaultKind.HANG}),  # ... but not forever: the first-step bound
        (60, 60, 700.0, 700.0, {FaultKind.DEAD}),
        # before its last step, or with no known last step, the step-time bounds hold
        (59, 60, 0.0, 30.0, {FaultKind.HANG}),
        (59, 60, 30.0, 30.0, {FaultKind.DEAD}),
        (60, None, 0.0, 30.0, {FaultKind.HANG}),
    ],
)
def test_a_rank_past_its_last_step_gets_the_teardown_bound(
    step: int, final_step: int | None, silent_for: float, stalled_for: float, expect: set[FaultKind]
) -> None:
    from railyard.logic.health.liveness import decide_dead_ranks, decide_hung_ranks

    policy = HealthPolicy(final_step=final_step)
    now = 10_000.0
    rank = _Rank(step=step, last_seen_at=now - silent_for, step_advanced_at=now - stalled_for)
    pods = {0: PodStatus(0, "Running", "node-0", running_since=0.0)}
    hang_s = 12.0
    got = {v.kind for v in decide_dead_ranks([rank], pods, policy, now)}
    got |= {v.kind for v in decide_hung_ranks([rank], pods, hang_s, policy, now)}
    assert got == expect
