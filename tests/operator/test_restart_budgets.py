"""Restart budgets per class and exponential backoff."""

from __future__ import annotations

import pytest

from railyard.api.trainingjob import RestartBudget, RestartPolicy, Restarts
from railyard.logic.restarts import compute_backoff, decide_restart, record_restart
from railyard.protocol.exitcodes import FailureClass


def test_each_class_spends_only_its_own_budget() -> None:
    policy = RestartPolicy(application=RestartBudget(limit=2), infrastructure=RestartBudget(limit=1))
    r = Restarts()
    r = record_restart(r, FailureClass.APPLICATION, "crash", "t1")
    r = record_restart(r, FailureClass.APPLICATION, "crash", "t2")
    assert not decide_restart(policy, r, FailureClass.APPLICATION).allowed
    assert decide_restart(policy, r, FailureClass.INFRASTRUCTURE).allowed
    assert (r.total, r.application, r.infrastructure, r.last_reason, r.last_time) == (2, 2, 0, "crash", "t2")


def test_spent_budget_names_the_field_to_raise() -> None:
    policy = RestartPolicy(sdc=RestartBudget(limit=0))
    d = decide_restart(policy, Restarts(), FailureClass.SDC)
    assert not d.allowed and "spec.restartPolicy.sdc.limit" in d.reason


def test_permanent_failures_are_never_retried() -> None:
    d = decide_restart(RestartPolicy(), Restarts(), FailureClass.PERMANENT)
    assert not d.allowed and d.limit == 0


@pytest.mark.parametrize(("used", "expected"), [(0, 10.0), (1, 20.0), (2, 40.0), (5, 300.0), (60, 300.0)])
def test_backoff_doubles_up_to_the_cap(used: int, expected: float) -> None:
    assert compute_backoff(RestartBudget(limit=99, backoff_seconds=10.0), used, 300.0) == expected


def test_decision_carries_the_backoff_of_the_next_restart() -> None:
    policy = RestartPolicy(application=RestartBudget(limit=5, backoff_seconds=2.0), max_backoff_seconds=5.0)
    r = record_restart(Restarts(), FailureClass.APPLICATION, "x", "t")
    d = decide_restart(policy, r, FailureClass.APPLICATION)
    assert d.allowed and d.backoff_seconds == 4.0 and d.used == 1
    assert compute_backoff(RestartBudget(limit=1, backoff_seconds=0.0), 3, 300.0) == 0.0
