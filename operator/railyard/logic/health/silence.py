"""Running pods the operator hears nothing from: the job runs blind.

A pod reaches the operator in two ways: its ranks post heartbeats, and its launcher (which starts
in well under a second and never imports torch) long-polls the restart control channel at the
same base URL. A Running pod that has done neither for a while cannot reach the operator (the
advertised URL does not resolve or is blocked: issue 35, an operator restarted by hand against
the local cluster advertised the in-cluster Service name) or runs no Railyard launcher at all.
Until it is heard, the job has no health checks, its step stays where it was, and an in-place
restart cannot reach its launcher (NoControlChannel). The dead-rank rule restarts such a pod only
after ``first_heartbeat_timeout_s`` (minutes: a trainer may load for long); this rule says so
early, as the ``Blind`` condition, and never restarts anything.

The clock starts when the gang's last pod started running (no rank can beat before the gang's
rendezvous, and a launcher-less program's first beat comes after it) or when this operator began
watching the job, whichever is later: a restarted operator gives every pod a whole bound to find
it again.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from railyard.api.trainingjob import TrainingJobStatus
from railyard.logic.conditions import find_condition, set_condition
from railyard.logic.health.liveness import RUNNING
from railyard.logic.health.model import HealthPolicy, PodStatus

#: The condition type (logic/conditions.py), and its reasons.
CONDITION = "Blind"
SILENT = "PodsSilent"
HEARD = "PodsHeard"
#: A job with no gang running (Pending, Placing, Suspended) or finished: nothing to hear.
NO_GANG = "NoRunningGang"
#: Phases during which a gang exists and a Blind verdict stays meaningful until judged again.
GANG_PHASES = frozenset({"Starting", "Running", "Restarting"})

#: The bound is this many heartbeat timeouts, at least :data:`SILENCE_FLOOR_S` ...
SILENCE_TIMEOUTS = 3.0
SILENCE_FLOOR_S = 30.0
#: ... and at most this fraction of the bound after which a never-heard pod is restarted.
SILENCE_CAP_OF_FIRST_HEARTBEAT = 0.5
#: Rank ranges named in a message before "and N more".
RANGES_SHOWN = 8


def compute_silence_bound(policy: HealthPolicy) -> float:
    """How long a Running gang's pod may stay unheard before the job is Blind: 3 x
    ``heartbeatTimeoutSeconds``, at least 30 s (a launcher on a loaded 2-core machine reaches the
    operator within seconds), at most half ``first_heartbeat_timeout_s`` (the condition comes
    well before the restart)."""
    bound = max(SILENCE_FLOOR_S, SILENCE_TIMEOUTS * policy.heartbeat_timeout_s)
    return min(bound, SILENCE_CAP_OF_FIRST_HEARTBEAT * policy.first_heartbeat_timeout_s)


@dataclass(frozen=True, slots=True)
class Silence:
    """One judgement. ``blind``: True (pods unheard past the bound), False (every Running pod
    was heard), None (too early to say: keep what the status says)."""

    blind: bool | None
    #: Pod indices unheard past the bound.
    silent: tuple[int, ...] = ()
    running: int = 0
    silent_for_s: float = 0.0
    bound_s: float = 0.0
    reason: str = ""
    message: str = ""


def decide_silence(
    pods: Mapping[int, PodStatus],
    heard: Collection[int],
    *,
    bound_s: float,
    watching_since: float,
    now: float,
    ranks_of: Mapping[int, Sequence[int]] | None = None,
    pods_url: str = "",
    operator_url: str = "",
) -> Silence:
    """``pods``: the gang's pods; ``heard``: pod indices that sent a heartbeat (any rank) or a
    launcher report in this attempt; ``ranks_of``: pod index -> its global ranks (for the
    message); ``pods_url``: the heartbeat URL the silent pods were given; ``operator_url``: the
    one this operator advertises for the job."""
    running = {i: p for i, p in pods.items() if p.phase == RUNNING}
    if not running:
        return Silence(None)
    unheard = sorted(i for i in running if i not in heard)
    if not unheard:
        return Silence(False, running=len(running), reason=HEARD,
                       message=f"all {len(running)} Running pods reached the operator: health checks are on")
    starts = [p.running_since for p in running.values() if p.running_since is not None]
    since = max([watching_since, *starts])
    silent_for = now - since
    if silent_for < bound_s:
        return Silence(None, running=len(running), silent_for_s=silent_for, bound_s=bound_s)
    return Silence(
        True, silent=tuple(unheard), running=len(running), silent_for_s=silent_for, bound_s=bound_s,
        reason=SILENT,
        message=build_silence_message(unheard, len(running), bound_s, ranks_of or {}, pods_url, operator_url),
    )


def build_silence_message(
    silent: Sequence[int],
    running: int,
    bound_s: float,
    ranks_of: Mapping[int, Sequence[int]],
    pods_url: str,
    operator_url: str,
) -> str:
    ranks = sorted(r for i in silent for r in ranks_of.get(i, ()))
    who = f"{len(silent)}/{running} Running pods (pod {format_ranges(silent)}"
    who += f"; ranks {format_ranges(ranks)})" if ranks else ")"
    # no elapsed time in it: the message stays the same from cycle to cycle (no status write
    # per heartbeat interval); lastTransitionTime says since when
    msg = (
        f"{who} sent no heartbeat and no launcher report within {bound_s:g}s of running "
        "(the silence bound, from spec.health.heartbeatTimeoutSeconds): "
        "health checks are off and the step is not updated"
    )
    where = f" at {pods_url}" if pods_url else ""
    msg += f"; the pods cannot reach the operator{where}, or run no railyard launcher"
    if pods_url and operator_url and pods_url != operator_url:
        msg += (
            f"; this operator advertises {operator_url} instead (restarted with another address?): "
            "run it with the pods' address (--heartbeat-advertise-url, --metrics-port)"
        )
    else:
        msg += (
            "; check that the address resolves and is reachable from the pods "
            "(the operator's --heartbeat-advertise-url, its Service, NetworkPolicy)"
        )
    return msg


def apply_silence(
    status: TrainingJobStatus, silence: Silence | None, *, now: str
) -> tuple[TrainingJobStatus, tuple[str, str, str] | None]:
    """The status with the ``Blind`` condition set from ``silence``, and the Event to write
    (type, reason, message) when it flips. ``silence`` None (no judgement this cycle): a Blind
    condition of a job without a gang (Pending, Placing, Suspended, finished) turns False, with
    no Event; otherwise nothing changes. Like Degraded, the condition appears only once True."""
    old = find_condition(status.conditions, CONDITION)
    if silence is None:
        if old is None or old.status != "True" or status.phase in GANG_PHASES:
            return status, None
        value, reason, message = "False", NO_GANG, f"phase {status.phase}: no gang running"
    elif silence.blind is None:
        return status, None
    else:
        value, reason, message = ("True" if silence.blind else "False"), silence.reason, silence.message
    if old is None and value == "False":
        return status, None
    if old is not None and (old.status, old.reason, old.message) == (value, reason, message):
        return status, None
    conditions = set_condition(status.conditions, CONDITION, value, reason=reason, message=message, now=now,
                               generation=status.observed_generation or None)
    event = None
    if silence is not None and (old is None or old.status != value):
        event = ("Warning", reason, message) if value == "True" else ("Normal", reason, message)
    return status.model_copy(update={"conditions": conditions}), event


def format_ranges(values: Iterable[int], shown: int = RANGES_SHOWN) -> str:
    """``[0, 1, 2, 3, 8, 9, 12]`` -> ``"0-3, 8-9, 12"``; past ``shown`` ranges, ``"... and N more"``."""
    runs: list[tuple[int, int]] = []
    for v in sorted(set(values)):
        if runs and v == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], v)
        else:
            runs.append((v, v))
    parts = [str(a) if a == b else f"{a}-{b}" for a, b in runs[:shown]]
    if len(runs) > shown:
        parts.append(f"and {sum(b - a + 1 for a, b in runs[shown:])} more")
    return ", ".join(parts)
