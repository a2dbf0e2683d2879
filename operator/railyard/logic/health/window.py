"""The heartbeat window model: what the operator remembers of each job's heartbeats.

Each pod posts one batch for its local ranks every interval (protocol.heartbeat); the ingest
endpoint (:mod:`railyard.observe.heartbeats`) authenticates and parses it and hands it to the
:class:`HeartbeatStore` here. The store keeps, per job, a fixed-size rolling window per rank
(``collections.deque``), the job's recent step times, failed health checks, the last checkpoint
events per tier and what the attempt restored from. Work per rank beat is constant; memory is
bounded by ranks x window. The rank windows implement :class:`railyard.logic.health.RankSignals`
so the detection rules read them in place.

Replica groups (faultTolerance ReplicaGroups): each group is a world of its own whose beats carry
ranks from 0, and a group repair moves the job's attempt on while the other groups carry on with
theirs. With the job's :class:`GroupLayout` the store keys every beat by its job-wide rank
(:func:`railyard.protocol.mesh.job_rank_of_group_rank`), so the rules see the whole job; and
:meth:`HeartbeatStore.begin_attempt` with ``carry_on`` keeps the carried-on pods' windows and
accepts their older attempt's beats.

Pure: no I/O, no clock (every method that records takes ``now``, Unix seconds, the clock pod
start times use too).
"""

from __future__ import annotations

import enum
import struct
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import islice

from railyard.logic.health.model import HealthEvent
from railyard.protocol.heartbeat import HEAL_SOURCE, CheckpointEvent, HeartbeatBatch, HeartbeatError, RankBeat
from railyard.protocol.mesh import group_of_pod_index, job_rank_of_group_rank, pods_per_group
from railyard.protocol.ranktable import RankTable

#: Steps of compute time kept per rank (the straggler window needs at most window + 2).
DEFAULT_WINDOW = 256
#: Beats kept per rank (arrival, step, step time, compute, loss, grad norm).
SAMPLE_WINDOW = 64
_SAMPLE_FIELDS = 6
#: One sample written in one C call: six item stores on an ``array('d')`` each parse their value
#: through ``PyArg_Parse`` (350 instructions apiece, 17,000 per 8-rank batch).
_pack_sample = struct.Struct(f"{_SAMPLE_FIELDS}d").pack_into
_SAMPLE_BYTES = 8 * _SAMPLE_FIELDS
_NAN = float("nan")
HEALTH_EVENTS_KEPT = 1024
CHECKPOINT_EVENTS_PER_TIER = 8
#: Fingerprints kept per rank (ReplicaGroups' cross-group vote; the newest steps).
FINGERPRINTS_KEPT = 8


@dataclass(frozen=True, slots=True)
class StepSample:
    arrived_at: float
    step: int
    step_time_s: float
    compute_s: float
    loss: float | None
    grad_norm: float | None


