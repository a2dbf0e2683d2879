"""The ingest endpoint's decoder (orjson, json where orjson refuses or reads otherwise) gives the same
batch or the same error as the standard library's, body by body.

orjson and json differ on a handful of inputs (NaN and Infinity, a byte order mark, UTF-16, lone
surrogates, integers past 64 bits, which orjson reads as floats): each such row is here, and the
last test checks that orjson alone would have answered those rows otherwise, so the fallback is
what makes them agree."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from railyard.observe import heartbeats as endpoint
from railyard.observe.heartbeats import decode_heartbeat
from railyard.protocol.heartbeat import (
    MAX_INT,
    CheckpointEvent,
    HealthResult,
    HeartbeatBatch,
    HeartbeatError,
    RankBeat,
    parse_heartbeat,
)

_BEATS = tuple(
    RankBeat(rank=r, step=40, step_time_s=1.0, compute_s=0.8 + r / 100, loss=2.5, grad_norm=1.25,
             tokens_per_s=4096.0, recent_compute_s=(0.8 + r / 100,))
    for r in range(8)
)
_BATCH = HeartbeatBatch("llm", 1, 0, "node-0", 1_796_650_782.329649, _BEATS)
VALID = _BATCH.to_json()


def _with(path: str, literal: str) -> bytes:
    """The valid body with the value at ``path`` replaced by a raw JSON literal (any text)."""
    raw: Any = json.loads(VALID)
    *parents, last = path.split(".")
    node = raw
    for p in parents:
        node = node[int(p)] if p.isdigit() else node[p]
    node[last] = "@@"
    return json.dumps(raw, separators=(",", ":")).replace('"@@"', literal).encode()


def _without(path: str) -> bytes:
    raw: Any = json.loads(VALID)
    *parents, last = path.split(".")
    node = raw
    for p in parents:
        node = node[int(p)] if p.isdigit() else node[p]
    del node[last]
    return json.dumps(raw).encode()


_FULL = HeartbeatBatch(
    "llm", 1, 0, "node-0", 2.0,
    (RankBeat(rank=0, step=3, step_time_s=1.0, health=(HealthResult("kat", False, 3, "outvoted", 0, True),),
              fingerprint_step=2, fingerprint="ab" * 32, waiting_for_groups=True),),
    checkpoints=(CheckpointEvent(step=3, tier="local", ok=True, blocked_s=0.5, bytes=1 << 40),),
    restored_tier="peer", restored_step=2,
).to_json()

#: (what, body, outcome): "ok" (both accept it) or the start of the error both give.
ROWS: list[tuple[str, bytes, str]] = [
    ("what to_json sends", VALID.encode(), "ok"),
    ("every field, health results and checkpoints", _FULL.encode(), "ok"),
    ("a required batch field missing", _without("job"), "job: required field is missing"),
    ("a required rank field missing", _without("ranks.3.step"), "ranks[3].step: required field is missing"),
    ("a string for an integer", _with("attempt", '"2"'), "attempt: expected an integer"),
    ("a float for an integer", _with("ranks.0.step", "1.5"), "ranks[0].step: expected an integer"),
    ("a number for a boolean", _with("ranks.0.saving", "0"), "ranks[0].saving: expected true or false"),
    ("NaN loss (json reads it; orjson refuses it)", _with("ranks.0.loss", "NaN"), "ok"),
    ("-Infinity grad norm", _with("ranks.0.grad_norm", "-Infinity"), "ok"),
    ("Infinity step time", _with("ranks.0.step_time_s", "Infinity"), "ranks[0].step_time_s: expected a finite number"),
    ("NaN in recent compute", _with("ranks.0.recent_compute_s", "[NaN]"), "ranks[0].recent_compute_s: expected finite"),
    ("1e400, a float literal past the range (json: inf)", _with("ranks.0.loss", "1e400"), "ok"),
    ("1e400 for a step time", _with("ranks.0.step_time_s", "1e400"), "ranks[0].step_time_s: expected a finite number"),
    ("a duplicate key: the last wins", VALID.replace('"job":"llm"', '"job":"other","job":"llm"').encode(), "ok"),
    ("a duplicate rank key", VALID.replace('"step":40', '"step":-1,"step":40', 1).encode(), "ok"),
    ("a byte order mark", b"\xef\xbb\xbf" + VALID.encode(), "ok"),
    ("UTF-16 (json detects it)", VALID.encode("utf-16"), "ok"),
    ("a byte that is not UTF-8", VALID.encode().replace(b'"node-0"', b'"node-\xff"'), "body: not valid JSON"),
    ("a lone surrogate escape", _with("node", '"\\ud800"'), "ok"),
    ("an escaped non-ASCII name", _with("node", '"n\\u00e9ud"'), "ok"),
    ("an integer at 2**63 - 1", _with("ranks.0.step", str(MAX_INT)), "ok"),
    ("an integer at 2**63", _with("ranks.0.step", str(MAX_INT + 1)), "ranks[0].step: above"),
    ("an integer past 64 bits (orjson: a float)", _with("ranks.0.step", str(2**64)), "ranks[0].step: above"),
    ("a negative integer past 64 bits", _with("restored_step", str(-(2**64))), "restored_step: -18446744073709551616 is below -1"),
    ("10**400 for a step", _with("ranks.0.step", "1" + "0" * 400), "ranks[0].step: above"),
    ("10**20 for a step time (json: an int, orjson: a float)", _with("ranks.0.step_time_s", "1" + "0" * 20), "ok"),
    ("2**70 + 2**17 (halfway between two floats) for a step time", _with("ranks.0.step_time_s", str(2**70 + 2**17)), "ok"),
    ("10**400 for a step time", _with("ranks.0.step_time_s", "1" + "0" * 400),
     "ranks[0].step_time_s: expected a finite number (this integer is beyond a float's range)"),
    ("10**400 for a loss", _with("ranks.0.loss", "1" + "0" * 400), "ranks[0].loss: expected a number or null"),
    ("-10**400 for sent_at", _with("sent_at", "-1" + "0" * 400), "sent_at: expected a finite number"),
    ("10**400 in recent compute", _with("ranks.1.recent_compute_s", "[1" + "0" * 400 + "]"),
     "ranks[1].recent_compute_s: expected finite non-negative numbers, got an integer beyond"),
    ("an integer of 5,000 digits (json's limit on int conversion)", _with("ranks.0.step", "9" * 5000),
     "body: not valid JSON"),
    ("nested 100,000 deep", b"[" * 100_000, "body: not valid JSON (nested too deeply)"),
    ("trailing data", VALID.encode() + b" x", "body: not valid JSON"),
    ("a leading zero", _with("attempt", "01"), "body: not valid JSON"),
    ("a control character in a string", _with("node", '"a\x01"'), "body: not valid JSON"),
    ("empty", b"", "body: not valid JSON"),
    ("a list", b"[]", "body: expected a JSON object"),
]


def _outcome(parse: Callable[[bytes], HeartbeatBatch], body: bytes) -> str:
    """The batch's repr (floats to the last bit, NaN equal to NaN, 1 unlike 1.0) or the error."""
    try:
        return "ok " + repr(parse(body))
    except HeartbeatError as exc:
        return str(exc)


