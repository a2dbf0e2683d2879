"""Heartbeats: what each pod's launcher posts to the operator, batched for its local ranks.

Wire format: JSON object, ``POST /v1/heartbeats/{namespace}/{job}`` with
``Authorization: Bearer <per-job token>``. Versioned; readers ignore unknown fields (newer
trainers may add some) and reject malformed input with :class:`HeartbeatError`, whose message
names the field.

The speed signal: in synchronous training every rank waits for the slowest at each collective,
so wall-clock step time is the same everywhere, and under FSDP even forward/backward time is
(parameters are all-gathered inside them). ``compute_s`` is therefore the time of a fixed,
collective-free workload each rank runs every step on its own device (the trainer's speed
probe, railyard_trainer/speed_probe.py): only a slow device makes it slower. ``bench_s`` is
left for a longer benchmark run every N steps (0: none).
"""

from __future__ import annotations

import json
import math
import operator
import sys
from collections.abc import Callable
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any

SCHEMA_VERSION = 1
#: Upper bound for one batch, enforced by the ingest endpoint (413 beyond).
MAX_BODY_BYTES = 256 * 1024
MAX_RANKS_PER_BATCH = 64
#: Most per-step compute samples one rank may carry in ``recent_compute_s``.
MAX_RECENT_STEPS = 64
#: Most health results one rank may carry in one beat.
MAX_HEALTH_RESULTS = 32
#: Longest ``fingerprint`` (a hex digest).
MAX_FINGERPRINT_CHARS = 64
#: Integers on the wire are 64-bit (steps, ranks, bytes): a larger one is refused by name rather
#: than reaching the store, whose samples hold it as a float (past 1.8e308 none does).
MAX_INT = 2**63 - 1


class HeartbeatError(ValueError):
    """A malformed heartbeat; the message names the field."""


@dataclass(frozen=True, slots=True)
class HealthResult:
    """Outcome of one health check run on a rank (``kind``: kat, replica_checksum, spike, replay)."""

    kind: str
    ok: bool
    step: int
    detail: str = ""
    #: Rank the check blames (a majority vote can name another rank); -1: this rank / nobody.
    suspect_rank: int = -1
    #: A confirmed corruption (replay mismatch, known-answer outvoted), not just a symptom.
    confirmed: bool = False


@dataclass(frozen=True, slots=True)
class RankBeat:
    rank: int
    step: int
    #: Wall time of the last completed step (seconds); equal across ranks in sync training.
    step_time_s: float
    #: Rank-local, collective-free compute time of the last step (the straggler signal).
    compute_s: float = 0.0
    #: Time of the last fixed benchmark run (0: not run yet).
    bench_s: float = 0.0
    loss: float | None = None
    grad_norm: float | None = None
    #: True while the rank is inside a checkpoint save (hang detection must not fire).
    saving: bool = False
    tokens_per_s: float = 0.0
    health: tuple[HealthResult, ...] = ()
    #: Compute times of the steps since the previous beat, oldest first, ending at ``step``
    #: (at most MAX_RECENT_STEPS). Lets the operator score per step when beats are sparser
    #: than steps; empty means only ``compute_s`` is known.
    recent_compute_s: tuple[float, ...] = ()
    #: False: the rank's program has not opted into step reports (a program under the launcher
    #: that does not call ``railyard_trainer.sdk.report_step``). It is alive, but its ``step``
    #: means nothing, so the hang and straggler rules skip it. Added field: readers default to True.
    progress: bool = True
    #: faultTolerance ReplicaGroups: the step of the rank's newest fingerprint (-1: none yet) and
    #: the fingerprint itself, a digest of the rank's parameters and optimizer state after that
    #: step, which the same rank of every other group holds bit for bit (the operator's
    #: cross-group SDC vote, logic/health/groups.py). Added fields: readers default to none.
    fingerprint_step: int = -1
    fingerprint: str = ""
    #: faultTolerance ReplicaGroups: the rank is inside the exchange with the other groups
    #: (torchft's quorum, the gradient sum, the commit), waiting for them rather than stuck
    #: itself. Added field: readers default to False.
    waiting_for_groups: bool = False


