"""An HTTP proxy in front of an API server that records every request as (group, resource, verb),
the way the API server's authorizer sees it: an audit log of what a client really does."""

from __future__ import annotations

import asyncio
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

from railyard.k8s.rbac import Permission

_HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


def to_permission(method: str, path: str, query: dict[str, str]) -> Permission | None:
    """The RBAC check the API server makes for a request (None: a non-resource URL)."""
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        return None  # /api, /apis, /apis/<g>/<v>, /version, /openapi: discovery
    if not rest:
        return None
    if rest[0] == "namespaces" and len(rest) >= 3:
        rest = rest[2:]  # /namespaces/<ns>/<resource>/...
    resource, name, sub = rest[0], (rest[1] if len(rest) > 1 else None), (rest[2] if len(rest) > 2 else None)
    if sub:
        resource = f"{resource}/{sub}"
    m = method.upper()
    if m == "GET":
        verb = "watch" if query.get("watch") in ("true", "1") else ("get" if name else "list")
    elif m == "POST":
        verb = "create"
    elif m == "PUT":
        verb = "update"
    elif m == "PATCH":
        verb = "patch"
    elif m == "DELETE":
        verb = "delete" if name else "deletecollection"
    else:
        return None
    return Permission(group, resource, verb)


@dataclass
class Audit:
    seen: set[Permission] = field(default_factory=set)
    denied_paths: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def snapshot(self) -> set[Permission]:
        with self.lock:
            return set(self.seen)


@contextmanager
def audit_proxy(upstream: str, ca_file: str | None) -> Iterator[tuple[str, Audit]]:
    """Serve http://127.0.0.1:<port> forwarding to ``upstream``; yields (url, audit)."""
    audit = Audit()
    loop = asyncio.new_event_loop()
    started = threading.Event()
    holder: dict[str, object] = {}

    async def main() -> None:
        ctx = ssl.create_default_context(cafile=ca_file) if ca_file else None
        session = ClientSession(connector=TCPConnector(ssl=ctx if ctx else False), timeout=ClientTimeout(total=None))

        async def handle(request: web.Request) -> web.StreamResponse:
            perm = to_permission(request.method, request.path, dict(request.query))
            if perm is not None:
                with audit.lock:
                    audit.seen.add(perm)
            headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
            body = await request.read()
            async with session.request(request.method, upstream + request.path_qs, headers=headers,
                                       data=body or None, allow_redirects=False) as up:
                resp = web.StreamResponse(status=up.status, headers={
                    k: v for k, v in up.headers.items() if k.lower() not in _HOP | {"content-encoding"}})
                await resp.prepare(request)
                try:
                    async for chunk in up.content.iter_any():
                        await resp.write(chunk)
                    await resp.write_eof()
                except (ConnectionError, asyncio.CancelledError):
                    pass  # the client went away (a watch it stopped): nothing left to forward
                return resp

        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", handle)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None and server.sockets
        holder["port"] = server.sockets[0].getsockname()[1]
        holder["stop"] = asyncio.Event()
        started.set()
        await holder["stop"].wait()  # type: ignore[attr-defined]
        await runner.cleanup()
        await session.close()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    started.wait(10)
    try:
        yield f"http://127.0.0.1:{holder['port']}", audit
    finally:
        loop.call_soon_threadsafe(holder["stop"].set)  # type: ignore[attr-defined]
        thread.join(15)
        if not thread.is_alive():
            loop.close()
