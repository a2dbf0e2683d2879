"""Nothing in the local cluster's runtime may wait forever: a watch that goes quiet is
re-established, a loop that dies is restarted, and one that keeps dying stops the runtime with a
message that names it. Against a scripted API server (aiohttp), so each failure mode is exact."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from railyard_local.apiserver.nodelifecycle import NodeLifecycleSettings
from railyard_local.apiserver.server import APIServer
from railyard_local.kube import Informer, KubeClient, WatchInactive
from railyard_local.tasks import Supervisor, TaskSet

#: Only catches a hang: every wait below ends as soon as its condition holds.
HANG = 20.0


class ScriptedServer:
    """Serves a pod list at resourceVersion 5 and answers watches from a script, one entry per
    watch request: ``"silent"`` (headers, then nothing: a stream that went quiet without closing),
    ``"add:<name>:<rv>"`` (one ADDED event, then nothing) or ``"gone"`` (ERROR 410)."""

    def __init__(self, script: list[str]) -> None:
        self.script = script
        self.lists: list[dict[str, str]] = []
        self.watches: list[dict[str, str]] = []
        self.changed = asyncio.Event()
        self._release = asyncio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        params = dict(request.query)
        if params.get("watch") != "true":
            self.lists.append(params)
            self.changed.set()
            return web.json_response({"kind": "PodList", "metadata": {"resourceVersion": "5"}, "items": []})
        self.watches.append(params)
        self.changed.set()
        step = self.script.pop(0) if self.script else "silent"
        resp = web.StreamResponse()
        await resp.prepare(request)
        if step.startswith("add:"):
            _, name, rv = step.split(":")
            obj = {"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv}}
            await resp.write(json.dumps({"type": "ADDED", "object": obj}).encode() + b"\n")
        elif step == "gone":
            status = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old resource version"}
            await resp.write(json.dumps({"type": "ERROR", "object": status}).encode() + b"\n")
            return resp
        await self._release.wait()  # hold the stream open, sending nothing
        return resp

    async def until(self, what: str, pred: Callable[[], bool]) -> None:
        async def loop() -> None:
            while not pred():
                self.changed.clear()
                await self.changed.wait()

        try:
            await asyncio.wait_for(loop(), HANG)
        except TimeoutError:
            raise AssertionError(f"{what}: lists {self.lists}, watches {self.watches}") from None

    def release(self) -> None:
        self._release.set()


@contextlib.asynccontextmanager
async def serve(script: list[str]) -> AsyncIterator[tuple[ScriptedServer, KubeClient]]:
    server = ScriptedServer(script)
    app = web.Application()
    app.router.add_get("/api/v1/pods", server.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    client = KubeClient(f"http://127.0.0.1:{port}")
    try:
        yield server, client
    finally:
        server.release()
        await client.close()
        await runner.cleanup()


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 3 * HANG))


def test_a_watch_that_delivers_nothing_is_reestablished_from_the_last_resource_version() -> None:
    async def scenario() -> None:
        async with serve(["silent", "add:p1:7", "silent"]) as (server, client):
            informer = Informer(client, "/api/v1/pods", "pods", inactivity_timeout=0.3)
            added: list[str] = []
            informer.add_handler(lambda kind, obj, old: added.append(f"{kind} {obj['metadata']['name']}"))
            task = asyncio.get_running_loop().create_task(informer.run())
            try:
                await server.until("the quiet watch re-established, and the one after it", lambda: len(server.watches) >= 3)
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            # one list; the second watch resumes where the first stood (the list's version), the
            # third after the event it delivered: nothing was lost and nothing relisted
            assert len(server.lists) == 1
            assert [w["resourceVersion"] for w in server.watches[:3]] == ["5", "5", "7"]
            assert all(w["allowWatchBookmarks"] == "true" for w in server.watches)
            assert added == ["ADDED p1"] and "ns/p1" in informer.cache
            assert informer.rewatches >= 2

    run(scenario())


def test_a_quiet_watch_whose_version_expired_is_relisted() -> None:
    async def scenario() -> None:
        async with serve(["silent", "gone", "silent"]) as (server, client):
            informer = Informer(client, "/api/v1/pods", "pods", inactivity_timeout=0.3)
            task = asyncio.get_running_loop().create_task(informer.run())
            try:
                await server.until("a relist after 410 and a new watch", lambda: len(server.lists) >= 2 and len(server.watches) >= 3)
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            assert [w["resourceVersion"] for w in server.watches[:3]] == ["5", "5", "5"]

    run(scenario())


def test_the_client_watch_raises_when_the_stream_goes_quiet() -> None:
    async def scenario() -> None:
        async with serve(["silent"]) as (_server, client):
            with pytest.raises(WatchInactive, match=r"nothing received for 0\.2s"):
                async for _ in client.watch("/api/v1/pods", "5", inactivity_timeout=0.2):
                    pass

    run(scenario())


async def _ends_when_cancelled(task: asyncio.Task[Any], what: str) -> None:
    """Wait (bounded: only catches a hang) for a task that was asked to stop; fail naming it if it ran on."""
    await asyncio.wait({task}, timeout=HANG)
    if not task.done():
        task.cancel()  # a second request ends it (the first one was lost), so the test can end too
        await asyncio.wait({task}, timeout=HANG)
        raise AssertionError(f"{what}: still running {HANG:g} s after it was cancelled (the cancellation was lost)")
    assert task.cancelled(), f"{what}: ended by {task.exception()!r}, not by its cancellation"


def test_a_watch_cancelled_as_its_next_chunk_arrives_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    """A runtime stops its informers while their streams deliver: a cancellation that comes in the same loop iteration
    as a chunk must end the watch. Python 3.11's asyncio.wait_for returned the chunk and dropped the cancellation, and
    the informer watched on forever (the node agent test hung under load, awaiting its cancelled informer)."""

    async def scenario() -> None:
        async with serve(["add:p1:6"]) as (_server, client):
            informer = Informer(client, "/api/v1/pods", "pods")
            task = asyncio.get_running_loop().create_task(informer.run())
            readany = aiohttp.StreamReader.readany

            async def readany_then_cancelled(self: aiohttp.StreamReader) -> bytes:
                chunk = await readany(self)
                if chunk and informer.synced.is_set():  # a chunk of the watch (the list came before)
                    task.cancel()
                return chunk

            monkeypatch.setattr(aiohttp.StreamReader, "readany", readany_then_cancelled)
            await _ends_when_cancelled(task, "the pods informer")

    run(scenario())


def test_the_node_lifecycle_stops_when_stopped_as_it_is_kicked(tmp_path: Path) -> None:
    """The API server's stop() cancels the node lifecycle loop; a node write that kicks the loop in the same iteration
    must not keep it running (with 3.11's wait_for it ran on, and stop() never returned)."""

    async def scenario() -> None:
        srv = APIServer(tmp_path / "state", token="t", tls=False, node_lifecycle=NodeLifecycleSettings())
        await srv.start()
        lifecycle = srv.node_lifecycle
        assert lifecycle is not None
        try:
            await asyncio.sleep(0)  # the loop waits for its kick or its period
            lifecycle._kick.set()  # as a node's Ready condition changes
            stopping = asyncio.get_running_loop().create_task(lifecycle.stop())
            await asyncio.wait({stopping}, timeout=HANG)
            assert stopping.done(), f"the node lifecycle loop still running {HANG:g} s after stop()"
        finally:
            if lifecycle._task is not None:
                lifecycle._task.cancel()
            await srv.stop()

    run(scenario())


def test_a_loop_that_dies_is_logged_and_restarted(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        calls = 0
        second = asyncio.Event()

        async def flaky() -> None:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise RuntimeError("boom")
            second.set()
            await asyncio.Event().wait()

        sup = Supervisor(backoff_s=0.01)
        sup.start("scheduler", flaky)
        await asyncio.wait_for(second.wait(), HANG)
        assert sup.restarts == {"scheduler": 1} and sup.fatal is None
        await sup.cancel_all()

    with caplog.at_level("ERROR", logger="railyard_local.tasks"):
        run(scenario())
    assert any("runtime task 'scheduler' died; restarting" in r.getMessage() and r.exc_info for r in caplog.records)


def test_a_loop_that_keeps_dying_stops_the_runtime_with_a_message_naming_it() -> None:
    async def scenario() -> str | None:
        async def broken() -> None:
            raise KeyError("spec")

        async def returns() -> None:
            return None

        sup = Supervisor(max_restarts=2, backoff_s=0.01)
        sup.start("pods informer", broken)
        fatal = await asyncio.wait_for(sup.wait(asyncio.Event()), HANG)
        await sup.cancel_all()
        # a loop that simply returns is dead too
        sup2 = Supervisor(max_restarts=0)
        sup2.start("hosts writer", returns)
        fatal2 = await asyncio.wait_for(sup2.wait(asyncio.Event()), HANG)
        await sup2.cancel_all()
        assert fatal2 is not None and "'hosts writer'" in fatal2 and "returned" in fatal2
        return fatal

    fatal = run(scenario())
    assert fatal is not None
    assert "'pods informer' died 3 times" in fatal and "KeyError('spec')" in fatal and "railyard local up" in fatal


def test_a_stop_signal_ends_the_wait_without_a_verdict() -> None:
    async def scenario() -> str | None:
        async def forever() -> None:
            await asyncio.Event().wait()

        sup = Supervisor()
        sup.start("forever", forever)
        stop = asyncio.Event()
        stop.set()
        out = await asyncio.wait_for(sup.wait(stop), HANG)
        await sup.cancel_all()
        return out

    assert run(scenario()) is None


def test_a_failed_background_task_is_logged_with_its_name(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        tasks = TaskSet("scheduler")

        async def bind() -> None:
            raise ConnectionResetError("server went away")

        task = tasks.spawn(bind(), "binding ns/p-0")
        await asyncio.gather(task, return_exceptions=True)  # its done callbacks ran first
        assert len(tasks) == 0

    with caplog.at_level("ERROR", logger="railyard_local.tasks"):
        run(scenario())
    (record,) = [r for r in caplog.records if "binding ns/p-0" in r.getMessage()]
    assert "scheduler: background task binding ns/p-0 failed" in record.getMessage() and record.exc_info