#: The "tier" of a restore that was a heal: faultTolerance ReplicaGroups, a group that fetched a
#: live peer group's state instead of reading a checkpoint tier (``status.restore.tier``).
HEAL_SOURCE = "peer"


@dataclass(frozen=True, slots=True)
class CheckpointEvent:
    """A checkpoint committed (or failed) on some tier, reported by pod 0 / rank 0."""

    step: int
    tier: str
    ok: bool
    blocked_s: float = 0.0
    duration_s: float = 0.0
    bytes: int = 0
    sdc_passed: bool = True
    detail: str = ""
    #: "save" (a tier's save committed or failed), "skip" (a save due at ``step`` was not
    #: written because a rank's previous save was still running; ``ok`` False) or "restore"
    #: (this attempt loaded ``step`` from ``tier`` in ``duration_s``; ``bytes`` read; tier
    #: :data:`HEAL_SOURCE`: a replica group healed from a live peer, its rank 0's fetch). Added
    #: field: readers default to "save".
    kind: str = "save"
    #: restore only: steps trained before the failure that are redone (-1: unknown).
    steps_lost: int = -1


@dataclass(frozen=True, slots=True)
class HeartbeatBatch:
    job: str
    attempt: int
    pod_index: int
    node: str
    sent_at: float
    ranks: tuple[RankBeat, ...]
    checkpoints: tuple[CheckpointEvent, ...] = ()
    #: Which tier and step this attempt restored from ("" / -1: fresh start).
    restored_tier: str = ""
    restored_step: int = -1
    version: int = field(default=SCHEMA_VERSION)

    def to_json(self) -> str:
        raw = asdict(self)
        for rank in raw["ranks"]:
            for key, default in _SENT_ONLY_WHEN_SET.items():
                if rank[key] == default:
                    del rank[key]
        return json.dumps(raw, separators=(",", ":"))


#: Rank-beat fields a sender leaves out at their defaults (readers default them, as for any
#: added field): the ReplicaGroups fields, which every other job would send as 58 bytes of
#: nothing per rank, a quarter of a beat the ingest endpoint decodes 40,000 times a second.
_SENT_ONLY_WHEN_SET: dict[str, object] = {"fingerprint_step": -1, "fingerprint": "", "waiting_for_groups": False}


def parse_heartbeat(body: bytes | str, loads: Callable[[bytes | str], Any] = json.loads) -> HeartbeatBatch:
    """Parse and validate a heartbeat body. Raises :class:`HeartbeatError`.

    ``loads``: the JSON decoder. This module is standard library only (the trainer imports it), so
    a faster decoder comes from the caller: the operator's ingest passes orjson's, and parses again
    with the default whatever that one refuses (railyard.observe.heartbeats.decode_heartbeat).
    """
    if isinstance(body, bytes | bytearray) and len(body) > MAX_BODY_BYTES:
        raise HeartbeatError(f"body: {len(body)} bytes is over the {MAX_BODY_BYTES} byte limit")
    try:
        raw = loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise HeartbeatError(f"body: not valid JSON ({exc})") from exc
    except RecursionError as exc:  # json's decoder recurses once per nested array or object
        raise HeartbeatError("body: not valid JSON (nested too deeply)") from exc
    return heartbeat_from_dict(raw)


def heartbeat_from_dict(raw: Any) -> HeartbeatBatch:
    if type(raw) is dict:
        batch = _batch_fast(raw)
        if batch is not None:
            return batch
    return _batch_checked(raw)


_BATCH_FIELDS = tuple(f.name for f in fields(HeartbeatBatch))
_pick_batch = operator.itemgetter(*(name for name in _BATCH_FIELDS if name != "ranks"))
_BATCH_DEFAULTS = {f.name: f.default for f in fields(HeartbeatBatch) if f.default is not MISSING}
# the body's defaults, as the checked path's: checkpoints an empty list (never mutated), node ""
_BATCH_DEFAULTS.update(checkpoints=[], node="")