def test_the_endpoint_decodes_with_orjson() -> None:
    assert endpoint._orjson_loads is orjson.loads


@pytest.mark.parametrize(("what", "body", "expected"), ROWS, ids=[r[0] for r in ROWS])
def test_both_decoders_give_the_same_batch_or_error(what: str, body: bytes, expected: str) -> None:
    with_json = _outcome(parse_heartbeat, body)
    assert with_json.startswith(expected), (what, with_json[:200])
    assert _outcome(decode_heartbeat, body) == with_json


def test_the_rows_orjson_alone_reads_otherwise_are_the_ones_json_decides() -> None:
    """Without the fallback these rows would differ: the table tests the fallback, not only orjson."""
    differ = {what for what, body, _ in ROWS
              if _outcome(lambda b: parse_heartbeat(b, orjson.loads), body) != _outcome(parse_heartbeat, body)}
    assert differ >= {
        "NaN loss (json reads it; orjson refuses it)", "a byte order mark", "UTF-16 (json detects it)",
        "a lone surrogate escape", "an integer past 64 bits (orjson: a float)", "1e400, a float literal past the range (json: inf)",
    }


def _literals(rng: random.Random) -> list[str]:
    out = []
    for _ in range(400):
        digits = rng.randint(1, 40)
        mantissa = str(rng.randint(1, 10**digits))
        point = rng.randint(1, len(mantissa))
        out.append(f"{mantissa[:point]}.{mantissa[point:] or '0'}e{rng.randint(-320, 300)}")
        out.append(str(rng.randint(1, 10 ** rng.randint(1, 320))))  # integers, past 64 bits too
    return out


@pytest.mark.parametrize("field", ["step_time_s", "loss", "recent_compute_s"])
def test_numbers_in_a_float_field_decode_to_the_same_float(field: str) -> None:
    """Both decoders round each literal to the nearest float (orjson reads big integers as floats,
    json as ints the parse converts): same value or the same error for every literal."""
    rng = random.Random(field)
    for literal in _literals(rng):
        value = f"[{literal}]" if field == "recent_compute_s" else literal
        body = _with(f"ranks.0.{field}", value)
        assert _outcome(decode_heartbeat, body) == _outcome(parse_heartbeat, body), literal
