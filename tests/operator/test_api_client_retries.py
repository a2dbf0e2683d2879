"""The operator's API client: transient errors are retried with backoff, AlreadyExists and
NotFound are answers, other errors surface with their status."""

from __future__ import annotations

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from railyard.k8s.client import ApiError, Kube


async def _server(handler) -> TestServer:  # type: ignore[no-untyped-def]
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    server = TestServer(app)
    await server.start_server()
    return server


async def test_transient_errors_are_retried_until_success() -> None:
    calls: list[str] = []

    async def handler(request: web.Request) -> web.Response:
        calls.append(request.method)
        if len(calls) < 3:
            return web.json_response({"kind": "Status", "reason": "ServiceUnavailable"}, status=503)
        return web.json_response({"metadata": {"name": "x"}})

    server = await _server(handler)
    kube = Kube(str(server.make_url("")), backoff_s=0.001)
    try:
        got = await kube.patch("/api/v1/namespaces/a/pods/x", {"metadata": {}})
        assert got == {"metadata": {"name": "x"}} and len(calls) == 3
    finally:
        await kube.close()
        await server.close()


async def test_conflict_and_not_found_are_answers_not_errors() -> None:
    async def handler(request: web.Request) -> web.Response:
        if request.method == "POST":
            return web.json_response({"kind": "Status", "reason": "AlreadyExists"}, status=409)
        return web.json_response({"kind": "Status", "reason": "NotFound"}, status=404)

    server = await _server(handler)
    kube = Kube(str(server.make_url("")), backoff_s=0.001)
    try:
        assert await kube.create("/api/v1/namespaces/a/pods", {"metadata": {"name": "x"}}) is None
        assert await kube.delete("/api/v1/namespaces/a/pods/x") is False
        assert await kube.get("/api/v1/namespaces/a/pods/x") is None
    finally:
        await kube.close()
        await server.close()


async def test_permanent_errors_and_exhausted_retries_raise_with_status() -> None:
    hits = 0

    async def handler(request: web.Request) -> web.Response:
        nonlocal hits
        hits += 1
        if request.path.endswith("forbidden"):
            return web.json_response({"kind": "Status", "reason": "Forbidden", "message": "no"}, status=403)
        return web.json_response({"kind": "Status"}, status=500)

    server = await _server(handler)
    kube = Kube(str(server.make_url("")), backoff_s=0.001, retries=2)
    try:
        with pytest.raises(ApiError) as err:
            await kube.request("GET", "/forbidden")
        assert err.value.status == 403 and err.value.reason == "Forbidden" and hits == 1
        with pytest.raises(ApiError) as err:
            await kube.request("GET", "/flaky")
        assert err.value.status == 500 and hits == 1 + 3
    finally:
        await kube.close()
        await server.close()


async def test_a_create_that_needs_no_answer_still_reports_refusals() -> None:
    peers: set[object] = set()

    async def handler(request: web.Request) -> web.Response:
        peers.add(request.transport.get_extra_info("peername") if request.transport else None)
        if (await request.json())["metadata"]["name"] == "taken":
            return web.json_response({"kind": "Status", "reason": "AlreadyExists"}, status=409)
        if request.path.endswith("/quota/pods"):
            return web.json_response({"kind": "Status", "reason": "Forbidden", "message": "quota"}, status=403)
        return web.json_response({"metadata": {"name": "x", "uid": "u"}, "spec": {}}, status=201)

    server = await _server(handler)
    kube = Kube(str(server.make_url("")), backoff_s=0.001)
    try:
        for _ in range(3):
            assert await kube.create("/api/v1/namespaces/a/pods", {"metadata": {"name": "x"}}, answer=False) == {}
        assert await kube.create("/api/v1/namespaces/a/pods", {"metadata": {"name": "taken"}}, answer=False) is None
        with pytest.raises(ApiError) as err:
            await kube.create("/api/v1/namespaces/quota/pods", {"metadata": {"name": "x"}}, answer=False)
        assert err.value.status == 403 and err.value.reason == "Forbidden"
        assert await kube.create("/api/v1/namespaces/a/pods", {"metadata": {"name": "x"}}) == {
            "metadata": {"name": "x", "uid": "u"}, "spec": {}}
        assert len(peers) == 1, "the connection is kept for the next request"
    finally:
        await kube.close()
        await server.close()
