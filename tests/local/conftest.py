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


@pytest.fixture(scope="session")
def core(api_client: k8s.ApiClient) -> k8s.CoreV1Api:
    return k8s.CoreV1Api(api_client)


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