def _batch_fast(raw: dict[str, Any]) -> HeartbeatBatch | None:
    """The batch's own fields, validated inline with one C lookup (ingest runs this 5,000 times a
    second); the ranks as :func:`_batch_checked` parses them.

    Returns None when any batch field is unusual (absent where required, of another type, out of
    range) or checkpoints are present: :func:`_batch_checked` then validates the whole batch
    again, in its own order, and names the field. Both accept exactly the same inputs.
    """
    try:
        job, attempt, pod_index, node, sent_at, checkpoints, restored_tier, restored_step, version = _pick_batch(
            {**_BATCH_DEFAULTS, **raw}
        )
    except KeyError:
        return None
    ranks_raw = raw.get("ranks")
    if (
        type(version) is not int or version != SCHEMA_VERSION
        or type(ranks_raw) is not list or not ranks_raw or len(ranks_raw) > MAX_RANKS_PER_BATCH
        or type(checkpoints) is not list or checkpoints  # checkpoint events take the checked path
        or type(job) is not str
        or type(attempt) is not int or not 0 <= attempt <= MAX_INT
        or type(pod_index) is not int or not 0 <= pod_index <= MAX_INT
        or type(node) is not str
        or type(sent_at) not in _NUM or not -_FLOAT_MAX <= sent_at <= _FLOAT_MAX
        or type(restored_tier) is not str
        or type(restored_step) is not int or not -1 <= restored_step <= MAX_INT
    ):
        return None
    ranks = tuple([_rank_fast(r) or _rank_checked(r, f"ranks[{i}]") for i, r in enumerate(ranks_raw)])
    batch = _HeartbeatBatchSlots()
    batch.job = job
    batch.attempt = attempt
    batch.pod_index = pod_index
    batch.node = node
    batch.sent_at = float(sent_at)
    batch.ranks = ranks
    batch.checkpoints = ()
    batch.restored_tier = restored_tier
    batch.restored_step = restored_step
    batch.version = version
    batch.__class__ = HeartbeatBatch  # type: ignore[assignment]  # same slots: see _RankBeatSlots
    return batch  # type: ignore[return-value]


class _HeartbeatBatchSlots:
    """A HeartbeatBatch's slots without the frozen dataclass's guard (as :class:`_RankBeatSlots`)."""

    __slots__ = HeartbeatBatch.__slots__
    job: str
    attempt: int
    pod_index: int
    node: str
    sent_at: float
    ranks: tuple[RankBeat, ...]
    checkpoints: tuple[CheckpointEvent, ...]
    restored_tier: str
    restored_step: int
    version: int


if len(_BATCH_FIELDS) != 10:
    raise AssertionError(f"HeartbeatBatch has {len(_BATCH_FIELDS)} fields: give _batch_fast a line for each new one")


def _batch_checked(raw: Any) -> HeartbeatBatch:
    if not isinstance(raw, dict):
        raise HeartbeatError("body: expected a JSON object")
    version = _int(raw, "version", default=SCHEMA_VERSION)
    if version < 1 or version > SCHEMA_VERSION:
        raise HeartbeatError(f"version: {version} is not supported (this operator reads 1..{SCHEMA_VERSION})")
    ranks_raw = raw.get("ranks")
    if not isinstance(ranks_raw, list) or not ranks_raw:
        raise HeartbeatError("ranks: expected a non-empty list")
    if len(ranks_raw) > MAX_RANKS_PER_BATCH:
        raise HeartbeatError(f"ranks: {len(ranks_raw)} entries, at most {MAX_RANKS_PER_BATCH}")
    # the fast path first; the field path (its name formatted) only for a beat it declines
    ranks = tuple([_rank_fast(r) or _rank_checked(r, f"ranks[{i}]") for i, r in enumerate(ranks_raw)])
    cps_raw = raw.get("checkpoints", [])
    if not isinstance(cps_raw, list):
        raise HeartbeatError("checkpoints: expected a list")
    cps = tuple(_checkpoint(c, f"checkpoints[{i}]") for i, c in enumerate(cps_raw))
    return HeartbeatBatch(
        job=_str(raw, "job"),
        attempt=_int(raw, "attempt", minimum=0),
        pod_index=_int(raw, "pod_index", minimum=0),
        node=_str(raw, "node", default=""),
        sent_at=_float(raw, "sent_at"),
        ranks=ranks,
        checkpoints=cps,
        restored_tier=_str(raw, "restored_tier", default=""),
        restored_step=_int(raw, "restored_step", default=-1, minimum=-1),
        version=version,
    )


