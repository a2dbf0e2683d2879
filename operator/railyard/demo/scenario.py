"""The demo's fault scenario: which faults happen, at which training step, on which rank/node.

Defaults give the three faults the demo is about; each can be turned off or moved with flags or
a YAML scenario file (``--scenario``), e.g.::

    steps: 80
    nodeFailure: {step: 25}          # fail the node running pod 1 at step 25 (null: off)
    straggler: {step: 10, factor: 1.6, node: auto}
    bitflip: {step: 50, rank: 1, target: grad}

``railyard demo --replica-groups`` selects :func:`replica_groups_scenario` instead: the same job
under ``faultTolerance: ReplicaGroups`` with HSDP (``parallelism.dataReplicas``), one node lost
(scenario file: ``replicaGroups: {groups: 2, minReplicas: 1}``, no straggler and no bit flip).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


class ScenarioError(ValueError):
    """A scenario that cannot run; the message names the field."""


@dataclass(frozen=True)
class NodeFailure:
    step: int
    #: Pod index whose node fails (its memory tier is lost with it).
    pod_index: int = 1


@dataclass(frozen=True)
class Straggler:
    step: int
    #: Strong enough to stand out of this 2-core machine's scheduling noise (healthy ranks'
    #: probe times differ by 10-15% here from CPU contention alone).
    factor: float = 2.5
    #: Pod index whose node is slowed.
    pod_index: int = 0


@dataclass(frozen=True)
class BitFlip:
    step: int
    rank: int = 1
    target: str = "grad"


@dataclass(frozen=True)
class ReplicaGroups:
    """``faultTolerance: {mode: ReplicaGroups}`` with ``parallelism.dataReplicas: groups``: one
    pod per group (FSDP over its ranks), so losing a node loses one group."""

    groups: int = 2
    min_replicas: int = 1


@dataclass(frozen=True)
class Scenario:
    steps: int = 80
    nodes: int = 2
    procs_per_node: int = 2
    tensor: int = 2
    spares: int = 1
    node_failure: NodeFailure | None = NodeFailure(step=25)
    straggler: Straggler | None = Straggler(step=6)
    bitflip: BitFlip | None = BitFlip(step=50)
    memory_interval: int = 5
    local_interval: int = 20
    shared_interval: int = 40
    #: Replica groups that fail alone (None: the gang is one world, the default demo).
    replica_groups: ReplicaGroups | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        problems = []
        if self.steps < 10:
            problems.append("steps: at least 10")
        for name, fault in (
            ("nodeFailure", self.node_failure),
            ("straggler", self.straggler),
            ("bitflip", self.bitflip),
        ):
            if fault is not None and not 1 <= fault.step < self.steps:
                problems.append(f"{name}.step: {fault.step} must be in [1, steps={self.steps})")
        if self.node_failure and not 0 <= self.node_failure.pod_index < self.nodes:
            problems.append(f"nodeFailure.podIndex: must be below nodes={self.nodes}")
        if self.bitflip and not 0 <= self.bitflip.rank < self.nodes * self.procs_per_node:
            problems.append("bitflip.rank: must be a rank of the job")
        if self.bitflip and self.bitflip.target not in ("grad", "param"):
            problems.append("bitflip.target: grad or param")
        if self.straggler and not 1.0 < self.straggler.factor <= 10:
            problems.append("straggler.factor: must be in (1, 10]")
        rg = self.replica_groups
        if rg is not None:
            if not 2 <= rg.groups <= 4:
                problems.append(
                    f"replicaGroups.groups: {rg.groups} must be in [2, 4] (one pod per group on this machine)"
                )
            if not 1 <= rg.min_replicas < rg.groups:
                problems.append(
                    f"replicaGroups.minReplicas: {rg.min_replicas} must be in [1, groups={rg.groups}) so the "
                    "survivors of a lost group still commit steps"
                )
            if self.nodes != rg.groups:
                problems.append(f"nodes: {self.nodes} must equal replicaGroups.groups={rg.groups} (one pod per group)")
            if self.tensor != 1:
                problems.append("tensor: 1 with replicaGroups (FSDP inside each group, HSDP across groups)")
            if self.straggler or self.bitflip:
                problems.append(
                    "straggler, bitflip: null with replicaGroups (the demo of replica groups shows a node loss; "
                    "the SDC vote has no replica to compare inside a group, docs/fault-tolerance.md)"
                )
        if self.node_failure and self.spares < 1:
            problems.append("spares: a node failure needs at least one hot spare to show sticky re-placement")
        if problems:
            raise ScenarioError("; ".join(problems))

    @property
    def cluster_nodes(self) -> int:
        """Two leaves, enough for the gang, its spares, and two more: one node fails and one is
        quarantined in the default scenario, and the gang should still find a spare after both."""
        need = self.nodes + self.spares + 2
        return need + (need % 2)

    def bitflip_attempt(self) -> int:
        """The attempt in which the bit flip is injected: after the node failure's restart when
        that comes first, so the demo shows both."""
        if self.bitflip and self.node_failure and self.node_failure.step < self.bitflip.step:
            return 1
        return 0

    def training_job(self, name: str = "demo") -> dict[str, Any]:
        faults: list[dict[str, Any]] = []
        if self.bitflip:
            faults.append({"kind": "bitflip", "rank": self.bitflip.rank, "step": self.bitflip.step,
                           "target": self.bitflip.target, "attempt": self.bitflip_attempt()})
        if self.replica_groups is not None:
            return self._replica_groups_job(name, self.replica_groups)
        return {
            "apiVersion": "railyard.dev/v1alpha1",
            "kind": "TrainingJob",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "nodes": self.nodes,
                "procsPerNode": self.procs_per_node,
                "parallelism": {"tensor": self.tensor},
                "trainer": {
                    "preset": "tiny", "steps": self.steps, "batchSize": 8, "seqLen": 64,
                    "learningRate": 0.003, "warmupSteps": 5, "faults": faults,
                },
                "topology": {"preset": "railyard", "mode": "Preferred"},
                "gang": {"hotSpares": self.spares, "scheduleTimeoutSeconds": 120},
                "checkpoint": {
                    "memory": {"intervalSteps": self.memory_interval, "keep": 2},
                    "local": {"intervalSteps": self.local_interval, "keep": 2},
                    "shared": {"intervalSteps": self.shared_interval, "keep": 2},
                },
                "health": {
                    "heartbeatIntervalSeconds": 1, "heartbeatTimeoutSeconds": 10,
                    "straggler": {"threshold": 0.75, "windowSteps": 16, "action": "Report"},
                    "sdc": {"intervalSteps": 5, "action": "Restart"},
                },
                "restartPolicy": {"application": {"limit": 3, "backoffSeconds": 1}},
                **self.extra,
            },
        }


    def _replica_groups_job(self, name: str, rg: ReplicaGroups) -> dict[str, Any]:
        """The job of bench/replica_groups.py and the system test (tried on this machine's CPUs):
        R groups of one pod x procsPerNode ranks, memory-tier checkpoints only, health timeouts
        longer than torchft's pause while it drops the lost group (its heartbeat timeout)."""
        return {
            "apiVersion": "railyard.dev/v1alpha1",
            "kind": "TrainingJob",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "nodes": self.nodes,
                "procsPerNode": self.procs_per_node,
                "parallelism": {"dataReplicas": rg.groups},
                "faultTolerance": {"mode": "ReplicaGroups", "minReplicas": rg.min_replicas},
                "trainer": {"preset": "tiny", "steps": self.steps, "batchSize": 4 * rg.groups, "seqLen": 32,
                            "learningRate": 0.003, "warmupSteps": 5, "seed": 0},
                "topology": {"preset": "railyard", "mode": "Preferred"},
                "gang": {"hotSpares": self.spares, "scheduleTimeoutSeconds": 240},
                "checkpoint": {
                    "memory": {"intervalSteps": self.memory_interval, "keep": 2},
                    "local": {"enabled": False},
                    "shared": {"intervalSteps": 1000, "keep": 1},
                },
                "health": {"heartbeatIntervalSeconds": 1, "heartbeatTimeoutSeconds": 20, "hangTimeoutSeconds": 30},
                "restartPolicy": {"infrastructure": {"limit": 3, "backoffSeconds": 0},
                                  "application": {"limit": 2, "backoffSeconds": 0}},
                **self.extra,
            },
        }


