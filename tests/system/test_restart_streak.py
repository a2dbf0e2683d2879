"""Restart backoff and budgets count the current streak: a gang that ran healthy for
``restartPolicy.resetAfterSeconds`` starts again from ``backoffSeconds`` with the whole limit."""

from __future__ import annotations

from railyard.api.trainingjob import RestartPolicy, Restarts
from railyard.logic.restarts import decide_restart, decide_streak_reset, record_restart
from railyard.protocol.exitcodes import FailureClass

APP = FailureClass.APPLICATION
POLICY = RestartPolicy.model_validate({"application": {"limit": 3, "backoffSeconds": 10}, "maxBackoffSeconds": 300, "resetAfterSeconds": 600})


def _restart(r: Restarts, cls: FailureClass = APP) -> Restarts:
    return record_restart(r, cls, "x", "2026-01-01T00:00:00Z")


def test_backoff_doubles_within_a_streak_and_the_budget_is_spent() -> None:
    r = Restarts()
    waits = []
    for _ in range(3):
        d = decide_restart(POLICY, r, APP)
        assert d.allowed
        waits.append(d.backoff_seconds)
        r = _restart(r)
    assert waits == [10, 20, 40]
    assert not decide_restart(POLICY, r, APP).allowed
    assert r.application == 3 and r.streak == {"infrastructure": 0, "application": 3, "sdc": 0, "straggler": 0}


def test_a_healthy_run_clears_the_streak_not_the_totals() -> None:
    r = _restart(_restart(Restarts()))
    assert decide_streak_reset(r, POLICY, running_since=1000.0, now=1000.0 + 599) is None, "not healthy long enough"
    reset = decide_streak_reset(r, POLICY, running_since=1000.0, now=1000.0 + 600)
    assert reset is not None and reset.application == 2 and reset.total == 2
    assert reset.streak == {"infrastructure": 0, "application": 0, "sdc": 0, "straggler": 0}
    d = decide_restart(POLICY, reset, APP)
    assert d.allowed and d.backoff_seconds == 10 and d.used == 0
    assert decide_streak_reset(reset, POLICY, running_since=1000.0, now=5000.0) is None, "nothing open: no patch"


def test_a_long_job_failing_now_and_then_never_spends_its_budget() -> None:
    r, t = Restarts(), 0.0
    for _ in range(10):
        d = decide_restart(POLICY, r, APP)
        assert d.allowed and d.backoff_seconds == 10
        r = _restart(r)
        t += 3600  # an hour of healthy training between failures
        r = decide_streak_reset(r, POLICY, running_since=t - 3000, now=t) or r
    assert r.application == 10


def test_reset_disabled_and_old_statuses() -> None:
    never = POLICY.model_copy(update={"reset_after_seconds": 0.0})
    r = _restart(Restarts())
    assert decide_streak_reset(r, never, running_since=0.0, now=1e9) is None
    old = Restarts(application=3, total=3)  # written before streaks existed: the totals count
    assert not decide_restart(POLICY, old, APP).allowed
    assert decide_streak_reset(old, POLICY, running_since=0.0, now=600.0) is not None
