"""A kubeconfig for the embedded server that kubectl and the kubernetes client use as is."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import yaml


def build_kubeconfig(url: str, token: str, *, ca_file: Path | str | None = None, name: str = "railyard-local",
                     namespace: str = "default") -> dict[str, object]:
    cluster: dict[str, str] = {"server": url}
    if ca_file is not None:
        cluster["certificate-authority-data"] = base64.b64encode(Path(ca_file).read_bytes()).decode()
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": cluster}],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name, "namespace": namespace}}],
        "current-context": name,
        "preferences": {},
    }


def write_kubeconfig(path: Path | str, url: str, token: str, *, ca_file: Path | str | None = None,
                     name: str = "railyard-local") -> Path:
    """Write the kubeconfig readable only by the user (it holds the token)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(p.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(build_kubeconfig(url, token, ca_file=ca_file, name=name), f, sort_keys=False)
    tmp.replace(p)
    return p