#: The replica-groups scenario's length: the survivors must not finish before the lost group's
#: new pod starts (torch's import and the rendezvous, 15-30 s on a loaded 2-core machine) and
#: heals; with 80 steps it healed at step 51-66 in three runs here.
REPLICA_GROUP_STEPS = 120


def replica_groups_scenario(groups: int = 2, min_replicas: int = 1, *, steps: int = REPLICA_GROUP_STEPS,
                            node_failure_step: int = 10) -> Scenario:
    """``railyard demo --replica-groups``: R groups of one pod x 2 ranks, the node of the last
    group's pod lost at ``node_failure_step``. Early in the run on purpose: the survivors must
    not finish before the replacement joins and heals (docs/fault-tolerance.md, "A replacement
    that comes after the end"). Two groups by default: each survivor rank's one cross-group
    peer is then the lost one, so its collective fails at once; with three, a survivor rank
    whose gloo ring neighbour is the other survivor can wait in that collective until its
    timeout (docs/demo.md), and minReplicas 1 lets the other survivor go on meanwhile."""
    return Scenario(
        steps=steps, nodes=groups, procs_per_node=2, tensor=1, spares=1,
        node_failure=NodeFailure(step=node_failure_step, pod_index=groups - 1), straggler=None, bitflip=None,
        replica_groups=ReplicaGroups(groups, min_replicas),
    )


