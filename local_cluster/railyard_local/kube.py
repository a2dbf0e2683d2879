"""A small asyncio Kubernetes client for the local cluster's runtime (scheduler, nodes, agent).

The runtime binds hundreds of pods a second and keeps one watch per kind; the generated
``kubernetes`` client is synchronous and slow at that. This client speaks plain HTTP with
aiohttp, reads any kubeconfig through the ``kubernetes`` package's loader (so token, client
certificate and CA setups of real clusters work in ``existing`` mode), and gives
list/watch/get/create/patch/delete plus a list-then-watch :class:`Informer`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import aiohttp

from railyard.kubeclient import (
    JSON_PATCH,
    MERGE,
    STRATEGIC,
    ApiError,
    BaseClient,
    Obj,
    json_or_text,
    load_connection,
)
from railyard_local import jsonexact

__all__ = [
    "JSON_PATCH", "MERGE", "STRATEGIC", "ApiError", "Informer", "KubeClient", "Obj", "WatchInactive", "decode_line",
    "key_of", "retry",
]

log = logging.getLogger(__name__)
#: Longer than any API server's bookmark interval (kube-apiserver: about a minute), as kopf's
#: ``settings.watching.inactivity_timeout``.
DEFAULT_WATCH_INACTIVITY_S = 70.0


def decode_line(line: bytes) -> Any:
    """One watch event, as ``json.loads`` reads it: decoding the watch streams was a sixth of the
    runtime's CPU while a gang started (orjson where exact, :mod:`railyard_local.jsonexact`)."""
    return jsonexact.loads(line)


class KubeClient(BaseClient):
    """One aiohttp session against one API server; requests time out per call, watches stream."""

    @classmethod
    def from_kubeconfig(cls, path: str, context: str | None = None) -> KubeClient:
        return cls.for_connection(load_connection(path, context))

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float = 30.0,
        answer: bool = True,
    ) -> Obj:
        """``answer=False``: ``{}`` on success, the object answered not decoded (BaseClient.send)."""
        return await self.send(method, path, params=params, body=body, content_type=content_type, timeout=timeout,
                               answer=answer)

    async def get(self, path: str, **params: Any) -> Obj:
        return await self.request("GET", path, params=params)

    async def create(self, path: str, body: Obj, *, answer: bool = True) -> Obj:
        return await self.request("POST", path, body=body, answer=answer)

    async def patch(self, path: str, body: Any, content_type: str = MERGE, *, answer: bool = True) -> Obj:
        return await self.request("PATCH", path, body=body, content_type=content_type, answer=answer)

    async def replace(self, path: str, body: Obj) -> Obj:
        return await self.request("PUT", path, body=body)

    async def delete(self, path: str, body: Obj | None = None, **params: Any) -> Obj:
        return await self.request("DELETE", path, body=body, params=params)

    async def watch(
        self,
        path: str,
        resource_version: str,
        *,
        timeout_seconds: int = 300,
        inactivity_timeout: float | None = None,
    ) -> AsyncIterator[Obj]:
        """Yield watch events until the server ends the stream.

        With ``inactivity_timeout``, a stream that delivers nothing (no event, no bookmark) for
        that long raises :class:`WatchInactive`: a connection that went quiet without closing
        (a half-dead proxy, a server that stopped serving it) would otherwise wait forever.
        """
        params = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
        }
        async with self._sess().get(
            self.server + path,
            params=params,
            timeout=aiohttp.ClientTimeout(total=timeout_seconds + 30, sock_read=timeout_seconds + 30),
        ) as resp:
            if resp.status >= 400:
                text = await resp.text()
                raise ApiError(resp.status, json_or_text(text), "WATCH", path)
            buf = b""
            while True:
                try:
                    # asyncio.timeout, not wait_for: Python 3.11's wait_for returns the chunk and drops a
                    # cancellation that arrives as the chunk does, and this watch would then never stop
                    async with asyncio.timeout(inactivity_timeout):
                        chunk = await resp.content.readany()
                except TimeoutError:
                    raise WatchInactive(path, inactivity_timeout or 0.0) from None
                if not chunk:
                    break
                buf += chunk
                if b"\n" not in chunk:
                    continue
                # one split per chunk, not one per event: a chunk of a busy stream holds many
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield decode_line(line)
            if buf.strip():
                yield decode_line(buf)


class WatchInactive(TimeoutError):
    """A watch stream delivered nothing, not even a bookmark, for longer than allowed."""

    def __init__(self, path: str, seconds: float) -> None:
        super().__init__(f"watch of {path}: nothing received for {seconds:g}s")
        self.path = path
        self.seconds = seconds