#: The fast paths' range of a float field: an int past it (JSON has integers of any length) has
#: no float, or one the checked path decides about; NaN fails the comparison too.
_FLOAT_MAX = sys.float_info.max
_NUM = (float, int)


#: The fields every beat of ``to_json`` carries, read with one C call (``_pick_sent``); the
#: defaults stand in for those an older sender leaves out.
_RANK_FIELDS = tuple(f.name for f in fields(RankBeat))
_RANK_DEFAULTS = {f.name: f.default for f in fields(RankBeat) if f.default is not MISSING}
_pick_sent = operator.itemgetter(*(name for name in _RANK_FIELDS if name not in _SENT_ONLY_WHEN_SET))
_N_SENT = len(_RANK_FIELDS) - len(_SENT_ONLY_WHEN_SET)


def _rank_fast(r: Any) -> RankBeat | None:
    """The common well-formed beat, validated inline (ingest runs this 40,000 times a second).

    Returns None on anything unusual; :func:`_rank_checked` then validates again and names the
    field. Both accept exactly the same inputs.
    """
    if type(r) is not dict:
        return None
    try:
        values = _pick_sent(r)
        # exactly the fields every beat carries: the ReplicaGroups fields are absent, at their defaults
        bare = len(r) == _N_SENT
    except KeyError:
        try:
            values = _pick_sent({**_RANK_DEFAULTS, **r})
        except KeyError:  # a required field is missing: the checked path names it
            return None
        bare = False
    rank, step, st, cs, bs, loss, gn, saving, tps, health, recent, progress = values
    if bare:
        fstep, fp, waiting = -1, "", False
    else:
        g = r.get
        fstep, fp, waiting = g("fingerprint_step", -1), g("fingerprint", ""), g("waiting_for_groups", False)
        if (
            type(fstep) is not int or not -1 <= fstep <= MAX_INT
            or type(fp) is not str or len(fp) > MAX_FINGERPRINT_CHARS
            or type(waiting) is not bool
        ):
            return None
    if (
        type(rank) is not int or not 0 <= rank <= MAX_INT or type(step) is not int or not 0 <= step <= MAX_INT
        or type(st) not in _NUM or not 0.0 <= st <= _FLOAT_MAX
        or type(cs) not in _NUM or not 0.0 <= cs <= _FLOAT_MAX
        or type(bs) not in _NUM or not 0.0 <= bs <= _FLOAT_MAX
        or type(tps) not in _NUM or not 0.0 <= tps <= _FLOAT_MAX
        # any float, NaN and infinities too; an int only if it has a float
        or (loss is not None and type(loss) is not float
            and (type(loss) is not int or not -_FLOAT_MAX <= loss <= _FLOAT_MAX))
        or (gn is not None and type(gn) is not float
            and (type(gn) is not int or not -_FLOAT_MAX <= gn <= _FLOAT_MAX))
        or type(saving) is not bool
        or type(progress) is not bool
        or health  # health results take the checked path
        or (type(health) not in (list, tuple))
        or type(recent) not in (list, tuple) or len(recent) > MAX_RECENT_STEPS
    ):
        return None
    for v in recent:
        if type(v) not in _NUM or not 0.0 <= v <= _FLOAT_MAX:
            return None
    beat = _RankBeatSlots()
    beat.rank = rank
    beat.step = step
    beat.step_time_s = float(st)
    beat.compute_s = float(cs)
    beat.bench_s = float(bs)
    beat.loss = None if loss is None else float(loss)
    beat.grad_norm = None if gn is None else float(gn)
    beat.saving = saving
    beat.tokens_per_s = float(tps)
    beat.health = ()
    # one step since the last beat, the common case, without a map object (1,300 instructions a beat)
    beat.recent_compute_s = (float(recent[0]),) if len(recent) == 1 else tuple(map(float, recent))
    beat.progress = progress
    beat.fingerprint_step = fstep
    beat.fingerprint = fp
    beat.waiting_for_groups = waiting
    beat.__class__ = RankBeat  # type: ignore[assignment]  # same slots: the object becomes the frozen beat
    return beat  # type: ignore[return-value]


