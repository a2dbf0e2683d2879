"""What stays of a finished job's pods (``spec.cleanup``), and until when.

A person debugging a failed run reads ``kubectl logs`` and the exit codes of its pods, so by
default the finished pods of the last attempt stay after the job reached Succeeded or Failed,
until ``spec.cleanup.ttlSecondsAfterFinished`` or the job's deletion. Only finished pods stay:
their containers have exited, so they hold no GPUs (placement and the scheduler count only pods
that are not Succeeded/Failed, as Kubernetes does). A member of the last attempt still running
when the job failed (a peer of the failed rank, about to exit on the broken collective) gets
:data:`FINISH_SETTLE_S` to exit on its own, so its last words are kept too; then it is deleted.
Everything else goes at once: pods of earlier attempts, held spares and placeholders (anything
labelled with the job that is not a gang member, with a pod index, of the last attempt).

Pods are recognised by their labels (job, attempt, pod index), never by their names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from railyard.api.trainingjob import Cleanup
from railyard.logic.gang import gang_members, pod_index_of

Pod = Mapping[str, Any]
FINISHED_POD_PHASES = frozenset({"Succeeded", "Failed"})
#: Seconds a gang member still running when the job failed may take to exit on its own.
FINISH_SETTLE_S = 30.0


@dataclass(frozen=True, slots=True)
class FinishedPods:
    #: Pods to delete now (the cycle's deletion rules decide grace and force).
    delete: tuple[Pod, ...]
    #: Finished pods of the last attempt that stay for now.
    keep: tuple[Pod, ...]
    #: Members of the last attempt still running, given until the settle time to exit.
    settling: tuple[Pod, ...]
    #: Seconds until a decision changes: a settle time or the TTL runs out (None: never).
    due_in: float | None


def keeps_pods(cleanup: Cleanup, job_phase: str) -> bool:
    """Whether a job that finished in ``job_phase`` keeps its finished pods at all."""
    return cleanup.pods == "Keep" or (cleanup.pods == "KeepFailed" and job_phase == "Failed")


def decide_finished_pods(
    pods: Sequence[Pod],
    *,
    job_phase: str,
    attempt: int,
    cleanup: Cleanup,
    completion_time: float | None,
    now: float,
    settle_s: float = FINISH_SETTLE_S,
    since: int | None = None,
) -> FinishedPods:
    """Split a finished job's pods into those to delete now, those kept until the TTL and the
    last attempt's members still running, given until ``settle_s`` after the finish to exit.

    ``attempt`` is the job's last attempt (``status.attempt``); ``completion_time`` the job's
    ``status.completionTime`` (None: counted from ``now``); ``since`` the attempt of the last
    full creation when the last attempt was started in place (its kept pods carry older attempt
    labels; :func:`railyard.logic.gang.gang_members`)."""
    finished_at = now if completion_time is None else completion_time
    expires = finished_at + cleanup.ttl_seconds_after_finished
    keeping = keeps_pods(cleanup, job_phase) and now < expires
    settles_until = finished_at + settle_s
    keep: list[Pod] = []
    settling: list[Pod] = []
    delete: list[Pod] = []
    members, _ = gang_members([p for p in pods if pod_index_of(p) >= 0], attempt=attempt, since=since)
    is_member = {id(p) for p in members}
    for p in pods:
        phase = (p.get("status") or {}).get("phase")
        gone = bool((p.get("metadata") or {}).get("deletionTimestamp"))
        member = id(p) in is_member
        if keeping and not gone and member and phase in FINISHED_POD_PHASES:
            keep.append(p)
        elif keeping and not gone and member and now < settles_until:
            settling.append(p)
        else:
            delete.append(p)
    due = [t - now for t, pods_ in ((expires, keep), (settles_until, settling)) if pods_]
    return FinishedPods(tuple(delete), tuple(keep), tuple(settling), max(min(due), 0.0) if due else None)
