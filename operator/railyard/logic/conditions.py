"""Kubernetes-style conditions: set one, keep ``lastTransitionTime`` unless the status flips.

Pure: the caller passes ``now`` as an RFC 3339 string, so tests control time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from railyard.api.trainingjob import Condition

#: Every condition type the operator maintains, in display order.
CONDITION_TYPES = (
    "Admitted",
    "Placed",
    "GangReady",
    "Running",
    "Restarting",
    "Degraded",
    "Blind",
    "Succeeded",
    "Failed",
    "Suspended",
)


def format_time(now: float) -> str:
    """RFC 3339 UTC with seconds precision (what Kubernetes writes)."""
    return datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_micro_time(now: float) -> str:
    """RFC 3339 UTC with microseconds (Kubernetes MicroTime), for durations measured from it."""
    return datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None


def find_condition(conditions: Sequence[Condition], ctype: str) -> Condition | None:
    return next((c for c in conditions if c.type == ctype), None)


def is_true(conditions: Sequence[Condition], ctype: str) -> bool:
    c = find_condition(conditions, ctype)
    return c is not None and c.status == "True"


def set_condition(
    conditions: Sequence[Condition],
    ctype: str,
    status: str,
    *,
    reason: str,
    message: str,
    now: str,
    generation: int | None = None,
) -> list[Condition]:
    """A new list with ``ctype`` set. ``lastTransitionTime`` changes only when ``status`` does."""
    if ctype not in CONDITION_TYPES:
        raise ValueError(f"condition type {ctype!r} is not one of {CONDITION_TYPES}")
    old = find_condition(conditions, ctype)
    ltt = old.last_transition_time if old is not None and old.status == status else now
    new = Condition(
        type=ctype,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=ltt,
        observed_generation=generation,
    )
    out = [c for c in conditions if c.type != ctype] + [new]
    order = {t: i for i, t in enumerate(CONDITION_TYPES)}
    return sorted(out, key=lambda c: order.get(c.type, len(order)))


@dataclass(frozen=True, slots=True)
class Transition:
    """A condition whose status changed (or appeared): worth an Event."""

    type: str
    status: str
    reason: str
    message: str


def compute_transitions(old: Sequence[Condition], new: Sequence[Condition]) -> list[Transition]:
    before = {c.type: c.status for c in old}
    return [
        Transition(c.type, c.status, c.reason, c.message)
        for c in new
        if before.get(c.type) != c.status and not (c.type not in before and c.status == "False")
    ]
