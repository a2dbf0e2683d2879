"""Pure scheduling rules of the local cluster's scheduler: which nodes a pod may run on.

The rules are those of kube-scheduler's default filter plugins that our workloads rely on:
NodeName, NodeUnschedulable, NodeAffinity (nodeSelector + required node affinity), TaintToleration
(NoSchedule/NoExecute) and NodeResourcesFit (every requested resource, ``pods`` included),
plus scheduling gates. Node selection (nodeSelector, node-affinity terms), taints, tolerations,
node readiness and quantities are :mod:`railyard.api.corev1`'s and :mod:`railyard.api.quantity`'s,
the same rules placement uses. Scoring is LeastAllocated (spread), ties broken by node name so the
result is deterministic. Everything here works on plain dicts: no I/O, no clock.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from railyard.api.corev1 import (
    Toleration,
    build_tolerations,
    compute_pod_requests,
    labels_match,
    match_node_selector_term,
    node_is_ready,
    untolerated_taint,
)
from railyard.api.quantity import QuantityError, to_milli

Obj = Mapping[str, Any]
NOT_READY_TAINT = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
UNSCHEDULABLE_TAINT = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass
class NodeInfo:
    """What the scheduler knows of one node: labels, taints, allocatable and what is in use."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[dict[str, Any]] = field(default_factory=list)
    allocatable: dict[str, int] = field(default_factory=dict)  # milli-units
    ready: bool = True
    unschedulable: bool = False
    requested: dict[str, int] = field(default_factory=dict)  # milli-units, incl. "pods"
    #: Bumped by every :meth:`add`: what a :class:`DecisionCache` knows of this node is valid
    #: while the NodeInfo object and its version are the same.
    version: int = 0

    def add(self, requests: Mapping[str, int], sign: int = 1) -> None:
        for key, value in requests.items():
            self.requested[key] = self.requested.get(key, 0) + sign * value
        self.requested["pods"] = self.requested.get("pods", 0) + sign * 1000
        self.version += 1

    def effective_taints(self) -> list[Mapping[str, Any]]:
        """Node taints plus the ones the node lifecycle controller would add."""
        taints: list[Mapping[str, Any]] = list(self.taints)
        if not self.ready:
            taints.append(NOT_READY_TAINT)
        if self.unschedulable:
            taints.append(UNSCHEDULABLE_TAINT)
        return taints


def build_node_info(node: Obj) -> NodeInfo:
    """A :class:`NodeInfo` from a Node object (usage starts at zero)."""
    meta = node.get("metadata", {})
    spec = node.get("spec", {}) or {}
    status = node.get("status", {}) or {}
    alloc_raw = status.get("allocatable") or status.get("capacity") or {}
    allocatable: dict[str, int] = {}
    for key, value in alloc_raw.items():
        try:
            allocatable[key] = to_milli(value)
        except QuantityError:
            continue
    return NodeInfo(
        name=meta.get("name", ""),
        labels=dict(meta.get("labels") or {}),
        taints=list(spec.get("taints") or []),
        allocatable=allocatable,
        ready=node_is_ready(node),
        unschedulable=bool(spec.get("unschedulable", False)),
    )


def is_gated(pod: Obj) -> bool:
    return bool((pod.get("spec", {}) or {}).get("schedulingGates"))


def is_terminated(pod: Obj) -> bool:
    return (pod.get("status", {}) or {}).get("phase") in TERMINAL_PHASES


def required_terms(pod: Obj) -> list[Obj] | None:
    """The required node-affinity terms (ORed), or None when the pod has none."""
    affinity = ((pod.get("spec", {}) or {}).get("affinity") or {}).get("nodeAffinity") or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is None:
        return None
    return list(required.get("nodeSelectorTerms") or [])


@dataclass(frozen=True)
class PodView:
    """What the filters read from a pod, extracted once per decision rather than per node."""

    node_selector: tuple[tuple[str, str], ...]
    terms: list[Obj] | None
    tolerations: tuple[Toleration, ...]
    requests: Mapping[str, int]


