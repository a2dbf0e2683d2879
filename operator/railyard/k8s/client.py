"""The operator's Kubernetes API client: plain async HTTP, retries for what is transient.

The generated ``kubernetes`` client is synchronous; a 1,000-pod gang must be created at
hundreds of pods per second, so the operator speaks HTTP with aiohttp over one pooled session;
credentials come from the kubeconfig or the pod (``railyard.kubecreds``: token, token file,
client certificate, exec plugin) and are renewed when they expire or the server answers 401
(``railyard.kubeclient``). 429, 5xx and connection errors are
retried with exponential backoff and jitter; 409 is returned to the caller, who knows whether
it means "already exists" (fine: names are deterministic) or "conflict" (re-read and retry).
"""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp

from railyard.kubeclient import MERGE, STRATEGIC, ApiError, BaseClient, Obj, load_connection
from railyard.kubecreds import Credential, Credentials

__all__ = ["MERGE", "STRATEGIC", "TRANSIENT", "ApiError", "Kube", "Obj", "core_path", "custom_path"]

log = logging.getLogger(__name__)
TRANSIENT = frozenset({429, 500, 502, 503, 504})


class Kube(BaseClient):
    """One aiohttp session against one API server, retrying what is transient."""

    session_timeout = aiohttp.ClientTimeout(total=60, sock_connect=10)

    def __init__(
        self,
        server: str,
        *,
        token: str | None = None,
        ssl_context: ssl.SSLContext | bool | None = None,
        limit: int = 64,
        retries: int = 6,
        backoff_s: float = 0.1,
        credentials: Credentials | None = None,
        tls: Callable[[Credential | None], ssl.SSLContext | bool | None] | None = None,
    ) -> None:
        super().__init__(server, token=token, ssl_context=ssl_context, limit=limit, credentials=credentials, tls=tls)
        self._retries = retries
        self._backoff = backoff_s

    @classmethod
    def from_config(cls, kubeconfig: str | None = None, context: str | None = None, **kw: Any) -> Kube:
        """From a kubeconfig (``None``: $KUBECONFIG or ~/.kube/config), else in-cluster."""
        return cls.for_connection(load_connection(kubeconfig, context), **kw)

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
        answer: bool = True,
    ) -> Obj:
        """``answer=False``: ``{}`` instead of the object answered (BaseClient.send)."""
        attempt = 0
        while True:
            try:
                return await self.send(
                    method, path, body=body, params=params, content_type=content_type, answer=answer
                )
            except ApiError as exc:
                if exc.status not in TRANSIENT:
                    raise
                err = exc
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

    async def create(self, path: str, body: Obj, *, answer: bool = True) -> Obj | None:
        """Create; None when an object of that name already exists (our names are deterministic).
        ``answer=False``: ``{}`` for a created object, its body not decoded."""
        try:
            return await self.request("POST", path, body=body, answer=answer)
        except ApiError as exc:
            if exc.status == 409:
                return None
            raise

    async def patch(self, path: str, body: Any, content_type: str = MERGE, *, answer: bool = True) -> Obj | None:
        """Merge-patch; None when the object is gone. ``answer=False``: ``{}`` when patched, the
        object answered not decoded."""
        try:
            return await self.request("PATCH", path, body=body, content_type=content_type, answer=answer)
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


def custom_path(
    group: str, version: str, plural: str, namespace: str | None, name: str | None = None, sub: str | None = None
) -> str:
    """A resource path of an API group; ``namespace`` None: a cluster-scoped resource."""
    p = (
        f"/apis/{group}/{version}/namespaces/{namespace}/{plural}"
        if namespace is not None
        else f"/apis/{group}/{version}/{plural}"
    )
    if name is not None:
        p += f"/{name}"
    if sub:
        p += f"/{sub}"
    return p
