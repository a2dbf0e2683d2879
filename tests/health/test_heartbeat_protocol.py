"""The heartbeat wire format: round trip, tolerance of unknown fields, rejection of bad input."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from railyard.protocol.heartbeat import (
    MAX_BODY_BYTES,
    SCHEMA_VERSION,
    CheckpointEvent,
    HealthResult,
    HeartbeatBatch,
    HeartbeatError,
    RankBeat,
    parse_heartbeat,
)


def _batch() -> HeartbeatBatch:
    return HeartbeatBatch(
        job="llm",
        attempt=2,
        pod_index=3,
        node="node-3",
        sent_at=12.5,
        ranks=(
            RankBeat(
                rank=24,
                step=100,
                step_time_s=1.25,
                compute_s=0.9,
                loss=2.5,
                grad_norm=float("nan"),
                saving=True,
                health=(HealthResult("kat", False, 100, "outvoted", suspect_rank=24, confirmed=True),),
                recent_compute_s=(0.8, 0.9),
                progress=False,
            ),
        ),
        checkpoints=(CheckpointEvent(step=100, tier="tier1", ok=True, blocked_s=0.01),),
        restored_tier="tier2",
        restored_step=50,
    )


def _raw() -> dict[str, Any]:
    raw: dict[str, Any] = json.loads(_batch().to_json())
    return raw


def test_a_batch_survives_the_round_trip() -> None:
    got = parse_heartbeat(_batch().to_json().encode())
    assert got.ranks[0].health[0] == _batch().ranks[0].health[0]
    assert got.ranks[0].recent_compute_s == (0.8, 0.9)
    assert got.ranks[0].progress is False
    assert got.checkpoints == _batch().checkpoints
    assert (got.restored_tier, got.restored_step, got.version) == ("tier2", 50, SCHEMA_VERSION)


def test_unknown_fields_from_newer_trainers_are_ignored() -> None:
    raw = _raw()
    raw["gpu_temperature"] = 71
    raw["ranks"][0]["nvlink_errors"] = [1, 2]
    raw["ranks"][0]["health"][0]["duration_s"] = 0.2
    raw["checkpoints"][0]["region"] = "eu"
    assert parse_heartbeat(json.dumps(raw)).ranks[0].step == 100


def test_older_senders_without_the_additive_fields_still_parse() -> None:
    raw = _raw()
    for k in ("recent_compute_s", "bench_s", "saving", "tokens_per_s", "progress"):
        raw["ranks"][0].pop(k)
    for k in ("suspect_rank", "confirmed"):
        raw["ranks"][0]["health"][0].pop(k)
    r = parse_heartbeat(json.dumps(raw)).ranks[0]
    assert (r.recent_compute_s, r.saving, r.health[0].suspect_rank, r.health[0].confirmed) == ((), False, -1, False)
    assert r.progress is True, "a sender that predates the field reports its steps (the bundled trainer)"


def _set(path: str, value: Any) -> dict[str, Any]:
    raw = _raw()
    *parents, last = path.split(".")
    node: Any = raw
    for p in parents:
        node = node[int(p)] if p.isdigit() else node[p]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return raw


_DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        ("version", 99, "version"),
        ("job", _DELETE, "job"),
        ("attempt", -1, "attempt"),
        ("attempt", "2", "attempt"),
        ("pod_index", True, "pod_index"),
        ("ranks", [], "ranks"),
        ("ranks", [{}] * 65, "ranks"),
        ("ranks.0.step", 1.5, "ranks[0].step"),
        ("ranks.0.step_time_s", float("inf"), "ranks[0].step_time_s"),
        ("ranks.0.compute_s", -0.1, "ranks[0].compute_s"),
        ("ranks.0.saving", "yes", "ranks[0].saving"),
        ("ranks.0.progress", 1, "ranks[0].progress"),
        ("ranks.0.loss", "high", "ranks[0].loss"),
        ("ranks.0.health", {}, "ranks[0].health"),
        ("ranks.0.health.0.ok", _DELETE, "ranks[0].health[0].ok"),
        ("ranks.0.recent_compute_s", [0.1] * 65, "ranks[0].recent_compute_s"),
        ("ranks.0.recent_compute_s", [0.1, -1], "ranks[0].recent_compute_s"),
        ("checkpoints", {"step": 1}, "checkpoints"),
        ("checkpoints.0.tier", 2, "checkpoints[0].tier"),
        # JSON integers have any length: one with no float, or past 64 bits, is refused by name
        # (float() of it raised OverflowError, and the endpoint answered 500)
        ("sent_at", -(10**400), "sent_at"),
        ("ranks.0.step_time_s", 10**400, "ranks[0].step_time_s"),
        ("ranks.0.loss", 10**400, "ranks[0].loss"),
        ("ranks.0.grad_norm", -(10**400), "ranks[0].grad_norm"),
        ("ranks.0.recent_compute_s", [0.1, 10**400], "ranks[0].recent_compute_s"),
        ("checkpoints.0.duration_s", 10**400, "checkpoints[0].duration_s"),
        ("ranks.0.step", 10**400, "ranks[0].step"),
        ("ranks.0.rank", 2**63, "ranks[0].rank"),
        ("checkpoints.0.bytes", 2**64, "checkpoints[0].bytes"),
    ],
    ids=lambda v: f"an-integer-of-{len(str(v))}-digits" if type(v) is int and abs(v) > 2**64 else None,
)
def test_malformed_input_is_rejected_naming_the_field(path: str, value: Any, named: str) -> None:
    raw = _set(path, value)
    with pytest.raises(HeartbeatError) as err:
        parse_heartbeat(json.dumps(raw))
    assert str(err.value).startswith(named)


@pytest.mark.parametrize("body", [b"", b"{", b"[]", b"\xff\xfe", b'"ranks"'])
def test_bodies_that_are_not_a_json_object_are_rejected(body: bytes) -> None:
    with pytest.raises(HeartbeatError, match=r"^body"):
        parse_heartbeat(body)


def test_the_largest_numbers_with_a_float_or_64_bits_are_accepted() -> None:
    raw = _set("ranks.0.step", 2**63 - 1)
    raw["ranks"][0]["step_time_s"] = 2**1024 - 2**971  # rounds down to the largest float
    got = parse_heartbeat(json.dumps(raw)).ranks[0]
    assert (got.step, got.step_time_s) == (2**63 - 1, sys.float_info.max)


def test_a_body_nested_past_the_decoders_depth_is_rejected() -> None:
    with pytest.raises(HeartbeatError, match=r"^body: not valid JSON \(nested too deeply\)"):
        parse_heartbeat(b"[" * 100_000)


def test_oversized_bodies_are_rejected_before_parsing() -> None:
    with pytest.raises(HeartbeatError, match="over the"):
        parse_heartbeat(b" " * (MAX_BODY_BYTES + 1))
