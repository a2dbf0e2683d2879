"""Heartbeat ingest endpoint: the aiohttp route pods post their batches to.

``POST /v1/heartbeats/{namespace}/{job}`` with the job's bearer token: the handler checks the
size, the token and the body (protocol.heartbeat) and stores the batch in the window model,
:class:`railyard.logic.health.window.HeartbeatStore`. Nothing here decides anything.
"""

from __future__ import annotations

import hmac
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from railyard.logic.health.window import BatchHook, HeartbeatStore, IngestResult
from railyard.protocol.heartbeat import MAX_BODY_BYTES, HeartbeatBatch, HeartbeatError, parse_heartbeat

if TYPE_CHECKING:
    from railyard.observe.health_metrics import HealthMetrics

_orjson_loads: Callable[[bytes | str], Any] | None
try:
    import orjson
except ImportError:  # a development install without the operator's dependencies: json alone
    _orjson_loads = None
else:
    _orjson_loads = orjson.loads

log = logging.getLogger(__name__)

ROUTE = "/v1/heartbeats/{namespace}/{job}"

#: token_for(namespace, job): the job's token, or None for an unknown job. May be async.
TokenLookup = Callable[[str, str], "str | Awaitable[str | None] | None"]


def _refuse(status: int, message: str) -> web.Response:
    headers = {"WWW-Authenticate": 'Bearer realm="railyard"'} if status == 401 else None
    return web.json_response({"error": message}, status=status, headers=headers)


async def _read_limited(request: web.Request, limit: int, length: int | None) -> bytes | None:
    """The body, or None past ``limit``; ``length``: the request's Content-Length (aiohttp parses
    the header again at each ``request.content_length``)."""
    if length is not None and length <= limit:
        content = request.content
        body = await content.read(length + 1)
        while len(body) < length:
            chunk = await content.read(length + 1 - len(body))
            if not chunk:
                break
            body += chunk
        return body if len(body) <= limit else None
    buf = bytearray()
    async for chunk in request.content.iter_chunked(64 * 1024):
        buf += chunk
        if len(buf) > limit:
            return None
    return bytes(buf)


def decode_heartbeat(body: bytes) -> HeartbeatBatch:
    """:func:`parse_heartbeat` with orjson's decoder where it agrees with json's, json's verdict elsewhere.

    orjson decodes a batch in a fifth of json's instructions (ingest decodes 5,000 a second). It
    refuses some bodies json accepts (NaN and Infinity, a byte order mark, lone surrogates,
    UTF-16) and decodes an integer past 64 bits as a float. Any body it refuses, or whose decoded
    form fails validation (such a float in an integer field), is parsed again with json: what is
    accepted, and every error's words, are json's. Where both decode a body, they give the same
    values (both round a decimal to the nearest float; a big integer in a float field becomes the
    float nearest to it either way): tests/health/test_heartbeat_decoders_agree.py.
    """
    if _orjson_loads is not None:
        try:
            return parse_heartbeat(body, _orjson_loads)
        except HeartbeatError:
            pass
    return parse_heartbeat(body)


def build_heartbeat_handler(
    store: HeartbeatStore,
    token_for: TokenLookup,
    *,
    metrics: HealthMetrics | None = None,
    clock: Callable[[], float] = time.time,
    max_body_bytes: int = MAX_BODY_BYTES,
    on_batch: BatchHook | None = None,
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The request handler alone, for an operator that owns its aiohttp application.
    ``on_batch(namespace, job, batch)`` runs once per stored batch (checkpoint metrics)."""

    def done(code: int, resp: web.StreamResponse) -> web.StreamResponse:
        if metrics is not None:
            metrics.count_request(code)
        return resp

    async def handle(request: web.Request) -> web.StreamResponse:
        match_info = request.match_info
        namespace = match_info["namespace"]
        job = match_info["job"]
        length = request.content_length
        if length is not None and length > max_body_bytes:
            return done(413, _refuse(413, f"body: {length} bytes is over the {max_body_bytes} byte limit"))
        auth = request.headers.get("Authorization", "")
        scheme, _, token = auth.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return done(
                401, _refuse(401, "Authorization: expected 'Bearer <job token>' (the token from the job's Secret)")
            )
        expected = token_for(namespace, job)
        if expected is not None and type(expected) is not str and inspect.isawaitable(expected):
            expected = await expected
        if expected is None:
            return done(404, _refuse(404, f"job {namespace}/{job} is not known to this operator"))
        if not hmac.compare_digest(token.encode(), str(expected).encode()):
            return done(403, _refuse(403, f"Authorization: the token is not {namespace}/{job}'s"))
        try:
            body = await _read_limited(request, max_body_bytes, length)
        except ConnectionResetError:
            # the pod went away mid-request (killed, node lost): nothing to store, nothing to say
            return done(400, _refuse(400, "body: the connection closed before the body arrived"))
        if body is None:
            return done(413, _refuse(413, f"body: over the {max_body_bytes} byte limit"))
        try:
            batch = decode_heartbeat(body)
        except HeartbeatError as exc:
            return done(400, _refuse(400, str(exc)))
        if batch.job != job:
            return done(400, _refuse(400, f"job: the body names {batch.job!r} but the URL names {job!r}"))
        try:
            result = store.ingest(namespace, job, batch, clock())
        except HeartbeatError as exc:  # a rank outside its replica group's world
            return done(400, _refuse(400, str(exc)))
        if result is IngestResult.STALE_ATTEMPT:
            jw = store.job(namespace, job)
            current = jw.attempt if jw else -1
            return done(
                409, _refuse(409, f"attempt: {batch.attempt} is older than the job's current attempt {current}")
            )
        if metrics is not None:
            metrics.count_beats(namespace, job, batch)
        if on_batch is not None:
            on_batch(namespace, job, batch)
        # a StreamResponse: the same bytes on the wire as a bodiless Response, without the body and
        # compression bookkeeping (18,000 instructions of a 730,000-instruction POST)
        return done(204, web.StreamResponse(status=204))

    return handle


def add_heartbeat_routes(
    app: web.Application,
    store: HeartbeatStore,
    token_for: TokenLookup,
    *,
    metrics: HealthMetrics | None = None,
    clock: Callable[[], float] = time.time,
    on_batch: BatchHook | None = None,
) -> None:
    app.router.add_post(
        ROUTE, build_heartbeat_handler(store, token_for, metrics=metrics, clock=clock, on_batch=on_batch)
    )


def build_heartbeat_app(
    store: HeartbeatStore,
    token_for: TokenLookup,
    *,
    metrics: HealthMetrics | None = None,
    clock: Callable[[], float] = time.time,
) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY_BYTES + 1)
    add_heartbeat_routes(app, store, token_for, metrics=metrics, clock=clock)
    return app


class StaticTokens:
    """A dict-backed ``token_for`` (tests, benchmarks; the operator fills it from Secrets)."""

    def __init__(self, tokens: dict[tuple[str, str], str] | None = None) -> None:
        self.tokens: dict[tuple[str, str], str] = dict(tokens or {})

    def set(self, namespace: str, job: str, token: str) -> None:
        self.tokens[(namespace, job)] = token

    def remove(self, namespace: str, job: str) -> None:
        self.tokens.pop((namespace, job), None)

    def __call__(self, namespace: str, job: str) -> str | None:
        return self.tokens.get((namespace, job))