def build_pod_view(pod: Obj, requests: Mapping[str, int]) -> PodView:
    spec = pod.get("spec", {}) or {}
    return PodView(
        node_selector=tuple((spec.get("nodeSelector") or {}).items()),
        terms=required_terms(pod),
        tolerations=build_tolerations(spec.get("tolerations") or ()),
        requests=requests,
    )


def check_view(view: PodView, node: NodeInfo) -> str | None:
    """:func:`check_node` on a prepared :class:`PodView` (the scheduler's hot loop)."""
    labels = node.labels
    if not labels_match(view.node_selector, labels) or (
        view.terms is not None
        and not any(match_node_selector_term(t, name=node.name, labels=labels) for t in view.terms)
    ):
        return "node(s) didn't match Pod's node affinity/selector"
    if node.unschedulable and untolerated_taint(view.tolerations, [UNSCHEDULABLE_TAINT]) is not None:
        return "node(s) were unschedulable"  # kube-scheduler's NodeUnschedulable plugin, before the taints
    if node.taints or not node.ready or node.unschedulable:
        taint = untolerated_taint(view.tolerations, node.effective_taints())
        if taint is not None:
            value = f"={taint['value']}" if taint.get("value") else ""
            return f"node(s) had untolerated taint {{{taint.get('key')}{value}: {taint.get('effect')}}}"
    requested = node.requested
    allocatable = node.allocatable
    if requested.get("pods", 0) + 1000 > allocatable.get("pods", 110_000):
        return "Too many pods"
    for key, want in view.requests.items():
        if want > allocatable.get(key, 0) - requested.get(key, 0):
            # claimed devices (railyard_local.devices), worded as kube-scheduler's DRA plugin
            return "cannot allocate all claims" if key.startswith("devices/") else f"Insufficient {key}"
    return None


def check_node(pod: Obj, node: NodeInfo, requests: Mapping[str, int]) -> str | None:
    """None when ``pod`` fits ``node``; otherwise the reason, as kube-scheduler words it."""
    return check_view(build_pod_view(pod, requests), node)


def feasible_nodes_to_find(total: int) -> int:
    """kube-scheduler's adaptive percentageOfNodesToScore: stop filtering after this many fits.

    All nodes up to 100; then max(100, total * max(5, 50 - total/125) %).
    """
    if total <= 100:
        return total
    percent = max(5.0, 50.0 - total / 125.0)
    return max(100, int(total * percent / 100))


_SCORED = ("cpu", "memory", "nvidia.com/gpu")


def score_node(node: NodeInfo, requests: Mapping[str, int]) -> float:
    """LeastAllocated: the mean free fraction of cpu, memory and GPUs after placing the pod."""
    alloc, used = node.allocatable, node.requested
    total, count = 0.0, 0
    for key in _SCORED:
        have = alloc.get(key, 0)
        if have > 0:
            free = have - used.get(key, 0) - requests.get(key, 0)
            if free > 0:
                total += free / have
            count += 1
    return total / count if count else 0.0


def candidate_names(pod: Obj) -> set[str] | None:
    """Node names the pod is pinned to by a hostname selector or a matchFields term, if any.

    Lets the scheduler skip a scan of every node for pods the operator already placed.
    """
    spec = pod.get("spec", {}) or {}
    host = (spec.get("nodeSelector") or {}).get("kubernetes.io/hostname")
    names: set[str] | None = {host} if host else None
    terms = required_terms(pod)
    if terms:
        pinned: set[str] = set()
        for term in terms:
            found = None
            for expr in (term.get("matchFields") or []) + (term.get("matchExpressions") or []):
                if expr.get("operator") == "In" and expr.get("key") in ("metadata.name", "kubernetes.io/hostname"):
                    found = {str(v) for v in expr.get("values") or []}
            if found is None:
                return names
            pinned |= found
        names = pinned if names is None else names & pinned
    return names


