"""The part of a kubelet's HTTPS API a real API server calls for ``kubectl logs``.

kube-apiserver answers ``pods/log`` by dialing the pod's node: ``https://<address>:<port>/
containerLogs/<ns>/<pod>/<container>?follow=&tailLines=&limitBytes=&previous=...``, the address
being the Node's InternalIP (our nodes report no Hostname address, which the API server would
try first and which does not resolve) and the port its ``status.daemonEndpoints.kubeletEndpoint.
Port``. This endpoint serves the log files the node agent writes, one listening socket per
simulated node on that node's own loopback address (one port for all), so a request is answered
only for pods bound to the node it reached.

Logs are not for anyone on the machine: the endpoint requires a client certificate signed by the
CA that signs the API server's kubelet client certificate (``--kubelet-client-certificate``;
kubeadm and kind use the cluster CA, envtest mode issues one from its own CA). A request with no
or another certificate fails the TLS handshake. Any certificate of that CA is accepted (a
kubelet would also ask the API server whether the user may read ``nodes/log``); the listening
addresses are loopback ones, so only this machine can connect at all. The serving certificate is
from a CA of its own, which the API server does not check by default
(``--kubelet-certificate-authority`` unset).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Callable
from pathlib import Path

from aiohttp import web

from railyard_local import podlogs
from railyard_local.apiserver.pki import ensure_certs, issue_cert
from railyard_local.kube import Obj
from railyard_local.podlogs import LogOptionError, parse_log_options
from railyard_local.topology import NodeSpec

log = logging.getLogger(__name__)
#: (namespace, pod, container, previous) -> the log file (the node agent's ``log_path``).
LogPath = Callable[[str, str, str, bool], Path]
#: Tries at one port free on every node address before giving up.
PORT_TRIES = 20


def server_context(pki_dir: Path, hosts: tuple[str, ...], client_ca: Path) -> ssl.SSLContext:
    """TLS for the endpoint: a serving certificate for the node addresses, and client
    certificates required, checked against ``client_ca``."""
    ensure_certs(pki_dir)
    cert, key = issue_cert(pki_dir, "kubelet", common_name="railyard-local-kubelet", hosts=hosts)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(cafile=str(client_ca))
    return ctx


def bind_all(hosts: list[str], port: int = 0) -> list[socket.socket]:
    """Listening sockets on every address at one port (``port``, or a free one)."""
    for _ in range(PORT_TRIES if port == 0 else 1):
        socks: list[socket.socket] = []
        chosen = port
        try:
            for host in hosts:
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind((host, chosen))
                chosen = s.getsockname()[1]
                s.listen(128)
                s.setblocking(False)
            return socks
        except OSError:
            for s in socks:
                s.close()
            if port:
                raise
    raise OSError(f"no port free on all of {len(hosts)} node addresses after {PORT_TRIES} tries")


class KubeletEndpoint:
    """``/containerLogs`` for the pods of ``nodes``; ``pod("ns/name")`` looks a pod up in the
    agent's cache, ``log_path`` is where the agent writes its logs."""

    def __init__(
        self, nodes: list[NodeSpec], pod: Callable[[str], Obj | None], log_path: LogPath, *, ssl_context: ssl.SSLContext
    ) -> None:
        self.by_ip = {n.ip: n.name for n in nodes}
        self.pod = pod
        self.log_path = log_path
        self.ssl_context = ssl_context
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._stopping = asyncio.Event()

    async def start(self, port: int = 0) -> int:
        """Listen on every node's address; returns the port (advertised in the Nodes' status)."""
        socks = bind_all(list(self.by_ip), port)
        app = web.Application()
        app.router.add_get("/containerLogs/{ns}/{pod}/{container}", self._logs)
        app.router.add_get("/healthz", self._healthz)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        for s in socks:
            await web.SockSite(self._runner, s, ssl_context=self.ssl_context).start()
        self.port = int(socks[0].getsockname()[1])
        log.info("kubelet endpoint: containerLogs on port %d of %d node addresses", self.port, len(socks))
        return self.port

    async def stop(self) -> None:
        self._stopping.set()
        if self._runner is not None:
            with contextlib.suppress(Exception):
                await self._runner.cleanup()
            self._runner = None

    def _node_of(self, request: web.Request) -> str:
        sock = request.transport.get_extra_info("sockname") if request.transport is not None else None
        return self.by_ip.get(str(sock[0]) if sock else "", "")

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _logs(self, request: web.Request) -> web.StreamResponse:
        ns, name, container = (request.match_info[k] for k in ("ns", "pod", "container"))
        node = self._node_of(request)
        pod = self.pod(f"{ns}/{name}")
        if pod is None or not node or (pod.get("spec") or {}).get("nodeName") != node:
            raise web.HTTPNotFound(text=f'pod "{ns}/{name}" does not exist on node "{node}"\n')
        spec = pod.get("spec") or {}
        names = [c.get("name") for c in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]]
        if container not in names:
            raise web.HTTPNotFound(text=f'container "{container}" not found in pod "{ns}/{name}"\n')
        try:
            opts = parse_log_options(request.query)
        except LogOptionError as exc:
            raise web.HTTPBadRequest(text=f"{exc}\n") from None
        path = self.log_path(ns, name, container, opts.previous)
        if opts.previous and not path.exists():
            raise web.HTTPBadRequest(text=f'previous terminated container "{container}" in pod "{name}" not found\n')
        uid = (pod.get("metadata") or {}).get("uid")

        def done() -> bool:
            cur = self.pod(f"{ns}/{name}")
            if cur is None or (cur.get("metadata") or {}).get("uid") != uid:
                return True
            statuses = [*((cur.get("status") or {}).get("containerStatuses") or []),
                        *((cur.get("status") or {}).get("initContainerStatuses") or [])]
            return any(s.get("name") == container and "terminated" in (s.get("state") or {}) for s in statuses)

        return await podlogs.respond(request, path, opts, current=lambda: self.log_path(ns, name, container, False),
                                     done=done, stopping=self._stopping)

