"""Planned moves: the nodes of a gang the cluster announced it will take away, found from the
Node objects alone. A node is going when it is cordoned (``spec.unschedulable``: ``kubectl
drain`` cordons first), tainted NoSchedule/NoExecute by someone else (not our own quarantine,
not the node lifecycle's not-ready/unreachable taints: those are failures), or announced for
maintenance by a label or annotation of :data:`MAINTENANCE_SIGNALS` (or the operator's own
list). Such a node is a planned move, not a failure: the recovery decision moves the gang's
pods off it ahead of time (logic/recovery.py's :class:`MoveAhead`), spending no restart budget.

Every node of the gang marked at the moment of the decision is in one answer, so a rolling
drain of a rack, announced node after node, is one move while the marks arrive together.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from railyard import GROUP
from railyard.api.corev1 import BLOCKING_EFFECTS, Toleration, node_is_ready
from railyard.logic.quarantine import QUARANTINE_KEY

Obj = Mapping[str, Any]

#: GKE's upcoming-maintenance label (its value: when, in epoch seconds).
GKE_MAINTENANCE = "cloud.google.com/scheduled-maintenance-time"
#: Railyard's own: any value announces the node's maintenance (a person's or a tool's mark).
RAILYARD_MAINTENANCE = f"{GROUP}/maintenance"
#: The labels and annotations that announce a node's maintenance, by default
#: (``railyard operator run --maintenance-signal KEY`` adds one).
MAINTENANCE_SIGNALS: tuple[str, ...] = (GKE_MAINTENANCE, RAILYARD_MAINTENANCE)

#: The node lifecycle's own taints: a node that stopped answering, not an announcement.
_FAILURE_TAINT_PREFIX = "node.kubernetes.io/"
#: The cordon's taint (the node lifecycle mirrors ``spec.unschedulable`` as this taint).
_CORDON_TAINT = "node.kubernetes.io/unschedulable"


def planned_reason(node: Obj, *, signals: Sequence[str] = MAINTENANCE_SIGNALS,
                   tolerations: Sequence[Toleration] = ()) -> str:
    """Why ``node`` is going ("" when it is not announced to go). A node that is not Ready is a
    failure's business, not a planned move."""
    meta, spec = node.get("metadata") or {}, node.get("spec") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    # Nearly every node carries no mark at all: it is not going, whatever its readiness (the
    # placement asks this of every node of the cluster at every decision, issue 46)
    if (not spec.get("unschedulable") and not spec.get("taints") and labels.keys().isdisjoint(signals)
            and annotations.keys().isdisjoint(signals)):
        return ""
    if not node_is_ready(node):
        return ""
    if spec.get("unschedulable"):
        return "cordoned"
    for taint in spec.get("taints") or ():
        key = str(taint.get("key") or "")
        if taint.get("effect") not in BLOCKING_EFFECTS or key == QUARANTINE_KEY:
            continue
        if key.startswith(_FAILURE_TAINT_PREFIX) and key != _CORDON_TAINT:
            continue
        if any(t.tolerates(taint) for t in tolerations):
            continue
        return f"tainted {key}:{taint.get('effect')}"
    for key in signals:
        for where, marks in (("label", labels), ("annotation", annotations)):
            if key in marks:
                return f"maintenance announced ({where} {key}={marks[key]})"
    return ""


def find_going_nodes(nodes: Mapping[str, Obj], *, signals: Sequence[str] = MAINTENANCE_SIGNALS,
                     tolerations: Sequence[Toleration] = ()) -> dict[str, str]:
    """Every node of the cluster announced to go (node -> why): where no new pod is placed.
    :func:`find_planned_moves` over every node, without sorting the names of the many that are
    not going (this runs at every placement decision)."""
    going = [
        (name, why) for name, node in nodes.items()
        if name and node is not None and (why := planned_reason(node, signals=signals, tolerations=tolerations))
    ]
    return dict(sorted(going))


def find_planned_moves(nodes: Mapping[str, Obj], gang_nodes: Iterable[str], *,
                       signals: Sequence[str] = MAINTENANCE_SIGNALS,
                       tolerations: Sequence[Toleration] = ()) -> dict[str, str]:
    """Node -> why it is going, for every node of the gang announced to go now (one move for
    all of them). A node the gang's pods tolerate the taint of stays."""
    out: dict[str, str] = {}
    for name in sorted(set(gang_nodes)):
        node = nodes.get(name)
        if not name or node is None:
            continue
        why = planned_reason(node, signals=signals, tolerations=tolerations)
        if why:
            out[name] = why
    return out
