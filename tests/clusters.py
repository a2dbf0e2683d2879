"""The local cluster the integration tests run on, on whichever API server this run is given.

One rule for every folder that starts a :class:`railyard_local.cluster.LocalCluster`:
``RAILYARD_TEST_KUBECONFIG`` adds the cluster's simulated nodes and its node agent to that API
server (existing mode: the pods still run here, as local processes); ``KUBEBUILDER_ASSETS`` starts
envtest's kube-apiserver and etcd; otherwise the embedded server. What the node agent writes
(``log_dir``, the shared host paths under ``state_dir``) is here in every mode; what the embedded
API server stores is not, so tests read the former and never the latter.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: This test run's mark on the nodes it adds to a given API server. The server may be shared with
#: other runs (two at once, tests/shared_cluster.py) and other users: names that only this run
#: uses keep each run on its own nodes, and ``remove_nodes`` off the others'.
RUN_TAG = f"t{secrets.token_hex(3)}"
#: A folder the given API server reads container logs from (tests/shared_cluster.py's embedded
#: server, which serves pods/log from files and asks no node's kubelet endpoint, as kube-apiserver
#: would): the node agent of a cluster on it writes its logs there.
POD_LOG_DIR_ENV = "RAILYARD_TEST_POD_LOG_DIR"
#: This run's block of loopback addresses (all of 127/8 is lo): two runs' pods never share an address.
RUN_IP_OFFSET = 1024 * (1 + secrets.randbelow(15_000))


def given_kubeconfig() -> str | None:
    """The API server this run was given (``RAILYARD_TEST_KUBECONFIG``), or None: start one."""
    return os.environ.get("RAILYARD_TEST_KUBECONFIG") or None


def own_namespace(name: str) -> str:
    """A namespace this run uses by a fixed name: that name on a server of this run's own, made
    this run's (``RUN_TAG`` after it) on a given one, where another run may use the same name."""
    return f"{name}-{RUN_TAG}" if given_kubeconfig() else name


def own_group(group: str) -> str:
    """An API group this run registers (a CRD's): ``group`` on a server of this run's own; on a given
    one this run's, so that a run deleting its CRD never takes it from another run beside it."""
    return f"{RUN_TAG}.{group}" if given_kubeconfig() else group


def own_shape(**shape: Any) -> dict[str, Any]:
    """``shape`` (``LocalCluster``'s keyword arguments) as it is on a server of this run's own; on a
    given one with this run's ``RUN_TAG`` before its ``node_prefix`` and its addresses in this
    run's block, so that two runs at once on one server never take each other's nodes."""
    if given_kubeconfig():
        shape["node_prefix"] = f"{RUN_TAG}-{shape.get('node_prefix') or 'node-'}"
        shape["node_ip_offset"] = RUN_IP_OFFSET + int(shape.get("node_ip_offset") or 0)
    return shape


@contextlib.contextmanager
def running_local_cluster(state: Path, **shape: Any) -> Iterator[Any]:
    """Start a ``LocalCluster`` of ``shape`` (its keyword arguments) in ``state``; stop it after.

    In existing mode its nodes are deleted once it has stopped: the given API server is left with
    the nodes it had. Two clusters in one run of one server need their own ``node_prefix`` (and
    ``node_ip_offset``, so that their pods' addresses differ too); on a given server both are
    made this run's own (``RUN_TAG``, ``RUN_IP_OFFSET``), so that runs beside it keep apart. Tests
    take node names and addresses from ``cluster.node_specs``, never spell them out.
    """
    from railyard_local.cluster import LocalCluster

    given = given_kubeconfig()
    if given:
        served = os.environ.get(POD_LOG_DIR_ENV)
        if served:  # the agent's log_dir (existing mode: <state>/pods) is where the server reads
            state.mkdir(parents=True, exist_ok=True)
            (state / "pods").symlink_to(Path(served).absolute(), target_is_directory=True)
        cluster = LocalCluster(state, kubeconfig=given, **own_shape(**shape))
    elif os.environ.get("KUBEBUILDER_ASSETS"):
        cluster = LocalCluster(state, mode="envtest", **shape)
    else:
        cluster = LocalCluster(state, mode="embedded", **shape)
    cluster.start(timeout=120)
    try:
        yield cluster
    finally:
        cluster.stop()
        if cluster.mode == "existing":
            cluster.remove_nodes()
