"""A real `helm install` / `helm uninstall` of the chart (Helm's Go SDK through helm-python-sdk)
against an API server: the one named by RAILYARD_TEST_KUBECONFIG, envtest's kube-apiserver when
KUBEBUILDER_ASSETS is set, otherwise our embedded API server (railyard_local.apiserver)."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helm_python.chart import Chart
from helm_python.config import Config
from helm_python.errors import HelmError

from . import rawkube
from .chart import CHART, render_objects

pytestmark = pytest.mark.cluster

RELEASE = "railyard-it"
NAMESPACE = "railyard-it"


@pytest.fixture(scope="module")
def kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """(kubeconfig, which server) for a server of our own: Helm writes cluster-scoped objects."""
    if os.environ.get("RAILYARD_TEST_KUBECONFIG"):
        yield Path(os.environ["RAILYARD_TEST_KUBECONFIG"]), "given"
        return
    from railyard_local.apiserver.envtest import assets_dir, start_envtest

    work = tmp_path_factory.mktemp("helm-it")
    assets = assets_dir()
    if assets is not None:
        env = start_envtest(assets, work / "envtest")
        try:
            yield env.kubeconfig, "envtest"
        finally:
            env.stop()
        return
    from railyard_local.apiserver.process import start_server_process

    srv = start_server_process(work / "api")
    try:
        yield srv.write_kubeconfig(work / "kubeconfig"), "embedded"
    finally:
        srv.stop()


def _served(api: Any) -> dict[tuple[str, str], tuple[str, bool]]:
    """(apiVersion, kind) -> (plural, namespaced) from discovery."""
    served: dict[tuple[str, str], tuple[str, bool]] = {}
    paths = ["/api/v1"]
    for g in _get(api, "/apis").get("groups", []):
        for v in g.get("versions", []):
            paths.append(f"/apis/{v['groupVersion']}")
    for p in paths:
        doc = _get(api, p)
        gv = doc.get("groupVersion", "v1")
        for r in doc.get("resources", []):
            if "/" not in r["name"]:
                served[(gv, r["kind"])] = (r["name"], bool(r.get("namespaced")))
    return served


def _get(api: Any, path: str) -> dict[str, Any]:
    status, body = rawkube.request(api, "GET", path)
    return body if status == 200 else {}


def _object_path(obj: dict[str, Any], served: dict[tuple[str, str], tuple[str, bool]]) -> str:
    plural, namespaced = served[(obj["apiVersion"], obj["kind"])]
    base = "/api/v1" if obj["apiVersion"] == "v1" else f"/apis/{obj['apiVersion']}"
    ns = obj["metadata"].get("namespace") or NAMESPACE
    return f"{base}/namespaces/{ns}/{plural}/{obj['metadata']['name']}" if namespaced else f"{base}/{plural}/{obj['metadata']['name']}"


def _exists(api: Any, path: str) -> bool:
    return rawkube.request(api, "GET", path)[0] == 200


def _wait_gone(api: Any, paths: list[str], timeout: float = 30.0) -> list[str]:
    deadline = time.monotonic() + timeout
    left = paths
    while left and time.monotonic() < deadline:
        left = [p for p in left if _exists(api, p)]
        if left:
            time.sleep(0.2)
    return left


@pytest.mark.parametrize(
    "values",
    [{}, {"replicas": 2, "watchNamespaces": [NAMESPACE], "grafanaDashboard": {"enabled": True}}],
    ids=["default", "two-replicas-namespaced"],
)
def test_helm_install_creates_the_objects_and_uninstall_removes_them(kubeconfig: tuple[Path, str], values: dict[str, Any]) -> None:
    from kubernetes import config as k8s_config

    path, which = kubeconfig
    api = k8s_config.new_client_from_config(config_file=str(path))
    objs = render_objects(values, name=RELEASE, namespace=NAMESPACE)
    served = _served(api)
    missing = sorted({f"{o['kind']} ({o['apiVersion']})" for o in objs if (o["apiVersion"], o["kind"]) not in served}
                     - {"ClusterKopfPeering (kopf.dev/v1)"})  # its CRD comes with the chart's crds/
    helm = Config(kubeconfig_path=str(path), namespace=NAMESPACE)
    chart = Chart.load(CHART)
    try:
        try:
            release = helm.install(chart, RELEASE, values, namespace=NAMESPACE, create_namespace=True, timeout=120)
        except HelmError as exc:
            text = str(exc)
            if not missing:
                raise
            # Helm got through discovery, namespace and CRD install; it stops exactly at the kinds
            # this server does not serve.
            named = set(re.findall(r'no matches for kind "(\w+)" in version "([\w./]+)"', text))
            assert {f"{k} ({v})" for k, v in named} == set(missing), text
            assert _exists(api, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/trainingjobs.railyard.dev")
            helm.uninstall(RELEASE, ignore_not_found=True, timeout=60)
            pytest.xfail(f"the {which} API server does not serve {', '.join(missing)}, which the chart needs; "
                         "Helm's install stops there (set RAILYARD_TEST_KUBECONFIG or KUBEBUILDER_ASSETS for a full run)")
        assert release["name"] == RELEASE
        served = _served(api)  # the chart's CRDs are served now
        paths = [_object_path(o, served) for o in objs]
        assert [p for p in paths if not _exists(api, p)] == []
        # Helm keeps its release record in a Secret of the release namespace
        assert _exists(api, f"/api/v1/namespaces/{NAMESPACE}/secrets/sh.helm.release.v1.{RELEASE}.v1")
        helm.uninstall(RELEASE, timeout=120)
        assert _wait_gone(api, [*paths, f"/api/v1/namespaces/{NAMESPACE}/secrets/sh.helm.release.v1.{RELEASE}.v1"]) == []
        # Helm never deletes what it installed from crds/ (documented Helm behaviour)
        assert _exists(api, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/trainingjobs.railyard.dev")
    finally:
        chart.close()
        helm.close()
        api.close()
