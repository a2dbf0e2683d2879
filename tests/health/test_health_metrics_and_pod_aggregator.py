"""Health metrics stay bounded per job; the pod aggregator batches, retries and forgets."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

from prometheus_client import CollectorRegistry

from railyard.observe.health_metrics import HealthMetrics
from railyard.protocol.heartbeat import HealthResult, RankBeat, parse_heartbeat
from railyard_trainer.health.client import BeatSender, PodAggregator, beat_message

from .sim import JOB, NS, SimJob


def test_only_the_slowest_ranks_get_series_and_verdicts_are_counted() -> None:
    reg = CollectorRegistry()
    m = HealthMetrics(reg)
    sim = SimJob(world=64, seed=2, slow={10: (21, 1.4)})
    sim.run_steps(40)
    for d in sim.decisions:
        m.observe_decision(NS, JOB, d)
    names = {s.labels["rank"] for fam in reg.collect() if fam.name == "railyard_straggler_score" for s in fam.samples}
    assert len(names) == 5 and "10" in names
    assert reg.get_sample_value("railyard_stragglers_flagged_total", {"namespace": NS, "job": JOB}) == 1
    assert reg.get_sample_value("railyard_stragglers_flagged_current", {"namespace": NS, "job": JOB}) == 1
    assert reg.get_sample_value("railyard_fault_detection_seconds_count", {"kind": "Straggler"}) == 1
    assert reg.get_sample_value("railyard_step_time_seconds", {"namespace": NS, "job": JOB, "percentile": "99"}) > 0
    m.forget_job(NS, JOB)
    assert not [s for fam in reg.collect() if fam.name == "railyard_straggler_score" for s in fam.samples]


class FakeOperator:
    def __init__(self) -> None:
        self.status = 204
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, url: str, token: str, body: bytes) -> int:
        assert token == "tok"
        parse_heartbeat(body)  # what we send is always valid
        self.bodies.append(json.loads(body))
        return self.status


def _aggregator(post: FakeOperator, clock: list[float]) -> PodAggregator:
    path = os.path.join(tempfile.mkdtemp(), "agg.sock")
    return PodAggregator(url="http://x", token="tok", job="j", attempt=2, pod_index=1, node="n1",
                         interval_s=1.0, path=path, post=post, clock=lambda: clock[0])


def _datagram(rank: int, step: int, **kw: Any) -> bytes:
    beat = RankBeat(rank=rank, step=step, step_time_s=1.0, compute_s=0.5, recent_compute_s=(0.4, 0.5), **kw)
    return json.dumps(beat_message(beat)).encode()


def test_the_aggregator_batches_ranks_and_keeps_failed_checks_until_delivered() -> None:
    op, clock = FakeOperator(), [100.0]
    agg = _aggregator(op, clock)
    try:
        agg.accept(_datagram(8, 3, health=(HealthResult("kat", False, 3, confirmed=True),)))
        agg.accept(_datagram(9, 3))
        op.status = 503
        assert not agg.flush()
        op.status = 204
        assert agg.flush()
        first, second = op.bodies
        assert [r["rank"] for r in second["ranks"]] == [8, 9] and second["pod_index"] == 1
        assert second["ranks"][0]["health"] == first["ranks"][0]["health"] != []
        assert second["ranks"][0]["recent_compute_s"] == [0.4, 0.5]
        assert agg.flush() and op.bodies[-1]["ranks"][0]["health"] == [], "delivered once"
    finally:
        agg.sock.close()


def test_a_rank_that_stopped_sending_drops_out_of_the_batch() -> None:
    op, clock = FakeOperator(), [100.0]
    agg = _aggregator(op, clock)
    try:
        agg.accept(_datagram(8, 3))
        clock[0] += 2.0
        agg.accept(_datagram(9, 4))
        clock[0] += 2.0  # rank 8 silent for 4 s > 3 intervals
        assert agg.flush()
        assert [r["rank"] for r in op.bodies[-1]["ranks"]] == [9]
        agg.accept(b"not json")  # our own pod's garbage never breaks the loop
        assert agg.flush()
    finally:
        agg.sock.close()


def test_the_last_beats_queued_when_the_aggregator_stops_are_posted() -> None:
    """A program's final step is sent just before it stops the aggregator: the datagrams still
    in the socket are part of the final post (else the job's status ends short of its last step)."""
    op, clock = FakeOperator(), [100.0]
    agg = _aggregator(op, clock)
    sender = BeatSender(agg.path)
    try:
        assert sender.send(json.loads(_datagram(8, 119))) and sender.send(json.loads(_datagram(9, 120)))
        agg.stop()  # before the thread ever read the socket: stop, then run drains and posts
        agg.start()
        agg.join(10)
        assert not agg.is_alive()
        assert [(r["rank"], r["step"]) for r in op.bodies[-1]["ranks"]] == [(8, 119), (9, 120)]
    finally:
        sender.close()


def _final(rank: int, step: int) -> dict[str, Any]:
    beat = RankBeat(rank=rank, step=step, step_time_s=1.0)
    return beat_message(beat, final=True)


def test_the_stopping_aggregator_waits_for_the_final_beat_of_every_rank_still_beating() -> None:
    """Ranks close one by one: local rank 0 stops its aggregator as soon as it finished, and the
    last post must still carry the other ranks' last steps (the status would end a step short)."""
    op, clock = FakeOperator(), [100.0]
    agg = _aggregator(op, clock)
    sender = BeatSender(agg.path)
    try:
        assert sender.send(json.loads(_datagram(9, 13)))  # rank 9 beats, its last step still to come
        assert sender.send(_final(8, 14))  # the aggregator's own rank finished
        agg.stop()
        agg.start()  # halted: it drains, then waits for rank 9
        assert sender.send(_final(9, 14))
        agg.join(agg.final_wait_s + 10)
        assert not agg.is_alive()
        assert [(r["rank"], r["step"]) for r in op.bodies[-1]["ranks"]] == [(8, 14), (9, 14)]
        assert agg.waiting_for() == []
    finally:
        sender.close()


def test_a_rank_that_never_sends_its_final_beat_delays_the_last_post_only_a_bounded_time() -> None:
    op, clock = FakeOperator(), [100.0]
    agg = _aggregator(op, clock)
    agg.final_wait_s = 0.2
    agg.accept(_datagram(9, 13))  # beating, but it hangs and never closes
    agg.accept(json.dumps(_final(8, 14)).encode())
    agg.stop()
    agg.start()
    agg.join(10)
    assert not agg.is_alive()
    assert [(r["rank"], r["step"]) for r in op.bodies[-1]["ranks"]] == [(8, 14), (9, 13)]
    assert agg.waiting_for() == [9]


def test_a_rank_that_fell_silent_is_not_waited_for() -> None:
    op, clock = FakeOperator(), [100.0]
    agg = _aggregator(op, clock)
    agg.final_wait_s = 3600.0  # only a wait that is skipped lets the test end
    agg.accept(_datagram(9, 13))
    clock[0] += 5.0  # rank 9 silent for 5 intervals: its process is gone
    agg.accept(json.dumps(_final(8, 14)).encode())
    assert agg.waiting_for() == []
    agg.stop()
    agg.start()
    agg.join(10)
    assert not agg.is_alive()
    assert [(r["rank"], r["step"]) for r in op.bodies[-1]["ranks"]] == [(8, 14)]


def test_the_health_service_keeps_state_between_evaluations_and_forgets_jobs() -> None:
    from railyard.logic.health import FaultKind, PodStatus
    from railyard.observe.health import HealthService
    from railyard.protocol.heartbeat import HeartbeatBatch

    reg = CollectorRegistry()
    svc = HealthService(metrics=HealthMetrics(reg))
    svc.begin_attempt("ns", "j", 1)
    pods = {0: PodStatus(0, "Running", "n0", running_since=0.0)}
    spec = {"heartbeatTimeoutSeconds": 10}
    beats = tuple(RankBeat(rank=r, step=1, step_time_s=1.0) for r in range(2))
    svc.store.ingest("ns", "j", HeartbeatBatch("j", 1, 0, "n0", 0.0, beats), 1.0)
    assert svc.evaluate("ns", "j", 1, pods, spec, 5.0).verdicts == ()
    first = svc.evaluate("ns", "j", 1, pods, spec, 12.0)
    assert [v.kind for v in first.verdicts] == [FaultKind.DEAD] and first.restart
    assert svc.evaluate("ns", "j", 1, pods, spec, 14.0).verdicts == (), "reported once"
    svc.forget("ns", "j")
    assert svc.store.job("ns", "j") is None
    assert reg.get_sample_value("railyard_heartbeat_age_seconds", {"namespace": "ns", "job": "j"}) is None


def test_a_refused_attempt_posts_no_more_and_says_so_once_as_expected() -> None:
    """A 409 says the job moved on to a newer attempt (a restart overtook this process's last
    post): resending cannot succeed, and it is no failure of the heartbeat path."""
    op, clock = FakeOperator(), [100.0]
    agg = _aggregator(op, clock)
    try:
        agg.accept(_datagram(8, 3))
        op.status = 503
        assert not agg.flush() and not agg.superseded, "a server error is retried"
        op.status = 409
        assert not agg.flush() and agg.superseded
        op.status = 204
        clock[0] += 0.5
        agg.accept(_datagram(8, 4))
        assert not agg.flush() and len(op.bodies) == 2, "nothing is posted after the 409"
    finally:
        agg.sock.close()
