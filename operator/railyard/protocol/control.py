"""The restart control channel: what a pod's launcher and the operator say to each other.

An in-place restart keeps the pods on healthy nodes and restarts only their worker processes, so
the new attempt, its rank table and the restore choice must reach every kept launcher at once (a
ConfigMap update reaches a mounted file only at the kubelet's next sync, up to a minute later).
Each launcher therefore long-polls the operator, on the same authenticated HTTP server as the
heartbeat ingest:

``POST /v1/control/{namespace}/{job}?wait=<seconds>`` with ``Authorization: Bearer <job token>``
and a :class:`LauncherReport` (what this launcher is doing: attempt, state, the exit codes of
its workers). The answer is a :class:`ControlOrder`, at once when there is something to do, else
when the job's control state changes or ``wait`` runs out:

- ``continue``: keep doing what you do (for a launcher whose workers failed: keep waiting);
- ``restart``: stop your workers and start them for ``attempt``, with the rank table of that
  attempt (a :class:`RankTableDelta` against the table you run, or the whole table) and the
  restore hint;
- ``stop``: you are not a member of the job's current attempt (you were replaced, e.g. after a
  partition) or the job is over: stop your workers and exit;
- ``save``: a planned move is coming (docs/disruptions.md): have your workers of ``attempt`` save
  to the memory tier at a step boundary no earlier than ``save_step`` (every rank the same step,
  agreed among the workers) and then hold still until the restart. The launcher acknowledges it by
  reporting ``save_step`` back, so the order is answered once, not to every poll. With
  faultTolerance ReplicaGroups the order goes only to the moved groups' launchers: their workers
  first leave the groups' quorum at that step boundary (the other groups never fail a step for
  them), and the launcher reports the step they left after as ``left_step``; the move waits for it.

Fencing (attempt numbers only grow): a launcher acts on a ``restart`` only for an attempt newer
than its own (:func:`decide_launcher_step`), checks that the rank table it builds is exactly the
operator's (:func:`rank_table_digest`), and its workers rendezvous on the attempt's own port
under a store prefix naming the attempt, so a rank can never join another attempt's gang.

Standard library only: the operator and the torch-free launcher both import it.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from railyard.protocol.ranktable import PodEntry, RankTable, RankTableError

SCHEMA_VERSION = 1
ROUTE = "/v1/control/{namespace}/{job}"
#: Longest hold of a long poll the operator grants (a launcher asking for more gets this).
MAX_WAIT_S = 30.0
#: Upper bound of a report body (the ingest answers 413 beyond).
MAX_REPORT_BYTES = 64 * 1024
#: Most worker exit codes one report carries (a pod runs at most 64 ranks).
MAX_WORKERS = 64
#: Longest ``message`` of a report: the kubelet's limit of a termination message.
MAX_MESSAGE_CHARS = 4096


class ControlError(ValueError):
    """A malformed control message; the message names the field."""


class LauncherState(StrEnum):
    #: The workers of ``attempt`` run (or are starting).
    RUNNING = "running"
    #: A worker of ``attempt`` exited non-zero; the others are being stopped and the launcher
    #: waits for an order (restart in place) instead of exiting.
    FAILED = "failed"
    #: Every worker of ``attempt`` exited 0; the launcher exits 0.
    SUCCEEDED = "succeeded"
    #: Told to stop (or it gave up waiting): the launcher exits with ``code``.
    STOPPED = "stopped"


class Action(StrEnum):
    CONTINUE = "continue"
    RESTART = "restart"
    STOP = "stop"
    SAVE = "save"


@dataclass(frozen=True, slots=True)
class LauncherReport:
    """What a launcher tells the operator with each poll."""

    job: str
    attempt: int
    pod_index: int
    #: The pod's name (``RAILYARD_POD_NAME``): the operator answers ``stop`` to a pod that is not
    #: the member of its index in the current attempt.
    pod: str
    state: LauncherState
    #: The most specific exit code of the workers that exited (0: none failed).
    code: int = 0
    #: (rank, exit code) of the workers that have exited in this attempt.
    workers: tuple[tuple[int, int], ...] = ()
    sent_at: float = 0.0
    version: int = SCHEMA_VERSION
    #: The failed workers' last words (state Failed): what the launcher would write to the pod's
    #: termination message, which it does not write while it keeps the pod to restart in place.
    message: str = ""
    #: The ``save_step`` of the save order this launcher passed on to its workers (-1: none).
    save_step: int = -1
    #: ReplicaGroups: the step after which this launcher's workers left the quorum for the
    #: planned move (-1: they did not).
    left_step: int = -1

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": self.version, "job": self.job, "attempt": self.attempt, "pod_index": self.pod_index,
                "pod": self.pod, "state": self.state.value, "code": self.code,
                "workers": [[r, c] for r, c in self.workers], "sent_at": self.sent_at,
                **({"message": self.message} if self.message else {}),
                **({"save_step": self.save_step} if self.save_step >= 0 else {}),
                **({"left_step": self.left_step} if self.left_step >= 0 else {}),
            },
            separators=(",", ":"),
        )


@dataclass(frozen=True, slots=True)
class RankTableDelta:
    """The rank table of ``attempt`` as a change of the table of ``base``: a sticky re-placement
    keeps every pod index and rank and moves only some pods to other nodes, so an order carries
    the moved pods' entries and the new rendezvous, not 16,384 rank entries per launcher."""

    base: int
    attempt: int
    master_addr: str
    master_port: int
    #: The pod entries that differ from the base table (node, address, replica peer).
    pods: tuple[PodEntry, ...]
    #: :func:`rank_table_digest` of the resulting table: the launcher checks it rebuilt the
    #: operator's table exactly.
    digest: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "base": self.base,
            "attempt": self.attempt,
            "master_addr": self.master_addr,
            "master_port": self.master_port,
            "pods": [
                {"pod_index": p.pod_index, "node": p.node, "address": p.address, "replica_peer": p.replica_peer}
                for p in self.pods
            ],
            "digest": self.digest,
        }


