"""Failure classification: what went wrong with a gang, which budget pays, which nodes to blame.

Evidence is extracted from pods and nodes (a terminated container's exit code or reason, a
pod's eviction or disruption condition, its node NotReady or gone, a health verdict) and each
kind of evidence is looked up in :data:`RULES`: a table, not an if-ladder, so adding a case is
one row. When several pods fail at once (a dead node makes its peers' collectives time out) the
rule with the highest ``priority`` explains the gang failure: the root cause, not its echoes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from railyard.api.corev1 import node_is_ready
from railyard.protocol.exitcodes import FailureClass, classify_exit_code

#: Pod condition types a health checker (or a test) may set to report a verdict on a pod.
SDC_CONDITION = "railyard.dev/SDC"
STRAGGLER_CONDITION = "railyard.dev/Straggler"


@dataclass(frozen=True, slots=True)
class Rule:
    cls: FailureClass
    #: Quarantine the pod's node: the hardware is suspect, other jobs should avoid it too.
    blame_node: bool
    #: Among simultaneous failures the highest priority explains the gang failure.
    priority: int
    #: Human-readable template; ``{detail}`` is filled with the evidence's specifics.
    message: str


#: evidence kind -> rule. Evidence kinds are CamelCase and double as status/Event reasons.
RULES: Mapping[str, Rule] = {
    # the trainer said it cannot work, retrying cannot help
    "PermanentExitCode": Rule(FailureClass.PERMANENT, False, 100, "trainer exited with permanent code {detail}"),
    # the machine under a pod
    "NodeGone": Rule(FailureClass.INFRASTRUCTURE, True, 90, "node {detail} disappeared"),
    "NodeNotReady": Rule(FailureClass.INFRASTRUCTURE, True, 90, "node {detail} is NotReady"),
    # the accelerator computes wrong numbers or too slowly
    "SDCExitCode": Rule(FailureClass.SDC, True, 80, "silent data corruption detected: {detail}"),
    "SDCCondition": Rule(FailureClass.SDC, True, 80, "silent data corruption reported: {detail}"),
    "SDCVerdict": Rule(FailureClass.SDC, True, 80, "silent data corruption: {detail}"),
    "StragglerExitCode": Rule(FailureClass.STRAGGLER, True, 70, "rank hung or straggled: {detail}"),
    "StragglerCondition": Rule(FailureClass.STRAGGLER, True, 70, "straggler reported: {detail}"),
    "HangVerdict": Rule(FailureClass.STRAGGLER, True, 70, "hang detected: {detail}"),
    "StragglerVerdict": Rule(FailureClass.STRAGGLER, True, 70, "straggler: {detail}"),
    "DeadRankVerdict": Rule(FailureClass.INFRASTRUCTURE, True, 65, "rank stopped sending heartbeats: {detail}"),
    # Kubernetes took the pod away; the node itself is fine
    "Evicted": Rule(FailureClass.INFRASTRUCTURE, False, 60, "pod evicted: {detail}"),
    "Preempted": Rule(FailureClass.INFRASTRUCTURE, False, 60, "pod preempted: {detail}"),
    "Disrupted": Rule(FailureClass.INFRASTRUCTURE, False, 60, "pod disrupted: {detail}"),
    "PodDeleted": Rule(FailureClass.INFRASTRUCTURE, False, 55, "pod deleted from outside: {detail}"),
    "PodLost": Rule(FailureClass.INFRASTRUCTURE, False, 55, "pod disappeared: {detail}"),
    "Killed": Rule(FailureClass.INFRASTRUCTURE, False, 50, "trainer killed by signal: {detail}"),
    # the program: a crash of one rank makes its peers fail too
    "OOMKilled": Rule(FailureClass.APPLICATION, False, 30, "out of memory on a healthy node: {detail}"),
    "ApplicationExitCode": Rule(FailureClass.APPLICATION, False, 20, "trainer exited with code {detail}"),
    # exit 70 is what a rank reports when a peer or a collective failed: the echo of another
    # pod's failure, so every other cause explains the gang better (lowest priority). It blames
    # no node: the first rank to notice a broken collective is not the one that broke it
    # (docs/operator.md, "Collective errors").
    "InfrastructureExitCode": Rule(
        FailureClass.INFRASTRUCTURE, False, 10, "collective or rendezvous failure: {detail}"
    ),
}

#: Exit-code class -> evidence kind.
_EXIT_EVIDENCE: Mapping[FailureClass, str] = {
    FailureClass.PERMANENT: "PermanentExitCode",
    FailureClass.SDC: "SDCExitCode",
    FailureClass.STRAGGLER: "StragglerExitCode",
    FailureClass.INFRASTRUCTURE: "InfrastructureExitCode",
    FailureClass.APPLICATION: "ApplicationExitCode",
}
#: Container termination reason -> evidence kind (checked before the exit code).
_TERMINATION_REASONS: Mapping[str, str] = {"OOMKilled": "OOMKilled"}
#: Pod ``status.reason`` -> evidence kind.
_POD_REASONS: Mapping[str, str] = {
    "Evicted": "Evicted",
    "Preempting": "Preempted",
    "Preempted": "Preempted",
    "NodeLost": "NodeGone",
    "NodeShutdown": "Killed",
    "Shutdown": "Killed",
    "Terminated": "Killed",
}
#: Pod condition type -> evidence kind, when the condition is True.
_POD_CONDITIONS: Mapping[str, str] = {
    SDC_CONDITION: "SDCCondition",
    STRAGGLER_CONDITION: "StragglerCondition",
    "DisruptionTarget": "Disrupted",
}
_SIGNALS: Mapping[int, str] = {128 + 9: "SIGKILL", 128 + 15: "SIGTERM", 128 + 6: "SIGABRT", 128 + 2: "SIGINT"}


@dataclass(frozen=True, slots=True)
class Failure:
    """One explained failure of a gang member."""

    kind: str
    cls: FailureClass
    #: Nodes to quarantine (empty when the node is not to blame).
    nodes: tuple[str, ...]
    message: str
    pod: str = ""
    priority: int = 0
    #: Pod indices the failure is about, when a health verdict named them (faultTolerance
    #: ReplicaGroups restarts only their groups: logic/inplace.py's decide_group_repair).
    pod_indices: tuple[int, ...] = ()
    #: The restart restores no checkpoint newer than this step (-1: any).
    restore_not_after: int = -1

    @property
    def restartable(self) -> bool:
        return self.cls is not FailureClass.PERMANENT


def build_failure(kind: str, detail: str, *, node: str = "", pod: str = "") -> Failure:
    """The failure for evidence ``kind`` (a key of :data:`RULES`)."""
    rule = RULES[kind]
    return Failure(
        kind=kind,
        cls=rule.cls,
        nodes=(node,) if rule.blame_node and node else (),
        message=rule.message.format(detail=detail),
        pod=pod,
        priority=rule.priority,
    )


def _terminated_states(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    out = []
    for cs in (pod.get("status") or {}).get("containerStatuses") or ():
        term = (cs.get("state") or {}).get("terminated")
        if term:
            out.append(term)
    return out


def _exit_evidence(code: int) -> tuple[str, str]:
    if code in _SIGNALS:
        return "Killed", f"{_SIGNALS[code]} (exit code {code})"
    kind = _EXIT_EVIDENCE[classify_exit_code(code)]
    return kind, str(code)


def classify_pod(
    pod: Mapping[str, Any],
    nodes: Mapping[str, Mapping[str, Any]],
) -> Failure | None:
    """The failure this pod shows, or None while it is healthy (pending, running, succeeded).

    ``nodes`` maps node name to Node dict (a missing entry means the node is gone).
    """
    meta = pod.get("metadata") or {}
    name = str(meta.get("name", ""))
    status = pod.get("status") or {}
    node = str((pod.get("spec") or {}).get("nodeName") or "")
    phase = status.get("phase")
    if phase == "Succeeded":
        return None
    if node:
        if node not in nodes:
            return build_failure("NodeGone", node, node=node, pod=name)
        if not node_is_ready(nodes[node]):
            return build_failure("NodeNotReady", node, node=node, pod=name)
    for ctype, kind in _POD_CONDITIONS.items():
        for c in status.get("conditions") or ():
            if c.get("type") == ctype and c.get("status") == "True":
                detail = c.get("message") or c.get("reason") or ctype
                return build_failure(kind, f"{name}: {detail}", node=node, pod=name)
    reason = str(status.get("reason") or "")
    if phase == "Failed" and reason in _POD_REASONS:
        detail = status.get("message") or reason
        return build_failure(_POD_REASONS[reason], f"{name}: {detail}", node=node, pod=name)
    if phase == "Failed" or (phase == "Running" and _terminated_states(pod)):
        for term in _terminated_states(pod):
            code = int(term.get("exitCode", 0) or 0)
            treason = str(term.get("reason") or "")
            if treason in _TERMINATION_REASONS:
                return build_failure(_TERMINATION_REASONS[treason], f"{name} (exit code {code})", node=node, pod=name)
            if code != 0:
                kind, detail = _exit_evidence(code)
                return build_failure(kind, f"{detail} in {name}", node=node, pod=name)
        if phase == "Failed":
            return build_failure(
                "ApplicationExitCode", f"unknown in {name} ({reason or 'no reason given'})", node=node, pod=name
            )
    if meta.get("deletionTimestamp") and phase not in ("Succeeded", "Failed"):
        return build_failure("PodDeleted", name, node=node, pod=name)
    return None


#: Health verdict kind (logic.health.FaultKind value) -> evidence kind.
VERDICT_EVIDENCE: Mapping[str, str] = {
    "Dead": "DeadRankVerdict",
    "Hang": "HangVerdict",
    "Straggler": "StragglerVerdict",
    "SDC": "SDCVerdict",
}


def build_verdict_failure(verdict_kind: str, message: str, nodes: Iterable[str], *, pod_indices: Iterable[int] = (),
                          restore_not_after: int = -1) -> Failure | None:
    """The failure a health verdict that asks for a restart stands for (None: unknown kind).
    ``pod_indices``: the pods the verdicts name; ``restore_not_after``: the newest step the
    restart may restore (-1: any)."""
    kind = VERDICT_EVIDENCE.get(verdict_kind)
    if kind is None:
        return None
    rule = RULES[kind]
    blamed = tuple(dict.fromkeys(n for n in nodes if n)) if rule.blame_node else ()
    return Failure(kind, rule.cls, blamed, rule.message.format(detail=message), "", rule.priority,
                   pod_indices=tuple(sorted({i for i in pod_indices if i >= 0})), restore_not_after=restore_not_after)


def decide_root_failure(failures: Iterable[Failure]) -> Failure | None:
    """The failure that explains the gang: highest priority; ties keep the first seen. All nodes
    blamed by failures of that same class are quarantined together."""
    items = list(failures)
    if not items:
        return None
    best = max(items, key=lambda f: f.priority)
    nodes: list[str] = []
    for f in items:
        if f.cls is best.cls and f.priority == best.priority:
            nodes.extend(n for n in f.nodes if n not in nodes)
    return Failure(best.kind, best.cls, tuple(nodes), best.message, best.pod, best.priority)
