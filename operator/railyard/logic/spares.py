"""Which hot spares the gang holds with a placeholder pod (handlers/spares.py acts on it)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from railyard.api.corev1 import node_is_ready
from railyard.logic.manifests import NODE_ANNOTATION
from railyard.logic.quarantine import QUARANTINE_KEY

#: Phases in which the gang holds its spares (between attempts too: the next gang uses them).
HOLDING = frozenset({"Starting", "Running", "Restarting"})


def _spare_node(pod: Mapping[str, Any]) -> str:
    return str(((pod.get("metadata") or {}).get("annotations") or {}).get(NODE_ANNOTATION) or "")


def decide_spares(
    *,
    phase: str,
    wanted: int,
    spares: list[str],
    nodes: Mapping[str, Mapping[str, Any]],
    have: Sequence[Mapping[str, Any]],
) -> tuple[list[str], list[Mapping[str, Any]], int]:
    """(nodes to put a placeholder on, placeholders to delete, placeholders holding their node).
    Pure; ``spares`` is the placement's spare list, ``have`` the placeholders that exist."""
    want = set()
    if wanted > 0 and phase in HOLDING:
        for n in spares:
            node = nodes.get(n)
            labels = ((node or {}).get("metadata") or {}).get("labels") or {}
            if node is not None and node_is_ready(node) and labels.get(QUARANTINE_KEY) != "true":
                want.add(n)
    by_node: dict[str, Mapping[str, Any]] = {}
    delete = []
    for p in have:
        n = _spare_node(p)
        if (p.get("metadata") or {}).get("deletionTimestamp"):
            continue
        if n not in want or n in by_node:
            delete.append(p)
        else:
            by_node[n] = p
    create = sorted(want - set(by_node))
    held = sum(1 for n, p in by_node.items() if (p.get("spec") or {}).get("nodeName") == n
               and str((p.get("status") or {}).get("phase") or "") in ("Pending", "Running"))
    return create, delete, held


