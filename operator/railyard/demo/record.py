"""What the demo observed, and the summary computed from it. Pure: no clock, no I/O.

The runner appends a :class:`Sample` of the TrainingJob's status every poll and a
:class:`Decision` for every Event the operator emits; :func:`summarise` turns the record into
the numbers the demo prints (and checks against the status and the operator's metrics).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Sample:
    t: float
    phase: str
    attempt: int
    step: int
    loss: float | None
    tokens_per_s: float


@dataclass(frozen=True)
class Decision:
    t: float
    reason: str
    message: str
    kind: str = "Normal"


@dataclass(frozen=True)
class Restore:
    attempt: int
    tier: str
    step: int
    steps_lost: int


@dataclass
class Record:
    started_at: float
    samples: list[Sample] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    #: attempt -> node per pod index, from ``status.placement`` of that attempt
    placements: dict[int, list[str]] = field(default_factory=dict)
    spares: dict[int, list[str]] = field(default_factory=dict)
    #: attempt -> pod indices that moved to another node (``status.placement.moved``)
    moved: dict[int, list[int]] = field(default_factory=dict)
    #: attempt -> {pod index: node} of the pods seen bound (what really ran)
    pods: dict[int, dict[int, str]] = field(default_factory=dict)
    #: node -> (spine, leaf)
    topology: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: node -> its NVLink domain, the value of the job's NVLink-domain label on the node
    #: (``topology.nvlinkLevel``, by default nvidia.com/gpu.clique); empty when no node carries it
    nvlink: dict[str, str] = field(default_factory=dict)
    #: pod index -> the tensor-parallel groups (``g = p * dp + d``) its ranks belong to, by the
    #: operator's layout rule (railyard.protocol.mesh.MeshShape.layout)
    tp_groups: dict[int, tuple[int, ...]] = field(default_factory=dict)
    #: scenario actions the runner took: (t, what)
    actions: list[tuple[float, str]] = field(default_factory=list)
    final_status: dict[str, Any] = field(default_factory=dict)
    finished_at: float | None = None
    #: attempt -> how the restart that started it was done (``status.lastRestart``)
    restarts: dict[int, dict[str, Any]] = field(default_factory=dict)

    def add_sample(self, sample: Sample) -> bool:
        """Keep a sample when something a person would see changed; True if kept."""
        last = self.samples[-1] if self.samples else None
        if last and (last.phase, last.attempt, last.step) == (sample.phase, sample.attempt, sample.step):
            return False
        self.samples.append(sample)
        return True


def note_placement(record: Record, status: dict[str, Any]) -> int | None:
    """Record ``status.placement`` under the attempt it was made for; returns that attempt when
    it is new. ``status.attempt`` moves on at a restart before the next gang is placed, so the
    placement's own ``attempt`` says whose it is (reading status.attempt showed attempt N+1 on
    attempt N's nodes)."""
    placement = status.get("placement") or {}
    nodes = list(placement.get("nodes") or [])
    if not nodes or "attempt" not in placement:
        return None
    attempt = int(placement["attempt"])
    if record.placements.get(attempt) == nodes:
        return None
    record.placements[attempt] = nodes
    record.spares[attempt] = list(placement.get("spares") or [])
    record.moved[attempt] = [int(i) for i in placement.get("moved") or []]
    return attempt


def note_nodes(record: Record, job: dict[str, Any], nodes: list[dict[str, Any]]) -> None:
    """Record each Node's (spine, leaf) and NVLink domain from its labels, and the TP groups of
    each pod index. The NVLink label key is the operator's (railyard.logic.placement
    build_gang_request: ``topology.nvlinkLevel``, else the preset's key the nodes carry), so is
    the pod -> TP group rule (the job's MeshShape); where the pods went is ``status.placement``'s."""
    from railyard.api.trainingjob import TrainingJob
    from railyard.logic.placement import build_gang_request

    request = build_gang_request(TrainingJob.model_validate(job), nodes=nodes)
    key = request.nvlink_level or ""
    for node in nodes:
        meta = node.get("metadata") or {}
        labels = meta.get("labels") or {}
        name = str(meta.get("name", ""))
        record.topology[name] = (labels.get("railyard.dev/spine", "?"), labels.get("railyard.dev/leaf", "?"))
        if labels.get(key):
            record.nvlink[name] = str(labels[key])
    shape = request.shape
    groups: dict[int, set[int]] = {}
    for _rank, pod, _local, p, d, _t in shape.layout():
        groups.setdefault(pod, set()).add(p * shape.dp + d)
    record.tp_groups = {pod: tuple(sorted(g)) for pod, g in sorted(groups.items())}