def key_of(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata", {}) or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


Handler = Callable[[str, Obj, Obj | None], None]


class Informer:
    """List then watch one collection, keep a cache, and call handlers on every change.

    Handlers get (type, object, previous) with type ADDED/MODIFIED/DELETED; on a relist after
    410 Gone the difference to the cache is replayed as such events, so handlers never miss a
    deletion. Handlers must be quick and must not block (they enqueue work).

    The watch never waits forever: every API server sends a bookmark at least once per
    bookmark interval on a watch that asks for them (ours every 15 s, kube-apiserver about every
    minute), so a stream that delivers nothing for ``inactivity_timeout`` is treated as dead and
    re-established from the last resourceVersion seen (and relisted if that is too old: 410).
    """

    def __init__(
        self,
        client: KubeClient,
        path: str,
        name: str,
        *,
        inactivity_timeout: float = DEFAULT_WATCH_INACTIVITY_S,
        server_timeout: int = 300,
    ) -> None:
        self.client = client
        self.path = path
        self.name = name
        self.inactivity_timeout = inactivity_timeout
        self.server_timeout = server_timeout
        self.cache: dict[str, Obj] = {}
        self.handlers: list[Handler] = []
        self.synced = asyncio.Event()
        self._rv = ""
        #: How many times a silent watch was re-established, and how many full lists were made.
        self.rewatches = 0
        self.lists = 0

    @property
    def resource_version(self) -> str:
        return self._rv

    def add_handler(self, handler: Handler) -> None:
        self.handlers.append(handler)

    def _emit(self, kind: str, obj: Obj, old: Obj | None) -> None:
        for handler in self.handlers:
            try:
                handler(kind, obj, old)
            except Exception:
                log.exception("%s informer handler failed on %s %s", self.name, kind, key_of(obj))

    async def _relist(self) -> None:
        listing = await self.client.get(self.path)
        self.lists += 1
        self._rv = str((listing.get("metadata") or {}).get("resourceVersion", ""))
        fresh = {key_of(o): o for o in listing.get("items") or []}
        for key, gone in list(self.cache.items()):
            if key not in fresh:
                del self.cache[key]
                self._emit("DELETED", gone, gone)
        for key, obj in fresh.items():
            old = self.cache.get(key)
            self.cache[key] = obj
            if old is None:
                self._emit("ADDED", obj, None)
            elif _rv(old) != _rv(obj):
                self._emit("MODIFIED", obj, old)

    async def run(self) -> None:
        backoff = 0.2
        need_list = True
        while True:
            try:
                if need_list:
                    await self._relist()
                    need_list = False
                    self.synced.set()
                async for event in self.client.watch(
                    self.path, self._rv, timeout_seconds=self.server_timeout, inactivity_timeout=self.inactivity_timeout
                ):
                    kind = event.get("type")
                    obj = event.get("object") or {}
                    if kind == "ERROR":
                        code = obj.get("code")
                        if code == 410:
                            need_list = True
                            break
                        raise ApiError(int(code or 500), obj, "WATCH", self.path)
                    rv = _rv(obj)
                    if rv:
                        self._rv = rv
                    if kind == "BOOKMARK":
                        continue
                    key = key_of(obj)
                    old = self.cache.get(key)
                    if kind == "DELETED":
                        self.cache.pop(key, None)
                    else:
                        self.cache[key] = obj
                    self._emit(str(kind), obj, old)
                backoff = 0.2
            except asyncio.CancelledError:
                raise
            except WatchInactive as exc:
                # no backoff: the server is not failing, this one stream went quiet
                self.rewatches += 1
                log.warning("%s: %s; watching again from resourceVersion %s", self.name, exc, self._rv or "(list)")
                need_list = need_list or not self._rv
            except ApiError as exc:
                if exc.status == 410:
                    need_list = True
                    continue
                log.warning("%s watch failed: %s; retrying in %.1fs", self.name, exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
            except (TimeoutError, aiohttp.ClientError, ValueError, OSError) as exc:
                log.warning("%s watch broke: %r; retrying in %.1fs", self.name, exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                need_list = need_list or not self._rv


def _rv(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))


async def retry(call: Callable[[], Awaitable[Obj]], *, attempts: int = 6, what: str = "") -> Obj | None:
    """Retry transient failures (5xx, 429, connection errors) with backoff; None on 404."""
    delay = 0.1
    for attempt in range(attempts):
        try:
            return await call()
        except ApiError as exc:
            if exc.status == 404:
                return None
            if (exc.status < 500 and exc.status != 429) or attempt == attempts - 1:
                raise
        except (TimeoutError, aiohttp.ClientError, OSError):
            if attempt == attempts - 1:
                raise
        log.debug("retrying %s", what)
        await asyncio.sleep(delay)
        delay = min(delay * 2, 2.0)
    return None

