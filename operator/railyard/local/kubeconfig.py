"""The kubeconfig ``railyard local up`` writes: one cluster, one token user, one context.

kubectl, kopf and the kubernetes client read it as is (``export KUBECONFIG=...``).
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import yaml

CONTEXT = "railyard-local"


def build_kubeconfig(server: str, token: str, *, ca_file: str | None = None, namespace: str = "default") -> dict[str, Any]:
    cluster: dict[str, Any] = {"server": server}
    if server.startswith("https"):
        if ca_file:
            cluster["certificate-authority-data"] = base64.b64encode(Path(ca_file).read_bytes()).decode()
        else:
            cluster["insecure-skip-tls-verify"] = True
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CONTEXT, "cluster": cluster}],
        "users": [{"name": CONTEXT, "user": {"token": token}}],
        "contexts": [{"name": CONTEXT, "context": {"cluster": CONTEXT, "user": CONTEXT, "namespace": namespace}}],
        "current-context": CONTEXT,
        "preferences": {},
    }


def write_kubeconfig(path: Path, server: str, token: str, *, ca_file: str | None = None) -> Path:
    """Write atomically with mode 0600 (it holds the token)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        yaml.safe_dump(build_kubeconfig(server, token, ca_file=ca_file), fh, sort_keys=False)
    os.replace(tmp, path)
    return path


def read_server(path: Path) -> str:
    """The server URL of the current context (for messages and status)."""
    doc = yaml.safe_load(path.read_text()) or {}
    current = doc.get("current-context")
    ctx: dict[str, Any] = next((c["context"] for c in doc.get("contexts") or [] if c.get("name") == current), {})
    cluster: dict[str, Any] = next((c["cluster"] for c in doc.get("clusters") or [] if c.get("name") == ctx.get("cluster")), {})
    return str(cluster.get("server", ""))
