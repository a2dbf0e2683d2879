"""Node quarantine: the marks we put on a node to blame, and when a person has released it.

A quarantined node carries, all set in one patch: the taint ``railyard.dev/quarantined=<kind>:
NoSchedule`` (the scheduler keeps every pod off it), the label ``railyard.dev/quarantined=true``
(placement and people can select on it) and annotations with the reason, time and job. A person
releases it by annotating ``railyard.dev/release=true`` or by removing either the label or the
taint; the operator then removes the rest, so a node is never half quarantined.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from railyard import GROUP

#: Taint key and label of a node we quarantined.
QUARANTINE_KEY = f"{GROUP}/quarantined"

REASON_ANNOTATION = f"{GROUP}/quarantine-reason"
TIME_ANNOTATION = f"{GROUP}/quarantine-time"
JOB_ANNOTATION = f"{GROUP}/quarantine-job"
RELEASE_ANNOTATION = f"{GROUP}/release"


def is_quarantined(node: Mapping[str, Any]) -> bool:
    labels = (node.get("metadata") or {}).get("labels") or {}
    taints = (node.get("spec") or {}).get("taints") or ()
    return labels.get(QUARANTINE_KEY) == "true" or any(t.get("key") == QUARANTINE_KEY for t in taints)


def wants_release(node: Mapping[str, Any]) -> bool:
    """True when a node we quarantined was (partly) released by a person."""
    meta = node.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    has_label = labels.get(QUARANTINE_KEY) == "true"
    has_taint = any(t.get("key") == QUARANTINE_KEY for t in (node.get("spec") or {}).get("taints") or ())
    if annotations.get(RELEASE_ANNOTATION) == "true":
        return True
    if REASON_ANNOTATION not in annotations:
        return False
    return not (has_label and has_taint)