class RankWindow:
    """One rank's recent history in fixed-size rings. Implements ``logic.health.RankSignals``.

    Compute times (one per step, the straggler signal) live in a float32 ring of ``window``
    steps; per-beat samples (arrival, step, step time, compute, loss, grad norm) in a float64
    ring of ``sample_window`` beats. 16,384 ranks x 256 steps stay near 50 MiB.
    """

    __slots__ = (
        "_c",
        "_ci",
        "_cn",
        "_s",
        "_si",
        "_sn",
        "fingerprints",
        "group",
        "group_rank",
        "last_beat",
        "last_saving_at",
        "last_seen_at",
        "last_waiting_at",
        "node",
        "pod_index",
        "progress",
        "rank",
        "saving",
        "step",
        "step_advanced_at",
        "waiting_for_groups",
    )

    def __init__(self, rank: int, window: int, sample_window: int = SAMPLE_WINDOW) -> None:
        self.rank = rank
        self.pod_index = -1
        self.node = ""
        self.last_seen_at = float("-inf")
        self.step = -1
        self.step_advanced_at = float("-inf")
        self.saving = False
        self.last_saving_at = float("-inf")
        self.progress = True
        self.waiting_for_groups = False
        self.last_waiting_at = float("-inf")
        #: ReplicaGroups: this rank's group and its rank inside the group's world (its slot:
        #: the same slot of every group holds the same state), and its newest fingerprints by step.
        self.group = 0
        self.group_rank = rank
        self.fingerprints: dict[int, str] = {}
        self.last_beat: RankBeat | None = None
        self._c = array("f", bytes(4 * window))
        self._ci = 0
        self._cn = 0
        self._s = array("d", bytes(8 * _SAMPLE_FIELDS * sample_window))
        self._si = 0
        self._sn = 0

    def update(self, b: RankBeat, pod_index: int, node: str, now: float) -> bool:
        """Record one beat; True when the step advanced."""
        self.last_seen_at = now
        self.pod_index = pod_index
        self.node = node
        self.saving = b.saving
        if b.saving:
            self.last_saving_at = now
        self.progress = b.progress
        self.waiting_for_groups = b.waiting_for_groups
        if b.waiting_for_groups:
            self.last_waiting_at = now
        self.last_beat = b
        if b.fingerprint and b.fingerprint_step >= 0 and b.fingerprint_step not in self.fingerprints:
            fps = self.fingerprints
            fps[b.fingerprint_step] = b.fingerprint
            if len(fps) > FINGERPRINTS_KEPT:
                del fps[min(fps)]
        if b.step <= self.step:
            return False
        recent = b.recent_compute_s
        advanced = b.step - self.step if self.step >= 0 else len(recent) or 1
        self.step = b.step
        self.step_advanced_at = now
        c = self._c
        cap = len(c)
        i = self._ci
        if len(recent) == 1:  # one step since the last beat, the common case
            c[i] = recent[0]
            i = i + 1 if i + 1 < cap else 0
            self._cn += 1
        elif recent:
            for x in recent[-min(advanced, len(recent), cap) :]:
                c[i] = x
                i = i + 1 if i + 1 < cap else 0
                self._cn += 1
        elif b.compute_s > 0.0:
            c[i] = b.compute_s
            i = i + 1 if i + 1 < cap else 0
            self._cn += 1
        self._ci = i
        if self._cn > cap:
            self._cn = cap
        si = self._si
        sv = self._s
        loss, grad_norm = b.loss, b.grad_norm
        _pack_sample(
            sv, si * _SAMPLE_BYTES, now, b.step, b.step_time_s, b.compute_s,
            _NAN if loss is None else loss, _NAN if grad_norm is None else grad_norm,
        )
        n = len(sv)
        self._si = si + 1 if (si + 1) * _SAMPLE_FIELDS < n else 0
        if self._sn * _SAMPLE_FIELDS < n:
            self._sn += 1
        return True

    def recent_compute(self, n: int) -> Sequence[float]:
        """A copy of the ring's newest ``n`` (an ``array``: the garbage collector never walks it,
        where 16,384 lists per evaluation made it walk the heap)."""
        k = min(n, self._cn)
        cap, end = len(self._c), self._ci
        start = end - max(k, 0)
        if start >= 0:
            return self._c[start:end]
        return self._c[start + cap :] + self._c[:end]

    def samples(self) -> list[StepSample]:
        """The per-beat samples, oldest first (for status and debugging; not on a hot path)."""
        cap = len(self._s) // _SAMPLE_FIELDS
        first = (self._si - self._sn) % cap
        out = []
        for k in range(self._sn):
            j = ((first + k) % cap) * _SAMPLE_FIELDS
            a, st, t, c, loss, gn = self._s[j : j + _SAMPLE_FIELDS]
            out.append(StepSample(a, int(st), t, c, None if loss != loss else loss, None if gn != gn else gn))
        return out


@dataclass(frozen=True, slots=True)
class GroupLayout:
    """How a ReplicaGroups job splits into groups: ``pods_per_group`` consecutive pods each, the
    job's mesh ``pp x dp x tp`` cut along ``dp`` into ``replicas`` worlds."""

    replicas: int
    pods_per_group: int
    pp: int
    dp: int
    tp: int

    @classmethod
    def of(cls, table: RankTable, replicas: int) -> GroupLayout | None:
        """The layout of the job whose (job-wide) rank table is ``table``; None for one group."""
        if replicas < 2:
            return None
        return cls(replicas, pods_per_group(len(table.pods), replicas), table.pp, table.dp, table.tp)

    def group_of(self, pod_index: int) -> int:
        return min(group_of_pod_index(pod_index, self.pods_per_group), self.replicas - 1)

    def job_rank(self, group: int, rank: int) -> int:
        """The job-wide rank of ``rank`` of ``group``'s world (a :class:`HeartbeatError` for a
        rank outside it: the batch is refused, nothing is stored)."""
        try:
            return job_rank_of_group_rank(rank, group=group, replicas=self.replicas, pp=self.pp, dp=self.dp, tp=self.tp)
        except ValueError as exc:
            raise HeartbeatError(f"ranks: {exc}") from exc


