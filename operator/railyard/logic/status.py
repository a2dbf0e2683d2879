"""The TrainingJob status: phases, the conditions each phase implies, and the one patch per cycle.

A reconcile cycle starts from the stored status, applies its decisions to a copy with the
functions here, and writes the difference once (:func:`build_status_patch`). Each phase sets
the conditions it implies from a table (:data:`PHASE_CONDITIONS`); conditions a phase does not
mention keep their value (Degraded, for instance, is orthogonal to the phase).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from railyard.api.trainingjob import PlacementStatus, TrainingJobStatus
from railyard.logic.conditions import compute_transitions, set_condition
from railyard.logic.inplace import GROUP_REPAIR
from railyard.logic.pending import PENDING_REASONS
from railyard.logic.placement import Placement
from railyard.logic.shrink import count_training_groups, describe_groups, waiting_groups

#: phase -> {condition type: status}. The first entry is the phase's headline condition and
#: carries the phase's reason and message; the rest carry them as context.
PHASE_CONDITIONS: Mapping[str, Mapping[str, str]] = {
    "Pending": {"Placed": "False"},
    "Queued": {"Admitted": "False", "Placed": "False", "GangReady": "False", "Running": "False"},
    "Placing": {"Placed": "False", "GangReady": "False", "Running": "False"},
    "Starting": {"Placed": "True", "GangReady": "False", "Running": "False", "Suspended": "False"},
    "Running": {"Running": "True", "Placed": "True", "GangReady": "True", "Restarting": "False", "Suspended": "False"},
    "Restarting": {"Restarting": "True", "GangReady": "False", "Running": "False"},
    "Suspended": {"Suspended": "True", "GangReady": "False", "Running": "False", "Restarting": "False"},
    "Succeeded": {"Succeeded": "True", "Running": "False", "GangReady": "False", "Restarting": "False"},
    "Failed": {"Failed": "True", "Running": "False", "GangReady": "False", "Restarting": "False"},
}
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


def apply_phase(
    status: TrainingJobStatus,
    phase: str,
    *,
    reason: str,
    message: str,
    now: str,
    generation: int | None = None,
) -> TrainingJobStatus:
    """A copy of ``status`` in ``phase`` with the implied conditions set."""
    if phase not in PHASE_CONDITIONS:
        raise ValueError(f"phase {phase!r} is not one of {sorted(PHASE_CONDITIONS)}")
    conditions = list(status.conditions)
    headline = True
    for ctype, cstatus in PHASE_CONDITIONS[phase].items():
        conditions = set_condition(
            conditions, ctype, cstatus,
            reason=reason if headline else _context_reason(conditions, ctype, cstatus, phase),
            message=message if headline else "",
            now=now, generation=generation,
        )
        headline = False
    update: dict[str, Any] = {"phase": phase, "message": message, "conditions": conditions}
    if generation is not None:
        update["observed_generation"] = generation
    if phase in TERMINAL_PHASES and status.completion_time is None:
        update["completion_time"] = now
    return status.model_copy(update=update)


def _context_reason(conditions: Sequence[Any], ctype: str, cstatus: str, phase: str) -> str:
    """A condition set as a consequence of the phase keeps its reason while its status holds,
    else says which phase set it."""
    old = next((c for c in conditions if c.type == ctype), None)
    if old is not None and old.status == cstatus and old.reason:
        return str(old.reason)
    return f"Phase{phase}"


def build_placement_status(
    nodes: Sequence[str],
    *,
    attempt: int,
    spares: Sequence[str] = (),
    domains: Mapping[str, int] | None = None,
    cross_bytes_per_step: Mapping[str, float] | None = None,
    rail_aligned: bool = False,
    moved: Sequence[int] = (),
    shown: int = 64,
) -> PlacementStatus:
    """``status.placement``: where the gang of ``attempt`` runs (see :func:`placement_status`
    for a fresh decision)."""
    doms = dict(domains or {})
    cross = dict(cross_bytes_per_step or {})
    parts = [f"{len(nodes)} nodes"]
    parts += [f"{v} {k.rsplit('/', 1)[-1]}" for k, v in doms.items()]
    if cross:
        parts.append("cross " + ", ".join(f"{k.rsplit('/', 1)[-1]} {v / 1e9:.2f} GB/step" for k, v in cross.items()))
    if moved:
        parts.append(f"moved pod indices {list(moved)[:16]}")
    return PlacementStatus(
        attempt=attempt,
        moved=list(moved[:shown]),
        nodes=list(nodes[:shown]),
        node_count=len(nodes),
        spares=list(spares),
        domains=doms,
        cross_bytes_per_step=cross,
        rail_aligned=rail_aligned,
        summary="; ".join(parts),
    )


def placement_status(pl: Placement, *, attempt: int) -> PlacementStatus:
    """``status.placement`` for a placement decision (the one the operator writes; the demo and
    ``kubectl describe`` read it)."""
    return build_placement_status(
        pl.nodes, attempt=attempt, spares=pl.spares, domains=pl.domain_counts,
        cross_bytes_per_step=pl.cross_bytes_per_step, rail_aligned=pl.rail_aligned, moved=pl.moved,
    )


def decide_degraded(
    status: TrainingJobStatus, *, hot_spares: int, now: str, replica_groups: int = 1
) -> TrainingJobStatus:
    """``Degraded`` is True while ranks straggle, a running gang holds fewer hot spares than
    ``spec.gang.hotSpares`` (a sticky re-placement may have spent them), or (faultTolerance
    ReplicaGroups, ``replica_groups`` > 1) replica groups restart alone while the others train
    (until every pod of the gang runs again) or wait for a node (logic/shrink.py); it is
    orthogonal to the phase, except that a finished job is never Degraded (reason ``Finished``).
    Returns ``status`` itself when nothing changes."""
    reasons = []
    lr = status.last_restart
    waiting = waiting_groups(status)
    if replica_groups > 1 and waiting and status.phase not in TERMINAL_PHASES:
        reasons.append(describe_groups(count_training_groups(status, replica_groups), replica_groups, waiting=waiting))
    elif (replica_groups > 1 and lr is not None and lr.reason == GROUP_REPAIR and lr.attempt == status.attempt
            and status.phase in ("Restarting", "Starting")):
        training = count_training_groups(status, replica_groups)
        reasons.append(describe_groups(training, replica_groups, restarting=replica_groups - training))
    if status.stragglers and status.phase not in TERMINAL_PHASES:
        reasons.append(f"{len(status.stragglers)} straggling ranks")
    spares = len(status.placement.spares) if status.placement else 0
    if status.phase in ("Starting", "Running") and spares < hot_spares:
        reasons.append(f"{spares}/{hot_spares} hot spares held")
    value = "True" if reasons else "False"
    healthy = "Finished" if status.phase in TERMINAL_PHASES else "Healthy"
    old = next((x for x in status.conditions if x.type == "Degraded"), None)
    if old is None and value == "False":
        return status
    if old is not None and old.status == value and old.message == "; ".join(reasons):
        return status
    return status.model_copy(update={"conditions": set_condition(
        status.conditions, "Degraded", value, reason="Degraded" if reasons else healthy,
        message="; ".join(reasons), now=now, generation=status.observed_generation or None,
    )})


def status_to_wire(status: TrainingJobStatus) -> dict[str, Any]:
    return status.model_dump(by_alias=True, mode="json")


def build_status_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON merge patch turning ``old`` into ``new`` (top-level keys; lists and objects are
    replaced whole, which is what a merge patch does with them anyway). Empty: nothing to write."""
    patch: dict[str, Any] = {}
    for key, value in new.items():
        if old.get(key) != value:
            patch[key] = value
    for key in old:
        if key not in new:
            patch[key] = None
    return patch