@dataclass
class Decision:
    node: str | None
    message: str = ""
    postfilter: str = ""
    """What kube-scheduler's PostFilter plugins (DRA's deallocation, then preemption) add to the
    message of a pod that fits nowhere; the local scheduler never preempts."""


#: Filter verdicts a preemption could cure (the other verdicts are "unresolvable" to kube-scheduler).
_PREEMPTABLE = ("Insufficient ", "Too many pods")


@dataclass(frozen=True)
class Resident:
    """A pod bound to a node, as preemption sees it."""

    key: str
    priority: int
    requests: Mapping[str, int]
    terminating: bool = False


def plan_preemption(pod: Obj, requests: Mapping[str, int], nodes: Mapping[str, NodeInfo],
                    residents: Mapping[str, Sequence[Resident]]) -> tuple[str, list[str]] | None:
    """kube-scheduler's DefaultPreemption, as far as the local cluster needs it: among the nodes
    the pod fails only for resources, the one where evicting the fewest pods of lower priority
    (lowest first) lets it fit, and those pods; None when no eviction helps or the pod may not
    preempt (``preemptionPolicy: Never``). PodDisruptionBudgets are not weighed."""
    spec = pod.get("spec") or {}
    if spec.get("preemptionPolicy") == "Never":
        return None
    priority = int(spec.get("priority") or 0)
    view = build_pod_view(pod, requests)
    names = candidate_names(pod)
    best: tuple[str, list[str]] | None = None
    for name in sorted(names if names is not None else nodes):
        node = nodes.get(name)
        reason = check_view(view, node) if node is not None else None
        if node is None or reason is None or not reason.startswith(_PREEMPTABLE):
            continue
        lower = sorted((r for r in residents.get(name, ()) if r.priority < priority and not r.terminating),
                       key=lambda r: (r.priority, r.key))
        trial = replace(node, requested=dict(node.requested))
        victims: list[str] = []
        for resident in lower:
            trial.add(resident.requests, -1)
            victims.append(resident.key)
            if check_view(view, trial) is None:
                break
        else:
            continue  # even every lower-priority pod gone, it would not fit
        if best is None or len(victims) < len(best[1]):
            best = (name, victims)
    return best


def build_postfilter_message(pod: Obj, reasons: Mapping[str, int], total: int) -> str:
    """kube-scheduler's PostFilter text after a FitError: DRA's ("still not schedulable" for a pod
    with claims, "no new claims to deallocate" otherwise), then preemption's verdict per node."""
    dra = "still not schedulable" if (pod.get("spec") or {}).get("resourceClaims") else "no new claims to deallocate"
    curable = sum(n for reason, n in reasons.items() if reason.startswith(_PREEMPTABLE))
    verdicts = {"No preemption victims found for incoming pod": curable,
                "Preemption is not helpful for scheduling": total - curable}
    detail = ", ".join(f"{n} {v}" for v, n in sorted(verdicts.items()) if n)
    return f"{dra}, preemption: 0/{total} nodes are available: {detail}."


#: node name -> (the NodeInfo it was computed on, its version, filter verdict, score)
_Verdicts = dict[str, tuple[NodeInfo, int, "str | None", float]]


class DecisionCache:
    """Each node's filter verdict and score per pod shape (what :func:`check_view` and
    :func:`score_node` read of a pod), kept while the node's NodeInfo object and version stay
    the same. A gang's pods share one shape and each decision changes one node, so the next
    decision recomputes that node only instead of every node. The scheduler keeps one; NodeInfo
    must change only through :meth:`NodeInfo.add` or be replaced by a new object."""

    def __init__(self, max_shapes: int = 64) -> None:
        self.max_shapes = max_shapes
        self._shapes: dict[tuple[object, ...], _Verdicts] = {}

    def verdicts(self, view: PodView) -> _Verdicts:
        terms = None if view.terms is None else json.dumps(view.terms, sort_keys=True, default=str)
        key = (view.node_selector, terms, view.tolerations, tuple(sorted(view.requests.items())))
        found = self._shapes.get(key)
        if found is None:
            if len(self._shapes) >= self.max_shapes:
                self._shapes.clear()
            found = self._shapes[key] = {}
        return found


