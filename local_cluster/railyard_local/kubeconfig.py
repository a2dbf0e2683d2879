"""The kubeconfig ``railyard local up`` writes: one cluster, one token user, one context.

kubectl, kopf and the kubernetes client read it as is (``export KUBECONFIG=...``). The embedded
API server's helpers (:mod:`railyard_local.apiserver.kubeconfig`) write the same file through here.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import yaml

CONTEXT = "railyard-local"


def build_kubeconfig(
    server: str, token: str, *, ca_file: Path | str | None = None, name: str = CONTEXT, namespace: str = "default"
) -> dict[str, Any]:
    cluster: dict[str, Any] = {"server": server}
    if server.startswith("https"):
        if ca_file:
            cluster["certificate-authority-data"] = base64.b64encode(Path(ca_file).read_bytes()).decode()
        else:
            cluster["insecure-skip-tls-verify"] = True
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": cluster}],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name, "namespace": namespace}}],
        "current-context": name,
        "preferences": {},
    }


def write_kubeconfig(
    path: Path | str, server: str, token: str, *, ca_file: Path | str | None = None, name: str = CONTEXT
) -> Path:
    """Write atomically with mode 0600 (it holds the token)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        yaml.safe_dump(build_kubeconfig(server, token, ca_file=ca_file, name=name), fh, sort_keys=False)
    os.replace(tmp, path)
    return path



def kubeconfig_ca(path: Path | str, out: Path) -> Path | None:
    """The CA certificate of the kubeconfig's current cluster, as a file (``certificate-authority``
    as is, ``certificate-authority-data`` written to ``out``); None when it names none."""
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return None
    contexts = {c.get("name"): c.get("context") or {} for c in doc.get("contexts") or []}
    name = contexts.get(doc.get("current-context"), {}).get("cluster")
    clusters = {c.get("name"): c.get("cluster") or {} for c in doc.get("clusters") or []}
    cluster = clusters.get(name) or (next(iter(clusters.values())) if len(clusters) == 1 else {})
    if cluster.get("certificate-authority-data"):
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
        return out
    if cluster.get("certificate-authority"):
        return (path.parent / str(cluster["certificate-authority"])).absolute()
    return None
