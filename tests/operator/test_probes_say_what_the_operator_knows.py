"""/healthz and /readyz answer from what the operator knows about itself (observe/probes.py):
not ready before kopf has its initial lists of nodes and pods, ready after; not live while a
job's reconcile cycle is wedged, live again once it returns.

The operator runs as a process against the embedded API server through a proxy that can hold
requests: holding the initial node list keeps it syncing; holding the job's API calls wedges
its worker.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import ClientSession, ClientTimeout, TCPConnector, web
from tests.operator.conftest import ROOT, _free_port
from tests.waiting import wait_until

from railyard.observe.probes import Probes

_HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


# --- unit --------------------------------------------------------------------------------------


def test_readiness_needs_start_up_and_the_initial_lists() -> None:
    p = Probes()
    assert not p.readiness().ok and "starting" in p.readiness().reason
    p.started = True
    assert not p.readiness().ok and "syncing" in p.readiness().reason
    p.synced = True
    assert p.readiness().ok and p.liveness().ok


def test_liveness_fails_while_a_cycle_runs_too_long_and_recovers() -> None:
    now = [100.0]
    p = Probes(stuck_after_s=30, clock=lambda: now[0], started=True, synced=True)
    p.cycle_started(("ml", "a"))
    p.cycle_started(("ml", "b"))
    now[0] += 30
    assert p.liveness().ok  # at the limit, not over it
    now[0] += 1
    p.cycle_finished(("ml", "a"))
    p.cycle_started(("ml", "a"))  # a new cycle of a: fresh
    live = p.liveness()
    assert not live.ok and "ml/b" in live.reason and "31 s" in live.reason
    assert not p.readiness().ok  # a wedged operator is not ready either
    p.cycle_finished(("ml", "b"))
    assert p.liveness().ok and p.readiness().ok


# --- a proxy that holds requests ---------------------------------------------------------------


@dataclass
class Gate:
    """Requests matching ``rule`` wait until ``release`` is set."""

    rule: Callable[[str, str, dict[str, str]], bool]
    release: threading.Event = field(default_factory=threading.Event)
    held: int = 0


@dataclass
class Gates:
    gates: list[Gate] = field(default_factory=list)

    def add(self, rule: Callable[[str, str, dict[str, str]], bool]) -> Gate:
        g = Gate(rule)
        self.gates.append(g)
        return g


@contextmanager
def holding_proxy(upstream: str, ca_file: str | None) -> Iterator[tuple[str, Gates]]:
    gates = Gates()
    loop = asyncio.new_event_loop()
    started = threading.Event()
    holder: dict[str, Any] = {}

    async def main() -> None:
        import ssl

        ctx = ssl.create_default_context(cafile=ca_file) if ca_file else None
        session = ClientSession(connector=TCPConnector(ssl=ctx if ctx else False), timeout=ClientTimeout(total=None))

        async def handle(request: web.Request) -> web.StreamResponse:
            for g in list(gates.gates):
                if not g.release.is_set() and g.rule(request.method, request.path, dict(request.query)):
                    g.held += 1
                    await loop.run_in_executor(None, g.release.wait, 120)
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
                    pass
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
        await holder["stop"].wait()
        await runner.cleanup()
        await session.close()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    started.wait(10)
    try:
        yield f"http://127.0.0.1:{holder['port']}", gates
    finally:
        for g in gates.gates:
            g.release.set()
        loop.call_soon_threadsafe(holder["stop"].set)
        thread.join(15)
        if not thread.is_alive():
            loop.close()


def status_of(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)


# --- integration --------------------------------------------------------------------------------


@pytest.mark.cluster
@pytest.mark.slow
def test_probes_follow_sync_and_a_wedged_worker(tmp_path: Path) -> None:
    from kubernetes import config as k8s_config
    from tests.deployment import rawkube

    from railyard_local.apiserver.kubeconfig import write_kubeconfig
    from railyard_local.apiserver.process import start_server_process

    ns = "probes"
    srv = start_server_process(tmp_path / "api")
    proc: subprocess.Popen[bytes] | None = None
    log_path = tmp_path / "operator.log"
    try:
        api = k8s_config.new_client_from_config(config_file=str(srv.write_kubeconfig(tmp_path / "admin")))
        crd = yaml.safe_load((ROOT / "crds" / "trainingjob.yaml").read_text())
        assert rawkube.request(api, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)[0] == 201
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n0", "labels": {"kubernetes.io/hostname": "n0"}},
                "status": {"conditions": [{"type": "Ready", "status": "True"}],
                           "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"}}}
        assert rawkube.request(api, "POST", "/api/v1/nodes", node)[0] == 201
        assert rawkube.request(api, "POST", "/api/v1/namespaces", {"metadata": {"name": ns}})[0] == 201

        with holding_proxy(srv.url, str(srv.ca_file) if srv.ca_file else None) as (proxy_url, gates):
            node_list = gates.add(lambda m, p, q: m == "GET" and p == "/api/v1/nodes" and q.get("watch") not in ("true", "1"))
            port = _free_port()
            kubeconfig = write_kubeconfig(tmp_path / "operator", proxy_url, srv.token)
            proc = subprocess.Popen(
                [sys.executable, "-m", "railyard", "operator", "run", "--standalone", "--namespace", ns,
                 "--kubeconfig", str(kubeconfig), "--metrics-host", "127.0.0.1", "--metrics-port", str(port),
                 "--stuck-reconcile-seconds", "2"],
                stdout=log_path.open("wb"), stderr=subprocess.STDOUT, cwd=ROOT)
            healthz, readyz = f"http://127.0.0.1:{port}/healthz", f"http://127.0.0.1:{port}/readyz"

            def tail() -> str:
                return log_path.read_text(errors="replace")[-3000:]

            # started and live, but the node list is held: kopf's indexes are not filled
            wait_until(lambda: status_of(healthz)[0] == 200, timeout=60, message="the operator to serve /healthz", retry_on=(Exception,))
            wait_until(lambda: node_list.held >= 1, timeout=30, message="the operator's node list to be held", retry_on=(Exception,))
            code, text = status_of(readyz)
            assert (code, text.strip()) == (503, "syncing: waiting for the initial list of nodes and pods"), tail()
            node_list.release.set()
            wait_until(lambda: status_of(readyz)[0] == 200, timeout=60, message="readiness once synced", retry_on=(Exception,))

            # wedge the job's worker: every call it makes for the job's namespace waits
            wedge = gates.add(lambda m, p, q: f"/namespaces/{ns}/" in p and q.get("watch") not in ("true", "1"))
            job = {"apiVersion": "railyard.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "wedged"},
                   "spec": {"nodes": 1, "gpusPerPod": 0, "command": ["true"]}}
            status, body = rawkube.request(api, "POST", f"/apis/railyard.dev/v1alpha1/namespaces/{ns}/trainingjobs", job)
            assert status == 201, body
            wait_until(lambda: wedge.held >= 1, timeout=30, message="the worker's call to be held", retry_on=(Exception,))
            code, text = wait_until(lambda: (r := status_of(healthz))[0] == 503 and r, timeout=30, message="liveness to fail", retry_on=(Exception,))
            assert f"the reconcile of {ns}/wedged has run for" in text and "wedged" in text, text
            assert status_of(readyz)[0] == 503
            wedge.release.set()
            wait_until(lambda: status_of(healthz)[0] == 200, timeout=60, message="liveness once the cycle returns", retry_on=(Exception,))
            assert status_of(readyz)[0] == 200
            assert proc.poll() is None, tail()
            proc.terminate()
            proc.wait(timeout=30)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        srv.stop()