def decide_node(
    pod: Obj,
    nodes: Mapping[str, NodeInfo],
    requests: Mapping[str, int] | None = None,
    *,
    start: int = 0,
    cache: DecisionCache | None = None,
) -> Decision:
    """The node to bind ``pod`` to, or None with a kube-scheduler style FailedScheduling message.

    Like kube-scheduler, filtering stops once :func:`feasible_nodes_to_find` nodes fit, starting
    at ``start`` (the caller rotates it so that successive pods look at different nodes first).
    ``cache`` reuses verdicts and scores of nodes that did not change since an earlier decision
    for a pod of the same shape (the answer is the same).
    """
    if requests is None:
        requests = compute_pod_requests(pod)
    view = build_pod_view(pod, requests)
    memo = cache.verdicts(view) if cache is not None else None
    names = candidate_names(pod)
    pool: list[NodeInfo]
    if names is not None:
        pool = [nodes[n] for n in sorted(names) if n in nodes]
    else:
        pool = list(nodes.values())
        if start and pool:
            start %= len(pool)
            pool = pool[start:] + pool[:start]
    enough = feasible_nodes_to_find(len(pool))
    best: NodeInfo | None = None
    best_score = -1.0
    found = 0
    reasons: dict[str, int] = {}
    for node in pool:
        known = memo.get(node.name) if memo is not None else None
        if known is not None and known[0] is node and known[1] == node.version:
            reason, score = known[2], known[3]
        else:
            reason = check_view(view, node)
            score = score_node(node, requests) if reason is None else 0.0
            if memo is not None:
                memo[node.name] = (node, node.version, reason, score)
        if reason is not None:
            reasons[reason] = reasons.get(reason, 0) + 1
            continue
        if score > best_score or (score == best_score and best is not None and node.name < best.name):
            best, best_score = node, score
        found += 1
        if found >= enough:
            break
    if best is not None:
        return Decision(best.name)
    total = len(nodes)
    detail = ", ".join(f"{count} {reason}" for reason, count in sorted(reasons.items()))
    if names is not None and total:
        skipped = total - sum(reasons.values())
        if skipped:
            detail = ", ".join(filter(None, [detail, f"{skipped} node(s) didn't match Pod's node affinity/selector"]))
    return Decision(None, f"0/{total} nodes are available: {detail or 'no nodes registered'}.",
                    build_postfilter_message(pod, reasons, total) if total else "")


# --------------------------------------------------------------------------- gangs (PodGroups)

#: What kube-scheduler v1.36 says of a gang's pod while the gang cannot be placed (its
#: PodScheduled condition; tests/golden/kube-v1.36-workload 028).
GANG_WAITING_MESSAGE = ("pod group is unschedulable, waiting for minCount pods from a gang to be scheduled, "
                        "one or more plugins asked to wait and no plugin rejected pod")
#: Appended to the per-node verdict of a gang pod that did not fit (029).
GANG_NO_PREEMPTION = "no new claims to deallocate, preemption: not eligible due to placement-based pod group " \
    "scheduling limitation"


@dataclass(frozen=True)
class GangPolicy:
    """A PodGroup's ``schedulingPolicy`` and ``schedulingConstraints`` as the scheduler reads them.
    ``min_count`` None: the ``basic`` policy (each pod on its own)."""

    min_count: int | None
    topology_keys: tuple[str, ...] = ()


def group_name_of(pod: Obj) -> str | None:
    """The PodGroup a pod names (``spec.schedulingGroup.podGroupName``), if any."""
    group = (pod.get("spec", {}) or {}).get("schedulingGroup")
    name = group.get("podGroupName") if isinstance(group, Mapping) else None
    return name if isinstance(name, str) and name else None


