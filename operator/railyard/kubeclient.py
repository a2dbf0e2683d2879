"""The core both of our async Kubernetes API clients share: credentials, session, one request.

The generated ``kubernetes`` client is synchronous and slow at hundreds of calls a second, so
the operator (:class:`railyard.k8s.client.Kube`, which adds retries) and the local cluster's
runtime (:class:`railyard.local.kube.KubeClient`, which adds watches) speak plain HTTP with
aiohttp over one pooled session. Credentials come from the ``kubernetes`` package's kubeconfig /
in-cluster loaders, so token, client-certificate, CA and exec-plugin setups all work.

This module belongs to neither side: it imports no other ``railyard`` module.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

Obj = dict[str, Any]
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"


class ApiError(Exception):
    """A non-2xx answer; ``status`` is the HTTP code (0: no answer), ``body`` the Status object
    when given, ``reason`` its reason (``AlreadyExists``, ``Conflict`` ...) or ""."""

    def __init__(self, status: int, body: Any, method: str, path: str) -> None:
        self.status = status
        self.body = body
        self.reason = str(body.get("reason", "")) if isinstance(body, dict) else ""
        message = body.get("message") if isinstance(body, dict) else str(body)[:300]
        super().__init__(f"{method} {path}: {status} {message}")


@dataclass(frozen=True)
class Connection:
    """Where the API server is and how to authenticate to it."""

    server: str
    token: str | None
    ssl_context: ssl.SSLContext | bool | None


def load_connection(kubeconfig: str | None = None, context: str | None = None) -> Connection:
    """From a kubeconfig (``None``: $KUBECONFIG or ~/.kube/config), else in-cluster.

    The in-cluster fallback applies only when no kubeconfig was named; a named one that cannot
    be read raises the loader's ``ConfigException``.
    """
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config

    cfg = k8s_client.Configuration()
    try:
        k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig, context=context, client_configuration=cfg
        )
    except k8s_config.ConfigException:
        if kubeconfig:
            raise
        k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    keys = cfg.api_key or {}  # the loaders set "BearerToken"
    token = keys.get("BearerToken") or keys.get("authorization")
    ctx: ssl.SSLContext | bool | None = None
    if str(cfg.host).startswith("https"):
        if not cfg.verify_ssl:
            ctx = False
        else:
            ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert) if cfg.ssl_ca_cert else ssl.create_default_context()
            if cfg.cert_file:
                ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
    return Connection(str(cfg.host), token, ctx)


def query_params(params: Mapping[str, Any] | None) -> dict[str, str]:
    """Query parameters as the API server reads them: booleans lower-case, ``None`` left out."""
    return {k: (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in (params or {}).items() if v is not None}


def json_or_text(text: str) -> Any:
    """A response body: its JSON, ``{}`` when empty, else the text itself."""
    try:
        return json.loads(text) if text else {}
    except ValueError:
        return text


class BaseClient:
    """One aiohttp session against one API server; :meth:`send` makes one request, no retries."""

    session_timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)

    def __init__(
        self,
        server: str,
        *,
        token: str | None = None,
        ssl_context: ssl.SSLContext | bool | None = None,
        limit: int = 64,
    ) -> None:
        self.server = server.rstrip("/")
        self._headers = {"Accept": "application/json"}
        if token:
            self._headers["Authorization"] = token if token.lower().startswith("bearer ") else f"Bearer {token}"
        self._ssl = ssl_context
        self._limit = limit
        self._session: aiohttp.ClientSession | None = None

    def _sess(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                headers=self._headers,
                connector=aiohttp.TCPConnector(limit=self._limit, ssl=self._ssl if self._ssl is not None else True),
                timeout=self.session_timeout,
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def send(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
        timeout: float | None = None,
    ) -> Obj:
        """One request; the JSON object answered (non-objects as ``{"raw": ...}``), or ApiError.

        ``timeout`` (seconds, whole request) overrides the session's. Connection errors and
        timeouts propagate as aiohttp / ``TimeoutError`` exceptions.
        """
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type} if data is not None else {}
        extra: dict[str, Any] = {} if timeout is None else {"timeout": aiohttp.ClientTimeout(total=timeout)}
        async with self._sess().request(
            method, self.server + path, data=data, headers=headers, params=query_params(params), **extra
        ) as resp:
            payload = json_or_text(await resp.text())
            if resp.status >= 400:
                raise ApiError(resp.status, payload, method, path)
            return payload if isinstance(payload, dict) else {"raw": payload}
