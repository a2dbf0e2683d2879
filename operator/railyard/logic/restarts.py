"""Restart budgets and backoff, per failure class.

Each class (infrastructure, application, SDC, straggler) spends its own budget from
``spec.restartPolicy``, so a flaky node never burns the application's three retries and a
permanent exit code spends nothing: it fails the job at once. Backoff doubles per restart of the
same class, capped by ``maxBackoffSeconds``.

Budgets and backoff count the **streak** (``status.restarts.streak``): restarts since the gang
last ran with every pod Running for ``restartPolicy.resetAfterSeconds`` (default 600 s). A
crash loop spends its budget and backs off; a job that fails once a day for weeks does not end
up waiting the maximum backoff on every restart, nor fails for restarts spread over its life
(the way the kubelet resets CrashLoopBackOff after 10 minutes of running). The per-class totals
in ``status.restarts`` keep counting for people and metrics.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from railyard.api.trainingjob import (
    CheckpointFence,
    CheckpointRef,
    QuarantinedNode,
    RestartBudget,
    RestartPolicy,
    Restarts,
    TrainingJobSpec,
    TrainingJobStatus,
)
from railyard.logic.conditions import format_micro_time
from railyard.logic.failures import Failure
from railyard.protocol.exitcodes import FailureClass
from railyard.protocol.restore import TIER_RANK

#: Failure class -> (field of RestartPolicy, field of Restarts).
_CLASS_FIELDS: Mapping[FailureClass, str] = {
    FailureClass.INFRASTRUCTURE: "infrastructure",
    FailureClass.APPLICATION: "application",
    FailureClass.SDC: "sdc",
    FailureClass.STRAGGLER: "straggler",
}


@dataclass(frozen=True, slots=True)
class RestartDecision:
    allowed: bool
    #: Seconds to wait before the next gang is placed.
    backoff_seconds: float
    #: Restarts of this class already spent, and the limit.
    used: int
    limit: int
    reason: str


def budget_of(policy: RestartPolicy, cls: FailureClass) -> RestartBudget | None:
    name = _CLASS_FIELDS.get(cls)
    if name is None:
        return None
    budget: RestartBudget = getattr(policy, name)
    return budget


def restarts_of(restarts: Restarts, cls: FailureClass) -> int:
    """Restarts of ``cls`` in the current streak (a status without a streak: the total)."""
    name = _CLASS_FIELDS.get(cls)
    if name is None:
        return 0
    if restarts.streak is not None:
        return int(restarts.streak.get(name, 0))
    return int(getattr(restarts, name))


def decide_streak_reset(
    restarts: Restarts, policy: RestartPolicy, running_since: float | None, now: float
) -> Restarts | None:
    """The restarts with the streak cleared when the current gang has been all Running for
    ``resetAfterSeconds`` and a streak is open; None when nothing changes. Cleared classes are
    set to 0 (not removed), so a merge patch carries the change."""
    if running_since is None or policy.reset_after_seconds <= 0 or now - running_since < policy.reset_after_seconds:
        return None
    current = (
        restarts.streak
        if restarts.streak is not None
        else {n: int(getattr(restarts, n)) for n in _CLASS_FIELDS.values()}
    )
    if not any(current.values()):
        return None
    return restarts.model_copy(update={"streak": dict.fromkeys(current, 0)})


def compute_backoff(budget: RestartBudget, used: int, max_backoff: float) -> float:
    """``backoffSeconds * 2**used``, capped."""
    if budget.backoff_seconds <= 0:
        return 0.0
    return float(min(budget.backoff_seconds * (2.0 ** min(used, 40)), max_backoff))


def decide_restart(policy: RestartPolicy, restarts: Restarts, cls: FailureClass) -> RestartDecision:
    if cls is FailureClass.PLANNED:
        return RestartDecision(True, 0.0, restarts.planned, 0, "planned move: no restart budget spent")
    budget = budget_of(policy, cls)
    if budget is None:
        return RestartDecision(False, 0.0, 0, 0, f"{cls.value} failures are not retried")
    used = restarts_of(restarts, cls)
    if used >= budget.limit:
        return RestartDecision(
            False,
            0.0,
            used,
            budget.limit,
            f"{cls.value} restart budget spent ({used}/{budget.limit}); raise "
            f"spec.restartPolicy.{_CLASS_FIELDS[cls]}.limit to allow more",
        )
    return RestartDecision(
        True, compute_backoff(budget, used, policy.max_backoff_seconds), used, budget.limit,
        f"{cls.value} restart {used + 1}/{budget.limit}",
    )


def record_restart(restarts: Restarts, cls: FailureClass, reason: str, now_iso: str) -> Restarts:
    """A copy of ``restarts`` with one more restart of ``cls``. A planned move (class Planned)
    is counted apart: not in ``total``, not in the streak, no budget spent."""
    if cls is FailureClass.PLANNED:
        return restarts.model_copy(
            update={"planned": restarts.planned + 1, "last_reason": reason, "last_time": now_iso}
        )
    name = _CLASS_FIELDS[cls]
    streak = (
        dict(restarts.streak)
        if restarts.streak is not None
        else {n: int(getattr(restarts, n)) for n in _CLASS_FIELDS.values()}
    )
    streak[name] = streak.get(name, 0) + 1
    return restarts.model_copy(
        update={
            name: int(getattr(restarts, name)) + 1,
            "streak": streak,
            "total": restarts.total + 1,
            "last_reason": reason,
            "last_time": now_iso,
        }
    )


def restart_update(
    status: TrainingJobStatus, failure: Failure, *, attempt: int, now: float, now_iso: str, backoff_s: float,
    quarantined: list[QuarantinedNode], in_place: bool,
) -> dict[str, Any]:
    """What every restart writes into the status, written once (full, in place, a replica-group
    shrink): the restart counted, the new attempt, when it failed, when the next attempt may start
    (after the backoff), the quarantined nodes. ``in_place``: the attempt keeps pods of earlier
    attempts, counted from ``pods_since_attempt`` (kept across in-place restarts)."""
    update: dict[str, Any] = {
        "restarts": record_restart(status.restarts, failure.cls, f"{failure.kind}: {failure.message}", now_iso),
        "attempt": attempt,
        "failure_time": format_micro_time(now),
        "next_attempt_time": format_micro_time(now + backoff_s) if backoff_s > 0 else None,
        "quarantined_nodes": quarantined,
    }
    fence = new_fence(failure, attempt)
    if fence is not None:
        # the checkpoints after the step are on the abandoned part of the run: not hinted again
        refs = [r for r in status.checkpoints if r.step <= fence.step]
        update.update(checkpoint_fence=fence, checkpoints=refs, last_checkpoint=best_checkpoint(refs) if refs else None)
    if in_place:
        update["pods_since_attempt"] = (
            status.pods_since_attempt if status.pods_since_attempt is not None else status.attempt
        )
    return update


def best_checkpoint(refs: Iterable[CheckpointRef]) -> CheckpointRef:
    """The newest checkpoint; at one step, the fastest tier to read (the trainer's restore
    order, :data:`railyard.protocol.restore.TIER_RANK`; a tier it does not know comes last)."""
    return max(refs, key=lambda r: (r.step, -TIER_RANK.get(r.tier, len(TIER_RANK))))


def new_fence(failure: Failure, attempt: int) -> CheckpointFence | None:
    """The fence a restart to ``attempt`` after ``failure`` puts up (None: none): the replica
    groups' states differed after ``failure.restore_not_after`` and no majority named the bad
    one (logic/health/groups.py), so this attempt goes back to at most that step, and what the
    earlier attempts saved after it must never be restored, by this restart or any later one
    (until this attempt's own saves, which the fence lets through, replace them)."""
    if failure.restore_not_after < 0:
        return None
    return CheckpointFence(step=failure.restore_not_after, attempt=attempt)


def restore_hint(status: TrainingJobStatus, spec: TrainingJobSpec, *, pods_kept: bool,
                 fence: CheckpointFence | None = None) -> dict[str, Any] | None:
    """The next attempt's restore hint (config.json ``restore``): the newest verified checkpoint
    that survives the restart, and the newest step reported (the trainer counts the steps lost).

    A full restart (``pods_kept`` False) deletes every pod, and with ``checkpoint.memory.medium:
    Pod`` the memory tier with them: its checkpoints are not hinted then (the trainer refuses to
    start from scratch when a hinted checkpoint is missing), the newest local or shared one is.
    An in-place restart keeps the pods' memory, and a replaced pod's shards come back from its
    neighbour's replica.

    ``fence``: the one this restart puts up (:func:`new_fence`), else ``status.checkpointFence``
    (in force since an earlier restart; the status no longer lists the checkpoints it shuts
    out). The hint carries it (``notAfter``, ``abandonedBefore``): the trainer restores no
    checkpoint newer than ``notAfter`` that an attempt before ``abandonedBefore`` wrote."""
    refs = list(status.checkpoints) or ([status.last_checkpoint] if status.last_checkpoint is not None else [])
    if not pods_kept and spec.checkpoint.memory.medium == "Pod":
        refs = [r for r in refs if r.tier != "memory"]
    if fence is not None:
        refs = [r for r in refs if r.step <= fence.step]
    fence = fence or status.checkpoint_fence
    if fence is not None:
        best = best_checkpoint(refs) if refs else None
        return {"tier": best.tier if best else "", "step": best.step if best else -1, "lastStep": status.step,
                "notAfter": fence.step, "abandonedBefore": fence.attempt}
    if not refs:
        return None
    best = best_checkpoint(refs)
    return {"tier": best.tier, "step": best.step, "lastStep": status.step}
