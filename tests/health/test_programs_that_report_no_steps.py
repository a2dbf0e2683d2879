"""A program of one's own under the launcher (``spec.trainer.program``) may never call the SDK's
``report_step``: its ranks are then alive but their step means nothing. The operator must not
call them hung, must not call a pod that never beats dead, and must judge them as any rank the
moment they opt in."""

from __future__ import annotations

import math

from railyard.logic.health import FaultKind, HealthPolicy, PodStatus, decide_health

from .sim import JOB, NS, SimJob


def test_a_rank_that_never_reports_steps_is_never_hung() -> None:
    sim = SimJob(world=8, progress=False)
    sim.beat()
    sim.idle(20 * max(sim.policy.hang_timeout_floor_s, sim.policy.first_step_timeout_s))
    assert [v for v in sim.verdicts() if v.kind is FaultKind.HANG] == []


def test_it_is_hung_like_any_rank_once_it_reports_steps() -> None:
    sim = SimJob(world=8, progress=False)
    sim.idle(3 * sim.policy.hang_timeout_floor_s)
    sim.progress = True  # the program's first report_step
    sim.run_steps(20)
    sim.idle(sim.policy.hang_timeout_floor_s + 4 * sim.policy.heartbeat_interval_s)
    assert [v.kind for v in sim.verdicts()] == [FaultKind.HANG]


def test_a_rank_that_reports_no_steps_but_stops_beating_is_dead() -> None:
    sim = SimJob(world=16, progress=False)
    sim.beat()
    sim.silent_pods = {1}
    sim.idle(sim.policy.heartbeat_timeout_s + 2 * sim.policy.heartbeat_interval_s)
    assert [(v.kind, v.pod_index) for v in sim.verdicts()] == [(FaultKind.DEAD, 1)]


def test_without_the_sdk_a_pod_that_never_beats_is_not_dead() -> None:
    bundled = HealthPolicy.from_spec({})
    program = HealthPolicy.from_spec({}, heartbeats_expected=False)
    assert math.isfinite(bundled.first_heartbeat_timeout_s) and program.first_heartbeat_timeout_s == math.inf
    assert program.heartbeat_timeout_s == bundled.heartbeat_timeout_s, "ranks that do beat are judged as any other"
    sim = SimJob(world=8, policy=program)
    job = sim.store.job(NS, JOB)
    assert job is not None
    pods = {0: PodStatus(0, "Running", "node-0", running_since=100.0)}
    assert decide_health(job, pods, sim.state, program, 100.0 + 100 * bundled.first_heartbeat_timeout_s).verdicts == ()
    assert decide_health(job, pods, sim.state, bundled, 100.0 + bundled.first_heartbeat_timeout_s + 1).verdicts != ()
