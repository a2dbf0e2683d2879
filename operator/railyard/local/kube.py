"""A small asyncio Kubernetes client for the local cluster's runtime (scheduler, nodes, agent).

The runtime binds hundreds of pods a second and keeps one watch per kind; the generated
``kubernetes`` client is synchronous and slow at that. This client speaks plain HTTP with
aiohttp, reads any kubeconfig through the ``kubernetes`` package's loader (so token, client
certificate and CA setups of real clusters work in ``existing`` mode), and gives
list/watch/get/create/patch/delete plus a list-then-watch :class:`Informer`.
"""

from __future__ import annotations

import asyncio
import json
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

__all__ = ["JSON_PATCH", "MERGE", "STRATEGIC", "ApiError", "Informer", "KubeClient", "Obj", "key_of", "retry"]

log = logging.getLogger(__name__)


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
    ) -> Obj:
        return await self.send(method, path, params=params, body=body, content_type=content_type, timeout=timeout)

    async def get(self, path: str, **params: Any) -> Obj:
        return await self.request("GET", path, params=params)

    async def create(self, path: str, body: Obj) -> Obj:
        return await self.request("POST", path, body=body)

    async def patch(self, path: str, body: Any, content_type: str = MERGE) -> Obj:
        return await self.request("PATCH", path, body=body, content_type=content_type)

    async def replace(self, path: str, body: Obj) -> Obj:
        return await self.request("PUT", path, body=body)

    async def delete(self, path: str, body: Obj | None = None, **params: Any) -> Obj:
        return await self.request("DELETE", path, body=body, params=params)

    async def watch(self, path: str, resource_version: str, *, timeout_seconds: int = 300) -> AsyncIterator[Obj]:
        """Yield watch events until the server ends the stream."""
        params = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
        }
        async with self._sess().get(
            self.server + path, params=params, timeout=aiohttp.ClientTimeout(total=timeout_seconds + 30, sock_read=timeout_seconds + 30)
        ) as resp:
            if resp.status >= 400:
                text = await resp.text()
                raise ApiError(resp.status, json_or_text(text), "WATCH", path)
            buf = b""
            async for chunk in resp.content.iter_any():
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        yield json.loads(line)
            if buf.strip():
                yield json.loads(buf)


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
    """

    def __init__(self, client: KubeClient, path: str, name: str) -> None:
        self.client = client
        self.path = path
        self.name = name
        self.cache: dict[str, Obj] = {}
        self.handlers: list[Handler] = []
        self.synced = asyncio.Event()
        self._rv = ""

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
                async for event in self.client.watch(self.path, self._rv):
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

