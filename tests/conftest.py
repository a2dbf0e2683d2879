"""Shared test configuration.

Markers (``--strict-markers``): ``torch`` (multi-process trainer tests), ``cluster`` (needs a
Kubernetes API: the embedded local cluster is started when none is given), ``e2e`` (needs a real
cluster: kind through pytest-kind, or ``RAILYARD_TEST_KUBECONFIG``; skipped otherwise), ``slow``.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")


# --- the local cluster (railyard/local) -------------------------------------------------------
import pytest


@pytest.fixture(scope="session")
def local_cluster(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """One running :class:`railyard.local.cluster.LocalCluster` for the whole session.

    Three simulated nodes (``node-0..2``, 2 GPUs each, ``spine=1,leaf=2``) in a temporary state
    dir. Against a real API server when asked: ``RAILYARD_TEST_KUBECONFIG`` adds the nodes and
    the node agent to that cluster (existing mode); ``KUBEBUILDER_ASSETS`` starts envtest's
    kube-apiserver + etcd. Otherwise the embedded server. Use ``local_cluster.kubeconfig``.
    """
    from railyard.local.cluster import LocalCluster

    state = tmp_path_factory.mktemp("railyard-local")
    shape = {"nodes": 3, "gpus_per_node": 2, "topology": "spine=1,leaf=2", "lease_interval": 2.0}
    if os.environ.get("RAILYARD_TEST_KUBECONFIG"):
        cluster = LocalCluster(state, kubeconfig=os.environ["RAILYARD_TEST_KUBECONFIG"], **shape)  # type: ignore[arg-type]
    elif os.environ.get("KUBEBUILDER_ASSETS"):
        cluster = LocalCluster(state, mode="envtest", **shape)  # type: ignore[arg-type]
    else:
        cluster = LocalCluster(state, mode="embedded", **shape)  # type: ignore[arg-type]
    cluster.start(timeout=120)
    try:
        yield cluster
    finally:
        cluster.stop()
