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
    """One running :class:`railyard_local.cluster.LocalCluster` for the whole session.

    Three simulated nodes (``node-0..2``, 2 GPUs each, ``spine=1,leaf=2``) in a temporary state
    dir. Against a real API server when asked: ``RAILYARD_TEST_KUBECONFIG`` adds the nodes and
    the node agent to that cluster (existing mode); ``KUBEBUILDER_ASSETS`` starts envtest's
    kube-apiserver + etcd. Otherwise the embedded server (tests/clusters.py). Use
    ``local_cluster.kubeconfig``.
    """
    from tests.clusters import running_local_cluster

    shape = {"nodes": 3, "gpus_per_node": 2, "topology": "spine=1,leaf=2", "lease_interval": 2.0}
    with running_local_cluster(tmp_path_factory.mktemp("railyard-local"), **shape) as cluster:
        yield cluster


# --- the order files run in ------------------------------------------------------------------
#: Folders whose files run longest (a minute or two each: the demo, the end-to-end system tests,
#: the benchmarks' smoke runs, the multi-process trainer tests) run first, so that a run stopped
#: early (``-x``, a timeout) has tried the tests most likely to find a fault, and a parallel runner
#: (pytest-xdist's ``--dist loadfile --no-loadscope-reorder``) ends on the short ones.
LONGEST_FIRST = ("demo", "system", "bench", "trainer", "health", "checkpoint", "observability", "local", "operator")


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    def folder_rank(item: pytest.Item) -> int:
        parts = item.nodeid.split("/")
        folder = parts[1] if len(parts) > 2 and parts[0] == "tests" else ""
        return LONGEST_FIRST.index(folder) if folder in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=folder_rank)  # stable: each file's tests stay together and in their order