class _RankBeatSlots:
    """A RankBeat's slots without the frozen dataclass's guard, for the fast path only.

    The frozen dataclass's ``__init__`` sets each field through ``object.__setattr__`` and a slot's
    own setter is a C call too: 1.7 us of the 6 a beat costs to parse. Here each field is a plain
    slot store; the finished object then takes RankBeat's class (the same slots in the same order,
    so the same layout: Python allows the assignment and the object is a RankBeat like any other).
    A field added to RankBeat must get its line in :func:`_rank_fast` (the check below says so).
    """

    __slots__ = RankBeat.__slots__
    rank: int
    step: int
    step_time_s: float
    compute_s: float
    bench_s: float
    loss: float | None
    grad_norm: float | None
    saving: bool
    tokens_per_s: float
    health: tuple[HealthResult, ...]
    recent_compute_s: tuple[float, ...]
    progress: bool
    fingerprint_step: int
    fingerprint: str
    waiting_for_groups: bool


if len(_RANK_FIELDS) != 15:
    raise AssertionError(f"RankBeat has {len(_RANK_FIELDS)} fields: give _rank_fast a setter for each new one")


def _rank_checked(r: Any, where: str) -> RankBeat:
    if not isinstance(r, dict):
        raise HeartbeatError(f"{where}: expected an object")
    health_raw = r.get("health", [])
    if not isinstance(health_raw, list):
        raise HeartbeatError(f"{where}.health: expected a list")
    if len(health_raw) > MAX_HEALTH_RESULTS:
        raise HeartbeatError(f"{where}.health: {len(health_raw)} entries, at most {MAX_HEALTH_RESULTS}")
    recent_raw = r.get("recent_compute_s", [])
    if not isinstance(recent_raw, list) or len(recent_raw) > MAX_RECENT_STEPS:
        raise HeartbeatError(f"{where}.recent_compute_s: expected a list of at most {MAX_RECENT_STEPS} numbers")
    recent: list[float] = []
    for v in recent_raw:
        f = _finite(v)
        if f is None or f < 0:
            shown = "an integer beyond a float's range" if f is None and type(v) is int else repr(v)
            raise HeartbeatError(f"{where}.recent_compute_s: expected finite non-negative numbers, got {shown}")
        recent.append(f)
    health = []
    for j, h in enumerate(health_raw):
        hw = f"{where}.health[{j}]"
        if not isinstance(h, dict):
            raise HeartbeatError(f"{hw}: expected an object")
        health.append(
            HealthResult(
                kind=_str(h, "kind", where=hw),
                ok=_bool(h, "ok", where=hw),
                step=_int(h, "step", where=hw, minimum=0),
                detail=_str(h, "detail", default="", where=hw),
                suspect_rank=_int(h, "suspect_rank", default=-1, where=hw, minimum=-1),
                confirmed=_bool(h, "confirmed", default=False, where=hw),
            )
        )
    return RankBeat(
        rank=_int(r, "rank", where=where, minimum=0),
        step=_int(r, "step", where=where, minimum=0),
        step_time_s=_float(r, "step_time_s", where=where, minimum=0.0),
        compute_s=_float(r, "compute_s", default=0.0, where=where, minimum=0.0),
        bench_s=_float(r, "bench_s", default=0.0, where=where, minimum=0.0),
        loss=_opt_float(r, "loss", where),
        grad_norm=_opt_float(r, "grad_norm", where),
        saving=_bool(r, "saving", default=False, where=where),
        tokens_per_s=_float(r, "tokens_per_s", default=0.0, where=where, minimum=0.0),
        health=tuple(health),
        recent_compute_s=tuple(recent),
        progress=_bool(r, "progress", default=True, where=where),
        fingerprint_step=_int(r, "fingerprint_step", default=-1, where=where, minimum=-1),
        fingerprint=_fingerprint(r, where),
        waiting_for_groups=_bool(r, "waiting_for_groups", default=False, where=where),
    )


