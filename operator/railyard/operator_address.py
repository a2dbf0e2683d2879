"""Where the local cluster's pods reach the operator, published next to the cluster's kubeconfig.

The local cluster's pods are processes on this machine: they reach an operator on its loopback,
never the in-cluster Service name an operator advertises by default (nothing resolves it here:
issue 35, an operator restarted by hand against the local cluster left its jobs blind). So
``railyard local up`` (embedded and envtest modes) picks the operator's port once (kept in
``cluster.json`` as ``operatorPort``) and writes ``<state>/operator.json`` beside
``<state>/kubeconfig``::

    {"host": "127.0.0.1", "port": 41234, "heartbeatUrl": "http://127.0.0.1:41234"}

``railyard operator run`` against that kubeconfig without ``--heartbeat-advertise-url`` serves
on that port and advertises that URL (commands/operator.py), as ``--with-operator`` does: an
operator started by hand, or restarted by hand under running pods, is where they look.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

FILE = "operator.json"
#: Pods of the local cluster are processes of this machine.
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True, slots=True)
class LocalOperatorAddress:
    host: str
    port: int
    #: The state dir that published it (for messages).
    where: Path

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def publish_operator_address(state_dir: Path, port: int) -> LocalOperatorAddress:
    address = LocalOperatorAddress(LOOPBACK, port, state_dir)
    path = state_dir / FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"host": address.host, "port": port, "heartbeatUrl": address.url}) + "\n")
    tmp.replace(path)
    return address


def unpublish_operator_address(state_dir: Path) -> None:
    (state_dir / FILE).unlink(missing_ok=True)


def read_operator_address(kubeconfig: Path) -> LocalOperatorAddress | None:
    """The address published beside ``kubeconfig`` (None: not a local cluster's kubeconfig, or
    an unreadable file)."""
    path = kubeconfig.parent / FILE
    try:
        data = json.loads(path.read_text())
        host, port = str(data["host"]), int(data["port"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not host or not 0 < port < 65536:
        return None
    return LocalOperatorAddress(host, port, kubeconfig.parent)


def find_operator_address(kubeconfig: str | None, env: Mapping[str, str] | None = None) -> LocalOperatorAddress | None:
    """The local cluster's address when the kubeconfig the operator uses (``--kubeconfig``, else
    the first file of ``$KUBECONFIG``, else ``~/.kube/config``) is a local cluster's."""
    env = os.environ if env is None else env
    if kubeconfig:
        path = Path(kubeconfig)
    elif env.get("KUBECONFIG"):
        first = next((p for p in env["KUBECONFIG"].split(os.pathsep) if p), "")
        if not first:
            return None
        path = Path(first)
    else:
        path = Path.home() / ".kube" / "config"
    return read_operator_address(path.expanduser())
