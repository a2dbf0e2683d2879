"""The simulator's calls into the project's own policy code, each behind one small function.

Nothing here decides on its own: detection latencies come from the health rules
(:mod:`railyard.logic.health`) driven with a few synthetic ranks, the failure class and whether
to quarantine from :mod:`railyard.logic.failures`, restart permission and backoff from
:mod:`railyard.logic.restarts`, placement and sticky re-placement from
:mod:`railyard.logic.placement`, and which checkpoint to restore from
:func:`railyard.protocol.restore.decide_restore`. This module only translates the simulator's
state into their inputs.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from railyard.api.trainingjob import Restarts, TrainingJob
from railyard.logic.failures import Failure, build_failure
from railyard.logic.health.liveness import (
    compute_hang_timeout,
    decide_dead_ranks,
    decide_hung_ranks,
)
from railyard.logic.health.model import HealthPolicy, PodStatus
from railyard.logic.health.straggler import compute_straggler_scores, decide_stragglers
from railyard.logic.placement import Placement, Unplaceable, build_placement_input, plan_placement
from railyard.logic.placement.job import build_gang_request
from railyard.logic.quarantine import apply_merge_patch, build_quarantine_patch
from railyard.logic.restarts import (
    RestartDecision,
    decide_restart,
    decide_streak_reset,
    record_restart,
)
from railyard.logic.topology import (
    HOST_KEYS,
    LEVEL_PRESETS,
    TopologyCache,
    build_synthetic_nodes,
    natural_key,
)
from railyard.protocol.exitcodes import FailureClass
from railyard.protocol.manifest import Manifest, ShardInfo
from railyard.protocol.restore import FoundCheckpoint, Layout, decide_restore, pod_location
from railyard.protocol.trainerconfig import to_wire
from railyard.sim.model import Cause, PolicyConfig, Scenario

# --------------------------------------------------------------------------- detection


@dataclass(slots=True)
class _Rank:
    """One synthetic rank, shaped like the heartbeat store's per-rank window."""

    rank: int
    pod_index: int
    node: str
    last_seen_at: float
    step: int
    step_advanced_at: float
    saving: bool = False
    last_saving_at: float = -math.inf
    progress: bool = True
    waiting_for_groups: bool = False
    last_waiting_at: float = -math.inf
    group: int = 0
    group_rank: int = 0
    fingerprints: Mapping[int, str] = dataclasses.field(default_factory=dict)
    compute: list[float] = dataclasses.field(default_factory=list)

    def recent_compute(self, n: int) -> Sequence[float]:
        return self.compute[-n:]


_RUNNING = {0: PodStatus(pod_index=0, phase="Running", node="n0", running_since=0.0)}