def _fault(raw: Any, cls: type, where: str, keys: dict[str, str]) -> Any:
    if raw is None or raw is False:
        return None
    if not isinstance(raw, dict):
        raise ScenarioError(f"{where}: expected a mapping or null")
    unknown = set(raw) - set(keys)
    if unknown:
        raise ScenarioError(f"{where}: unknown field(s) {sorted(unknown)}; known: {sorted(keys)}")
    return cls(**{keys[k]: v for k, v in raw.items()})


def scenario_from_dict(raw: dict[str, Any]) -> Scenario:
    known = {"steps", "nodeFailure", "straggler", "bitflip", "replicaGroups"}
    unknown = set(raw) - known
    if unknown:
        raise ScenarioError(f"scenario: unknown field(s) {sorted(unknown)}; known: {sorted(known)}")
    if raw.get("replicaGroups") is not None:
        return _replica_groups_from_dict(raw)
    base = Scenario()
    scn = Scenario(
        steps=int(raw.get("steps", base.steps)),
        node_failure=_fault(
            raw.get("nodeFailure", {"step": base.node_failure.step} if base.node_failure else None),
            NodeFailure,
            "nodeFailure",
            {"step": "step", "podIndex": "pod_index"},
        ),
        straggler=_fault(
            raw.get("straggler", {"step": base.straggler.step} if base.straggler else None),
            Straggler,
            "straggler",
            {"step": "step", "factor": "factor", "podIndex": "pod_index"},
        ),
        bitflip=_fault(
            raw.get("bitflip", {"step": base.bitflip.step} if base.bitflip else None),
            BitFlip,
            "bitflip",
            {"step": "step", "rank": "rank", "target": "target"},
        ),
    )
    scn.validate()
    return scn


def _replica_groups_from_dict(raw: dict[str, Any]) -> Scenario:
    """A scenario file with ``replicaGroups``: :func:`replica_groups_scenario`, its steps and
    node failure moved by the file."""
    rg = _fault(raw["replicaGroups"], dict, "replicaGroups", {"groups": "groups", "minReplicas": "min_replicas"})
    base = replica_groups_scenario(
        int(rg.get("groups", 2)), int(rg.get("min_replicas", 1)), steps=int(raw.get("steps", REPLICA_GROUP_STEPS))
    )
    failure = _fault(raw.get("nodeFailure", {"step": base.node_failure.step if base.node_failure else 10}), NodeFailure,
                     "nodeFailure", {"step": "step", "podIndex": "pod_index"})
    if failure is not None and "podIndex" not in (raw.get("nodeFailure") or {}):
        failure = NodeFailure(failure.step, base.node_failure.pod_index if base.node_failure else 0)
    scn = dataclasses.replace(
        base,
        node_failure=failure,
        straggler=_fault(
            raw.get("straggler"), Straggler, "straggler", {"step": "step", "factor": "factor", "podIndex": "pod_index"}
        ),
        bitflip=_fault(raw.get("bitflip"), BitFlip, "bitflip", {"step": "step", "rank": "rank", "target": "target"}),
    )
    scn.validate()
    return scn
