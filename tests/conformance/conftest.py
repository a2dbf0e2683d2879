"""The API server the conformance tests are given.

- default: the embedded server (``python -m railyard_local.apiserver``) on a temp state dir;
- ``KUBEBUILDER_ASSETS`` with kube-apiserver and etcd: those real binaries on loopback (envtest);
- ``RAILYARD_TEST_KUBECONFIG`` (or ``KUBECONFIG`` with ``RAILYARD_TEST_USE_KUBECONFIG=1``): that
  cluster, each test in a fresh namespace.

Tests are written against the documented behaviour of kube-apiserver so that they pass on all
three. Behaviour a bare kube-apiserver lacks (no controller manager: garbage collection,
namespace cleanup) is skipped with ``needs_controllers`` in envtest mode.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from tests.clusters import own_group
from tests.waiting import wait_until

from railyard_local.apiserver.envtest import EnvtestCluster, assets_dir, start_envtest
from railyard_local.apiserver.process import ServerProcess, start_server_process

CRD_GROUP = own_group("conformance.railyard.io")
#: The scheduler of every pod these tests make: none serves it, so that a pod stays unbound until
#: a test binds it, even on a cluster whose scheduler binds every pod it can (as kube-scheduler).
UNSERVED_SCHEDULER = "railyard-conformance-nobody"
#: A node no cluster has: pods bound to it are run by no node agent.
ABSENT_NODE = "railyard-conformance-absent-node"


@dataclass
class Cluster:
    mode: str
    kubeconfig: Path
    api: client.ApiClient
    process: ServerProcess | None = None
    envtest: EnvtestCluster | None = None

    @property
    def embedded(self) -> bool:
        return self.mode == "embedded"

    @property
    def has_controllers(self) -> bool:
        return self.mode != "envtest"

    def raw(self, method: str, path: str, body: Any = None, *, content_type: str = "application/json",
            accept: str = "application/json", query: dict[str, str] | None = None,
            auth: bool | str = True, preload: bool = True) -> tuple[int, dict[str, str], Any]:
        """One HTTP request with the cluster's credentials; returns (status, headers, parsed body).

        ``auth=False``: none of the kubeconfig's credentials, neither its token nor its client
        certificate; ``auth="TOKEN"``: that bearer token and nothing else."""
        import urllib.parse

        cfg = self.api.configuration
        url = cfg.host + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        headers = {"Accept": accept}
        pool = self.api.rest_client.pool_manager
        if auth is True:
            token = cfg.api_key.get("authorization") or cfg.api_key.get("BearerToken")
            if token:
                headers["Authorization"] = token if token.startswith("Bearer") else f"Bearer {token}"
        else:
            pool = self._pool_without_credentials()
            if auth:
                headers["Authorization"] = f"Bearer {auth}"
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
        resp = pool.request(method, url, body=data, headers=headers, preload_content=preload, timeout=30)
        if not preload:
            return resp.status, dict(resp.headers), resp
        text = resp.data
        try:
            parsed = json.loads(text) if text else None
        except ValueError:
            parsed = text
        return resp.status, dict(resp.headers), parsed

    def _pool_without_credentials(self) -> Any:
        """A connection pool that trusts the server as the kubeconfig says but presents no
        client certificate (a server authenticates a request by certificate before token)."""
        import copy

        from kubernetes.client import rest

        anonymous = copy.copy(self.api.configuration)
        anonymous.cert_file = anonymous.key_file = None
        anonymous.api_key = {}
        anonymous.refresh_api_key_hook = None
        return rest.RESTClientObject(anonymous).pool_manager


def _api_client(kubeconfig: Path) -> client.ApiClient:
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    return client.ApiClient(cfg)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    explicit = os.environ.get("RAILYARD_TEST_KUBECONFIG")
    if not explicit and os.environ.get("RAILYARD_TEST_USE_KUBECONFIG") == "1":
        explicit = os.environ.get("KUBECONFIG")
    if explicit:
        kc = Path(explicit)
        yield Cluster("kubeconfig", kc, _api_client(kc))
        return
    assets = assets_dir()
    if assets is not None:
        env = start_envtest(assets, tmp_path_factory.mktemp("envtest"))
        try:
            yield Cluster("envtest", env.kubeconfig, _api_client(env.kubeconfig), envtest=env)
        finally:
            env.stop()
        return
    state = tmp_path_factory.mktemp("apiserver-state")
    proc = start_server_process(state, token=secrets.token_hex(16))
    kc = proc.write_kubeconfig(state / "kubeconfig")
    try:
        yield Cluster("embedded", kc, _api_client(kc), process=proc)
    finally:
        proc.stop()


@pytest.fixture
def core(cluster: Cluster) -> client.CoreV1Api:
    return client.CoreV1Api(cluster.api)


@pytest.fixture
def custom(cluster: Cluster) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(cluster.api)


def gone(fn: Callable[[], Any]) -> bool:
    try:
        fn()
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


@pytest.fixture
def ns(core: client.CoreV1Api) -> Iterator[str]:
    name = f"conf-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    yield name
    with contextlib.suppress(ApiException):
        core.delete_namespace(name)


@pytest.fixture
def needs_controllers(cluster: Cluster) -> None:
    if not cluster.has_controllers:
        pytest.skip("a bare kube-apiserver (envtest) runs no garbage collector or namespace controller")


def wait_for_default_service_account(cluster: Cluster, core: client.CoreV1Api, namespace: str) -> None:
    """Before pods go into a new namespace: its ``default`` ServiceAccount, which the controller
    manager makes (ServiceAccount admission refuses pods until then). A bare kube-apiserver
    (envtest) makes none, and runs without that admission plugin, so there is nothing to wait for."""
    if cluster.has_controllers:
        wait_until(lambda: not gone(lambda: core.read_namespaced_service_account("default", namespace)),
                   timeout=15,
                   message=f"the default ServiceAccount of {namespace}",
                   interval=0.05)


@pytest.fixture
def embedded_only(cluster: Cluster) -> None:
    if not cluster.embedded:
        pytest.skip("checks the embedded server's own contract (state dir, event window)")


def widget_crd(group: str = CRD_GROUP) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wdg"]},
            "versions": [{
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": [
                    {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"},
                    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                    {"name": "Ready", "type": "string",
                     "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"},
                ],
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "description": "A Widget used by the conformance tests.",
                    "properties": {
                        "spec": {
                            "type": "object",
                            "description": "Desired widget.",
                            "required": ["replicas"],
                            "x-kubernetes-validations": [
                                {"rule": "self.replicas <= self.maxReplicas",
                                 "message": "replicas must not exceed maxReplicas"},
                                {"rule": "self.maxReplicas >= oldSelf.maxReplicas",
                                 "message": "maxReplicas may not shrink"},
                            ],
                            "properties": {
                                "replicas": {"type": "integer", "minimum": 1, "description": "How many."},
                                "maxReplicas": {"type": "integer", "default": 10, "description": "Upper bound."},
                                "mode": {"type": "string", "enum": ["fast", "slow"], "default": "fast",
                                         "description": "Speed."},
                                "name": {"type": "string", "maxLength": 8, "pattern": "^[a-z]+$"},
                                "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                                "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
                            },
                        },
                        "status": {
                            "type": "object",
                            "properties": {
                                "phase": {"type": "string"},
                                "conditions": {"type": "array", "items": {
                                    "type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                            },
                        },
                    },
                }},
            }],
        },
    }


@pytest.fixture(scope="session")
def widgets(cluster: Cluster) -> Iterator[dict[str, str]]:
    """The Widget CRD, registered for the session; yields group/version/plural."""
    ext = client.ApiextensionsV1Api(cluster.api)
    body = widget_crd()
    try:
        ext.create_custom_resource_definition(body)
    except ApiException as exc:
        if exc.status != 409:
            raise

    def established() -> bool:
        crd = ext.read_custom_resource_definition(body["metadata"]["name"])
        conds = (crd.status.conditions or []) if crd.status else []
        if not any(c.type == "Established" and c.status == "True" for c in conds):
            return False
        status, _, _ = cluster.raw("GET", f"/apis/{CRD_GROUP}/v1")
        return status == 200

    wait_until(established, timeout=15, message="the Widget CRD to be established and served", interval=0.05)
    yield {"group": CRD_GROUP, "version": "v1", "plural": "widgets"}
    with contextlib.suppress(ApiException):
        ext.delete_custom_resource_definition(body["metadata"]["name"])


def widget(name: str, **spec: Any) -> dict[str, Any]:
    spec.setdefault("replicas", 1)
    return {"apiVersion": f"{CRD_GROUP}/v1", "kind": "Widget", "metadata": {"name": name}, "spec": spec}


def pod(name: str, **extra: Any) -> dict[str, Any]:
    """A pod that no scheduler binds (``UNSERVED_SCHEDULER``); ``extra`` goes into its spec, but
    ``labels`` into its metadata."""
    body: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"schedulerName": UNSERVED_SCHEDULER,
                 "containers": [{"name": "main", "image": "busybox:1.36", "command": ["sleep", "3600"]}]},
    }
    for k, v in extra.items():
        if k == "labels":
            body["metadata"]["labels"] = v
        else:
            body["spec"][k] = v
    return body