#: Called with (namespace, job, batch) for every stored batch.
BatchHook = Callable[[str, str, HeartbeatBatch], None]


class JobWindow:
    """One job's heartbeat state. Implements ``logic.health.JobSignals``."""

    def __init__(self, namespace: str, job: str, attempt: int, window: int) -> None:
        self.namespace = namespace
        self.job = job
        self.attempt = attempt
        self.window = window
        self.ranks: dict[int, RankWindow] = {}
        self.step_times: deque[float] = deque(maxlen=1024)
        self.max_step = -1
        self.health: deque[HealthEvent] = deque(maxlen=HEALTH_EVENTS_KEPT)
        self.health_seq = 0
        self.checkpoints: dict[str, deque[tuple[float, CheckpointEvent]]] = {}
        self.restored_tier = ""
        self.restored_step = -1
        #: The newest step the previous attempt reported (-1: unknown), for steps lost.
        self.previous_max_step = -1
        self.batches = 0
        self.rank_beats = 0
        #: ReplicaGroups: how beats' group ranks map to job ranks (None: one world).
        self.layout: GroupLayout | None = None
        #: Pod index -> the oldest attempt accepted from it: pods that carry on with an older
        #: attempt after a replica-group repair.
        self.carried: dict[int, int] = {}

    def accepts(self, batch: HeartbeatBatch) -> bool:
        """Whether a batch belongs to this attempt: the attempt itself, or the older attempt a
        carried-on pod still runs."""
        if batch.attempt >= self.attempt:
            return True
        oldest = self.carried.get(batch.pod_index)
        return oldest is not None and batch.attempt >= oldest

    def ingest(self, batch: HeartbeatBatch, now: float) -> None:
        layout = self.layout
        group = 0
        if layout is None:
            ranks: Iterable[int] = [b.rank for b in batch.ranks]
        else:
            group = layout.group_of(batch.pod_index)
            ranks = [layout.job_rank(group, b.rank) for b in batch.ranks]
            for b in batch.ranks:  # every rank named is checked before anything is stored
                for res in b.health:
                    if res.suspect_rank >= 0:
                        layout.job_rank(group, res.suspect_rank)
        self.batches += 1
        windows, pod_index, node = self.ranks, batch.pod_index, batch.node
        for rank, b in zip(ranks, batch.ranks, strict=True):
            rw = windows.get(rank)
            if rw is None:
                rw = windows[rank] = RankWindow(rank, self.window)
                rw.group, rw.group_rank = group, b.rank
            if rw.update(b, pod_index, node, now) and b.step > self.max_step:
                self.max_step = b.step
                if b.step_time_s > 0.0:
                    self.step_times.append(b.step_time_s)
            if not b.health:
                continue
            for res in b.health:
                if not res.ok:
                    if layout is not None and res.suspect_rank >= 0:
                        # a check blames a rank of its own world: the reporter's group
                        res = replace(res, suspect_rank=layout.job_rank(group, res.suspect_rank))
                    self.health_seq += 1
                    self.health.append(HealthEvent(self.health_seq, rank, batch.pod_index, batch.node, now, res))
        self.rank_beats += len(batch.ranks)
        for cp in batch.checkpoints:
            q = self.checkpoints.get(cp.tier)
            if q is None:
                q = self.checkpoints[cp.tier] = deque(maxlen=CHECKPOINT_EVENTS_PER_TIER)
            q.append((now, cp))
        # how this attempt restored: its own pods say; a carried-on pod's restore was its older
        # attempt's (a replica group's survivors while the restarted group heals from them). A
        # tier wins over a heal: after a whole-job restart a group without its tier heals from
        # the groups that restored (one answer per attempt, not one per group's last beat)
        if batch.restored_tier and batch.attempt == self.attempt and (
            batch.restored_tier != HEAL_SOURCE or self.restored_tier in ("", HEAL_SOURCE)
        ):
            self.restored_tier = batch.restored_tier
            self.restored_step = batch.restored_step

    # JobSignals
    def rank_signals(self) -> Iterable[RankWindow]:
        return self.ranks.values()

    def recent_step_times(self, n: int) -> Sequence[float]:
        st = self.step_times
        return list(st) if n >= len(st) else list(islice(st, len(st) - n, None))

    def health_events(self) -> Sequence[HealthEvent]:
        return list(self.health)

    def progress(self) -> tuple[float | None, float]:
        """Loss and tokens/s of the newest step any rank reported (both are global values that
        every rank computes; the first rank at the newest step is taken)."""
        for rw in self.ranks.values():
            b = rw.last_beat
            if b is not None and b.step == self.max_step:
                return b.loss, b.tokens_per_s
        return None, 0.0

    def last_checkpoints(self) -> dict[str, CheckpointEvent]:
        """Newest checkpoint event per tier."""
        return {tier: q[-1][1] for tier, q in self.checkpoints.items() if q}


