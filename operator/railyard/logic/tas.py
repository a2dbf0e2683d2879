"""Kueue's Topology-Aware Scheduling assignment, honoured: the nodes an admitted gang may use.

With a TAS flavor Kueue admits a Workload with ``status.admission.podSetAssignments[]
.topologyAssignment``: ``levels`` (node label keys, broadest first; Kueue v0.13 lists only the
lowest, record 107) and ``domains`` (``values``, one per level, and ``count``, the pods Kueue
counted in that domain). Kueue's quota and its topology accounting assume the pods run there, so
the operator's own rail-aware placement places inside it, through a node filter at its input
(:func:`decide_outside_assignment`, applied by
:func:`railyard.logic.placement.build_placement_input`):

- a domain at the node level (``kubernetes.io/hostname``) allows that node, for one pod (the
  placement puts one pod on a node; a count above one cannot be honoured and is said so);
- a domain at a higher level (a rack or block label) allows the nodes carrying its label values,
  at most ``count`` of them: the ones the gang holds already, then usable ones in tree order (the
  placement fills a leaf in that order), so no domain gets more pods than Kueue counted there.

Restarts stay inside: a replacement goes to an allowed node the gang does not use, if one is
left; else the placement answers ``Unplaceable`` naming the nodes outside the assignment and the
job waits (Kueue may rewrite the assignment, e.g. replacing a failed node, which is read again).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from railyard.logic.manifests.kueue import SPARES_POD_SET, WORKERS_POD_SET
from railyard.logic.topology import HOSTNAME_KEY

#: Why a node is left out of a placement inside the assignment (the placement's exclusion reason).
OUTSIDE = "OutsideTopologyAssignment"
#: Kueue's TAS counts a pod without this label as a non-TAS pod on top of the Workload's assignment
#: (record 111-114: the next TAS Workload did not fit); with it, the pod is the assignment's (115-116).
#: Kueue's pod webhook leaves the pod alone all the same (it has no queue-name label).
TAS_LABEL = "kueue.x-k8s.io/tas"


def tas_pod_labels(assignment: TopologyAssignment | None) -> dict[str, str]:
    """The labels the gang's pods and spare placeholders carry under a TAS admission."""
    return {TAS_LABEL: "true"} if assignment is not None else {}


@dataclass(frozen=True, slots=True)
class TasDomain:
    """One domain of the assignment: the label values that select its nodes, and its pod count."""

    labels: tuple[tuple[str, str], ...]
    count: int

    @property
    def name(self) -> str:
        return "/".join(value for _, value in self.labels)

    def holds(self, node: Mapping[str, Any]) -> bool:
        """Whether the Node carries every label value of the domain (the node level also matches
        the Node's name, which the hostname label equals on a kubelet's node)."""
        meta = node.get("metadata") or {}
        labels = meta.get("labels") or {}
        return all(labels.get(key, meta.get("name") if key == HOSTNAME_KEY else None) == value
                   for key, value in self.labels)


@dataclass(frozen=True, slots=True)
class TopologyAssignment:
    """The admission's topology assignment of the job's pod sets (workers and spares together)."""

    levels: tuple[str, ...]
    domains: tuple[TasDomain, ...]

    @property
    def level(self) -> str:
        """The lowest level, the one the domains are at."""
        return self.levels[-1] if self.levels else ""

    @property
    def by_node(self) -> bool:
        return self.level == HOSTNAME_KEY

    def describe(self) -> str:
        count = len(self.domains)
        return f"placed inside the topology assignment: {count} domain{'s' * (count != 1)} at level {self.level}"

    def problems(self) -> list[str]:
        """What the placement cannot honour, each naming the domain and the way out."""
        if not self.by_node:
            return []
        return [
            f"Kueue assigned {d.count} pods to node {d.name}, Railyard places one pod per node: request the "
            "node's whole GPUs per pod (procsPerNode, gpusPerPod) so that Kueue assigns one"
            for d in self.domains if d.count > 1
        ]


def read_topology_assignment(
    workload: Mapping[str, Any], pod_sets: Collection[str] = (WORKERS_POD_SET, SPARES_POD_SET)
) -> TopologyAssignment | None:
    """The topology assignment of ``pod_sets`` (counts of one domain summed over them), None
    when the admission has none (no TAS flavor). The levels are the first pod set's."""
    levels: tuple[str, ...] = ()
    counts: dict[tuple[tuple[str, str], ...], int] = {}
    for assignment in ((workload.get("status") or {}).get("admission") or {}).get("podSetAssignments") or ():
        topology = assignment.get("topologyAssignment") if assignment.get("name") in pod_sets else None
        if not topology:
            continue
        keys = tuple(str(level) for level in topology.get("levels") or ())
        levels = levels or keys
        for domain in topology.get("domains") or ():
            labels = tuple(zip(keys, (str(v) for v in domain.get("values") or ()), strict=False))
            counts[labels] = counts.get(labels, 0) + int(domain.get("count") or 0)
    if not counts:
        return None
    return TopologyAssignment(levels, tuple(TasDomain(labels, count) for labels, count in counts.items()))


@dataclass(frozen=True, slots=True)
class AllowedNodes:
    """The nodes of each domain of an assignment (a node in no domain is outside)."""

    domains: tuple[tuple[TasDomain, tuple[str, ...]], ...]

    @property
    def nodes(self) -> frozenset[str]:
        return frozenset(name for _, names in self.domains for name in names)

    @property
    def missing(self) -> tuple[str, ...]:
        """Domains no node carries (gone since the admission, or another node-label scheme)."""
        return tuple(domain.name for domain, names in self.domains if not names)


def compute_allowed_nodes(assignment: TopologyAssignment, nodes: Sequence[Mapping[str, Any]]) -> AllowedNodes:
    """Each domain's nodes, from the Node objects' labels."""
    names = [(node, str((node.get("metadata") or {}).get("name") or "")) for node in nodes]
    return AllowedNodes(tuple(
        (domain, tuple(name for node, name in names if domain.holds(node))) for domain in assignment.domains
    ))


def decide_outside_assignment(
    allowed: AllowedNodes,
    *,
    names: Sequence[str],
    excluded: Sequence[str],
    usable: Sequence[bool],
    keep: Collection[str] = (),
) -> tuple[str, ...]:
    """The placement's exclusion reasons (``excluded``, in the order of ``names``, the topology's
    tree order) with the assignment applied: a node in no domain, or beyond its domain's count, is
    :data:`OUTSIDE`. Within a domain the count goes to the nodes in ``keep`` (the gang's current
    nodes: a restart keeps them) first, then to ``usable`` ones in tree order, then to the rest
    (unusable now: their own reason stays, so the placement says why it waits)."""
    index = {name: i for i, name in enumerate(names)}
    chosen: set[str] = set()
    for domain, members in allowed.domains:
        present = [name for name in members if name in index]
        ranked = sorted(present, key=lambda n: (n not in keep, not usable[index[n]], index[n]))
        chosen.update(ranked[: domain.count])
    return tuple(why or ("" if name in chosen else OUTSIDE) for name, why in zip(names, excluded, strict=True))
