"""The core both of our async Kubernetes API clients share: credentials, session, one request.

The generated ``kubernetes`` client is synchronous and slow at hundreds of calls a second, so
the operator (:class:`railyard.k8s.client.Kube`, which adds retries) and the local cluster's
runtime (:class:`railyard_local.kube.KubeClient`, which adds watches) speak plain HTTP with
aiohttp over one pooled session. Credentials come from :mod:`railyard.kubecreds` (kubeconfig or
in-cluster: token, token file, client certificate, CA, exec plugin) and are refreshed the way
client-go refreshes them: before a request when they have expired, and once after a 401.

This module belongs to neither side: it imports no ``railyard`` module but
:mod:`railyard.kubecreds` (which imports none).
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Callable, Mapping
from typing import Any, Self

import aiohttp

from railyard.kubecreds import Connection, Credential, Credentials, Static, load_connection

__all__ = [
    "JSON_PATCH", "MERGE", "STRATEGIC", "ApiError", "BaseClient", "Connection", "Obj", "json_or_text",
    "load_connection", "query_params",
]

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
    """One aiohttp session against one API server; :meth:`send` makes one request (and repeats it
    once when the server refused a credential that can be renewed)."""

    session_timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)

    def __init__(
        self,
        server: str,
        *,
        token: str | None = None,
        ssl_context: ssl.SSLContext | bool | None = None,
        limit: int = 64,
        credentials: Credentials | None = None,
        tls: Callable[[Credential | None], ssl.SSLContext | bool | None] | None = None,
    ) -> None:
        """``token``/``ssl_context``: fixed credentials. ``credentials``: ones that change (exec
        plugins, rotated token files), with ``tls`` making the TLS settings for a credential's
        client certificate (``Connection.ssl_context_for``)."""
        self.server = server.rstrip("/")
        self._headers = {"Accept": "application/json"}
        self._credentials: Credentials = credentials if credentials is not None else Static(Credential(token=token))
        self._ssl = ssl_context
        self._tls = tls
        self._limit = limit
        self._session: aiohttp.ClientSession | None = None
        self._session_cert: str | None = None

    @classmethod
    def for_connection(cls, conn: Connection, **kw: Any) -> Self:
        """A client of ``conn``'s server, with its (refreshing) credentials."""
        return cls(conn.server, ssl_context=conn.ssl_context, credentials=conn.credentials,
                   tls=conn.ssl_context_for, **kw)

    def _sess(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                headers=self._headers,
                connector=aiohttp.TCPConnector(limit=self._limit, ssl=self._ssl if self._ssl is not None else True),
                timeout=self.session_timeout,
            )
        return self._session

    async def _authorize(self) -> Credential:
        """The current credential, set on the session (so streams opened with ``_sess()`` carry
        it too); a new client certificate gets a new session."""
        cred = await self._credentials.current()
        if cred.cert_file != self._session_cert and self._tls is not None:
            self._ssl = self._tls(cred)
            self._session_cert = cred.cert_file
            if self._session is not None:
                await self._session.close()
                self._session = None
        auth = cred.authorization
        if auth:
            self._headers["Authorization"] = auth
        else:
            self._headers.pop("Authorization", None)
        sess = self._sess()
        if auth:
            sess.headers["Authorization"] = auth
        else:
            sess.headers.pop("Authorization", None)
        return cred

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
        answer: bool = True,
    ) -> Obj:
        """One request; the JSON object answered (non-objects as ``{"raw": ...}``), or ApiError.

        ``timeout`` (seconds, whole request) overrides the session's. A 401 to a credential that
        can be renewed (an exec plugin's, a rotated token file's) is retried once with a fresh
        one. Connection errors and timeouts propagate as aiohttp / ``TimeoutError`` exceptions.
        ``answer=False``: a success returns ``{}`` without decoding the body (the object a create
        or patch echoes, ~11 kB for a gang's pod: decoding it was ~9% of the operator's CPU while
        a gang started, issue 46); a refusal is decoded as ever.
        """
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type} if data is not None else {}
        extra: dict[str, Any] = {} if timeout is None else {"timeout": aiohttp.ClientTimeout(total=timeout)}
        for attempt in range(2):
            cred = await self._authorize()
            async with self._sess().request(
                method, self.server + path, data=data, headers=headers, params=query_params(params), **extra
            ) as resp:
                if not answer and resp.status < 400:
                    await resp.read()  # the whole body read: the connection goes back to the pool
                    return {}
                payload = json_or_text(await resp.text())
                if resp.status == 401 and attempt == 0 and self._credentials.invalidate(cred):
                    continue
                if resp.status >= 400:
                    raise ApiError(resp.status, payload, method, path)
                return payload if isinstance(payload, dict) else {"raw": payload}
        raise AssertionError("unreachable")  # pragma: no cover