@dataclass(frozen=True, slots=True)
class ControlOrder:
    """The operator's answer to one report."""

    job: str
    #: The job's current attempt.
    attempt: int
    action: Action
    reason: str = ""
    #: With ``restart``: the new rank table, as a change of the one the launcher reported running...
    delta: RankTableDelta | None = None
    #: ...or whole, when the launcher's table is not one the operator can diff against.
    rank_table: RankTable | None = None
    #: With ``restart``: the restore hint for config.json (``{"tier", "step", "lastStep"}``).
    restore: dict[str, Any] | None = None
    version: int = SCHEMA_VERSION
    #: With ``save``: the earliest step the workers save at (-1: no save ordered).
    save_step: int = -1

    def to_json(self) -> str:
        out: dict[str, Any] = {
            "version": self.version,
            "job": self.job,
            "attempt": self.attempt,
            "action": self.action.value,
            "reason": self.reason,
        }
        if self.save_step >= 0:
            out["save_step"] = self.save_step
        if self.delta is not None:
            out["delta"] = self.delta.to_dict()
        if self.rank_table is not None:
            out["rank_table"] = json.loads(self.rank_table.to_json())
        if self.restore is not None:
            out["restore"] = dict(self.restore)
        return json.dumps(out, separators=(",", ":"))


# --------------------------------------------------------------------------- rank tables


def rank_table_digest(table: RankTable) -> str:
    """SHA-256 of the table's canonical JSON (what both sides compare)."""
    return hashlib.sha256(table.to_json().encode()).hexdigest()


def _same_layout(a: RankTable, b: RankTable) -> bool:
    if (a.job, a.pp, a.dp, a.tp, a.procs_per_node, len(a.pods), len(a.ranks)) != (
        b.job,
        b.pp,
        b.dp,
        b.tp,
        b.procs_per_node,
        len(b.pods),
        len(b.ranks),
    ):
        return False
    if [p.pod_index for p in a.pods] != [p.pod_index for p in b.pods]:
        return False
    return all(
        (x.rank, x.pod_index, x.local_rank, x.rail, x.pp, x.dp, x.tp)
        == (y.rank, y.pod_index, y.local_rank, y.rail, y.pp, y.dp, y.tp)
        for x, y in zip(a.ranks, b.ranks, strict=True)
    )


