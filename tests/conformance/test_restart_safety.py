"""Every acknowledged write survives SIGKILL of the embedded server; resourceVersions keep rising."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from typing import Any

import aiohttp

from railyard_local.apiserver.process import ServerProcess, start_server_process


async def _writer(session: aiohttp.ClientSession, url: str, i: int, acked: dict[str, tuple[str, int]]) -> None:
    body = {"metadata": {"name": f"cm-{i}"}, "data": {"i": str(i)}}
    try:
        async with session.post(f"{url}/api/v1/namespaces/default/configmaps", json=body) as resp:
            if resp.status == 201:
                obj: dict[str, Any] = await resp.json()
                acked[obj["metadata"]["name"]] = (obj["metadata"]["uid"], int(obj["metadata"]["resourceVersion"]))
    except (TimeoutError, aiohttp.ClientError, ConnectionError):
        pass


def _session(proc: ServerProcess) -> aiohttp.ClientSession:
    ctx = ssl.create_default_context(cafile=str(proc.ca_file)) if proc.ca_file else None
    return aiohttp.ClientSession(headers={"Authorization": f"Bearer {proc.token}"},
                                 connector=aiohttp.TCPConnector(ssl=ctx or False, limit=16))


async def test_acknowledged_writes_survive_sigkill_and_restart(embedded_only: None, tmp_path: Path) -> None:
    state = tmp_path / "state"
    proc = start_server_process(state, token="restart-token")
    acked: dict[str, tuple[str, int]] = {}
    try:
        async with _session(proc) as session:
            sem = asyncio.Semaphore(16)

            async def one(i: int) -> None:
                async with sem:
                    await _writer(session, proc.url, i, acked)

            tasks = [asyncio.create_task(one(i)) for i in range(3000)]
            while len(acked) < 300:
                await asyncio.sleep(0.01)
                assert not all(t.done() for t in tasks), "the server stopped answering before the kill"
            proc.kill()
            await asyncio.gather(*tasks)
    finally:
        proc.kill()
    assert len(acked) >= 300
    max_acked_rv = max(rv for _, rv in acked.values())

    proc = start_server_process(state, token="restart-token")
    try:
        async with _session(proc) as session:
            async with session.get(f"{proc.url}/api/v1/namespaces/default/configmaps") as resp:
                listing = await resp.json()
            stored = {o["metadata"]["name"]: o for o in listing["items"]}
            missing = [n for n in acked if n not in stored]
            assert not missing, f"{len(missing)} acknowledged writes lost, e.g. {missing[:5]}"
            for name, (uid, rv) in acked.items():
                assert stored[name]["metadata"]["uid"] == uid
                assert int(stored[name]["metadata"]["resourceVersion"]) == rv
            assert int(listing["metadata"]["resourceVersion"]) >= max_acked_rv
            async with session.post(f"{proc.url}/api/v1/namespaces/default/configmaps",
                                    json={"metadata": {"name": "after-restart"}}) as resp:
                assert resp.status == 201
                after = await resp.json()
            assert int(after["metadata"]["resourceVersion"]) > max_acked_rv
            async with session.get(f"{proc.url}/api/v1/namespaces/default/configmaps",
                                   params={"watch": "1", "resourceVersion": "1", "timeoutSeconds": "2"}) as resp:
                first = await resp.content.readline()
            assert b'"ERROR"' in first and b"410" in first
    finally:
        proc.stop()
    assert proc.process.returncode == 0, "SIGTERM must shut the server down cleanly"


def test_a_second_server_on_the_same_state_dir_is_refused(embedded_only: None, tmp_path: Path) -> None:
    import pytest

    proc = start_server_process(tmp_path)
    try:
        with pytest.raises(RuntimeError):
            start_server_process(tmp_path, timeout_s=20)
        assert "another API server is using the state directory" in (tmp_path / "apiserver.log").read_text()
    finally:
        proc.stop()


def test_the_command_refuses_non_loopback_hosts(tmp_path: Path) -> None:
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "railyard_local.apiserver", "--state-dir", str(tmp_path),
                          "--token", "t", "--host", "0.0.0.0"], capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and "loopback" in res.stderr


async def test_in_process_server_serves_and_stops(embedded_only: None, tmp_path: Path) -> None:
    from railyard_local.apiserver import APIServer

    server = APIServer(tmp_path, token="in-process")
    url = await server.start()
    try:
        assert url.startswith("https://127.0.0.1:") and server.ca_file is not None
        ctx = ssl.create_default_context(cafile=str(server.ca_file))
        async with aiohttp.ClientSession(headers={"Authorization": "Bearer in-process"},
                                         connector=aiohttp.TCPConnector(ssl=ctx)) as s:
            async with s.post(f"{url}/api/v1/namespaces/default/configmaps",
                              json={"metadata": {"name": "x"}, "data": {"a": "b"}}) as r:
                assert r.status == 201
            async with s.get(f"{url}/api/v1/namespaces/default/configmaps/x") as r:
                assert (await r.json())["data"] == {"a": "b"}
    finally:
        await server.stop()
