"""Node events: release nodes a person un-quarantined, wake the jobs a node change concerns.

A plain function of the runtime (its state: the last placement signature per node), called by
the kopf node handler; the decisions are :func:`railyard.logic.quarantine.wants_release` and
:func:`railyard.logic.topology.placement_signature`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from railyard.handlers.cycle import GangIO
from railyard.handlers.runtime import Runtime
from railyard.logic.quarantine import wants_release
from railyard.logic.topology import placement_signature


async def on_node_change(runtime: Runtime, io: GangIO, *, deleted: bool, name: str, body: Mapping[str, Any]) -> None:
    """Finish a release a person started, wake every job when something placement reads
    changed (readiness, cordon, taints, quarantine, GPUs), and keep the quarantined-nodes gauge."""
    if deleted:
        runtime.node_signatures.pop(name, None)
        runtime.wake_jobs()
    else:
        if wants_release(body):
            await io.release_node(name)
        sig = placement_signature(body)
        if runtime.node_signatures.get(name) != sig:
            runtime.node_signatures[name] = sig
            runtime.wake_jobs()
    runtime.metrics.quarantined.set(sum(1 for s in runtime.node_signatures.values() if s[3]))
