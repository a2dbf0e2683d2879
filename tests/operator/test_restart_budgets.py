"""Restart budgets per class and exponential backoff."""

from __future__ import annotations

import pytest

from railyard.api.trainingjob import (
    CheckpointRef,
    RestartBudget,
    RestartPolicy,
    Restarts,
    TrainingJobSpec,
    TrainingJobStatus,
)
from railyard.logic.restarts import (
    best_checkpoint,
    compute_backoff,
    decide_restart,
    record_restart,
    restore_hint,
)
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


def _status(refs: list[tuple[str, int]], step: int = 40) -> TrainingJobStatus:
    checkpoints = [CheckpointRef(tier=t, step=s) for t, s in refs]
    newest = max(checkpoints, key=lambda r: r.step) if checkpoints else None
    return TrainingJobStatus(checkpoints=checkpoints, last_checkpoint=newest, step=step)


def _spec(medium: str) -> TrainingJobSpec:
    return TrainingJobSpec.model_validate({"nodes": 2, "checkpoint": {"memory": {"medium": medium}}})


def test_a_full_restart_never_hints_a_memory_tier_that_lived_in_the_deleted_pods() -> None:
    """Seen under load: an in-place restart fell back to a full one, the hint named the memory
    tier of the deleted pods (medium Pod), and the trainer refused to start (77: the hinted
    checkpoint is missing) instead of restoring the newest shared one."""
    st = _status([("memory", 30), ("shared", 20)])
    assert restore_hint(st, _spec("Pod"), pods_kept=False) == {"tier": "shared", "step": 20, "lastStep": 40}
    # the pods stay (in place): their memory tier is still there, a moved pod's comes from its neighbour
    assert restore_hint(st, _spec("Pod"), pods_kept=True) == {"tier": "memory", "step": 30, "lastStep": 40}
    # a tmpfs hostPath outlives the pods
    assert restore_hint(st, _spec("HostPath"), pods_kept=False) == {"tier": "memory", "step": 30, "lastStep": 40}
    # nothing survives: no hint (the trainer starts from what it finds, here nothing)
    assert restore_hint(_status([("memory", 30)]), _spec("Pod"), pods_kept=False) is None
    assert restore_hint(_status([]), _spec("HostPath"), pods_kept=True) is None


def test_at_one_step_the_hint_prefers_the_fastest_tier() -> None:
    st = _status([("shared", 30), ("local", 30), ("memory", 25)])
    assert restore_hint(st, _spec("HostPath"), pods_kept=True) == {"tier": "local", "step": 30, "lastStep": 40}


def test_one_ranking_of_tiers_names_the_best_checkpoint_and_an_unknown_tier_comes_last() -> None:
    """The status's lastCheckpoint (handlers/health.py) and the restore hint rank the same way."""
    refs = [CheckpointRef(tier=t, step=s) for t, s in [("nvme", 30), ("shared", 30), ("memory", 25)]]
    assert best_checkpoint(refs).tier == "shared"
    assert best_checkpoint([*refs, CheckpointRef(tier="memory", step=30)]).tier == "memory"
    assert best_checkpoint([CheckpointRef(tier="nvme", step=31), *refs]).tier == "nvme"  # newer wins whatever the tier


@pytest.mark.parametrize(
    ("in_place", "backoff", "since_before", "since_after"),
    [(False, 0.0, None, None), (False, 4.0, 2, None), (True, 0.0, None, 3), (True, 8.0, 1, 1)],
)
def test_every_restart_writes_the_same_status_fields(in_place: bool, backoff: float, since_before: int | None, since_after: int | None) -> None:
    """Full, in place or a replica-group shrink: the restart counted under its class, the new
    attempt, the failure time, the backoff's end, the quarantined nodes; an in-place restart also
    says from which attempt its pods count (kept across in-place restarts)."""
    from railyard.api.trainingjob import QuarantinedNode, TrainingJobStatus
    from railyard.logic.failures import Failure
    from railyard.logic.restarts import restart_update

    st = TrainingJobStatus(attempt=3, pods_since_attempt=since_before)
    q = [QuarantinedNode(node="n1", reason="NodeLost", time="t")]
    got = restart_update(st, Failure("NodeLost", FailureClass.INFRASTRUCTURE, ("n1",), "gone"), attempt=4, now=100.0,
                         now_iso="t", backoff_s=backoff, quarantined=q, in_place=in_place)
    assert got["attempt"] == 4 and got["quarantined_nodes"] == q
    assert got["restarts"].infrastructure == 1 and got["restarts"].last_reason == "NodeLost: gone"
    assert got["failure_time"] and (got["next_attempt_time"] is None) == (backoff == 0)
    assert got.get("pods_since_attempt") == since_after and ("pods_since_attempt" in got) == in_place
