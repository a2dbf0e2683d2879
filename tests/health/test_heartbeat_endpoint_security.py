"""The ingest endpoint refuses what it must, with the right code, and leaves state unchanged."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from railyard.logic.health.window import HeartbeatStore
from railyard.observe.health_metrics import HealthMetrics
from railyard.observe.heartbeats import StaticTokens, build_heartbeat_app
from railyard.protocol.heartbeat import MAX_BODY_BYTES, HeartbeatBatch, RankBeat

TOKENS = {("team", "llm"): "tok-llm", ("team", "other"): "tok-other"}


def _body(job: str = "llm", attempt: int = 1, step: int = 5, ranks: int = 8) -> bytes:
    beats = tuple(RankBeat(rank=r, step=step, step_time_s=1.0, compute_s=0.8) for r in range(ranks))
    return HeartbeatBatch(job, attempt, 0, "node-0", 1.0, beats).to_json().encode()


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


class Harness:
    def __init__(self) -> None:
        self.store = HeartbeatStore()
        self.registry = CollectorRegistry()
        self.metrics = HealthMetrics(self.registry)
        self.store.begin_attempt("team", "llm", 1)
        self.client: TestClient[Any, Any] | None = None

    def state(self) -> tuple[Any, ...]:
        """Everything a refusal must leave alone, for every job."""
        out = []
        for jw in sorted(self.store.jobs(), key=lambda j: j.job):
            ranks = tuple((r.rank, r.step, r.last_seen_at, tuple(r.recent_compute(256))) for r in jw.ranks.values())
            out.append((jw.job, jw.attempt, jw.batches, jw.rank_beats, ranks, len(jw.health)))
        return tuple(out)


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    harness = Harness()

    async def token_for(namespace: str, job: str) -> str | None:
        await asyncio.sleep(0)  # the operator's lookup may be async (a Secret read)
        return StaticTokens(TOKENS)(namespace, job)

    app = build_heartbeat_app(harness.store, token_for, metrics=harness.metrics)
    async with TestClient(TestServer(app)) as client:
        harness.client = client
        yield harness


async def _post(h: Harness, path: str, data: Any, headers: dict[str, str] | None = None) -> tuple[int, str]:
    assert h.client is not None
    resp = await h.client.post(path, data=data, headers=headers or {})
    return resp.status, await resp.text()


async def test_a_good_batch_is_accepted_and_stored(h: Harness) -> None:
    status, _ = await _post(h, "/v1/heartbeats/team/llm", _body(), _auth("tok-llm"))
    assert status == 204
    jw = h.store.job("team", "llm")
    assert jw is not None and sorted(jw.ranks) == list(range(8)) and jw.ranks[3].step == 5
    assert h.registry.get_sample_value("railyard_heartbeat_rank_beats_total") == 8


@pytest.mark.parametrize(
    ("path", "headers", "body", "code", "says"),
    [
        ("/v1/heartbeats/team/llm", {}, _body(), 401, "Authorization"),
        ("/v1/heartbeats/team/llm", {"Authorization": "tok-llm"}, _body(), 401, "Bearer"),
        ("/v1/heartbeats/team/llm", {"Authorization": "Basic dG9rLWxsbQ=="}, _body(), 401, "Bearer"),
        ("/v1/heartbeats/team/llm", {"Authorization": "Bearer "}, _body(), 401, "Bearer"),
        ("/v1/heartbeats/team/llm", _auth("tok-other"), _body(), 403, "token"),
        ("/v1/heartbeats/team/llm", _auth("tok-llm-x"), _body(), 403, "token"),
        ("/v1/heartbeats/team/ghost", _auth("tok-llm"), _body("ghost"), 404, "not known"),
        ("/v1/heartbeats/team/llm", _auth("tok-llm"), b"{not json", 400, "body"),
        ("/v1/heartbeats/team/llm", _auth("tok-llm"), b'{"job": "llm"}', 400, "ranks"),
        ("/v1/heartbeats/team/llm", _auth("tok-llm"), _body("other"), 400, "job"),
        ("/v1/heartbeats/team/llm", _auth("tok-llm"), b" " * (MAX_BODY_BYTES + 1), 413, "limit"),
        ("/v1/heartbeats/team/llm", _auth("tok-llm"), _body(attempt=0), 409, "attempt"),
        ("/v1/heartbeats/team/llm", _auth("tok-llm"), _body().replace(b'"step_time_s":1.0', b'"step_time_s":1' + b"0" * 400, 1),
         400, "ranks[0].step_time_s"),
        ("/v1/heartbeats/team/llm", _auth("tok-llm"), _body().replace(b'"step":5', b'"step":1' + b"0" * 400, 1), 400, "ranks[0].step"),
        ("/v1/heartbeats/team/llm", _auth("tok-llm"), b"[" * 100_000, 400, "nested too deeply"),
    ],
    ids=[
        "no-token",
        "no-scheme",
        "basic-auth",
        "empty-token",
        "another-jobs-token",
        "wrong-token",
        "unknown-job",
        "malformed-json",
        "missing-fields",
        "body-names-another-job",
        "oversized",
        "replayed-old-attempt",
        "an-integer-with-no-float-in-a-float-field",
        "an-integer-past-64-bits",
        "nested-past-the-decoders-depth",
    ],
)
async def test_refusals_have_the_right_code_and_change_nothing(
    h: Harness, path: str, headers: dict[str, str], body: bytes, code: int, says: str
) -> None:
    assert (await _post(h, "/v1/heartbeats/team/llm", _body(step=5), _auth("tok-llm")))[0] == 204
    before = h.state()
    status, text = await _post(h, path, body, headers)
    assert status == code
    assert says in json.loads(text)["error"]
    assert h.state() == before
    assert h.registry.get_sample_value("railyard_heartbeat_requests_total", {"code": str(code)}) == 1


async def test_an_oversized_chunked_body_is_refused_while_streaming(h: Harness) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(MAX_BODY_BYTES // 4096 + 2):
            yield b" " * 4096

    before = h.state()
    status, _ = await _post(h, "/v1/heartbeats/team/llm", chunks(), _auth("tok-llm"))
    assert status == 413
    assert h.state() == before


async def test_a_newer_attempt_replaces_the_old_windows(h: Harness) -> None:
    assert (await _post(h, "/v1/heartbeats/team/llm", _body(step=50), _auth("tok-llm")))[0] == 204
    assert (await _post(h, "/v1/heartbeats/team/llm", _body(attempt=2, step=3), _auth("tok-llm")))[0] == 204
    jw = h.store.job("team", "llm")
    assert jw is not None and jw.attempt == 2 and jw.ranks[0].step == 3
    status, _ = await _post(h, "/v1/heartbeats/team/llm", _body(attempt=1, step=60), _auth("tok-llm"))
    assert status == 409 and jw.ranks[0].step == 3


async def test_one_jobs_refusals_do_not_disturb_another_job(h: Harness) -> None:
    assert (await _post(h, "/v1/heartbeats/team/other", _body("other"), _auth("tok-other")))[0] == 204
    before = h.state()
    for body, headers in ((b"junk", _auth("tok-llm")), (_body(), _auth("tok-other")), (_body(), {})):
        assert (await _post(h, "/v1/heartbeats/team/llm", body, headers))[0] >= 400
    assert h.state() == before
