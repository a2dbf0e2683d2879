"""The restart control endpoint: authentication as the heartbeat ingest, long polls answered the
moment the job's attempt is published, 2,048 waiting launchers told at once, and a clean stop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from tests.waiting import wait_until_async

from railyard.observe.control import ControlBoard, add_control_routes
from railyard.observe.heartbeats import StaticTokens
from railyard.protocol.control import Action, LauncherReport, LauncherState, parse_order
from railyard.protocol.ranktable import PodEntry, RankEntry, RankTable

ROUTE = "/v1/control/team/llm"
AUTH = {"Authorization": "Bearer tok"}


def table(attempt: int, pods: int = 2) -> RankTable:
    return RankTable(job="llm", attempt=attempt, pp=1, dp=pods, tp=1, procs_per_node=1,
                     pods=tuple(PodEntry(i, f"n{i}", f"llm-{i}") for i in range(pods)),
                     ranks=tuple(RankEntry(i, f"n{i}", i, 0, 0, 0, i, 0) for i in range(pods)), master_addr="llm-0", master_port=20000 + attempt)


def report(index: int, attempt: int = 0, state: LauncherState = LauncherState.RUNNING) -> bytes:
    return LauncherReport("llm", attempt, index, f"llm-a0-{index}", state).to_json().encode()


@pytest.fixture
async def client() -> AsyncIterator[tuple[TestClient[Any, Any], ControlBoard, list[tuple[str, str]]]]:
    woken: list[tuple[str, str]] = []
    board = ControlBoard(on_report=lambda ns, job: woken.append((ns, job)))
    app = web.Application()
    add_control_routes(app, board, StaticTokens({("team", "llm"): "tok"}))
    c = TestClient(TestServer(app))
    await c.start_server()
    try:
        yield c, board, woken
    finally:
        board.close()
        await c.close()


@pytest.mark.parametrize(("headers", "route", "body", "code"), [
    ({}, ROUTE, report(0), 401),
    ({"Authorization": "Basic tok"}, ROUTE, report(0), 401),
    ({"Authorization": "Bearer wrong"}, ROUTE, report(0), 403),
    (AUTH, "/v1/control/team/unknown", report(0), 404),
    (AUTH, ROUTE, b"not json", 400),
    (AUTH, ROUTE, LauncherReport("other", 0, 0, "p", LauncherState.RUNNING).to_json().encode(), 400),
    (AUTH, ROUTE, b"x" * (70 * 1024), 413),
    (AUTH, ROUTE + "?wait=soon", report(0), 400),
])
async def test_refusals(client: Any, headers: dict[str, str], route: str, body: bytes, code: int) -> None:
    c, board, woken = client
    board.publish("team", "llm", attempt=0, members={0: "llm-a0-0"}, table=table(0))
    resp = await c.post(route, data=body, headers=headers)
    assert resp.status == code, await resp.text()
    assert not board.reports("team", "llm") and not woken, "a refusal stores nothing"


async def test_a_held_poll_is_answered_the_moment_the_new_attempt_opens(client: Any) -> None:
    c, board, woken = client
    board.publish("team", "llm", attempt=0, members={0: "llm-a0-0", 1: "llm-a0-1"}, table=table(0))
    # a failed launcher reports: the job's reconcile is woken, the launcher is held
    poll = asyncio.ensure_future(c.post(ROUTE + "?wait=30", data=report(0, state=LauncherState.FAILED), headers=AUTH))
    await asyncio.sleep(0.2)
    assert not poll.done() and woken == [("team", "llm")]
    assert board.reports("team", "llm")[0][0].state is LauncherState.FAILED
    t0 = time.monotonic()
    board.publish("team", "llm", attempt=1, members={0: "llm-a0-0", 1: "llm-a0-1"}, table=table(1), restore={"tier": "memory", "step": 5})
    resp = await asyncio.wait_for(poll, 5)
    order = parse_order(await resp.read())
    assert time.monotonic() - t0 < 1.0
    assert order.action is Action.RESTART and order.attempt == 1 and order.restore == {"tier": "memory", "step": 5}
    assert order.delta is not None and order.delta.master_port == 20001 and order.delta.base == 0
    # the same report again, repeated: no new wake-up
    await c.post(ROUTE, data=report(0, state=LauncherState.FAILED), headers=AUTH)
    assert woken == [("team", "llm")]


async def test_a_poll_with_nothing_to_say_waits_its_time(client: Any) -> None:
    c, board, _ = client
    board.publish("team", "llm", attempt=0, members={0: "llm-a0-0"}, table=table(0))
    t0 = time.monotonic()
    resp = await c.post(ROUTE + "?wait=0.5", data=report(0), headers=AUTH)
    assert parse_order(await resp.read()).action is Action.CONTINUE and time.monotonic() - t0 >= 0.45


async def test_2048_waiting_launchers_are_told_within_a_second(client: Any) -> None:
    c, board, _ = client
    n = 2048
    members = {i: f"llm-a0-{i}" for i in range(n)}
    board.publish("team", "llm", attempt=0, members=members, table=table(0, n))
    url = str(c.make_url(ROUTE + "?wait=30"))

    async def poll(session: aiohttp.ClientSession, i: int) -> bytes:
        async with session.post(url, data=report(i), headers=AUTH) as resp:
            return await resp.read()

    # one connection per launcher, as 2,048 pods have (a session's default pool is 100)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        polls = [asyncio.ensure_future(poll(session, i)) for i in range(n)]
        await wait_until_async(lambda: len(board.reports("team", "llm")) >= n, timeout=120, interval=0.05,
                               message=f"the reports of all {n} held polls")
        assert len(board.reports("team", "llm")) == n
        t0 = time.monotonic()
        board.publish("team", "llm", attempt=1, members=members, table=table(1, n))
        answers = await asyncio.wait_for(asyncio.gather(*polls), 60)
        elapsed = time.monotonic() - t0
    orders = [parse_order(a) for a in answers]
    assert all(o.action is Action.RESTART and o.attempt == 1 for o in orders)
    print(f"\n2,048 held polls answered {elapsed:.3f}s after the publish")
    assert elapsed < 10.0, "an upper bound that catches a hang, not a speed target (bench/inplace.py measures)"
