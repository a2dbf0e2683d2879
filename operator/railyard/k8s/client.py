"""The operator's Kubernetes API client: plain async HTTP, retries for what is transient.

The generated ``kubernetes`` client is synchronous; a 1,000-pod gang must be created at
hundreds of pods per second, so the operator speaks HTTP with aiohttp over one pooled session
and reads credentials through the ``kubernetes`` package's kubeconfig / in-cluster loaders (so
token, client certificate and exec-plugin setups all work). 429, 5xx and connection errors are
retried with exponential backoff and jitter; 409 is returned to the caller, who knows whether
it means "already exists" (fine: names are deterministic) or "conflict" (re-read and retry).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import ssl
from collections.abc import Mapping
from typing import Any

import aiohttp

log = logging.getLogger(__name__)
Obj = dict[str, Any]
MERGE = "application/merge-patch+json"
TRANSIENT = frozenset({429, 500, 502, 503, 504})


class ApiError(Exception):
    """A non-2xx answer; ``status`` is the HTTP code, ``reason`` the Status reason if given."""

    def __init__(self, status: int, body: Any, method: str, path: str) -> None:
        self.status = status
        self.body = body
        self.reason = str(body.get("reason", "")) if isinstance(body, dict) else ""
        message = body.get("message") if isinstance(body, dict) else str(body)[:300]
        super().__init__(f"{method} {path}: {status} {message}")


class Kube:
    """One aiohttp session against one API server."""

    def __init__(
        self,
        server: str,
        *,
        token: str | None = None,
        ssl_context: ssl.SSLContext | bool | None = None,
        limit: int = 64,
        retries: int = 6,
        backoff_s: float = 0.1,
    ) -> None:
        self.server = server.rstrip("/")
        self._headers = {"Accept": "application/json"}
        if token:
            self._headers["Authorization"] = token if token.lower().startswith("bearer ") else f"Bearer {token}"
        self._ssl = ssl_context
        self._limit = limit
        self._retries = retries
        self._backoff = backoff_s
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def from_config(cls, kubeconfig: str | None = None, context: str | None = None, **kw: Any) -> Kube:
        """From a kubeconfig (``None``: $KUBECONFIG or ~/.kube/config), else in-cluster."""
        from kubernetes import client as k8s_client
        from kubernetes import config as k8s_config

        cfg = k8s_client.Configuration()
        try:
            k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, context=context, client_configuration=cfg)
        except k8s_config.ConfigException:
            if kubeconfig:
                raise
            k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        token = (cfg.api_key or {}).get("authorization") or (cfg.api_key or {}).get("BearerToken")
        ctx: ssl.SSLContext | bool | None = None
        if str(cfg.host).startswith("https"):
            if not cfg.verify_ssl:
                ctx = False
            else:
                ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert) if cfg.ssl_ca_cert else ssl.create_default_context()
                if cfg.cert_file:
                    ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
        return cls(str(cfg.host), token=token, ssl_context=ctx, **kw)

    def _sess(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                headers=self._headers,
                connector=aiohttp.TCPConnector(limit=self._limit, ssl=self._ssl if self._ssl is not None else True),
                timeout=aiohttp.ClientTimeout(total=60, sock_connect=10),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> Obj:
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type} if data is not None else {}
        query = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in (params or {}).items() if v is not None}
        attempt = 0
        while True:
            try:
                async with self._sess().request(method, self.server + path, data=data, headers=headers, params=query) as resp:
                    text = await resp.text()
                    try:
                        payload: Any = json.loads(text) if text else {}
                    except ValueError:
                        payload = text
                    if resp.status < 400:
                        return payload if isinstance(payload, dict) else {"raw": payload}
                    err = ApiError(resp.status, payload, method, path)
                    if resp.status not in TRANSIENT:
                        raise err
            except (aiohttp.ClientConnectionError, TimeoutError) as exc:
                err = ApiError(0, str(exc), method, path)
            attempt += 1
            if attempt > self._retries:
                raise err
            delay = min(self._backoff * 2 ** (attempt - 1), 5.0) * (0.5 + random.random())
            log.debug("retrying %s %s in %.2fs: %s", method, path, delay, err)
            await asyncio.sleep(delay)

    async def get(self, path: str) -> Obj | None:
        """The object, or None when it does not exist."""
        try:
            return await self.request("GET", path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def list(self, path: str, **params: Any) -> list[Obj]:
        items: list[Obj] = list((await self.request("GET", path, params=params)).get("items") or [])
        return items

    async def create(self, path: str, body: Obj) -> Obj | None:
        """Create; None when an object of that name already exists (our names are deterministic)."""
        try:
            return await self.request("POST", path, body=body)
        except ApiError as exc:
            if exc.status == 409:
                return None
            raise

    async def patch(self, path: str, body: Any, content_type: str = MERGE) -> Obj | None:
        """Merge-patch; None when the object is gone."""
        try:
            return await self.request("PATCH", path, body=body, content_type=content_type)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def delete(self, path: str, *, grace_seconds: int | None = None, propagation: str | None = None) -> bool:
        """Delete; False when it was already gone."""
        opts: Obj = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if grace_seconds is not None:
            opts["gracePeriodSeconds"] = grace_seconds
        if propagation:
            opts["propagationPolicy"] = propagation
        try:
            await self.request("DELETE", path, body=opts)
            return True
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise


# paths ----------------------------------------------------------------------------------------


def core_path(plural: str, namespace: str | None = None, name: str | None = None, sub: str | None = None) -> str:
    p = "/api/v1"
    if namespace is not None:
        p += f"/namespaces/{namespace}"
    p += f"/{plural}"
    if name is not None:
        p += f"/{name}"
    if sub:
        p += f"/{sub}"
    return p


def custom_path(group: str, version: str, plural: str, namespace: str, name: str | None = None, sub: str | None = None) -> str:
    p = f"/apis/{group}/{version}/namespaces/{namespace}/{plural}"
    if name is not None:
        p += f"/{name}"
    if sub:
        p += f"/{sub}"
    return p
