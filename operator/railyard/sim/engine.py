"""The event loop: one gang training through a failure trace under one policy.

Time is wall-clock seconds from the start of the run; progress is optimizer steps (a float).
Between events the job runs analytically: it advances at ``1 / (step time x slowdown)`` steps
per second and stops for the blocking part of each checkpoint save. At a failure the loop asks
the policy code (railyard.sim.decisions) how long detection takes, which class the failure is,
whether the budget allows a restart and with what backoff, where the pod goes, and which
checkpoint to restore; progress rolls back to that checkpoint and the job resumes after
detection + backoff + restart + restore.

Accounting: every second of the run, times the job's GPUs, lands in exactly one bucket: useful
training (the final step count x step time), checkpoint stalls, straggler slowdown, or a cause's
downtime (detection, backoff, restart, restore) and recomputation (work thrown away by the
rollback). Useful + lost = GPUs x wall time, which the tests check.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter, deque
from dataclasses import dataclass, field

from railyard.logic.groups import compute_cross_group_fraction, compute_group_heal_s
from railyard.logic.health.groups import is_strict_majority
from railyard.protocol.mesh import group_of_pod_index
from railyard.protocol.trainerconfig import LIGHTHOUSE_HEARTBEAT_INTERVAL_MS, LIGHTHOUSE_MISSED_HEARTBEATS
from railyard.sim.checkpoints import decide_sim_intervals
from railyard.sim.decisions import Budgets, Cluster, Detector, Saved, choose_restore, classify
from railyard.sim.model import PLANNED_CAUSE, Cause, PolicyConfig, Scenario, Tier
from railyard.sim.trace import Event, exp_from_uniform

#: Loss components per cause.
COMPONENTS = ("detection", "backoff", "restart", "restore", "recompute")
STALL = "Checkpoint stalls"
SLOW = "Straggler slowdown"
#: The step time the cross-group all-reduce adds with replica groups (railyard.logic.groups).
CROSS = "Cross-group all-reduce"


@dataclass(slots=True)
class RunResult:
    policy: str
    wall_s: float
    gpus: int
    step_s: float
    useful_s: float
    #: cause -> component -> seconds of the whole gang lost (x GPUs = GPU-seconds).
    lost: dict[str, dict[str, float]] = field(default_factory=dict)
    restarts: Counter[str] = field(default_factory=Counter)
    restore_tiers: Counter[str] = field(default_factory=Counter)
    interruptions: int = 0
    #: Trace events that never happened under this policy (the node had been quarantined).
    prevented: int = 0
    quarantined: int = 0
    replacements: int = 0
    job_failures: int = 0
    #: Unplaceable re-placements that had to wait for a repair.
    waits_for_repair: int = 0
    #: Re-placements that moved a pod to a node that was not a held spare (the pool was used up).
    cold_moves: int = 0
    #: Every interruption: (time, cause, lost seconds including recomputation).
    timeline: list[tuple[float, str, float]] = field(default_factory=list)
    #: Each enabled tier's save interval in steps and why (railyard.logic.intervals).
    checkpoint_intervals: dict[str, int] = field(default_factory=dict)
    interval_reasons: tuple[str, ...] = ()

    @property
    def goodput(self) -> float:
        return self.useful_s / self.wall_s if self.wall_s else 0.0

    @property
    def steps(self) -> float:
        return self.useful_s / self.step_s

    def lost_total_s(self) -> float:
        return sum(sum(c.values()) for c in self.lost.values())

    def lost_gpu_hours(self) -> dict[str, float]:
        return {k: sum(v.values()) * self.gpus / 3600.0 for k, v in self.lost.items()}


@dataclass(slots=True)
class _TierState:
    interval: int
    commit_delay: float
    stall: float
    saved: deque[Saved]


@dataclass(slots=True)
class _Straggler:
    event: Event
    pod: int
    slowdown: float
    token: int = 0


@dataclass(slots=True)
class _Corruption:
    event: Event
    #: Progress (steps) when the state went bad.
    step: float
    #: The last SDC check that passed before it (our checks), else the onset itself.
    clean_up_to: float
    token: int = 0
    detections: int = 0


class _Run:
    def __init__(self, scn: Scenario, policy: PolicyConfig, trace: tuple[Event, ...]) -> None:
        self.scn = scn
        self.pol = policy
        self.trace = trace
        self.horizon = scn.wall_s
        self.step_s = scn.step_s
        self.detector = Detector(scn, policy)
        self.budgets = Budgets(policy)
        self.cluster = Cluster(scn, policy.hot_spares, policy.replica_groups) if policy.sticky else None
        groups = policy.replica_groups if policy.replica_groups > 1 else 1
        #: pods per replica group (the whole gang without groups)
        self.group_pods = scn.nodes // groups
        #: the step time the cross-group all-reduce adds, as a fraction of a step
        self.costs = scn.group_costs()
        self.cross = compute_cross_group_fraction(groups, self.costs)
        self.res = RunResult(policy.name, scn.wall_s, scn.gpus, self.step_s, 0.0)
        snapshot = (
            scn.bytes_per_node / (scn.gpus_per_node * scn.host_copy_bw_per_gpu)
            + scn.save_fixed_stall_s
        )
        self.snapshot_s = snapshot
        writes: dict[Tier, float] = {
            "memory": scn.bytes_per_node / scn.peer_bw_per_node
            if policy.checkpoint.memory.replicate
            else 0.0,
            "local": scn.bytes_per_node / scn.nvme_bw_per_node,
            "shared": max(
                scn.checkpoint_bytes / scn.shared_write_bw,
                scn.bytes_per_node / scn.peer_bw_per_node,
            ),
        }
        keeps: dict[Tier, int] = {
            "memory": policy.checkpoint.memory.keep,
            "local": policy.checkpoint.local.keep,
            "shared": policy.checkpoint.shared.keep,
        }
        stalls: dict[Tier, float] = {t: snapshot if policy.async_save else snapshot + w for t, w in writes.items()}
        # the intervals the spec leaves open by the operator's rule, from this scenario's figures
        choices = decide_sim_intervals(
            scn, policy, stall_s=stalls, duration_s=writes,
            group_outage_s=scn.pod_exit_detect_s + scn.in_place_restart_s(node_lost=True) + self.group_heal_s())
        self.res.checkpoint_intervals = {c.tier: c.steps for c in choices}
        self.res.interval_reasons = tuple(c.reason for c in choices)
        self.tiers: dict[Tier, _TierState] = {}
        for choice in choices:
            delay = writes[choice.tier] if policy.async_save else 0.0
            self.tiers[choice.tier] = _TierState(choice.steps, delay, stalls[choice.tier],
                                                 deque(maxlen=keeps[choice.tier]))
        # state
        self.t = 0.0
        self.step = 0.0
        self.busy_until = 0.0
        self.down_until = 0.0
        self.stragglers: dict[int, _Straggler] = {}
        self.corruption: _Corruption | None = None
        #: trace ids whose node we quarantined (their repeats and straggler failures vanish)
        self.removed: set[int] = set()
        self.deferred: list[Event] = []
        self.heap: list[tuple[float, int, int, str, int]] = []
        self.seq = 0

    # ------------------------------------------------------------------ bookkeeping

    def lose(self, cause: str, component: str, seconds: float) -> None:
        if seconds <= 0:
            return
        by = self.res.lost.setdefault(cause, {})
        by[component] = by.get(component, 0.0) + seconds

    def push(self, time: float, kind: str, ref: int, token: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (time, self.seq, ref, kind, token))

    def slowdown(self) -> float:
        return max((s.slowdown for s in self.stragglers.values()), default=1.0)

    # ------------------------------------------------------------------ running

    def advance(self, until: float) -> None:
        """Run (or sit out a restart) from ``self.t`` to ``until``.

        The hot loop of the simulator (one iteration per save): locals only, losses summed once.
        """
        until = min(until, self.horizon)
        if self.t < self.down_until:
            self.t = min(self.down_until, until)
        slow = self.slowdown()
        sps = self.step_s * slow * (1.0 + self.cross)
        waste = (1.0 - 1.0 / slow) / (1.0 + self.cross)
        tiers = [
            (tier, ts.interval, ts.stall, ts.commit_delay, ts.saved)
            for tier, ts in self.tiers.items()
        ]
        t, step, busy = self.t, self.step, self.busy_until
        stalled = 0.0
        ran = 0.0
        while t < until:
            if t < busy:
                dt = min(busy, until) - t
                stalled += dt
                t += dt
                continue
            if not tiers:
                ran += until - t
                step += (until - t) / sps
                t = until
                break
            save_step = min((math.floor(step / iv + 1e-9) + 1) * iv for _, iv, _, _, _ in tiers)
            dt_run = (save_step - step) * sps
            if t + dt_run > until:
                dt = until - t
                step += dt / sps
                ran += dt
                t = until
                break
            t += dt_run
            ran += dt_run
            step = float(save_step)
            stall = 0.0
            for _, iv, st, _, _ in tiers:
                if save_step % iv == 0 and st > stall:
                    stall = st
            for tier, iv, _, delay, saved in tiers:
                if save_step % iv == 0:
                    saved.append(Saved(tier, save_step, t + stall + delay))
            busy = t + stall
        self.t, self.step, self.busy_until = t, step, busy
        self.lose(STALL, "stall", stalled)
        self.lose(SLOW, "slowdown", ran * waste)
        self.lose(CROSS, "slowdown", ran * self.cross / (1.0 + self.cross))

    def committed(self, at: float) -> list[Saved]:
        return [s for ts in self.tiers.values() for s in ts.saved if s.committed_at <= at]

    # ------------------------------------------------------------------ events

    def run(self) -> RunResult:
        for ev in self.trace:
            self.push(ev.time, "trace", ev.id)
        while self.heap:
            time, _, ref, kind, token = heapq.heappop(self.heap)
            if time >= self.horizon:
                break
            if time < self.down_until:
                if kind == "trace":
                    self.on_event_while_down(self.trace[ref])
                elif kind == "resume":
                    pass
                else:
                    self.push(self.down_until, kind, ref, token)
                continue
            self.advance(time)
            if kind == "trace":
                self.on_event(self.trace[ref])
            elif kind == "resume":
                self.on_resume()
            elif kind == "straggler_detect":
                self.on_straggler_detect(ref, token)
            elif kind == "sdc_detect":
                self.on_sdc_detect(token)
        self.advance(self.horizon)
        self.res.useful_s = self.step * self.step_s
        if self.cluster is not None:
            self.res.replacements = self.cluster.replacements
        return self.res

    def on_event_while_down(self, ev: Event) -> None:
        if ev.kind == "straggler":
            self.start_straggler(ev)
        else:
            # a fault during a restart is found when the gang comes up: handle it at resume
            self.deferred.append(ev)

    def on_resume(self) -> None:
        for s in self.stragglers.values():
            self.schedule_straggler_detect(s)
        if self.corruption is not None:
            self.schedule_sdc_detect(self.corruption, resumed=True)
        pending, self.deferred = self.deferred, []
        for ev in pending:
            self.push(self.t, "trace", ev.id)

    def gone(self, ev: Event) -> bool:
        """The event hit a node we had already quarantined: under our policy it never happens."""
        if not self.pol.quarantine:
            return False
        return (ev.repeat_of >= 0 and ev.repeat_of in self.removed) or (
            ev.straggler_of >= 0 and ev.straggler_of in self.removed
        )

    def on_event(self, ev: Event) -> None:
        if self.gone(ev):
            self.res.prevented += 1
            return
        if ev.kind == "straggler":
            self.start_straggler(ev)
        elif ev.kind == "sdc":
            self.start_corruption(ev)
        elif ev.kind == "planned":
            self.planned(ev)
        else:
            if ev.straggler_of >= 0:
                self.stragglers.pop(ev.straggler_of, None)  # the slow node finally died
            self.fail(ev, ev.cause, self.detector.latency(ev.cause, ev.u1, ev.u2))

    # ------------------------------------------------------------------ stragglers

    def start_straggler(self, ev: Event) -> None:
        s = _Straggler(ev, ev.pod, self.scn.straggler_slowdown)
        self.stragglers[ev.id] = s
        if self.t >= self.down_until:
            self.schedule_straggler_detect(s)

    def schedule_straggler_detect(self, s: _Straggler) -> None:
        if not self.pol.straggler_restart:
            return
        s.token += 1
        steps = self.detector.straggler_steps(s.slowdown)
        if steps >= 10**9:
            return
        self.push(
            max(self.t, self.down_until) + steps * self.step_s * self.slowdown(),
            "straggler_detect",
            s.event.id,
            s.token,
        )

    def on_straggler_detect(self, ev_id: int, token: int) -> None:
        s = self.stragglers.get(ev_id)
        if s is None or s.token != token:
            return
        # a healthy-but-slow gang saves on demand to its fastest tier, so nothing is recomputed
        # (with replica groups the slow node's group restarts alone and heals from a peer)
        if not self.by_group(s.event.cause):
            self.save_on_demand(next(iter(self.tiers)), s.event.cause.name)
        self.fail(s.event, s.event.cause, 0.0)

    def save_on_demand(self, tier: Tier, cause: str) -> None:
        """Save at the current step and wait until it is committed (the gang is healthy)."""
        ts = self.tiers[tier]
        whole = math.floor(self.step)
        self.lose(cause, "recompute", (self.step - whole) * self.step_s)
        self.step = float(whole)
        wait = max(self.busy_until - self.t, 0.0) + ts.stall + ts.commit_delay
        self.lose(STALL, "stall", wait)
        ts.saved.append(Saved(tier, whole, self.t + wait))
        self.t += wait
        self.busy_until = self.t

    # ------------------------------------------------------------------ silent data corruption

    def start_corruption(self, ev: Event) -> None:
        if self.corruption is not None:
            return  # already corrupt; the first one is what detection finds
        clean = self.step
        if self.pol.sdc_checks:
            iv = self.pol.health.sdc.interval_steps
            clean = math.floor(self.step / iv) * iv
        self.corruption = _Corruption(ev, self.step, clean)
        self.schedule_sdc_detect(self.corruption, resumed=False)

    def schedule_sdc_detect(self, c: _Corruption, *, resumed: bool) -> None:
        c.token += 1
        sps = self.step_s * self.slowdown()
        start = max(self.t, self.down_until)
        if self.pol.sdc_checks:
            iv = self.pol.health.sdc.interval_steps
            # checks run before the first step of an attempt and every interval; one replay confirms
            steps = 1.0 if resumed else (math.floor(self.step / iv) + 1) * iv - self.step + 1.0
            at = start + steps * sps
        else:
            mean = self.scn.unchecked_sdc_detect_h * 3600.0
            at = start + exp_from_uniform(c.event.u1 if c.detections == 0 else c.event.u2, mean)
        self.push(at, "sdc_detect", c.event.id, c.token)

    def on_sdc_detect(self, token: int) -> None:
        c = self.corruption
        if c is None or c.token != token:
            return
        c.detections += 1
        self.fail(c.event, c.event.cause, 0.0)

    # ------------------------------------------------------------------ planned maintenance

    def planned(self, ev: Event) -> None:
        """A planned interruption: a rolling drain of one leaf domain's nodes, announced together.
        Our policy moves ahead of it as the operator does (logic/recovery.py's MoveAhead); the
        baseline and the full-restart policy save to a tier that survives the reboot and restart
        the gang."""
        if self.cluster is not None and (self.pol.in_place or self.pol.replica_groups > 1):
            self.planned_move(ev)
            return
        # hosts reboot: the memory tier does not survive, node-local disks do
        tier: Tier = (
            "local"
            if "local" in self.tiers
            else "shared"
            if "shared" in self.tiers
            else next(iter(self.tiers))
        )
        self.save_on_demand(tier, PLANNED_CAUSE.name)
        restart = self.gang_restart_s()
        restore = self.restore_s(tier, node_lost=False)
        self.res.restore_tiers[tier] += 1
        self.res.restarts[PLANNED_CAUSE.name] += 1
        self.res.interruptions += 1
        self.down(PLANNED_CAUSE.name, {"restart": restart, "restore": restore}, 0.0)

    def planned_move(self, ev: Event) -> None:
        """The operator's planned move: the drained nodes' pods move to spares at a step
        boundary, no step is trained twice and no restart budget is spent. With replica groups
        the groups on those nodes leave the quorum cleanly and restart alone (healing from a live
        peer); without, a just-in-time save to the memory tier and an in-place restart resumed
        from it. The drained nodes are back after ``maintenance_h``."""
        assert self.cluster is not None
        scn = self.scn
        drained = self.cluster.leaf_of(min(int(ev.u1 * scn.nodes), scn.nodes - 1))
        pods = self.cluster.pods_on(drained)  # the drained leaf holds the drawn pod, so never none
        name = PLANNED_CAUSE.name
        # the step in flight finishes (nothing is redone); the move starts at its boundary
        boundary = self.t + (math.ceil(self.step - 1e-9) - self.step) * self.step_s * (1.0 + self.cross)
        self.advance(boundary)
        self.step = float(round(self.step))
        wait = self.place_away(drained, self.t, scn.maintenance_h * 3600.0)
        self.res.restarts[name] += 1
        self.res.interruptions += 1
        groups = {group_of_pod_index(p, self.group_pods) for p in pods}
        parts = {"backoff": wait, "restart": self.in_place_restart_s(node_lost=True)}
        if self.pol.replica_groups > 1 and len(groups) < self.pol.replica_groups:
            self.group_down(PLANNED_CAUSE, parts, lost_groups=len(groups), clean=True)
            return
        tier: Tier = "memory" if "memory" in self.tiers else next(iter(self.tiers))
        self.save_on_demand(tier, name)
        parts["restore"] = self.restore_s(tier, node_lost=True)
        self.res.restore_tiers[tier] += 1
        self.down(name, parts, 0.0)

    def place_away(self, nodes: list[str], now: float, away_s: float) -> float:
        """Take ``nodes`` out for ``away_s`` and re-place the gang's pods on them sticky; the
        seconds spent waiting for a node to come back when no usable one is left."""
        assert self.cluster is not None
        when, waited = now, 0.0
        while not self.cluster.quarantine_and_replace(nodes, when, away_s):
            self.res.waits_for_repair += 1
            nxt = self.cluster.next_repair()
            if math.isinf(nxt):
                raise RuntimeError("no node can ever replace the failed one; enlarge the cluster")
            waited += max(0.0, nxt - when)
            when = max(when, nxt)
        self.res.cold_moves += self.cluster.last_cold > 0
        return waited

    # ------------------------------------------------------------------ failures

    def gang_restart_s(self) -> float:
        s = self.scn
        return s.teardown_s + s.nodes / s.schedule_pods_per_s + s.pod_start_s + s.init_s

    def in_place_restart_s(self, *, node_lost: bool) -> float:
        """The in-place restart after the last re-placement: a moved pod that found no held spare
        (the pool used up) starts cold on a free node, and the restart waits for the slowest."""
        cold = self.cluster is not None and node_lost and self.cluster.last_cold > 0
        return self.scn.in_place_restart_s(node_lost=node_lost, on_spare=not cold)

    def restore_s(self, tier: str, *, node_lost: bool) -> float:
        s = self.scn
        h2d = s.bytes_per_node / (s.gpus_per_node * s.host_copy_bw_per_gpu)
        if tier == "memory":
            return h2d + (s.bytes_per_node / s.peer_bw_per_node if node_lost else 0.0)
        if tier == "local":
            return h2d + s.bytes_per_node / s.nvme_bw_per_node
        return h2d + max(
            s.checkpoint_bytes / s.shared_read_bw, s.bytes_per_node / s.peer_bw_per_node
        )

    def by_group(self, cause: Cause) -> bool:
        """Replica groups handle this fault by restarting one group: any fault of one node or
        process, and a silent corruption when the other groups outvote the corrupt one (three
        groups or more): the operator's cross-group vote (``decide_group_sdc``) names that
        group, its node is quarantined and the group repair heals it from a good group while
        the others train on, as for a lost node (the corrupt gradient share summed into every
        group before the vote is not rolled back: the operator does not either). With two
        groups no majority names it: the whole job restores a checkpoint no newer than the
        last check that passed (the fence)."""
        r = self.pol.replica_groups
        return r > 1 and (cause.detect != "sdc" or is_strict_majority(r - 1, r))

    def group_heal_s(self) -> float:
        """The restarted group fetches a live peer's state: a fixed cost (measured) plus its
        nodes' shares of one replica, node to node, all nodes of the group at once."""
        return compute_group_heal_s(self.pol.replica_groups, self.scn.nodes, self.costs)

    def group_rate(self, lost_groups: int = 1) -> float:
        """Step rate with ``lost_groups`` groups missing, over the rate with all R."""
        r = self.pol.replica_groups
        return self.scn.group_degraded_efficiency * (r - lost_groups) / r

    def fail(self, ev: Event, cause: Cause, detect_s: float) -> None:
        scn, pol = self.scn, self.pol
        failed_at = self.t
        node = self.cluster.node_of(ev.pod) if self.cluster is not None else f"pod-{ev.pod}"
        failure = classify(cause, node)
        cls = failure.cls
        parts: dict[str, float] = {"detection": detect_s}
        self.budgets.healthy(self.down_until, failed_at)
        decision = self.budgets.decide(cls)
        if not decision.allowed:
            self.res.job_failures += 1
            self.budgets.reset()
            parts["backoff"] = scn.manual_restart_h * 3600.0
        else:
            parts["backoff"] = decision.backoff_seconds
        self.budgets.record(cls, failure.message)
        self.res.restarts[cls.value] += 1
        self.res.interruptions += 1

        node_lost = False
        restart = self.gang_restart_s()
        # a leaf switch takes every node under it: each of the gang's pods there, whatever group
        leaf = self.cluster.leaf_of(ev.pod) if ev.scope == "leaf" and self.cluster is not None else []
        hit = set(self.cluster.pods_on(leaf)) if self.cluster is not None and leaf else {ev.pod}
        lost_groups = len({group_of_pod_index(p, self.group_pods) for p in hit})
        gone = list(dict.fromkeys([*failure.nodes, *leaf]))
        if pol.quarantine and gone and self.cluster is not None:
            node_lost = True
            self.removed.add(ev.id)
            self.res.quarantined += len(gone)
            parts["backoff"] += self.place_away(gone, failed_at + detect_s, scn.repair_h * 3600.0)
            # the pods moved: a straggler on one is gone with its node
            for sid in [k for k, s in self.stragglers.items() if s.pod in hit]:
                self.removed.add(sid)
                del self.stragglers[sid]
        if pol.in_place or self.by_group(cause):
            restart = self.in_place_restart_s(node_lost=node_lost)
        parts["restart"] = restart
        if self.by_group(cause) and decision.allowed and lost_groups < pol.replica_groups:
            if cause.detect == "sdc":
                self.corruption = None  # the outvoted group takes a good group's state
            self.group_down(cause, parts, lost_groups=lost_groups)
            return

        c = self.corruption
        clean = math.inf
        if c is not None and c.detections > 0 and (pol.verified_restore or c.detections > 1):
            # our checks flagged it; without checks, a person rolls back after it shows again
            clean = c.clean_up_to
        peer = self.cluster.replica_peer(ev.pod) if self.cluster is not None else -1
        choice = choose_restore(
            self.committed(failed_at),
            scn=scn,
            replicate=pol.checkpoint.memory.replicate,
            node_lost=node_lost,
            failed_pod=ev.pod,
            replica_peer=peer,
            clean_up_to=clean,
        )
        if choice is None:
            tier, step = "scratch", 0
            parts["restore"] = 0.0
        else:
            tier, step = choice
            parts["restore"] = self.restore_s(tier, node_lost=node_lost)
        self.res.restore_tiers[tier] += 1
        recompute = max(0.0, self.step - step) * self.step_s
        self.step = float(min(self.step, step))
        if c is not None and self.step <= c.step:  # restored state predates the corruption
            self.corruption = None
        self.down(cause.name, parts, recompute)

    def group_down(self, cause: Cause, parts: dict[str, float], *, lost_groups: int = 1, clean: bool = False) -> None:
        """``lost_groups`` replica groups restart while the others train on: nothing is rolled back.

        The survivors pause (``group_survivor_stall_s``) and redo the step in flight; then they
        train at ``group_rate`` of the full rate while the lost groups are detected, back off,
        restart and heal. That reduced rate is booked as its equivalent full stop: the same
        steps lost, so useful + lost = wall time still holds. ``clean``: a planned move, the
        groups leave the quorum at a step boundary, so nothing is redone and the survivors do
        not wait out the Lighthouse's heartbeat timeout (only the quorum change is left).
        """
        missing = 1.0 - self.group_rate(lost_groups)
        whole = math.floor(self.step + 1e-9)
        recompute = (self.step - whole) * self.step_s
        self.step = float(whole)
        heal = self.group_heal_s()
        self.res.restore_tiers["live peer"] += lost_groups
        stall = self.scn.group_survivor_stall_s
        if clean:
            stall = max(0.0, stall - LIGHTHOUSE_HEARTBEAT_INTERVAL_MS * LIGHTHOUSE_MISSED_HEARTBEATS / 1000.0)
        # the group's outage, clipped at the end of the run before it is scaled (a group that
        # waits past the end for a repaired node costs its share of the time left, not of the wait)
        room = max(0.0, self.horizon - self.t - stall)
        scaled: dict[str, float] = {}
        for comp, sec in (("detection", parts.get("detection", 0.0)), ("backoff", parts.get("backoff", 0.0)),
                          ("restart", parts.get("restart", 0.0)), ("restore", heal)):
            sec = min(sec, room)
            room -= sec
            scaled[comp] = missing * sec
        scaled["detection"] += stall
        self.down(cause.name, scaled, recompute)

    def down(self, cause: str, parts: dict[str, float], recompute: float) -> None:
        """Sit out the restart (clipped at the end of the run) and schedule the resume."""
        total = 0.0
        for comp in COMPONENTS:
            if comp == "recompute":
                continue
            sec = parts.get(comp, 0.0)
            room = max(0.0, self.horizon - (self.t + total))
            self.lose(cause, comp, min(sec, room))
            total += sec
        self.lose(cause, "recompute", recompute)
        self.res.timeline.append((self.t, cause, total + recompute))
        self.busy_until = self.t
        self.down_until = self.t + total
        self.t = min(self.down_until, self.horizon)
        # the restored state is not saved again at the step it was loaded from
        self.push(self.down_until, "resume", -1)


def simulate(scn: Scenario, policy: PolicyConfig, trace: tuple[Event, ...]) -> RunResult:
    """Run ``policy`` through ``trace`` on ``scn``; deterministic."""
    problems = scn.problems()
    r = policy.replica_groups
    if r > 1 and scn.dp % r:
        problems.append(f"replica groups: {r} must divide the data-parallel degree ({scn.dp}); set --replica-groups")
    if problems:
        raise ValueError("; ".join(problems))
    return _Run(scn, policy, trace).run()