#: Phases whose entry is bad news (their Events are Warnings).
WARNING_PHASES = frozenset({"Restarting", "Failed", "Placing"})


def build_transition_events(old: TrainingJobStatus, new: TrainingJobStatus) -> list[tuple[str, str, str]]:
    """(type, reason, message) per transition: one for a phase change (or a new reason within a
    phase, e.g. a different placement problem), one per flip of Degraded while the job has not
    finished (no health news after Succeeded or Failed)."""
    events: list[tuple[str, str, str]] = []
    old_head = _headline(old)
    new_head = _headline(new)
    if old.phase != new.phase or (new_head is not None and (old_head is None or old_head.reason != new_head.reason)):
        reason = new_head.reason if new_head is not None and new_head.reason else new.phase
        # a gang the scheduler (or a missing controller) keeps from starting is a warning too
        warn = new.phase in WARNING_PHASES or (new.phase == "Starting" and reason in PENDING_REASONS)
        events.append(("Warning" if warn else "Normal", reason, new.message or f"phase {new.phase}"))
    for t in compute_transitions(old.conditions, new.conditions):
        if t.type == "Degraded" and new.phase not in TERMINAL_PHASES:
            events.append(
                (
                    "Warning" if t.status == "True" else "Normal",
                    t.reason or "Degraded",
                    t.message or f"Degraded is {t.status}",
                )
            )
    return events


def _headline(status: TrainingJobStatus) -> Any:
    table = PHASE_CONDITIONS.get(status.phase)
    if not table:
        return None
    head = next(iter(table))
    return next((c for c in status.conditions if c.type == head), None)