class Detector:
    """Fault-to-detection latency per way a fault shows, from the health rules and spec."""

    def __init__(self, scn: Scenario, policy: PolicyConfig) -> None:
        self.scn = scn
        self.policy = policy
        self.health = HealthPolicy.from_spec(to_wire(policy.health))
        self.hang_timeout_s = compute_hang_timeout([scn.step_s] * 100, self.health)
        self._straggler_steps: dict[float, int] = {}

    def _first_tick(self, earliest: float, phase: float, fires: object) -> float:
        """The first operator timer tick at or after ``earliest`` at which ``fires(now)`` holds."""
        period = self.scn.eval_period_s
        k = math.floor((earliest - phase) / period)
        for _ in range(1000):
            now = phase + k * period
            if now >= earliest - period and fires(now):  # type: ignore[operator]
                return now
            k += 1
        raise RuntimeError("health rules never fired on a dead rank; check spec.health")

    def latency(self, cause: Cause, u1: float, u2: float) -> float:
        """Seconds from the fault to the operator acting on it."""
        scn, pol = self.scn, self.policy
        if cause.detect == "exit":
            return scn.pod_exit_detect_s if pol.detection == "heartbeat" else pol.exit_detect_s
        if pol.detection == "timeout":
            return pol.collective_timeout_s
        h = self.health
        phase = u2 * scn.eval_period_s
        if cause.detect == "dead":
            last = -u1 * h.heartbeat_interval_s  # the fault happens at 0, after the last beat
            r = _Rank(0, 0, "n0", last_seen_at=last, step=1, step_advanced_at=last)

            def dead(now: float) -> bool:
                return bool(decide_dead_ranks([r], _RUNNING, h, now))

            return self._first_tick(last + h.heartbeat_timeout_s, phase, dead)
        # hang: heartbeats keep arriving, the step stops advancing
        advanced = -u1 * scn.step_s

        def hung(now: float) -> bool:
            r = _Rank(0, 0, "n0", last_seen_at=now, step=1, step_advanced_at=advanced)
            return bool(decide_hung_ranks([r], _RUNNING, self.hang_timeout_s, h, now))

        return self._first_tick(advanced + self.hang_timeout_s, phase, hung)

    def straggler_steps(self, slowdown: float, ranks: int = 16) -> int:
        """Steps from a rank becoming ``slowdown`` x slower to the straggler rule flagging it
        (a large number when it never does, e.g. below the threshold)."""
        key = round(slowdown, 6)
        if key in self._straggler_steps:
            return self._straggler_steps[key]
        h = self.health
        w = h.straggler_window_steps + h.straggler_confirm_steps
        rs = [_Rank(i, i, f"n{i}", 0.0, 0, 0.0, compute=[1.0] * w) for i in range(ranks)]
        flagged: dict[int, float] = {}
        found = 10**9
        for n in range(1, 20 * w + 1):
            for r in rs:
                # +-1% jitter, fixed per (rank, step) so the probe is deterministic
                r.compute.append(
                    (slowdown if r.rank == 0 else 1.0) * (1.0 + 0.01 * math.sin(7.0 * r.rank + n))
                )
                del r.compute[: -(w + 1)]
            flagged, new, _ = decide_stragglers(
                compute_straggler_scores(rs, h), flagged, h, float(n)
            )
            if any(v.rank == 0 for v in new):
                found = n
                break
        self._straggler_steps[key] = found
        return found


# --------------------------------------------------------------------------- failures, budgets


def classify(cause: Cause, node: str) -> Failure:
    """The operator's classification of the evidence this cause leaves (docs/simulate.md)."""
    return build_failure(cause.evidence, cause.name, node=node, pod="")


class Budgets:
    """Restart budgets per class, spent as the operator spends them (status.restarts)."""

    def __init__(self, policy: PolicyConfig) -> None:
        self.policy = policy
        self.restarts = Restarts()

    def decide(self, cls: FailureClass) -> RestartDecision:
        return decide_restart(self.policy.restart_policy, self.restarts, cls)

    def record(self, cls: FailureClass, reason: str) -> None:
        self.restarts = record_restart(self.restarts, cls, reason, "")

    def healthy(self, running_since: float, now: float) -> None:
        """The gang has run since ``running_since``: clear the restart streak as the operator
        does after ``restartPolicy.resetAfterSeconds`` (logic.restarts.decide_streak_reset)."""
        self.restarts = (
            decide_streak_reset(self.restarts, self.policy.restart_policy, running_since, now) or self.restarts
        )

    def reset(self) -> None:
        """A person resubmitted the job after it failed: a new TrainingJob, fresh budgets."""
        self.restarts = Restarts()


# --------------------------------------------------------------------------- placement


