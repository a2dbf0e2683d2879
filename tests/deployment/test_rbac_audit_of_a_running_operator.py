"""A second, dynamic RBAC check: run the operator through an auditing proxy, drive a TrainingJob
through gang creation, a pod failure and deletion, and check every request it made is one the
chart's ClusterRole allows (a request outside it would be a 403 on a real cluster)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.waiting import wait_until

from railyard.k8s.rbac import Permission, rules_to_permissions

from . import rawkube
from .auditproxy import audit_proxy, to_permission
from .chart import CHART, ROOT, find, render_objects

NS = "audit"


def _int_floats(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _int_floats(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_int_floats(x) for x in v]
    return int(v) if isinstance(v, float) and v.is_integer() else v


def test_request_mapping_follows_the_authorizer() -> None:
    assert to_permission("GET", "/api/v1/namespaces/a/pods", {"watch": "true"}) == Permission("", "pods", "watch")
    assert to_permission("GET", "/api/v1/nodes", {}) == Permission("", "nodes", "list")
    assert to_permission("PATCH", "/apis/railyard.dev/v1alpha1/namespaces/a/trainingjobs/j/status", {}) == Permission(
        "railyard.dev", "trainingjobs/status", "patch")
    assert to_permission("DELETE", "/api/v1/namespaces/a/pods", {}) == Permission("", "pods", "deletecollection")
    assert to_permission("GET", "/apis/apps/v1", {}) is None


@pytest.mark.cluster
@pytest.mark.slow
def test_every_request_of_a_running_operator_is_granted(tmp_path: Path) -> None:
    from kubernetes import config as k8s_config

    from railyard_local.apiserver.kubeconfig import write_kubeconfig
    from railyard_local.apiserver.process import start_server_process

    granted = rules_to_permissions(find(render_objects({}), "ClusterRole")["rules"])
    srv = start_server_process(tmp_path / "api")
    proc: subprocess.Popen[bytes] | None = None
    try:
        api = k8s_config.new_client_from_config(config_file=str(srv.write_kubeconfig(tmp_path / "admin")))
        crds = [*yaml.safe_load_all((ROOT / "crds" / "trainingjob.yaml").read_text()),
                *yaml.safe_load_all((CHART / "crds" / "kopf-peering.yaml").read_text())]
        for crd in crds:
            status, body = rawkube.request(api, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", _int_floats(crd))
            assert status == 201, body
        peering = find(render_objects({}), "ClusterKopfPeering")
        wait_until(lambda: rawkube.request(api, "POST", "/apis/kopf.dev/v1/clusterkopfpeerings", peering)[0] == 201,
                   timeout=10, interval=0.2, message="ClusterKopfPeering created")
        for i in range(4):
            node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"n{i}", "labels": {
                "railyard.dev/spine": "s0", "railyard.dev/leaf": f"l{i // 2}", "kubernetes.io/hostname": f"n{i}"}},
                "status": {"conditions": [{"type": "Ready", "status": "True"}],
                           "allocatable": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "2", "pods": "110"},
                           "capacity": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "2", "pods": "110"}}}
            assert rawkube.request(api, "POST", "/api/v1/nodes", node)[0] == 201
        assert rawkube.request(api, "POST", "/api/v1/namespaces", {"metadata": {"name": NS}})[0] == 201

        with audit_proxy(srv.url, str(srv.ca_file) if srv.ca_file else None) as (proxy_url, audit):
            kubeconfig = write_kubeconfig(tmp_path / "operator", proxy_url, srv.token)
            log = (tmp_path / "operator.log").open("wb")
            proc = subprocess.Popen(
                [sys.executable, "-m", "railyard", "operator", "run", "--kubeconfig", str(kubeconfig),
                 "--all-namespaces", "--peering", peering["metadata"]["name"], "--metrics-port", "0"],
                stdout=log, stderr=subprocess.STDOUT)
            job = yaml.safe_load((ROOT / "examples" / "tiny-cpu.yaml").read_text())
            job["metadata"]["namespace"] = NS
            path = f"/apis/railyard.dev/v1alpha1/namespaces/{NS}/trainingjobs"
            assert rawkube.request(api, "POST", path, job)[0] == 201

            def pods() -> list[dict[str, Any]]:
                return list(rawkube.request(api, "GET", f"/api/v1/namespaces/{NS}/pods")[1].get("items") or [])

            first = wait_until(lambda: len(pods()) == 2 and pods(), timeout=60, interval=0.2, message="the gang's pods")
            # a pod dies: the operator tears the gang down and starts attempt 1
            victim = first[0]["metadata"]["name"]
            rawkube.request(api, "DELETE", f"/api/v1/namespaces/{NS}/pods/{victim}",
                            {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0})
            wait_until(lambda: any(p["metadata"]["labels"].get("railyard.dev/attempt") == "1" for p in pods()),
                       timeout=60, interval=0.2, message="a new attempt's pods")
            assert rawkube.request(api, "DELETE", f"{path}/tiny")[0] == 200
            wait_until(lambda: not pods(), timeout=60, interval=0.2, message="the job's pods deleted with it")
            proc.terminate()
            proc.wait(timeout=30)
            seen = audit.snapshot()
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        srv.stop()

    print("granted but not exercised by this scenario:", sorted((p.group, p.resource, p.verb) for p in granted - seen))
    assert seen - granted == set(), f"the operator made requests its ClusterRole does not allow: {sorted(seen - granted)}"
    # the scenario really exercised the operator's write paths
    for p in [Permission("", "pods", "create"), Permission("", "pods", "patch"), Permission("", "pods", "delete"),
              Permission("", "secrets", "create"), Permission("", "configmaps", "create"),
              Permission("railyard.dev", "trainingjobs/status", "patch"), Permission("", "events", "create"),
              Permission("kopf.dev", "clusterkopfpeerings", "patch")]:
        assert p in seen, p
