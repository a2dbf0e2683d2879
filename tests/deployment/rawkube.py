"""Plain HTTP against an API server with a kubeconfig's credentials (no client-side models, so
objects travel exactly as kubectl and Helm would send them)."""

from __future__ import annotations

import json
from typing import Any


def request(api: Any, method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
    """(status, JSON body) of one request through ``api`` (a kubernetes.client.ApiClient)."""
    headers = {"Accept": "application/json"}
    auth = api.configuration.auth_settings().get("BearerToken")
    if auth:
        headers["Authorization"] = auth["value"]
    data = None
    if body is not None:
        headers["Content-Type"] = "application/json"
        data = json.dumps(body).encode()
    resp = api.rest_client.pool_manager.request(method, api.configuration.host + path, headers=headers, body=data)
    try:
        payload = json.loads(resp.data) if resp.data else {}
    except ValueError:
        payload = {"raw": resp.data.decode(errors="replace")}
    return int(resp.status), payload if isinstance(payload, dict) else {"items": payload}
