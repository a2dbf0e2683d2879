"""What ``railyard demo --replica-groups`` shows: how each replica group went through the node
loss, read from what the operator and the trainer left behind. Pure: no clock, no I/O.

Inputs (the runner records them, :class:`GroupRecord`): the gang's pods as the API showed them
(name, UID, the attempt each was created for, pod index, node) when the fault was injected and
at the end; the JSON events each pod's containers printed (the trainer's ``step`` events of each
group's rank 0, the launchers' ``workers_started`` with worker pids, ``replica_healed``,
``restored``); the final ``status``. The one time taken by the demo itself is the injection's;
every other time is a trainer event's. Which group a pod belongs to is the operator's rule
(:func:`railyard.logic.manifests.replica_group_of`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class PodSeen:
    """A gang pod as the API showed it."""

    name: str
    uid: str
    #: The attempt the pod was created for (``railyard.dev/attempt``).
    attempt: int
    index: int
    node: str


@dataclass
class GroupRecord:
    """What the runner collects for the replica-group report (kept in summary.json)."""

    #: Every gang pod seen during the run, by name.
    pods: dict[str, PodSeen] = field(default_factory=dict)
    #: Gang pods (names) when the node was failed, and at the end.
    at_failure: list[str] = field(default_factory=list)
    at_end: list[str] = field(default_factory=list)
    #: When the node was failed (the demo's clock, the same machine's as the events') and which.
    injected_at: float | None = None
    lost_node: str = ""
    #: pod name -> its containers' JSON events, in file order.
    events: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


@dataclass(frozen=True)
class Heal:
    t: float
    from_step: int
    to_step: int


@dataclass(frozen=True)
class GroupStory:
    group: int
    pod_indices: tuple[int, ...]
    #: Its pods when the node was lost, and at the end (names).
    pods_before: tuple[str, ...]
    pods_after: tuple[str, ...]
    #: Every pod of the group at the loss is the same object (UID) at the end.
    same_pods: bool
    #: Its pods' worker pids at the end are those before the loss (None: no workers_started seen).
    pids_same: bool | None
    lost_node: bool
    #: Highest step its rank 0 logged at or before the injection.
    step_at_loss: int | None
    last_step: int | None
    #: Step events after the loss whose step was not above the group's highest so far.
    steps_back: int
    #: Longest wait between new highest steps from its last step before the loss on (trainer times).
    longest_pause_s: float | None
    heals: tuple[Heal, ...]
    #: ``restored`` events (a checkpoint tier read) after the loss.
    checkpoint_reads: int
    #: (time, step) of every step its rank 0 logged, in time order.
    steps: tuple[tuple[float, int], ...]

    @property
    def carried_on(self) -> bool:
        """Untouched by the loss: the same pod objects and the same worker processes."""
        return self.same_pods and self.pids_same is True


@dataclass(frozen=True)
class GroupReport:
    groups: int
    min_replicas: int
    lost_node: str
    injected_at: float | None
    stories: tuple[GroupStory, ...]
    #: Every restart as ``status.lastRestart`` said (attempt, mode, reason, carriedOn, replaced).
    operator_restarts: tuple[dict[str, Any], ...]
    #: ``status.restarts`` by class.
    restarts: dict[str, int]
    phase: str

    @property
    def survivors(self) -> tuple[GroupStory, ...]:
        return tuple(s for s in self.stories if not s.lost_node)

    @property
    def survivors_never_went_back(self) -> bool:
        """No group whose node stayed logged a step at or below one it had logged before."""
        return all(s.steps_back == 0 for s in self.survivors)


def build_group_report(job: Mapping[str, Any], record: GroupRecord, status: Mapping[str, Any],
                       restarts: Mapping[int, Mapping[str, Any]]) -> GroupReport:
    """``restarts``: attempt -> ``status.lastRestart`` of the restart that started it (the demo
    record's ``restarts``)."""
    from railyard.api.trainingjob import TrainingJob
    from railyard.logic.manifests import replica_group_of

    spec = TrainingJob.model_validate(job).spec
    groups = spec.replica_groups
    t0 = record.injected_at
    by_group: dict[int, list[PodSeen]] = {}
    for pod in record.pods.values():
        by_group.setdefault(replica_group_of(spec, pod.index), []).append(pod)
    stories = []
    for g in range(groups):
        pods = sorted(by_group.get(g, []), key=lambda p: (p.attempt, p.index))
        before = [
            record.pods[n]
            for n in record.at_failure
            if n in record.pods and replica_group_of(spec, record.pods[n].index) == g
        ]
        after = [
            record.pods[n]
            for n in record.at_end
            if n in record.pods and replica_group_of(spec, record.pods[n].index) == g
        ]
        events = sorted(
            (e for p in pods for e in record.events.get(p.name, ()) if _time(e) is not None),
            key=lambda e: float(e["time"]),
        )
        stories.append(_story(g, pods, before, after, events, record, t0))
    return GroupReport(
        groups=groups,
        min_replicas=spec.fault_tolerance.min_replicas,
        lost_node=record.lost_node,
        injected_at=t0,
        stories=tuple(stories),
        operator_restarts=tuple({"attempt": a, **{k: n.get(k) for k in ("mode", "reason", "carriedOn", "replaced")}}
                                for a, n in sorted(restarts.items())),
        restarts={k: int(v) for k, v in (status.get("restarts") or {}).items() if isinstance(v, int)},
        phase=str(status.get("phase", "Unknown")),
    )


def _time(e: Mapping[str, Any]) -> float | None:
    try:
        return float(e["time"])
    except (KeyError, TypeError, ValueError):
        return None


def _story(g: int, pods: Sequence[PodSeen], before: Sequence[PodSeen], after: Sequence[PodSeen],
           events: Sequence[Mapping[str, Any]], record: GroupRecord, t0: float | None) -> GroupStory:
    steps = [(float(e["time"]), int(e["step"])) for e in events if e.get("event") == "step" and "step" in e]
    at_loss = max((s for t, s in steps if t0 is not None and t <= t0), default=None)
    top = at_loss if at_loss is not None else -1
    back = 0
    pause: float | None = None
    last_t = max((t for t, s in steps if s == at_loss), default=None) if at_loss is not None else t0
    for t, s in steps:
        if t0 is None or t <= t0:
            continue
        if s <= top:
            back += 1
            continue
        if last_t is not None:
            pause = max(pause or 0.0, t - last_t)
        top, last_t = s, t
    after_uids = {p.uid for p in after}
    same_pods = bool(before) and all(p.uid in after_uids for p in before)
    # every rank of the group logs the heal: one per (from, to), at its first rank's time
    heals: dict[tuple[int, int], Heal] = {}
    for e in events:
        if e.get("event") == "replica_healed" and (t0 is None or float(e["time"]) > t0):
            h = Heal(float(e["time"]), int(e.get("from_step", -1)), int(e.get("to_step", -1)))
            heals.setdefault((h.from_step, h.to_step), h)
    reads = sum(1 for e in events if e.get("event") == "restored" and t0 is not None and float(e["time"]) > t0)
    return GroupStory(
        group=g,
        pod_indices=tuple(sorted({p.index for p in pods})),
        pods_before=tuple(p.name for p in before),
        pods_after=tuple(p.name for p in after),
        same_pods=same_pods,
        pids_same=_pids_same(before, after, record, t0),
        lost_node=any(p.node == record.lost_node for p in before) if record.lost_node else False,
        step_at_loss=at_loss,
        last_step=steps[-1][1] if steps else None,
        steps_back=back,
        longest_pause_s=pause,
        heals=tuple(heals.values()),
        checkpoint_reads=reads,
        steps=tuple(steps),
    )


def _pids_same(
    before: Sequence[PodSeen], after: Sequence[PodSeen], record: GroupRecord, t0: float | None
) -> bool | None:
    """Whether the worker pids of the group's pods at the end are those before the loss: each
    pod's last ``workers_started`` before the injection against the end's pods' last one."""
    def pids(pod_names: Sequence[str], until: float | None) -> set[int] | None:
        out: set[int] = set()
        for name in pod_names:
            started = [e for e in record.events.get(name, ()) if e.get("event") == "workers_started"
                       and (until is None or (_time(e) or 0.0) <= until)]
            if not started:
                return None
            out |= {int(p) for p in (started[-1].get("pids") or {}).values()}
        return out

    old, new = pids([p.name for p in before], t0), pids([p.name for p in after], None)
    if old is None or new is None:
        return None
    return old == new


def format_group_report(r: GroupReport, started_at: float) -> str:
    """The lines the demo prints under its summary."""
    lost = next((s for s in r.stories if s.lost_node), None)
    lines = [f"  replica groups  {r.groups} (faultTolerance ReplicaGroups, minReplicas {r.min_replicas}); "
             + ("one node lost" if r.lost_node else "no node lost")]
    if lost is not None and r.injected_at is not None:
        lines.append(
            f"  node lost       {r.lost_node} (group {lost.group}) at {r.injected_at - started_at:.0f} s, after step "
            f"{lost.step_at_loss}"
            " (its rank 0's last step before the injection)"
        )
    by_class = ", ".join(f"{k} {v}" for k, v in r.restarts.items() if k != "total" and v) or "none"
    lines.append(f"  operator        restarts {by_class}" + "".join(
        f"; attempt {x['attempt']}: {x.get('mode')} ({x.get('reason')}), pods carried on {x.get('carriedOn') or []}, "
        f"replaced {x.get('replaced') or []}" for x in r.operator_restarts))
    for s in r.stories:
        lines.append(f"  group {s.group:<9} {_story_line(s)}")
    verdict = "yes" if r.survivors_never_went_back else "NO"
    untouched = [s.group for s in r.stories if s.carried_on]
    lines.append(
        f"  survivors       never a step back: {verdict}; carried on untouched (same pods and worker pids): "
        + (f"group{'s' if len(untouched) > 1 else ''} {', '.join(map(str, untouched))}" if untouched else "none")
    )
    return "\n".join(lines)


def _story_line(s: GroupStory) -> str:
    steps = f"steps up to {s.last_step}" if s.last_step is not None else "no step logged"
    reads = "no checkpoint read" if s.checkpoint_reads == 0 else f"{s.checkpoint_reads} checkpoint reads"
    back = "none went back" if s.steps_back == 0 else f"{s.steps_back} WENT BACK"
    pause = f", longest pause {s.longest_pause_s:.1f} s" if s.longest_pause_s is not None else ""
    heal = (f"healed from a live peer: step {s.heals[0].from_step} -> {s.heals[0].to_step}" if s.heals
            else "did NOT heal from a peer")
    if s.carried_on:
        return f"carried on: {', '.join(s.pods_before)} same UID, same worker pids; {steps}, {back}{pause}; {reads}"
    if s.same_pods:
        pids = "new worker pids" if s.pids_same is False else "worker pids not seen"
        return f"restarted in place: {', '.join(s.pods_before)} same UID, {pids}; {heal}, {reads}; {steps}, {back}"
    moved = f"{', '.join(s.pods_before) or '-'} -> {', '.join(s.pods_after) or '-'}"
    return f"restarted ({'its node lost' if s.lost_node else 'pod replaced'}): {moved}; {heal}, {reads}; {steps}"


@dataclass(frozen=True)
class GroupMark:
    """A mark on the demo's step picture (seconds since the job was applied)."""

    t: float
    step: int
    group: int
    #: "healed" or "node lost"
    kind: str
    label: str


def group_marks(r: GroupReport, started_at: float) -> list[GroupMark]:
    """Where the picture marks the node loss (on the lost group's curve, at the injection) and
    each heal (the healed group at the step it healed to, at the trainer's event time)."""
    marks = []
    for s in r.stories:
        if s.lost_node and r.injected_at is not None:
            marks.append(GroupMark(r.injected_at - started_at, s.step_at_loss or 0, s.group, "node lost",
                                   f"node {r.lost_node} lost (group {s.group})"))
        for h in s.heals:
            marks.append(GroupMark(h.t - started_at, h.to_step, s.group, "healed",
                                   f"group {s.group} healed from a peer: step {h.from_step} -> {h.to_step}"))
    return sorted(marks, key=lambda m: m.t)


def group_record_to_json(record: GroupRecord) -> dict[str, Any]:
    from dataclasses import asdict

    return {**asdict(record), "pods": {k: asdict(v) for k, v in record.pods.items()}}


def group_record_from_json(raw: Mapping[str, Any]) -> GroupRecord:
    """The record as summary.json holds it (to draw and report again from a past run)."""
    return GroupRecord(
        pods={k: PodSeen(**v) for k, v in (raw.get("pods") or {}).items()},
        at_failure=list(raw.get("at_failure") or []),
        at_end=list(raw.get("at_end") or []),
        injected_at=raw.get("injected_at"),
        lost_node=str(raw.get("lost_node") or ""),
        events={k: list(v) for k, v in (raw.get("events") or {}).items()},
    )
