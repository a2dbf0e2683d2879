"""The ingest fast path of a rank beat builds the same RankBeat as the checked path, for every
field (a field added to RankBeat without its line in the fast path fails here), and to_json
leaves out only the ReplicaGroups fields at their defaults."""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any

import pytest

from railyard.protocol import heartbeat
from railyard.protocol.heartbeat import HeartbeatBatch, RankBeat, heartbeat_from_dict

FULL: dict[str, Any] = {
    "rank": 3, "step": 7, "step_time_s": 1.5, "compute_s": 0.25, "bench_s": 0.5, "loss": 2.0, "grad_norm": 1,
    "saving": True, "tokens_per_s": 100, "health": [], "recent_compute_s": [0.2, 1], "progress": False,
    "fingerprint_step": 6, "fingerprint": "ab" * 32, "waiting_for_groups": True,
}

ROWS = [
    ("every field set", FULL),
    ("what to_json sends for a job without replica groups",
     {k: v for k, v in FULL.items() if k not in ("fingerprint_step", "fingerprint", "waiting_for_groups")}),
    ("an older sender: the required fields only", {"rank": 0, "step": 1, "step_time_s": 0.1}),
    ("loss and grad norm null", {**FULL, "loss": None, "grad_norm": None}),
]


@pytest.mark.parametrize(("what", "raw"), ROWS, ids=[r[0] for r in ROWS])
def test_the_fast_path_builds_what_the_checked_path_builds(what: str, raw: dict[str, Any]) -> None:
    fast = heartbeat._rank_fast(raw)
    assert fast is not None, what
    checked = heartbeat._rank_checked(raw, "ranks[0]")
    assert fast == checked
    for f in fields(RankBeat):  # every slot set, with the checked path's type
        assert type(getattr(fast, f.name)) is type(getattr(checked, f.name)), f.name


@pytest.mark.parametrize(
    "raw",
    [{**FULL, "fingerprint_step": -2}, {**FULL, "step": True}, {**FULL, "recent_compute_s": [-1.0]},
     {k: v for k, v in FULL.items() if k != "rank"}, {**FULL, "health": [{"kind": "kat", "ok": True, "step": 1}]}],
)
def test_the_fast_path_declines_what_it_does_not_vouch_for(raw: dict[str, Any]) -> None:
    assert heartbeat._rank_fast(raw) is None


def test_to_json_sends_the_replica_group_fields_only_when_set() -> None:
    plain = RankBeat(rank=0, step=1, step_time_s=0.1)
    grouped = RankBeat(rank=1, step=1, step_time_s=0.1, fingerprint_step=1, fingerprint="ab", waiting_for_groups=True)
    batch = HeartbeatBatch("llm", 0, 0, "n0", 0.0, (plain, grouped))
    sent = json.loads(batch.to_json())["ranks"]
    assert {"fingerprint_step", "fingerprint", "waiting_for_groups"}.isdisjoint(sent[0])
    assert (sent[1]["fingerprint_step"], sent[1]["fingerprint"], sent[1]["waiting_for_groups"]) == (1, "ab", True)
    assert heartbeat_from_dict(json.loads(batch.to_json())).ranks == (plain, grouped)


BATCH: dict[str, Any] = {
    "job": "llm", "attempt": 2, "pod_index": 1, "node": "n1", "sent_at": 12.5,
    "ranks": [{k: v for k, v in FULL.items() if k not in ("fingerprint_step", "fingerprint", "waiting_for_groups")}],
    "checkpoints": [], "restored_tier": "local", "restored_step": 40, "version": 1,
}

BATCH_ROWS = [
    ("what to_json sends", BATCH),
    ("an older sender: the required fields only",
     {"job": "llm", "attempt": 0, "pod_index": 0, "sent_at": 1, "ranks": [{"rank": 0, "step": 1, "step_time_s": 0.1}]}),
    ("a rank the rank fast path declines (health results)",
     {**BATCH, "ranks": [{**FULL, "health": [{"kind": "kat", "ok": False, "step": 7}]}]}),
]


@pytest.mark.parametrize(("what", "raw"), BATCH_ROWS, ids=[r[0] for r in BATCH_ROWS])
def test_the_batch_fast_path_builds_what_the_checked_path_builds(what: str, raw: dict[str, Any]) -> None:
    fast = heartbeat._batch_fast(raw)
    assert fast is not None, what
    assert type(fast) is HeartbeatBatch
    checked = heartbeat._batch_checked(raw)
    assert fast == checked
    for f in fields(HeartbeatBatch):
        assert type(getattr(fast, f.name)) is type(getattr(checked, f.name)), f.name


@pytest.mark.parametrize(
    "raw",
    [{**BATCH, "version": 2}, {**BATCH, "attempt": -1}, {**BATCH, "sent_at": float("nan")}, {**BATCH, "job": 1},
     {**BATCH, "pod_index": True}, {**BATCH, "restored_step": -2}, {**BATCH, "ranks": []},
     {**BATCH, "checkpoints": [{"step": 1, "tier": "local", "ok": True}]}, {**BATCH, "checkpoints": ()},
     {k: v for k, v in BATCH.items() if k != "sent_at"}],
)
def test_the_batch_fast_path_declines_what_it_does_not_vouch_for(raw: dict[str, Any]) -> None:
    """Each goes to the checked path, which stores it or names the field exactly as before."""
    assert heartbeat._batch_fast(raw) is None