class IngestResult(enum.Enum):
    ACCEPTED = "accepted"
    STALE_ATTEMPT = "stale_attempt"


class HeartbeatStore:
    """All jobs' windows. The operator calls :meth:`begin_attempt` when it starts an attempt."""

    def __init__(self, window: int = DEFAULT_WINDOW) -> None:
        if window < 8:
            raise ValueError(f"window: {window} is too small, use at least 8 steps")
        self.window = window
        self._jobs: dict[tuple[str, str], JobWindow] = {}

    def begin_attempt(
        self, namespace: str, job: str, attempt: int, *, layout: GroupLayout | None = None,
        carry_on: Mapping[int, int] | None = None,
    ) -> JobWindow:
        """The job's current attempt; a higher one drops the old attempt's windows.

        ``layout``: the job's replica groups (kept across attempts until given again).
        ``carry_on``: pod index -> the attempt that pod's launcher was started in, for the pods
        a replica-group repair leaves running: their windows stay, and their beats (of any
        attempt from that one on) are accepted. Given for the attempt already current, it
        replaces what that attempt carries (a beat of the new attempt may have begun it)."""
        key = (namespace, job)
        jw = self._jobs.get(key)
        if jw is None or attempt > jw.attempt:
            old = jw
            jw = self._jobs[key] = JobWindow(namespace, job, attempt, self.window)
            if old is not None:
                jw.previous_max_step = max(old.max_step, old.previous_max_step)
                jw.layout = old.layout
                if carry_on:
                    _carry(old, jw, carry_on)
        elif attempt == jw.attempt and carry_on is not None:
            jw.carried = dict(carry_on)
        if layout is not None and attempt == jw.attempt:
            jw.layout = layout
        return jw

    def forget_job(self, namespace: str, job: str) -> None:
        self._jobs.pop((namespace, job), None)

    def job(self, namespace: str, job: str) -> JobWindow | None:
        return self._jobs.get((namespace, job))

    def jobs(self) -> list[JobWindow]:
        return list(self._jobs.values())

    def ingest(self, namespace: str, job: str, batch: HeartbeatBatch, now: float) -> IngestResult:
        """Store an authenticated, parsed batch. An older attempt changes nothing (unless a
        carried-on pod runs it). Raises :class:`HeartbeatError` for a rank outside its replica
        group's world."""
        jw = self._jobs.get((namespace, job))
        if jw is not None and not jw.accepts(batch):
            return IngestResult.STALE_ATTEMPT
        if jw is None or batch.attempt > jw.attempt:
            jw = self.begin_attempt(namespace, job, batch.attempt)
        jw.ingest(batch, now)
        return IngestResult.ACCEPTED


def _carry(old: JobWindow, new: JobWindow, carry_on: Mapping[int, int]) -> None:
    """The carried-on pods' rank windows and the job's step times go on into the new attempt
    (their training never stopped); failed checks do not (each attempt judges its own)."""
    new.carried = dict(carry_on)
    for rank, rw in old.ranks.items():
        if rw.pod_index in carry_on:
            new.ranks[rank] = rw
            new.max_step = max(new.max_step, rw.step)
    new.step_times.extend(old.step_times)