def note_restart(record: Record, status: dict[str, Any]) -> dict[str, Any] | None:
    """Record ``status.lastRestart`` under the attempt it started, once it says what it did
    (in place: started, with what stayed and moved; full: decided); returns it when new."""
    last = status.get("lastRestart") or {}
    if "attempt" not in last or not last.get("message"):
        return None
    if last.get("mode") == "InPlace" and last.get("state") == "Pending":
        return None  # wait for the replacements: the message then names where they went
    attempt = int(last["attempt"])
    note = {k: last.get(k) for k in ("mode", "reason", "message", "kept", "replaced", "carriedOn")}
    if record.restarts.get(attempt) == note:
        return None
    record.restarts[attempt] = note
    return note


def describe_restart(attempt: int, note: dict[str, Any]) -> str:
    """One line: which pods stayed, which moved, and why."""
    if note.get("mode") == "InPlace":
        return f"attempt {attempt}: {note.get('message')}"
    return f"attempt {attempt}: {note.get('message') or 'full restart'}"


def members_of(status: dict[str, Any], pods: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """The bound pods (created-for attempt, pod index, node) that serve the status's attempt, by
    the operator's own rule (railyard.logic.gang.gang_members: an in-place restart keeps pods of
    earlier attempts), as (serving attempt, pod index, node)."""
    from railyard.api.trainingjob import TrainingJobStatus
    from railyard.logic.gang import gang_members, pod_index_of
    from railyard.logic.inplace import members_since
    from railyard.logic.manifests import ATTEMPT_LABEL, POD_INDEX_LABEL

    st = TrainingJobStatus.model_validate(status)
    objs = [
        {"metadata": {"labels": {ATTEMPT_LABEL: str(a), POD_INDEX_LABEL: str(i)}}, "spec": {"nodeName": n}}
        for a, i, n in pods
    ]
    members, _ = gang_members(objs, attempt=st.attempt, since=members_since(st))
    return [(st.attempt, pod_index_of(p), str(p["spec"]["nodeName"])) for p in members]


def note_pods(record: Record, pods: list[tuple[int, int, str]]) -> None:
    """Record (attempt, pod index, node) of bound pods: the placement that really ran."""
    for attempt, index, node in pods:
        if node and index >= 0:
            record.pods.setdefault(attempt, {})[index] = node


@dataclass(frozen=True)
class Cell:
    node: str
    #: "pod", "spare", "quarantined" or "free"
    role: str
    pod_index: int | None = None
    moved: bool = False
    #: the node's NVLink domain ("" without one)
    domain: str = ""
    #: with an NVLink domain: the TP groups of the pod on it
    tp_groups: tuple[int, ...] = ()


@dataclass(frozen=True)
class PlacementPicture:
    attempt: int
    #: (spine, leaf) -> the nodes of that leaf, in order (those of one NVLink domain together)
    leaves: dict[tuple[str, str], list[Cell]]

    def pods(self) -> dict[int, str]:
        return {c.pod_index: c.node for cells in self.leaves.values() for c in cells if c.pod_index is not None}

    def domains(self) -> dict[str, tuple[int, ...]]:
        """NVLink domain -> the TP groups of the pods inside it (a group split over several
        domains is listed under each, as in Placement.tp_groups_by_domain); empty without one."""
        out: dict[str, set[int]] = {}
        for cells in self.leaves.values():
            for c in cells:
                if c.domain:
                    out.setdefault(c.domain, set()).update(c.tp_groups)
        return {k: tuple(sorted(v)) for k, v in sorted(out.items())}


def placement_picture(record: Record) -> PlacementPicture:
    """What the placement picture shows: the final attempt's gang, as its status recorded it."""
    attempt = max(record.placements) if record.placements else 0
    gang = record.placements.get(attempt, [])
    moved = set(record.moved.get(attempt, []))
    spares = set(record.spares.get(attempt, []))
    quarantined = {q.get("node", "") for q in record.final_status.get("quarantinedNodes") or []}
    leaves: dict[tuple[str, str], list[Cell]] = {}
    nvlink = record.nvlink
    for n in sorted(record.topology, key=lambda n: (record.topology[n], nvlink.get(n, ""), n)):
        domain = nvlink.get(n, "")
        if n in gang:
            index = gang.index(n)
            cell = Cell(n, "pod", index, index in moved, domain, record.tp_groups.get(index, ()) if domain else ())
        elif n in quarantined:
            cell = Cell(n, "quarantined", domain=domain)
        elif n in spares:
            cell = Cell(n, "spare", domain=domain)
        else:
            cell = Cell(n, "free", domain=domain)
        leaves.setdefault(record.topology[n], []).append(cell)
    return PlacementPicture(attempt, leaves)


@dataclass(frozen=True)
class Summary:
    phase: str
    wall_s: float
    steps: int
    goodput: float
    restarts: dict[str, int]
    steps_lost: int
    restores: list[Restore]
    quarantined: list[str]
    stragglers: list[str]
    time_to_first_step_s: float | None
    #: how each restart was done: what stayed, what moved where, and why
    restarts_how: list[str] = field(default_factory=list)


def restores_from_status(history: list[dict[str, Any]]) -> list[Restore]:
    """One restore per attempt > 0, from the ``status.restore`` seen in each attempt."""
    seen: dict[int, Restore] = {}
    for status in history:
        restore = status.get("restore") or {}
        attempt = int(status.get("attempt", 0))
        if attempt > 0 and restore.get("tier"):
            seen[attempt] = Restore(
                attempt, str(restore["tier"]), int(restore.get("step", -1)), int(restore.get("stepsLost", 0))
            )
    return [seen[a] for a in sorted(seen)]


def summarise(record: Record, restores: list[Restore]) -> Summary:
    """Goodput here is the share of wall time (from the job's creation to its end) that produced
    steps the final model kept: kept steps x the clean median step time / wall time. Restarts,
    detection, restore and recomputed steps all count as lost."""
    status = record.final_status
    end = (
        record.finished_at
        if record.finished_at is not None
        else (record.samples[-1].t if record.samples else record.started_at)
    )
    wall = max(end - record.started_at, 1e-9)
    steps = int(status.get("step", record.samples[-1].step if record.samples else 0))
    step_times = _clean_step_times(record.samples)
    median = sorted(step_times)[len(step_times) // 2] if step_times else 0.0
    restarts = {k: int(v) for k, v in (status.get("restarts") or {}).items() if isinstance(v, int)}
    first = next((s.t for s in record.samples if s.step > 0), None)
    return Summary(
        phase=str(status.get("phase", record.samples[-1].phase if record.samples else "Unknown")),
        wall_s=wall,
        steps=steps,
        goodput=min(1.0, steps * median / wall),
        restarts=restarts,
        steps_lost=sum(r.steps_lost for r in restores),
        restores=restores,
        quarantined=[q.get("node", "") for q in status.get("quarantinedNodes") or []],
        stragglers=sorted({f"rank {s.get('rank')} on {s.get('node')}" for s in status.get("stragglers") or []}),
        time_to_first_step_s=None if first is None else first - record.started_at,
        restarts_how=[describe_restart(a, n) for a, n in sorted(record.restarts.items())],
    )


def _clean_step_times(samples: list[Sample]) -> list[float]:
    """Per-step wall time between consecutive samples of the same attempt that advanced."""
    out: list[float] = []
    for a, b in itertools.pairwise(samples):
        if a.attempt == b.attempt and b.step > a.step and a.phase == b.phase == "Running":
            out.append((b.t - a.t) / (b.step - a.step))
    return out


def format_summary(s: Summary) -> str:
    lines = [
        f"  result          {s.phase} after {s.wall_s:.0f} s, {s.steps} steps",
        f"  goodput         {s.goodput * 100:.0f}% of wall time produced kept steps",
        "  restarts        "
        + (", ".join(f"{k} {v}" for k, v in s.restarts.items() if k not in ("total",) and v) or "none")
        + f" (total {s.restarts.get('total', 0)})",
        f"  steps lost      {s.steps_lost}",
        "  restores        "
        + (
            "; ".join(f"attempt {r.attempt}: {r.tier} tier at step {r.step} ({r.steps_lost} lost)" for r in s.restores)
            or "none"
        ),
        "  quarantined     " + (", ".join(s.quarantined) or "none"),
        "  stragglers      " + (", ".join(s.stragglers) or "none flagged at the end"),
    ]
    for i, how in enumerate(s.restarts_how):
        lines.append(f"  {'how restarted' if i == 0 else '':<15} {how}")
    if s.time_to_first_step_s is not None:
        lines.append(f"  first step      {s.time_to_first_step_s:.0f} s after apply")
    return "\n".join(lines)