def _fingerprint(r: dict[str, Any], where: str) -> str:
    v = _str(r, "fingerprint", default="", where=where)
    if len(v) > MAX_FINGERPRINT_CHARS:
        raise HeartbeatError(
            f"{where}.fingerprint: {len(v)} characters, at most {MAX_FINGERPRINT_CHARS} (a hex digest)"
        )
    return v


def _checkpoint(c: Any, where: str) -> CheckpointEvent:
    if not isinstance(c, dict):
        raise HeartbeatError(f"{where}: expected an object")
    return CheckpointEvent(
        step=_int(c, "step", where=where, minimum=0),
        tier=_str(c, "tier", where=where),
        ok=_bool(c, "ok", where=where),
        blocked_s=_float(c, "blocked_s", default=0.0, where=where, minimum=0.0),
        duration_s=_float(c, "duration_s", default=0.0, where=where, minimum=0.0),
        bytes=_int(c, "bytes", default=0, where=where, minimum=0),
        sdc_passed=_bool(c, "sdc_passed", default=True, where=where),
        detail=_str(c, "detail", default="", where=where),
        kind=_str(c, "kind", default="save", where=where),
        steps_lost=_int(c, "steps_lost", default=-1, where=where, minimum=-1),
    )


_MISSING = object()


def _get(d: dict[str, Any], key: str, default: Any, where: str) -> Any:
    if key in d:
        return d[key]
    if default is _MISSING:
        raise HeartbeatError(f"{_path(where, key)}: required field is missing")
    return default


def _path(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _int(d: dict[str, Any], key: str, default: Any = _MISSING, where: str = "", minimum: int | None = None) -> int:
    v = _get(d, key, default, where)
    if isinstance(v, bool) or not isinstance(v, int):
        raise HeartbeatError(f"{_path(where, key)}: expected an integer, got {type(v).__name__}")
    if minimum is not None and v < minimum:
        raise HeartbeatError(f"{_path(where, key)}: {v} is below {minimum}")
    if v > MAX_INT:
        raise HeartbeatError(f"{_path(where, key)}: above {MAX_INT} (integers on the wire are 64-bit)")
    return v


def _finite(v: Any) -> float | None:
    """``v`` as a finite float, or None: not a number, NaN, infinite, or an integer too large for
    a float (JSON integers have any length; ``float()`` of one past 1.8e308 raises OverflowError)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def _float(
    d: dict[str, Any], key: str, default: Any = _MISSING, where: str = "", minimum: float | None = None
) -> float:
    v = _get(d, key, default, where)
    f = _finite(v)
    if f is None:
        why = " (this integer is beyond a float's range)" if type(v) is int else ""
        raise HeartbeatError(f"{_path(where, key)}: expected a finite number{why}")
    if minimum is not None and f < minimum:
        raise HeartbeatError(f"{_path(where, key)}: {v} is below {minimum}")
    return f


def _opt_float(d: dict[str, Any], key: str, where: str) -> float | None:
    v = d.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise HeartbeatError(f"{_path(where, key)}: expected a number or null")
    # NaN/inf losses are legitimate symptoms (a spike detector wants to see them); an integer
    # has no infinity, so one past a float's range is a sender's bug.
    try:
        return float(v)
    except OverflowError:
        raise HeartbeatError(
            f"{_path(where, key)}: expected a number or null (this integer is beyond a float's range)"
        ) from None


def _str(d: dict[str, Any], key: str, default: Any = _MISSING, where: str = "") -> str:
    v = _get(d, key, default, where)
    if not isinstance(v, str):
        raise HeartbeatError(f"{_path(where, key)}: expected a string")
    return v


def _bool(d: dict[str, Any], key: str, default: Any = _MISSING, where: str = "") -> bool:
    v = _get(d, key, default, where)
    if not isinstance(v, bool):
        raise HeartbeatError(f"{_path(where, key)}: expected true or false")
    return v
