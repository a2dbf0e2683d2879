"""Synthetic heartbeat streams: a simulated job posting into the real store, judged by the
real rules. Time is simulated (``now`` advances), so nothing sleeps."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from railyard.logic.health import (
    HealthDecision,
    HealthPolicy,
    HealthState,
    PodStatus,
    Verdict,
    decide_health,
)
from railyard.logic.health.window import HeartbeatStore
from railyard.protocol.heartbeat import HealthResult, HeartbeatBatch, RankBeat

NS, JOB = "team", "llm"


@dataclass
class SimJob:
    world: int = 16
    ranks_per_pod: int = 8
    compute_s: float = 0.8
    comm_s: float = 0.2
    noise: float = 0.05
    seed: int = 0
    steps_per_beat: int = 1
    #: Evaluate after every this many beats.
    beats_per_eval: int = 1
    policy: HealthPolicy = field(default_factory=HealthPolicy)
    attempt: int = 0
    #: rank -> (first slow step, factor)
    slow: dict[int, tuple[int, float]] = field(default_factory=dict)
    start: float = 1_000_000.0
    #: False: the ranks' program has not opted into step reports (a program without the SDK's report_step)
    progress: bool = True

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.store = HeartbeatStore()
        self.store.begin_attempt(NS, JOB, self.attempt)
        self.state = HealthState()
        self.now = self.start
        self.step = 0
        self.silent_pods: set[int] = set()
        self.pending: dict[int, list[float]] = {r: [] for r in range(self.world)}
        self.last_step_time = 0.0
        self.saving = False
        self.health: dict[int, list[HealthResult]] = {}
        self.decisions: list[HealthDecision] = []
        self.beats = 0

    @property
    def pods(self) -> dict[int, PodStatus]:
        n = (self.world + self.ranks_per_pod - 1) // self.ranks_per_pod
        return {p: PodStatus(p, "Running", f"node-{p}", self.start) for p in range(n)}

    def verdicts(self) -> list[Verdict]:
        return [v for d in self.decisions for v in d.verdicts]

    def run_steps(self, n: int) -> None:
        for _ in range(n):
            self.step += 1
            times = []
            for r in range(self.world):
                t = self.compute_s * max(0.5, 1.0 + self.rng.gauss(0.0, self.noise))
                first, factor = self.slow.get(r, (1 << 60, 1.0))
                if self.step >= first:
                    t *= factor
                self.pending[r].append(t)
                times.append(t)
            self.last_step_time = max(times) + self.comm_s
            self.now += self.last_step_time
            if self.step % self.steps_per_beat == 0:
                self.beat()

    def idle(self, seconds: float, *, beat_every: float | None = None) -> None:
        """Time passes without steps; pods keep beating (a hang, or a long save)."""
        every = beat_every or self.policy.heartbeat_interval_s
        end = self.now + seconds
        while self.now + every <= end:
            self.now += every
            self.beat()
        self.now = end

    def beat(self) -> None:
        for p in self.pods:
            if p in self.silent_pods:
                continue
            ranks = []
            for r in range(p * self.ranks_per_pod, min(self.world, (p + 1) * self.ranks_per_pod)):
                recent = tuple(self.pending[r][-64:])
                self.pending[r] = []
                ranks.append(
                    RankBeat(
                        rank=r,
                        step=self.step,
                        step_time_s=self.last_step_time,
                        compute_s=recent[-1] if recent else 0.0,
                        loss=2.0,
                        grad_norm=1.0,
                        saving=self.saving,
                        health=tuple(self.health.pop(r, [])),
                        recent_compute_s=recent,
                        progress=self.progress,
                    )
                )
            batch = HeartbeatBatch(JOB, self.attempt, p, f"node-{p}", self.now, tuple(ranks))
            self.store.ingest(NS, JOB, batch, self.now)
        self.beats += 1
        if self.beats % self.beats_per_eval == 0:
            self.evaluate()

    def evaluate(self) -> HealthDecision:
        job = self.store.job(NS, JOB)
        assert job is not None
        d = decide_health(job, self.pods, self.state, self.policy, self.now)
        self.state = d.state
        self.decisions.append(d)
        return d