def build_rank_table_delta(old: RankTable, new: RankTable) -> RankTableDelta | None:
    """The delta from ``old`` to ``new``, or None when ``new`` is not ``old`` with some pods on
    other nodes (another layout, other ranks or rails per pod: send the whole table)."""
    if not _same_layout(old, new):
        return None
    changed = tuple(q for p, q in zip(old.pods, new.pods, strict=True) if p != q)
    delta = RankTableDelta(old.attempt, new.attempt, new.master_addr, new.master_port, changed, "")
    try:
        rebuilt = _apply(old, delta)
    except ControlError:
        return None
    return replace(delta, digest=rank_table_digest(new)) if rebuilt == new else None


def apply_rank_table_delta(table: RankTable, delta: RankTableDelta) -> RankTable:
    """``table`` moved on to ``delta.attempt``; ControlError when ``table`` is not the delta's base
    or the result is not the table the operator built (the digest differs)."""
    out = _apply(table, delta)
    if rank_table_digest(out) != delta.digest:
        raise ControlError(
            f"delta.digest: the rank table rebuilt for attempt {delta.attempt} differs from the operator's"
        )
    return out


def _apply(table: RankTable, delta: RankTableDelta) -> RankTable:
    if table.attempt != delta.base:
        raise ControlError(
            f"delta.base: the delta applies to attempt {delta.base}, this rank table is attempt {table.attempt}"
        )
    by_index = {p.pod_index: p for p in delta.pods}
    unknown = sorted(set(by_index) - {p.pod_index for p in table.pods})
    if unknown:
        raise ControlError(f"delta.pods: pod indices {unknown} are not in the rank table")
    pods = tuple(by_index.get(p.pod_index, p) for p in table.pods)
    node_of = {p.pod_index: p.node for p in pods}
    ranks = tuple(replace(r, node=node_of[r.pod_index]) if r.node != node_of[r.pod_index] else r for r in table.ranks)
    return replace(
        table,
        attempt=delta.attempt,
        pods=pods,
        ranks=ranks,
        master_addr=delta.master_addr,
        master_port=delta.master_port,
    )


# --------------------------------------------------------------------------- the launcher's fence


def decide_launcher_step(local_attempt: int, order: ControlOrder) -> Action:
    """What a launcher running ``local_attempt`` does with ``order``: attempt numbers only grow,
    so a restart to this attempt or an older one (a late or replayed answer) is never acted on."""
    if order.action is Action.STOP:
        return Action.STOP
    if order.action is Action.RESTART and order.attempt > local_attempt:
        return Action.RESTART
    if order.action is Action.SAVE and order.attempt == local_attempt and order.save_step >= 0:
        return Action.SAVE  # a save is for the workers that run now, never another attempt's
    return Action.CONTINUE


def rank_table_for(order: ControlOrder, current: RankTable) -> RankTable:
    """The rank table a ``restart`` order names, checked: built from the delta (or taken whole),
    of the order's attempt, and a consistent layout. ControlError names what is wrong."""
    if order.rank_table is not None:
        table = order.rank_table
    elif order.delta is not None:
        table = apply_rank_table_delta(current, order.delta)
    else:
        raise ControlError("restart: the order carries neither delta nor rank_table")
    if table.attempt != order.attempt:
        raise ControlError(f"rank_table.attempt: {table.attempt}, the order is for attempt {order.attempt}")
    if table.attempt <= current.attempt:
        raise ControlError(
            f"rank_table.attempt: {table.attempt} is not newer than the running attempt {current.attempt}"
        )
    return table


# --------------------------------------------------------------------------- parsing


