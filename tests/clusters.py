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
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def running_local_cluster(state: Path, **shape: Any) -> Iterator[Any]:
    """Start a ``LocalCluster`` of ``shape`` (its keyword arguments) in ``state``; stop it after.

    In existing mode its nodes are deleted once it has stopped: the given API server is left with
    the nodes it had. Two clusters in one run of one server need their own ``node_prefix`` (and
    ``node_ip_offset``, so that their pods' addresses differ too).
    """
    from railyard_local.cluster import LocalCluster

    given = os.environ.get("RAILYARD_TEST_KUBECONFIG")
    if given:
        cluster = LocalCluster(state, kubeconfig=given, **shape)
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
