"""Which hot spares the gang holds with a placeholder pod (handlers/spares.py acts on it)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from railyard.api.corev1 import node_is_ready
from railyard.logic.manifests import spare_pod_name
from railyard.logic.quarantine import QUARANTINE_KEY

#: Phases in which the gang holds its spares (between attempts too: the next gang uses them).
HOLDING = frozenset({"Starting", "Running", "Restarting"})


def decide_spares(
    *,
    job: str,
    phase: str,
    wanted: int,
    spares: Sequence[str],
    nodes: Mapping[str, Mapping[str, Any]],
    have: Sequence[Mapping[str, Any]],
) -> tuple[list[str], list[Mapping[str, Any]], int]:
    """(nodes to put a placeholder on, placeholders to delete, placeholders holding their node).
    Pure; ``spares`` is the placement's spare list, ``have`` the placeholders that exist (found
    by name: :func:`railyard.logic.manifests.spare_pod_name` of each spare node)."""
    want: dict[str, str] = {}
    if wanted > 0 and phase in HOLDING:
        for n in spares:
            node = nodes.get(n)
            labels = ((node or {}).get("metadata") or {}).get("labels") or {}
            if node is not None and node_is_ready(node) and labels.get(QUARANTINE_KEY) != "true":
                want[spare_pod_name(job, n)] = n
    kept: dict[str, Mapping[str, Any]] = {}
    delete = []
    for p in have:
        meta = p.get("metadata") or {}
        name = str(meta.get("name") or "")
        if meta.get("deletionTimestamp"):
            continue
        if name in want and name not in kept:
            kept[name] = p
        else:
            delete.append(p)
    create = sorted(n for name, n in want.items() if name not in kept)
    held = sum(1 for name, p in kept.items() if (p.get("spec") or {}).get("nodeName") == want[name]
               and str((p.get("status") or {}).get("phase") or "") in ("Pending", "Running"))
    return create, delete, held
