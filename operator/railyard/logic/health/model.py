"""The vocabulary of health decisions: policy, the signals the store exposes, and verdicts.

The detection rules read the heartbeat store through the small read-only protocols below, so
the store's own per-rank objects are evaluated in place (no copy of 16,384 windows per timer
tick) and tests can feed plain dataclasses.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from railyard.protocol.heartbeat import HealthResult
from railyard.protocol.trainerconfig import Health


class FaultKind(enum.StrEnum):
    DEAD = "Dead"
    HANG = "Hang"
    STRAGGLER = "Straggler"
    SDC = "SDC"
    SUSPECTED_SDC = "SuspectedSDC"


class Action(enum.StrEnum):
    REPORT = "Report"
    RESTART = "Restart"


#: ``spec.health``'s defaults, as the trainer contract declares them.
_SPEC = Health()
_STRAGGLER_ACTION = Action(_SPEC.straggler.action)
_SDC_ACTION = Action(_SPEC.sdc.action)


@dataclass(frozen=True, slots=True)
class HealthPolicy:
    """Detection settings; :meth:`from_spec` reads a TrainingJob's ``spec.health``. Those settings
    default to ``spec.health``'s defaults; the others are the detector's own."""

    heartbeat_interval_s: float = _SPEC.heartbeat_interval_seconds
    heartbeat_timeout_s: float = _SPEC.heartbeat_timeout_seconds
    hang_timeout_floor_s: float = _SPEC.hang_timeout_seconds
    hang_p99_multiplier: float = _SPEC.hang_p99_multiplier
    #: Before the first step completes there is no p99: a rank may take this long (compile, load).
    first_step_timeout_s: float = 600.0
    #: A Running pod that never sent a heartbeat is dead after this long.
    first_heartbeat_timeout_s: float = 300.0
    straggler_threshold: float = _SPEC.straggler.threshold
    straggler_window_steps: int = _SPEC.straggler.window_steps
    #: A rank is flagged when its score is below the threshold at this many consecutive step
    #: positions (windows ending at the newest step, the one before, ...); cleared likewise.
    straggler_confirm_steps: int = 3
    #: Clear a flag only once the score is back above threshold + margin (hysteresis band).
    straggler_clear_margin: float = 0.05
    straggler_action: Action = _STRAGGLER_ACTION
    sdc_action: Action = _SDC_ACTION
    #: How many of the slowest ranks a report (and the metrics) name.
    slowest_ranks_reported: int = 5
    #: The step a rank stands at once it has trained its last (``spec.trainer.steps`` for the
    #: bundled trainer; None: unknown, a program of the user's). Such a rank is finishing (its
    #: final save, its exit, its peers' exits) and is judged dead or hung only after
    #: ``first_step_timeout_s``, not the step-time bounds.
    final_step: int | None = None

    def teardown_bound(self, step: int, bound: float) -> float:
        """``bound``, or the longer teardown allowance for a rank that has trained its last step."""
        if self.final_step is not None and step >= self.final_step:
            return max(bound, self.first_step_timeout_s)
        return bound

    @classmethod
    def from_spec(
        cls, health: Mapping[str, Any] | None, *, heartbeats_expected: bool = True, final_step: int | None = None
    ) -> HealthPolicy:
        """Build from ``spec.health`` as a dict (camelCase, as stored in the object).

        ``heartbeats_expected=False``: the job runs the user's own program (``spec.trainer.program``),
        which sends heartbeats only if it uses the SDK, so a pod that never sent one is not dead
        (its ranks that did send are judged as any other's)."""
        h = dict(health or {})
        s = dict(h.get("straggler") or {})
        d = dict(h.get("sdc") or {})
        base = cls()

        def num(src: Mapping[str, Any], key: str, default: float) -> float:
            v = src.get(key, default)
            if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
                raise ValueError(f"spec.health.{key}: expected a non-negative number, got {v!r}")
            return float(v)

        def act(src: Mapping[str, Any], key: str, default: Action) -> Action:
            v = src.get("action", default.value)
            try:
                return Action(v)
            except ValueError:
                raise ValueError(f"spec.health.{key}.action: expected Report or Restart, got {v!r}") from None

        return cls(
            heartbeat_interval_s=num(h, "heartbeatIntervalSeconds", base.heartbeat_interval_s),
            heartbeat_timeout_s=num(h, "heartbeatTimeoutSeconds", base.heartbeat_timeout_s),
            hang_timeout_floor_s=num(h, "hangTimeoutSeconds", base.hang_timeout_floor_s),
            hang_p99_multiplier=num(h, "hangP99Multiplier", base.hang_p99_multiplier),
            straggler_threshold=num(s, "threshold", base.straggler_threshold),
            straggler_window_steps=max(3, int(num(s, "windowSteps", base.straggler_window_steps))),
            straggler_action=act(s, "straggler", base.straggler_action),
            sdc_action=act(d, "sdc", base.sdc_action),
            first_heartbeat_timeout_s=base.first_heartbeat_timeout_s if heartbeats_expected else math.inf,
            final_step=final_step,
        )


class RankSignals(Protocol):
    """What detection reads about one rank (the store's per-rank window implements it)."""

    @property
    def rank(self) -> int: ...
    @property
    def pod_index(self) -> int: ...
    @property
    def node(self) -> str: ...
    @property
    def last_seen_at(self) -> float: ...
    @property
    def step(self) -> int: ...
    #: When ``step`` last increased (arrival time of that beat).
    @property
    def step_advanced_at(self) -> float: ...
    @property
    def saving(self) -> bool: ...
    #: Last arrival time at which the rank said it was saving (-inf: never).
    @property
    def last_saving_at(self) -> float: ...
    #: Whether the rank reports its steps (False: a program that has not opted in; its step
    #: says nothing about progress).
    @property
    def progress(self) -> bool: ...
    #: faultTolerance ReplicaGroups: the rank waits inside the exchange with the other groups
    #: (a hung peer group stalls it; it is not stuck itself).
    @property
    def waiting_for_groups(self) -> bool: ...
    #: Last arrival time at which the rank said it waited for the other groups (-inf: never).
    @property
    def last_waiting_at(self) -> float: ...
    #: faultTolerance ReplicaGroups: the rank's replica group and its rank inside the group.
    @property
    def group(self) -> int: ...
    @property
    def group_rank(self) -> int: ...
    #: faultTolerance ReplicaGroups: parameter fingerprints by step, for the vote across groups.
    @property
    def fingerprints(self) -> Mapping[int, str]: ...
    def recent_compute(self, n: int) -> Sequence[float]:
        """Up to ``n`` newest per-step compute times, oldest first."""
        ...


@dataclass(frozen=True, slots=True)
class HealthEvent:
    """A failed health check as received, numbered so each is judged once."""

    seq: int
    rank: int
    pod_index: int
    node: str
    arrived_at: float
    result: HealthResult


class JobSignals(Protocol):
    @property
    def attempt(self) -> int: ...
    def rank_signals(self) -> Iterable[RankSignals]: ...
    def recent_step_times(self, n: int) -> Sequence[float]: ...
    def health_events(self) -> Sequence[HealthEvent]: ...


@dataclass(frozen=True, slots=True)
class PodStatus:
    """What the operator knows about one pod of the current attempt."""

    pod_index: int
    phase: str
    node: str = ""
    #: When the pod became Running (None: unknown or not Running).
    running_since: float | None = None


@dataclass(frozen=True, slots=True)
class Verdict:
    kind: FaultKind
    rank: int
    node: str
    pod_index: int
    #: CamelCase reason for Events and conditions (HeartbeatTimeout, StepStalled, ...).
    reason: str
    message: str
    detected_at: float
    #: Best estimate of when the fault began (for the fault-to-detection metric).
    fault_at: float
    action: Action
    #: The operator should quarantine ``node`` (confirmed SDC or a straggler with Restart).
    quarantine_node: bool = False
    score: float | None = None
    #: The restart must restore no checkpoint newer than this step (-1: any): the replica
    #: groups' states differed after it and no majority said which was right.
    restore_not_after: int = -1


@dataclass(frozen=True, slots=True)
class StragglerScore:
    rank: int
    node: str
    pod_index: int
    #: Median of the other ranks' median compute time over this rank's (1.0: typical).
    score: float
    #: NVRx-style relative score: median over all ranks (self included) over this rank's.
    nvrx_score: float
    #: This rank's median compute time over the window (seconds).
    median_compute_s: float


@dataclass(frozen=True, slots=True)
class GroupVoteState:
    """What one evaluation of the cross-group SDC vote (groups.py) hands to the next."""

    #: Slot (group rank) -> the newest step judged for it.
    judged: Mapping[int, int] = field(default_factory=dict)
    #: Slot -> the newest step at which its groups agreed.
    agreed: Mapping[int, int] = field(default_factory=dict)
    #: Groups already named this attempt (each is named once; its repair ends the attempt).
    named: frozenset[int] = frozenset()
    #: A no-majority verdict was given this attempt.
    tied: bool = False


@dataclass(frozen=True, slots=True)
class HealthState:
    """What one evaluation hands to the next (keep it per job; reset on a new attempt)."""

    attempt: int = -1
    #: Open dead/hang conditions (kind, pod index) already reported, so each is reported once.
    open: frozenset[tuple[FaultKind, int]] = frozenset()
    #: Flagged stragglers: rank -> score at flag time.
    stragglers: Mapping[int, float] = field(default_factory=dict)
    sdc_seen_seq: int = -1
    #: faultTolerance ReplicaGroups: the cross-group SDC vote.
    groups: GroupVoteState = field(default_factory=GroupVoteState)


@dataclass(frozen=True, slots=True)
class HealthDecision:
    #: Newly detected faults (emit an Event and count a metric for each).
    verdicts: tuple[Verdict, ...]
    #: Everything still wrong now (dead/hung ranks, flagged stragglers).
    active: tuple[Verdict, ...]
    state: HealthState
    #: True when a new verdict asks for a gang restart.
    restart: bool
    quarantine_nodes: tuple[str, ...]
    #: The slowest ranks by score (lowest first), for status and metrics.
    slowest: tuple[StragglerScore, ...]
    stragglers: tuple[StragglerScore, ...]
    hang_timeout_s: float
    p50_step_time_s: float | None
    p99_step_time_s: float | None
    #: Age of the stalest heartbeat among ranks of Running pods (None: no ranks seen).
    max_heartbeat_age_s: float | None
