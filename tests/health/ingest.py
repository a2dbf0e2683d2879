"""The operator's heartbeat ingest route and store, served in-process on a loopback port, for
tests that send real heartbeats (the trainer's reporter, or a program's SDK under the launcher)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from aiohttp import web

from railyard.logic.health.window import HeartbeatStore
from railyard.observe.heartbeats import StaticTokens, build_heartbeat_app


class Server:
    def __init__(self, namespace: str = "ns", job: str = "job", token: str = "s3cret") -> None:
        self.namespace, self.job, self.token = namespace, job, token
        self.store = HeartbeatStore()
        self.store.begin_attempt(namespace, job, 0)
        self.loop = asyncio.new_event_loop()
        self.port = 0
        started = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            app = build_heartbeat_app(self.store, StaticTokens({(namespace, job): token}))
            self.runner = web.AppRunner(app)
            self.loop.run_until_complete(self.runner.setup())
            site = web.TCPSite(self.runner, "127.0.0.1", 0)
            self.loop.run_until_complete(site.start())
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            started.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert started.wait(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/heartbeats/{self.namespace}/{self.job}"

    def read(self, fn: Callable[[HeartbeatStore], Any]) -> Any:
        async def call() -> Any:
            return fn(self.store)

        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(5)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
