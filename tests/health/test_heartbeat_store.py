"""The rolling windows: bounded, ordered, per step, and cheap to read."""

from __future__ import annotations

import math

from railyard.logic.health.window import SAMPLE_WINDOW, HeartbeatStore, RankWindow
from railyard.protocol.heartbeat import CheckpointEvent, HealthResult, HeartbeatBatch, RankBeat


def _beat(step: int, recent: tuple[float, ...] = (), **kw: object) -> RankBeat:
    return RankBeat(rank=0, step=step, step_time_s=1.0, compute_s=recent[-1] if recent else 0.5, recent_compute_s=recent, **kw)  # type: ignore[arg-type]


def test_the_compute_window_keeps_the_newest_steps_in_order_across_wraparound() -> None:
    w = RankWindow(0, window=8)
    step = 0
    for k in range(5):
        vals = tuple(float(10 * k + i) for i in range(3))
        step += 3
        assert w.update(_beat(step, vals), 0, "n", float(k))
    assert list(w.recent_compute(100)) == [float(x) for x in (21, 22, 30, 31, 32, 40, 41, 42)]
    assert list(w.recent_compute(3)) == [40.0, 41.0, 42.0]


def test_only_the_steps_that_advanced_are_added_and_repeats_change_only_liveness() -> None:
    w = RankWindow(0, window=16)
    w.update(_beat(4, (1.0, 2.0)), 0, "n", 1.0)
    assert not w.update(_beat(4, (9.0,)), 0, "n", 2.0)
    assert (w.last_seen_at, w.step_advanced_at) == (2.0, 1.0)
    w.update(_beat(5, (7.0, 8.0)), 0, "n", 3.0)  # one new step: only the newest value is new
    assert list(w.recent_compute(16)) == [1.0, 2.0, 8.0]


def test_samples_are_bounded_and_keep_missing_values_missing() -> None:
    w = RankWindow(0, window=8)
    for s in range(1, SAMPLE_WINDOW + 11):
        w.update(_beat(s, loss=None if s % 2 else float(s), grad_norm=1.0), 0, "n", float(s))
    got = w.samples()
    assert len(got) == SAMPLE_WINDOW
    assert [x.step for x in got] == list(range(11, SAMPLE_WINDOW + 11))
    assert got[0].loss is None and got[1].loss == 12.0


def test_the_store_keeps_failed_checks_checkpoints_and_the_restore_source() -> None:
    store = HeartbeatStore()
    bad = HealthResult("replay", False, 3, confirmed=True)
    beats = (_beat(3, (0.5,), health=(HealthResult("kat", True, 3), bad)),)
    cps = (CheckpointEvent(step=3, tier="tier1", ok=True), CheckpointEvent(step=2, tier="tier2", ok=True))
    store.ingest("ns", "j", HeartbeatBatch("j", 1, 0, "n0", 0.0, beats, cps, "tier2", 2), 10.0)
    jw = store.job("ns", "j")
    assert jw is not None
    assert [e.result for e in jw.health_events()] == [bad]
    assert {t: c.step for t, c in jw.last_checkpoints().items()} == {"tier1": 3, "tier2": 2}
    assert (jw.restored_tier, jw.restored_step, jw.attempt) == ("tier2", 2, 1)
    assert list(jw.recent_step_times(10)) == [1.0]
    assert math.isinf(-jw.ranks[0].last_saving_at)


def test_an_attempt_restored_as_its_own_pods_say_not_as_the_carried_on_ones_did() -> None:
    """A replica-group repair: the survivors (pod 0, still attempt 0, which restored from the
    memory tier) keep sending how they started; the restarted group (pod 1, attempt 1) healed
    from a live peer, and that is how attempt 1 restored."""
    store = HeartbeatStore()
    store.begin_attempt("ns", "j", 0)
    store.begin_attempt("ns", "j", 1, carry_on={0: 0})
    healed = HeartbeatBatch("j", 1, 1, "n1", 0.0, (_beat(9),), (CheckpointEvent(step=9, tier="peer", ok=True, kind="restore", bytes=10),), "peer", 9)
    survivor = HeartbeatBatch("j", 0, 0, "n0", 0.0, (_beat(10),), (), "memory", 3)
    for batch in (healed, survivor, survivor):
        store.ingest("ns", "j", batch, 10.0)
    jw = store.job("ns", "j")
    assert jw is not None and (jw.restored_tier, jw.restored_step) == ("peer", 9)


def test_a_tier_restore_wins_over_a_heal_in_the_same_attempt() -> None:
    """A whole-job restart: group 0 restored the hinted memory checkpoint, group 1 had none and
    healed from group 0; the attempt restored from the memory tier, whichever beat comes last."""
    store = HeartbeatStore()
    restored = HeartbeatBatch("j", 1, 0, "n0", 0.0, (_beat(6),), (), "memory", 6)
    healed = HeartbeatBatch("j", 1, 1, "n1", 0.0, (_beat(6),), (), "peer", 6)
    for batch in (healed, restored, healed):
        store.ingest("ns", "j", batch, 10.0)
    jw = store.job("ns", "j")
    assert jw is not None and (jw.restored_tier, jw.restored_step) == ("memory", 6)
