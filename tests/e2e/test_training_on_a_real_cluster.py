"""helm install, topology labels, the tiny TrainingJob to Succeeded, a killed pod restarted."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from tests.waiting import wait_until

from .conftest import ROOT, E2ECluster

RELEASE = "railyard"
OPERATOR_NS = "railyard-system"


@pytest.fixture(scope="module")
def installed(e2e_cluster: E2ECluster) -> Iterator[E2ECluster]:
    """The chart installed through the Helm SDK, worker nodes labelled with a topology."""
    from helm_python.chart import Chart
    from helm_python.config import Config

    repo, _, tag = e2e_cluster.operator_image.rpartition(":")
    values = {
        "image": {"repository": repo, "tag": tag, "pullPolicy": "IfNotPresent"},
        "logLevel": "debug",
    }
    helm = Config(kubeconfig_path=str(e2e_cluster.kubeconfig), namespace=OPERATOR_NS)
    chart = Chart.load(ROOT / "helm" / "railyard")
    helm.install(chart, RELEASE, values, namespace=OPERATOR_NS, create_namespace=True, wait="watcher", timeout=300)
    nodes = json.loads(e2e_cluster.kubectl("get", "nodes", "-o", "json"))["items"]
    workers = [n["metadata"]["name"] for n in nodes
               if "node-role.kubernetes.io/control-plane" not in n["metadata"].get("labels", {})]
    for i, node in enumerate(sorted(workers)):
        e2e_cluster.kubectl("label", "node", node, "--overwrite", "railyard.dev/spine=s0", f"railyard.dev/leaf=l{i // 2}")
    try:
        yield e2e_cluster
    finally:
        helm.uninstall(RELEASE, ignore_not_found=True, timeout=300)
        chart.close()
        helm.close()


@pytest.fixture
def namespace(installed: E2ECluster) -> Iterator[str]:
    ns = f"e2e-{uuid.uuid4().hex[:6]}"
    installed.kubectl("create", "namespace", ns)
    yield ns
    installed.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def tiny_job(cluster: E2ECluster, name: str, **spec: Any) -> dict[str, Any]:
    job = yaml.safe_load((ROOT / "examples" / "tiny-cpu.yaml").read_text())
    job["metadata"]["name"] = name
    job["spec"].update(image=cluster.trainer_image, gpusPerPod=0, **spec)
    # kind workers are small: one process per pod, tensor parallel off
    job["spec"]["procsPerNode"] = 1
    job["spec"]["parallelism"] = {"tensor": 1}
    return job


def apply(cluster: E2ECluster, ns: str, obj: dict[str, Any], tmp_path: Any) -> None:
    path = tmp_path / f"{obj['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(obj))
    cluster.kubectl("apply", "-n", ns, "-f", str(path))


def job_status(cluster: E2ECluster, ns: str, name: str) -> dict[str, Any]:
    out = cluster.kubectl("get", "trainingjob", name, "-n", ns, "-o", "json", check=False)
    return dict(json.loads(out).get("status") or {}) if out else {}


def test_operator_is_running(installed: E2ECluster) -> None:
    pods = json.loads(installed.kubectl("get", "pods", "-n", OPERATOR_NS, "-l",
                                        f"app.kubernetes.io/instance={RELEASE}", "-o", "json"))["items"]
    assert pods and all(p["status"]["phase"] == "Running" for p in pods)


def test_tiny_job_succeeds(installed: E2ECluster, namespace: str, tmp_path: Any) -> None:
    apply(installed, namespace, tiny_job(installed, "tiny"), tmp_path)
    status = wait_until(lambda: (s := job_status(installed, namespace, "tiny")).get("phase") == "Succeeded" and s,
                        timeout=900, interval=2, message="TrainingJob tiny to succeed")
    assert status["phase"] == "Succeeded"


def test_a_killed_pod_restarts_the_gang(installed: E2ECluster, namespace: str, tmp_path: Any) -> None:
    apply(installed, namespace, tiny_job(installed, "victim", trainer={"preset": "tiny", "steps": 100000}), tmp_path)
    wait_until(lambda: job_status(installed, namespace, "victim").get("phase") == "Running",
               timeout=600, interval=2, message="TrainingJob victim Running")
    pods = json.loads(installed.kubectl("get", "pods", "-n", namespace, "-l", "railyard.dev/job=victim", "-o", "json"))["items"]
    before = job_status(installed, namespace, "victim").get("attempt", 0)
    installed.kubectl("delete", "pod", "-n", namespace, pods[0]["metadata"]["name"], "--grace-period=0", "--force")
    wait_until(lambda: (job_status(installed, namespace, "victim").get("attempt", 0) > before
                        and job_status(installed, namespace, "victim").get("phase") == "Running"),
               timeout=600, interval=2, message="the gang restarted and Running again")