def build_sim_job(scn: Scenario, hot_spares: int, *, name: str = "sim", replica_groups: int = 0) -> TrainingJob:
    """The TrainingJob the simulated gang is: the scenario's shape and our hot spares; with
    ``replica_groups`` R > 1 faultTolerance ReplicaGroups of R groups (placed as the operator
    places them: each group a block of whole leaves where the cluster allows)."""
    groups = replica_groups > 1
    return TrainingJob.model_validate({
        "metadata": {"name": name, "namespace": "sim"},
        "spec": {
            "nodes": scn.nodes,
            "procsPerNode": scn.gpus_per_node,
            "parallelism": {"tensor": scn.tp, "pipeline": scn.pp, "data": scn.dp,
                            **({"dataReplicas": replica_groups} if groups else {})},
            "gang": {"hotSpares": hot_spares},
            **({"faultTolerance": {"mode": "ReplicaGroups"}} if groups else {}),
        },
    })


class Cluster:
    """The synthetic cluster's Node objects, the gang's placement and the quarantined nodes.

    Placement, fresh and sticky after a failure, is the operator's: the input is built by
    :func:`build_placement_input` from the job and the nodes (quarantined ones carry the marks
    of :func:`build_quarantine_patch`, as the operator's node patch writes them) and decided by
    :func:`plan_placement`. A :class:`TopologyCache` carries what the input derived from each
    Node object to the next re-placement: Node objects are never changed in place (a
    quarantined node is a patched copy, made once per quarantine).
    """

    def __init__(self, scn: Scenario, hot_spares: int, replica_groups: int = 0) -> None:
        total = scn.cluster_nodes + hot_spares
        per_spine = scn.nodes_per_leaf * scn.leaves_per_spine
        spines = max(1, math.ceil(total / per_spine))
        leaves = min(scn.leaves_per_spine, math.ceil(total / scn.nodes_per_leaf))
        nodes = build_synthetic_nodes(
            spines, leaves, scn.nodes_per_leaf, scn.gpus_per_node, nvlink_domain=scn.nvlink_domain_nodes
        )
        self._start(build_sim_job(scn, hot_spares, replica_groups=replica_groups), nodes, reduced=True)
        leaf_key = LEVEL_PRESETS["railyard"][0][1]
        #: leaf domain -> its nodes (what a leaf switch's failure or a rack's drain takes)
        self._leaf_members: dict[str, list[str]] = {}
        #: node -> its leaf domain
        self._leaf: dict[str, str] = {}
        for n in nodes:
            name, leaf = str(n["metadata"]["name"]), str(n["metadata"]["labels"][leaf_key])
            self._leaf[name] = leaf
            self._leaf_members.setdefault(leaf, []).append(name)

    @classmethod
    def from_job(
        cls, job: TrainingJob, nodes: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]] = ()
    ) -> Cluster:
        """A cluster of the given Node objects (and other jobs' Pods) running ``job``; tests
        feed the operator, ``plan`` and the simulator the same cluster."""
        c = cls.__new__(cls)
        c._start(job, nodes, pods)
        return c

    def _start(self, job: TrainingJob, nodes: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]] = (),
               *, reduced: bool = False) -> None:
        self.job = job
        self.pods = list(pods)
        self._healthy: dict[str, Mapping[str, Any]] = {str(n["metadata"]["name"]): n for n in nodes}
        #: node name -> time it comes back from repair
        self.quarantined: dict[str, float] = {}
        #: node name -> the Node object with our quarantine marks, while quarantined
        self._marked: dict[str, Mapping[str, Any]] = {}
        self._topology_cache = TopologyCache()
        self.attempt = 0
        self.replacements = 0
        #: Pods the last re-placement put on a node that was not a held spare (their container
        #: starts cold, as a new pod's: Scenario.pod_start_s, not spare_container_start_s).
        self.last_cold = 0
        placed = plan_placement(build_placement_input(
            job, nodes=list(self._healthy.values()), pods=self.pods, cache=self._topology_cache))
        if isinstance(placed, Unplaceable):
            raise ValueError(f"placement: the gang does not fit the simulated cluster: {placed.message}")
        #: the first placement (fresh, on every node); later ones are in nodes, spares
        self.initial: Placement = placed
        self._gang: list[str] = list(placed.nodes)
        self._spares: tuple[str, ...] = placed.spares
        self._peers: tuple[int, ...] = placed.replica_peers
        # One pod per tensor-parallel group on ready, untainted nodes with no other pods (the
        # simulator's own cluster): re-placement can be decided on the reduced cluster of
        # _replace_reduced. Anything else (Cluster.from_job) re-places on every node.
        spec = job.spec
        self._reduced = reduced and not self.pods and spec.parallelism.tensor <= spec.procs_per_node
        if self._reduced:
            keys = tuple(k for k in build_gang_request(job, nodes=nodes).levels if k not in HOST_KEYS)
            #: node name -> its domain path (the label values of the levels), as build_topology keys it
            self._path: dict[str, tuple[Any, ...]] = {
                name: tuple(((n.get("metadata") or {}).get("labels") or {}).get(k) for k in keys)
                for name, n in self._healthy.items()}
            self._pod_of: dict[str, int] = {n: p for p, n in enumerate(self._gang)}
            #: deepest domain path -> the gang's nodes in it
            self._gang_in: dict[tuple[Any, ...], set[str]] = {}
            for n in self._gang:
                self._gang_in.setdefault(self._path[n], set()).add(n)
            #: deepest domain path -> the nodes the gang does not use there (spares, free nodes,
            #: quarantined or not), in tree order (build_topology's order inside a domain)
            self._off_in: dict[tuple[Any, ...], list[tuple[tuple[str | int, ...], str]]] = {}
            for n in sorted(set(self._healthy) - set(self._gang), key=natural_key):
                self._off_in.setdefault(self._path[n], []).append((natural_key(n), n))

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(self._gang)

    @property
    def spares(self) -> tuple[str, ...]:
        return self._spares

    def node_of(self, pod: int) -> str:
        return self._gang[pod]

    def leaf_of(self, pod: int) -> list[str]:
        """Every node under the leaf switch of ``pod``'s node (the simulator's own cluster)."""
        return list(self._leaf_members[self._leaf[self._gang[pod]]])

    def pods_on(self, nodes: Sequence[str]) -> list[int]:
        """The gang's pods on ``nodes``, by pod index."""
        names = set(nodes)
        return [p for p, n in enumerate(self._gang) if n in names]

    def replica_peer(self, pod: int) -> int:
        return self._peers[pod]

    def _node_object(self, name: str) -> Mapping[str, Any]:
        """The Node object now: a quarantined one carries our marks (one patched copy per quarantine)."""
        node = self._healthy[name]
        if name in self.quarantined:
            marked = self._marked.get(name)
            if marked is None:
                patch = build_quarantine_patch(
                    node, reason="simulated failure", job=f"sim/{self.job.metadata.name}", time="")
                marked = self._marked[name] = apply_merge_patch(node, patch)
            return marked
        return node

    def node_objects(self) -> list[Mapping[str, Any]]:
        """The cluster's Node objects now: quarantined ones carry our marks."""
        return [self._node_object(name) for name in self._healthy]

    def release_repaired(self, now: float) -> None:
        for n in [n for n, t in self.quarantined.items() if t <= now]:
            del self.quarantined[n]
            self._marked.pop(n, None)

    def next_repair(self) -> float:
        return min(self.quarantined.values(), default=math.inf)

    def quarantine_and_replace(self, nodes: Sequence[str], now: float, repair_s: float) -> bool:
        """Quarantine ``nodes`` and re-place their pods sticky (spares first); False when no
        usable node is left (the caller waits for a repair and tries again)."""
        for n in nodes:
            self.quarantined[n] = now + repair_s
        self.release_repaired(now)
        lost = sorted(self._pod_of[n] for n in self.quarantined if n in self._pod_of) if self._reduced else []
        reps = self._representatives(set(lost)) if lost else {}
        if reps:
            got = self._replace_reduced(lost, reps)
            if got is None:
                return False
            new_nodes, spares = got
            moved = len(lost)
        else:
            placed = plan_placement(build_placement_input(
                self.job, nodes=self.node_objects(), pods=self.pods, attempt=self.attempt + 1,
                previous_nodes=self._gang, previous_spares=self._spares,
                failed=set(self.quarantined), cache=self._topology_cache,
            ))
            if isinstance(placed, Unplaceable):
                return False
            lost = [p for p, (a, b) in enumerate(zip(self._gang, placed.nodes, strict=True)) if a != b]
            new_nodes = [placed.nodes[p] for p in lost]
            spares, self._peers, moved = placed.spares, placed.replica_peers, len(placed.moved)
        self.attempt += 1
        self.replacements += moved
        held = set(self._spares)
        self.last_cold = sum(1 for p, new in zip(lost, new_nodes, strict=True)
                             if new != self._gang[p] and new not in held)
        for p, new in zip(lost, new_nodes, strict=True):
            self._move(p, new)
        self._spares = spares
        return True

    def _move(self, pod: int, new: str) -> None:
        old = self._gang[pod]
        self._gang[pod] = new
        if self._reduced and old != new:
            del self._pod_of[old]
            self._pod_of[new] = pod
            self._gang_in[self._path[old]].discard(old)
            self._gang_in.setdefault(self._path[new], set()).add(new)
            bisect.insort(self._off_in.setdefault(self._path[old], []), (natural_key(old), old))
            self._off_in[self._path[new]].remove((natural_key(new), new))

    def _representatives(self, lost: set[int]) -> dict[tuple[Any, ...], str]:
        """One kept gang node per deepest domain the kept gang spans (empty when nothing is kept)."""
        out: dict[tuple[Any, ...], str] = {}
        for path, members in self._gang_in.items():
            for n in members:
                if self._pod_of[n] not in lost:
                    out[path] = n
                    break
        return out

    def _replace_reduced(
        self, lost: list[int], reps: Mapping[tuple[Any, ...], str]
    ) -> tuple[list[str], tuple[str, ...]] | None:
        """The operator's sticky re-placement of the ``lost`` pods, decided on a reduced cluster
        that provably gives the same answer (the new nodes of ``lost``, the new spares), or None
        when unplaceable.

        With one pod per tensor-parallel group, :func:`plan_sticky` reads the kept gang only as
        the nodes it may not take and as the set of domains it spans (the spares' top-up ranks
        free nodes by their affinity to those domains); every other choice is among the lost
        pods' old nodes, the spares and the free nodes, by domain, free GPUs and tree order. So
        the decision is made for a gang of one kept node per deepest domain the kept gang spans
        (the same domains at every level) plus the lost pods, in their order, on a cluster of
        those nodes and every node off the gang: the nodes, domains and the relative tree order
        it compares are the full cluster's. The kept pods' other nodes, which it never reads,
        are left out: a re-placement costs the nodes off the gang, not the whole cluster (the
        full decision at 98,304 GPUs is O(cluster) per failure, O(cluster^2) per run).
        tests/sim checks that both decisions agree failure by failure."""
        gang = [*reps.values(), *(self._gang[p] for p in lost)]
        # Of the free nodes, each deepest domain's first k in tree order: the rules pick free
        # nodes (a lost pod's nearest, the spares' top-up) by domain, then free GPUs (all the
        # same here), then tree order, k at most, so no later one of a domain is ever picked
        # while an earlier one is left; the pool is short of the lost pods exactly when the
        # whole one is. The spares are all there (a lost pod takes the nearest of them).
        spares = set(self._spares)
        usable = sum(1 for n in spares if n not in self.quarantined)
        k = len(lost) + self.job.spec.gang.hot_spares - max(0, usable - len(lost))
        free: list[str] = []
        for members in self._off_in.values():
            took = 0
            for _, n in members:
                if took >= k:
                    break
                if n not in spares and n not in self.quarantined:
                    free.append(n)
                    took += 1
        names = [*gang, *(n for n in self._spares if n not in self.quarantined), *free]
        spec = self.job.spec
        sub = TrainingJob.model_validate({  # build_sim_job's job, the gang cut to ``gang``
            "metadata": {"name": self.job.metadata.name, "namespace": self.job.metadata.namespace},
            "spec": {
                "nodes": len(gang),
                "procsPerNode": spec.procs_per_node,
                "parallelism": {"tensor": spec.parallelism.tensor, "pipeline": 1,
                                "data": len(gang) * spec.procs_per_node // spec.parallelism.tensor},
                "gang": {"hotSpares": spec.gang.hot_spares},
            },
        })
        placed = plan_placement(build_placement_input(
            sub, nodes=[self._node_object(n) for n in names], attempt=self.attempt + 1,
            previous_nodes=gang, previous_spares=self._spares, failed=set(self.quarantined),
            cache=self._topology_cache,
        ))
        if isinstance(placed, Unplaceable):
            return None
        k = len(reps)
        if placed.nodes[:k] != tuple(reps.values()) or placed.moved != tuple(range(k, len(gang))):
            raise AssertionError("reduced re-placement moved a kept pod; the reduction does not hold")
        return list(placed.nodes[k:]), placed.spares


# --------------------------------------------------------------------------- restore


@dataclass(frozen=True, slots=True)
class Saved:
    """A committed checkpoint in one tier."""

    tier: str
    step: int
    committed_at: float


_REST = "rest-of-gang.distcp"
_FAILED = "failed-pod.distcp"


def choose_restore(
    saved: Sequence[Saved],
    *,
    scn: Scenario,
    replicate: bool,
    node_lost: bool,
    failed_pod: int,
    replica_peer: int,
    clean_up_to: float,
) -> tuple[str, int] | None:
    """(tier, step) :func:`decide_restore` picks, or None when nothing is restorable.

    The gang's shards are modelled as two: the failed pod's and everyone else's. When the failed
    pod's node is gone, its node-local copies are gone too; its memory-tier replica on
    ``replica_peer`` survives. Checkpoints after ``clean_up_to`` are marked SDC-suspect.
    """
    shards = (ShardInfo(_REST, 1, "r", owner=0), ShardInfo(_FAILED, 1, "f", owner=1))
    both = frozenset({_REST, _FAILED})
    # decide_restore takes the newest acceptable checkpoint, the fastest tier on a tie. Here
    # whether one is acceptable depends on its tier (which copies survive) and on its step
    # (SDC-clean up to clean_up_to) only, so each tier's newest clean one is all it needs to
    # see: the same answer without a manifest per save (which cost O(saves) per failure).
    newest: dict[str, Saved] = {}
    for s in saved:
        if s.step <= clean_up_to and (s.tier not in newest or s.step > newest[s.tier].step):
            newest[s.tier] = s
    found: list[FoundCheckpoint] = []
    for s in newest.values():
        m = Manifest(
            job="sim",
            step=s.step,
            tier=s.tier,
            attempt=0,
            pp=scn.pp,
            dp=scn.dp,
            tp=scn.tp,
            shards=shards,
            sdc_passed=s.step <= clean_up_to,
        )
        if s.tier == "shared":
            found.append(FoundCheckpoint(m, "shared", both, verified=both))
        elif not node_lost:
            found.append(FoundCheckpoint(m, pod_location(0), both, verified=both))
        else:
            rest = frozenset({_REST})
            found.append(FoundCheckpoint(m, pod_location(0), rest, verified=rest))
            if s.tier == "memory" and replicate and replica_peer >= 0:
                mine = frozenset({_FAILED})
                found.append(FoundCheckpoint(m, pod_location(replica_peer), mine, verified=mine))
    # as the bundled trainer asks (CheckpointManager.restore): its loader reshards node tiers
    decision = decide_restore(
        found, layout=Layout(scn.pp, scn.dp, scn.tp), home={1: pod_location(failed_pod)}, node_reshard=True
    )
    if decision.source is None:
        return None
    return decision.source.tier, decision.source.step
