"""What stays of a finished job's pods (``spec.cleanup``), and until when.

A person debugging a failed run reads ``kubectl logs`` and the exit codes of its pods, so by
default the finished pods of the last attempt stay after the job reached Succeeded or Failed,
until ``spec.cleanup.ttlSecondsAfterFinished`` or the job's deletion. Only finished pods stay:
their containers have exited, so they hold no GPUs (placement and the scheduler count only pods
that are not Succeeded/Failed, as Kubernetes does). Everything else goes at once: pods still
running, pods of earlier attempts, held spares and placeholders (anything labelled with the job
that is not a finished pod of the last attempt).

Pods are recognised by their labels (job, attempt), never by their names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from railyard.api.trainingjob import Cleanup
from railyard.logic.gang import attempt_of

Pod = Mapping[str, Any]
FINISHED_POD_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True, slots=True)
class FinishedPods:
    #: Pods to delete now (the cycle's deletion rules decide grace and force).
    delete: tuple[Pod, ...]
    #: Finished pods of the last attempt that stay for now.
    keep: tuple[Pod, ...]
    #: Seconds until the kept pods' time is up (None: nothing kept).
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
) -> FinishedPods:
    """Split a finished job's pods into those to delete now and those kept until the TTL.

    ``attempt`` is the job's last attempt (``status.attempt``); ``completion_time`` the job's
    ``status.completionTime`` (None: counted from ``now``)."""
    finished_at = now if completion_time is None else completion_time
    expires = finished_at + cleanup.ttl_seconds_after_finished
    keeping = keeps_pods(cleanup, job_phase) and now < expires
    keep: list[Pod] = []
    delete: list[Pod] = []
    for p in pods:
        phase = (p.get("status") or {}).get("phase")
        gone = bool((p.get("metadata") or {}).get("deletionTimestamp"))
        if keeping and not gone and phase in FINISHED_POD_PHASES and attempt_of(p) == attempt:
            keep.append(p)
        else:
            delete.append(p)
    return FinishedPods(tuple(delete), tuple(keep), max(expires - now, 0.0) if keep else None)
