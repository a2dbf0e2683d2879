"""Node quarantine: the marks we put on a node to blame, and when a person has released it.

A quarantined node carries, all set in one patch: the taint ``railyard.dev/quarantined=<kind>:
NoSchedule`` (the scheduler keeps every pod off it), the label ``railyard.dev/quarantined=true``
(placement and people can select on it) and annotations with the reason, time and job. A person
releases it by annotating ``railyard.dev/release=true`` or by removing either the label or the
taint; the operator then removes the rest, so a node is never half quarantined.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from railyard import GROUP

#: Taint key and label of a node we quarantined.
QUARANTINE_KEY = f"{GROUP}/quarantined"

T = TypeVar("T")

REASON_ANNOTATION = f"{GROUP}/quarantine-reason"
TIME_ANNOTATION = f"{GROUP}/quarantine-time"
JOB_ANNOTATION = f"{GROUP}/quarantine-job"
RELEASE_ANNOTATION = f"{GROUP}/release"


def build_quarantine_patch(node: Mapping[str, Any], *, reason: str, job: str, time: str) -> dict[str, Any]:
    """The one merge patch that quarantines ``node`` (taint, label, annotations), for the
    operator's node patch and for the simulator's nodes alike."""
    value = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in reason)[:63].strip("-_.") or "failed"
    taints = [dict(t) for t in (node.get("spec") or {}).get("taints") or () if t.get("key") != QUARANTINE_KEY]
    taints.append({"key": QUARANTINE_KEY, "value": value, "effect": "NoSchedule"})
    return {
        "metadata": {
            "labels": {QUARANTINE_KEY: "true"},
            "annotations": {
                REASON_ANNOTATION: reason[:1024],
                TIME_ANNOTATION: time,
                JOB_ANNOTATION: job,
                RELEASE_ANNOTATION: None,
            },
        },
        "spec": {"taints": taints},
    }


def apply_merge_patch(obj: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """RFC 7386 JSON merge patch of ``patch`` onto a copy of ``obj`` (None deletes a key)."""
    out = dict(obj)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = apply_merge_patch(out[key], value)
        elif isinstance(value, Mapping):
            out[key] = apply_merge_patch({}, value)
        else:
            out[key] = value
    return out


def decide_still_quarantined(marked: Sequence[T], nodes: Mapping[str, Mapping[str, Any]]) -> list[T]:
    """The entries of a job's ``status.quarantinedNodes`` whose node still carries our label
    (a person releases a node by removing it; a node that is gone is dropped too)."""
    keep = []
    for q in marked:
        node = nodes.get(getattr(q, "node", ""))
        labels = ((node or {}).get("metadata") or {}).get("labels") or {}
        if node is not None and labels.get(QUARANTINE_KEY) == "true":
            keep.append(q)
    return keep


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