def parse_report(body: bytes | str) -> LauncherReport:
    raw = _load(body, "report")
    try:
        state = LauncherState(_str(raw, "state"))
    except ValueError as exc:
        raise ControlError(f"state: {raw.get('state')!r} is not one of {[s.value for s in LauncherState]}") from exc
    workers_raw = raw.get("workers", [])
    if not isinstance(workers_raw, list) or len(workers_raw) > MAX_WORKERS:
        raise ControlError(f"workers: expected a list of at most {MAX_WORKERS} [rank, code] pairs")
    workers: list[tuple[int, int]] = []
    for i, w in enumerate(workers_raw):
        if not (isinstance(w, list) and len(w) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in w)):
            raise ControlError(f"workers[{i}]: expected [rank, code] integers")
        workers.append((int(w[0]), int(w[1])))
    sent_at = raw.get("sent_at", 0.0)
    if not isinstance(sent_at, int | float) or isinstance(sent_at, bool) or not math.isfinite(sent_at):
        raise ControlError("sent_at: expected a finite number of seconds")
    message = raw.get("message", "")
    if not isinstance(message, str) or len(message) > MAX_MESSAGE_CHARS:
        raise ControlError(f"message: expected a string of at most {MAX_MESSAGE_CHARS} characters")
    return LauncherReport(
        job=_str(raw, "job"),
        attempt=_int(raw, "attempt", 0),
        pod_index=_int(raw, "pod_index", 0),
        pod=_str(raw, "pod"),
        state=state,
        code=_int(raw, "code", 0, default=0),
        workers=tuple(workers),
        sent_at=float(sent_at),
        version=_int(raw, "version", 1, default=SCHEMA_VERSION),
        message=message,
        save_step=_int(raw, "save_step", -1, default=-1),
        left_step=_int(raw, "left_step", -1, default=-1),
    )


def parse_order(body: bytes | str) -> ControlOrder:
    raw = _load(body, "order")
    try:
        action = Action(_str(raw, "action"))
    except ValueError as exc:
        raise ControlError(f"action: {raw.get('action')!r} is not one of {[a.value for a in Action]}") from exc
    delta = None
    if raw.get("delta") is not None:
        d = raw["delta"]
        if not isinstance(d, dict) or not isinstance(d.get("pods"), list):
            raise ControlError("delta: expected an object with a pods list")
        try:
            pods = tuple(
                PodEntry(int(p["pod_index"]), str(p["node"]), str(p.get("address", "")), int(p.get("replica_peer", -1)))
                for p in d["pods"]
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ControlError(f"delta.pods: {exc!r}") from exc
        delta = RankTableDelta(
            _int(d, "base", 0),
            _int(d, "attempt", 0),
            _str(d, "master_addr", allow_empty=True),
            _int(d, "master_port", 1),
            pods,
            _str(d, "digest"),
        )
    table = None
    if raw.get("rank_table") is not None:
        if not isinstance(raw["rank_table"], dict):
            raise ControlError("rank_table: expected an object")
        try:
            table = RankTable.from_dict(raw["rank_table"])
        except RankTableError as exc:
            raise ControlError(f"rank_table: {exc}") from exc
    restore = raw.get("restore")
    if restore is not None and not isinstance(restore, dict):
        raise ControlError("restore: expected an object {tier, step} or null")
    return ControlOrder(
        job=_str(raw, "job"), attempt=_int(raw, "attempt", 0), action=action, reason=str(raw.get("reason") or ""),
        delta=delta, rank_table=table, restore=restore, version=_int(raw, "version", 1, default=SCHEMA_VERSION),
        save_step=_int(raw, "save_step", -1, default=-1),
    )


def _load(body: bytes | str, what: str) -> dict[str, Any]:
    try:
        raw = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ControlError(f"{what}: not JSON ({exc})") from exc
    if not isinstance(raw, dict):
        raise ControlError(f"{what}: expected a JSON object")
    version = raw.get("version", SCHEMA_VERSION)
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise ControlError(f"version: {version!r} is newer than this reader ({SCHEMA_VERSION}); upgrade it")
    return raw


_MISSING: Any = object()


def _int(d: dict[str, Any], key: str, minimum: int, default: Any = _MISSING) -> int:
    v = d.get(key, default)
    if v is _MISSING:
        raise ControlError(f"{key}: required")
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
        raise ControlError(f"{key}: expected an integer >= {minimum}, got {v!r}")
    return v


def _str(d: dict[str, Any], key: str, *, allow_empty: bool = False) -> str:
    v = d.get(key)
    if not isinstance(v, str) or (not v and not allow_empty):
        raise ControlError(f"{key}: expected a non-empty string, got {v!r}")
    return v
