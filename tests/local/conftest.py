"""Helpers for the local cluster's integration tests (the cluster itself: root conftest)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from tests.waiting import wait_until


@pytest.fixture(scope="session")
def api_client(local_cluster: Any) -> Iterator[k8s.ApiClient]:
    api = k8s_config.new_client_from_config(config_file=str(local_cluster.kubeconfig))
    yield api
    api.close()


class OwnNodesCoreV1Api(k8s.CoreV1Api):
    """The core API, whose pods go only to the session cluster's nodes.

    On a given API server (``RAILYARD_TEST_KUBECONFIG``) other nodes are beside this session's,
    served by another agent or none, and the server's scheduler binds a pod to any of them that
    fits: a pod that is not pinned to a node (``spec.nodeName``) gets the cluster's
    ``nodeSelector`` as well as its own, so that this session's agent runs it and its files are
    here. On a server of the session's own every node has that label: nothing changes.
    """

    def __init__(self, api_client: k8s.ApiClient, selector: dict[str, str]) -> None:
        super().__init__(api_client)
        self.selector = selector

    def create_namespaced_pod(self, namespace: str, body: Any, **kwargs: Any) -> Any:
        if isinstance(body, dict) and not (body.get("spec") or {}).get("nodeName"):
            spec = dict(body.get("spec") or {})
            spec["nodeSelector"] = {**self.selector, **(spec.get("nodeSelector") or {})}
            body = {**body, "spec": spec}
        return super().create_namespaced_pod(namespace, body, **kwargs)


@pytest.fixture(scope="session")
def core(api_client: k8s.ApiClient, local_cluster: Any) -> k8s.CoreV1Api:
    return OwnNodesCoreV1Api(api_client, local_cluster.node_selector)


@pytest.fixture(scope="session")
def node_names(local_cluster: Any) -> list[str]:
    """The session cluster's nodes in order (``node-0..2`` on a server of the session's own; this
    run's names on a given one, tests/clusters.py)."""
    return [spec.name for spec in local_cluster.node_specs]


@pytest.fixture
def namespace(core: k8s.CoreV1Api) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    yield name
    try:
        for pod in core.list_namespaced_pod(name).items:
            core.delete_namespaced_pod(pod.metadata.name, name, grace_period_seconds=0)
        core.delete_namespace(name)
    except k8s.ApiException:
        pass


def phase_of(core: k8s.CoreV1Api, ns: str, name: str) -> str:
    return str(core.read_namespaced_pod(name, ns).status.phase)


def wait_phase(core: k8s.CoreV1Api, ns: str, name: str, phases: tuple[str, ...], timeout: float = 60.0) -> Any:
    def check() -> Any:
        pod = core.read_namespaced_pod(name, ns)
        return pod if pod.status.phase in phases else None

    return wait_until(check, timeout=timeout, message=f"pod {ns}/{name} in {phases}")
