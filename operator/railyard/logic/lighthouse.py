"""Whether the job's Lighthouse (faultTolerance ReplicaGroups) must be created, kept or deleted.

One Lighthouse per job, for as long as the gang holds its nodes (the phases of
:data:`railyard.logic.spares.HOLDING`: between attempts too, so the groups of the next attempt
find it). A Lighthouse whose pod ended (Failed or Succeeded: its process exited for good) or
whose node is gone or not Ready is a loss the operator repairs: it deletes that pod and creates
it again under the same name, so the groups' ``TORCHFT_LIGHTHOUSE`` stays valid. Meanwhile no
quorum forms: every group stands at its next step, its Manager retrying the quorum
(``lighthouse_quorum_retries`` in protocol/trainerconfig.py) until the new Lighthouse answers;
then the groups go on from that step, none restarted (docs/fault-tolerance.md). A Lighthouse that
does not come back within the trainer's watchdog ends in the ordinary restart.
handlers/lighthouse.py acts on the decision.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from railyard.api.corev1 import node_is_ready
from railyard.logic.gang import pod_name_of
from railyard.logic.spares import HOLDING


@dataclass(frozen=True, slots=True)
class LighthouseDecision:
    #: Create the Lighthouse pod (none exists that serves).
    create: bool
    #: Pods to delete: a lost Lighthouse, a second one, or any once the job is not running.
    delete: tuple[Mapping[str, Any], ...]
    #: Why a Lighthouse is deleted while the job still wants one ("": nothing was lost).
    lost: str = ""


def decide_lighthouse(
    *,
    replica_groups: int,
    phase: str,
    deleting: bool,
    have: Sequence[Mapping[str, Any]],
    nodes: Mapping[str, Mapping[str, Any]],
) -> LighthouseDecision:
    """Pure; ``have`` is the job's Lighthouse pods (found by label), ``nodes`` the cluster's."""
    wanted = replica_groups > 1 and phase in HOLDING and not deleting
    live = [p for p in have if not (p.get("metadata") or {}).get("deletionTimestamp")]
    if not wanted:
        return LighthouseDecision(create=False, delete=tuple(live))
    delete: list[Mapping[str, Any]] = []
    lost = ""
    keep = None
    for p in live:
        why = _lost(p, nodes)
        if why:
            delete.append(p)
            lost = lost or why
        elif keep is None:
            keep = p
        else:
            delete.append(p)
    # a Lighthouse still terminating holds the name: the new one is created once it is gone
    terminating = len(live) < len(have)
    return LighthouseDecision(create=keep is None and not delete and not terminating, delete=tuple(delete), lost=lost)


def _lost(pod: Mapping[str, Any], nodes: Mapping[str, Mapping[str, Any]]) -> str:
    """Why this Lighthouse pod no longer serves ("": it does, or may soon)."""
    name = pod_name_of(pod)
    phase = str((pod.get("status") or {}).get("phase") or "Pending")
    if phase in ("Failed", "Succeeded"):
        return f"Lighthouse pod {name} ended ({phase})"
    node_name = (pod.get("spec") or {}).get("nodeName")
    if node_name:
        node = nodes.get(str(node_name))
        if node is None:
            return f"Lighthouse pod {name}: its node {node_name} is gone"
        if not node_is_ready(node):
            return f"Lighthouse pod {name}: its node {node_name} is not Ready"
    return ""