def build_gang_policy(podgroup: Obj) -> GangPolicy:
    spec = podgroup.get("spec", {}) or {}
    gang = (spec.get("schedulingPolicy") or {}).get("gang")
    count = gang.get("minCount") if isinstance(gang, Mapping) else None
    topology = (spec.get("schedulingConstraints") or {}).get("topology") or []
    keys = tuple(str(t["key"]) for t in topology if isinstance(t, Mapping) and t.get("key"))
    return GangPolicy(int(count) if isinstance(count, int) and count > 0 else None, keys)


def topology_domains(nodes: Mapping[str, NodeInfo], keys: tuple[str, ...]) -> list[tuple[tuple[str, ...], list[str]]]:
    """The placements a topology constraint allows: nodes grouped by their values of every key
    (a node without one of the labels is in no domain), in order of those values. No keys: one
    placement of every node."""
    if not keys:
        return [((), sorted(nodes))]
    out: dict[tuple[str, ...], list[str]] = {}
    for name in sorted(nodes):
        labels = nodes[name].labels
        if all(k in labels for k in keys):
            out.setdefault(tuple(labels[k] for k in keys), []).append(name)
    return sorted(out.items())


@dataclass
class GangDecision:
    """Where each pod of a gang goes (all of them, or none: ``nodes`` empty)."""

    nodes: dict[str, str] = field(default_factory=dict)
    """pod key -> node name."""
    domain: tuple[str, ...] = ()
    group_message: str = ""
    """Why it does not fit, for the PodGroup's condition."""
    pod_message: str = ""
    """Why the first placement tried did not fit (the gang's pods' FailedScheduling events)."""


def decide_gang(pods: Mapping[str, Obj], nodes: Mapping[str, NodeInfo], policy: GangPolicy,
                requests: Mapping[str, Mapping[str, int]] | None = None) -> GangDecision:
    """All-or-nothing: a node for every pod of ``pods`` (pod key -> pod, already at least
    ``minCount`` of them) inside one topology placement, or none. Each pod's own filters hold
    (node affinity, taints, resources: a pod pinned to a node by required affinity goes there or
    the gang waits). Among placements that fit, the tightest (least free capacity left over) is
    chosen, leaving whole domains free for larger gangs; ties go to the first by label value.
    Pure: ``nodes`` is not changed (placements are tried on copies). ``requests``: each pod's
    requests by key where they are more than its containers' (claimed devices)."""
    placements = topology_domains(nodes, policy.topology_keys)
    best: GangDecision | None = None
    best_slack = 0.0
    first_failure = ""
    for domain, names in placements:
        trial = {n: NodeInfo(name=n, labels=nodes[n].labels, taints=nodes[n].taints,
                             allocatable=nodes[n].allocatable, ready=nodes[n].ready,
                             unschedulable=nodes[n].unschedulable, requested=dict(nodes[n].requested))
                 for n in names}
        chosen: dict[str, str] = {}
        failed = ""
        for key in sorted(pods):
            pod = pods[key]
            wants = requests[key] if requests is not None and key in requests else compute_pod_requests(pod)
            decision = decide_node(pod, trial, wants)
            if decision.node is None:
                failed = decision.message.removesuffix(".") + ". " + GANG_NO_PREEMPTION
                break
            chosen[key] = decision.node
            trial[decision.node].add(wants)
        if failed:
            if not first_failure:
                first_failure = failed
            continue
        slack = sum(score_node(trial[n], {}) for n in names)
        if best is None or slack < best_slack:
            best, best_slack = GangDecision(nodes=chosen, domain=domain), slack
    if best is not None:
        return best
    return GangDecision(group_message=f"0/{len(placements)} placements are available, first placement status: "
                                      "pod group is unschedulable", pod_message=first_failure)
