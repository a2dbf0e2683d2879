"""The operator image, run with the chart's pod spec (user, read-only root filesystem, dropped
capabilities, args, env, probes, the /tmp emptyDir, the service-account token), on the host
network against the embedded API server: it reaches Ready through the chart's probes and drives
a TrainingJob to Succeeded (its pods run by the local cluster's node agent)."""

from __future__ import annotations

import base64
import json
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from tests.deployment import rawkube
from tests.deployment.chart import CHART, NAMESPACE, find, render_objects
from tests.waiting import wait_until

from railyard.protocol.ports import free_port

from .conftest import Images
from .podspec import Given, docker_run_args, probe_url


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def _ints(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _ints(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_ints(x) for x in v]
    return int(v) if isinstance(v, float) and v.is_integer() else v


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Any]:
    """A fresh embedded cluster (own API server, scheduler and node agent): the operator under
    test watches all namespaces, so it gets a cluster no other test leaves jobs in."""
    from railyard_local.cluster import LocalCluster

    c = LocalCluster(tmp_path / "cluster", mode="embedded", nodes=2, gpus_per_node=1, topology="spine=1,leaf=1",
                     lease_interval=2.0)
    c.start(timeout=120)
    try:
        yield c
    finally:
        c.stop()


def service_account(tmp_path: Path, kubeconfig: Path) -> tuple[Path, str, str]:
    """The token folder the kubelet would mount, and KUBERNETES_SERVICE_HOST/PORT."""
    doc = yaml.safe_load(kubeconfig.read_text())
    cluster = doc["clusters"][0]["cluster"]
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text(doc["users"][0]["user"]["token"])
    (sa / "ca.crt").write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
    (sa / "namespace").write_text(NAMESPACE)
    for f in sa.iterdir():
        f.chmod(0o644)  # the kubelet's projected volume is readable by the pod's user
    server = urlsplit(cluster["server"])
    return sa, str(server.hostname), str(server.port)


def test_operator_image_reaches_ready_and_drives_a_job_to_succeeded(images: Images, cluster: Any, tmp_path: Path) -> None:
    from kubernetes import config as k8s_config

    port = free_port()  # host network: the chart's port value, moved off 8080
    objects = render_objects({"port": port})
    pod = find(objects, "Deployment")["spec"]["template"]["spec"]
    [container] = pod["containers"]

    api = k8s_config.new_client_from_config(config_file=str(cluster.kubeconfig))
    for path in sorted((CHART / "crds").glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            status, body = rawkube.request(api, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", _ints(crd))
            assert status in (201, 409), body
    peering = find(objects, "ClusterKopfPeering")
    wait_until(lambda: rawkube.request(api, "POST", "/apis/kopf.dev/v1/clusterkopfpeerings", peering)[0] in (201, 409),
               timeout=30, interval=0.2, message="the ClusterKopfPeering to be created")

    sa, host, api_port = service_account(tmp_path, cluster.kubeconfig)
    name = f"railyard-operator-{uuid.uuid4().hex[:6]}"
    given = Given(pod_name=name, node_name="node-0", namespace=NAMESPACE, service_account=sa,
                  extra_env={"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": api_port})
    argv = ["run", "-d", "--name", name, "--network", "host", *docker_run_args(pod, container, images.operator, given)]
    images.run(*argv)

    def logs() -> str:
        out = images.run("logs", "--tail", "80", name, check=False)
        return f"--- operator container logs ---\n{out.stdout}{out.stderr}"

    try:
        ready, live, startup = (probe_url(container, p) for p in ("readinessProbe", "livenessProbe", "startupProbe"))
        wait_until(lambda: http_status(startup) == 200, timeout=60, interval=0.2, message="the startup probe", explain=logs)
        wait_until(lambda: http_status(ready) == 200, timeout=120, interval=0.2, message="the readiness probe", explain=logs)
        assert http_status(live) == 200

        ns = f"smoke-{uuid.uuid4().hex[:6]}"
        assert rawkube.request(api, "POST", "/api/v1/namespaces", {"metadata": {"name": ns}})[0] == 201
        work = tmp_path / "work"
        job = {
            "apiVersion": "railyard.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "smoke"},
            "spec": {
                "nodes": 2, "procsPerNode": 1, "gpusPerPod": 1,
                "command": [sys.executable, "-c", "print('trained')"],
                "gang": {"scheduleTimeoutSeconds": 60},
                "checkpoint": {tier: {"hostPath": str(work / tier)} for tier in ("memory", "local", "shared")},
            },
        }
        path = f"/apis/railyard.dev/v1alpha1/namespaces/{ns}/trainingjobs"
        status, body = rawkube.request(api, "POST", path, job)
        assert status == 201, body

        def phase() -> str:
            return str((rawkube.request(api, "GET", f"{path}/smoke")[1].get("status") or {}).get("phase") or "")

        def dump() -> str:
            got = rawkube.request(api, "GET", f"{path}/smoke")[1]
            return json.dumps(got.get("status"), indent=1)[:3000] + "\n" + logs()

        wait_until(lambda: phase() == "Succeeded" or phase() == "Failed", timeout=180, interval=0.2, message="the TrainingJob to succeed",
                   explain=dump)
        assert phase() == "Succeeded", dump()
        assert http_status(live) == 200 and http_status(ready) == 200

        info = json.loads(images.run("inspect", name).stdout)[0]
        assert info["State"]["Running"] and info["RestartCount"] == 0, info["State"]
        assert "Traceback" not in logs(), logs()
        # SIGTERM as the kubelet sends it: kopf stops cleanly
        images.run("stop", "--time", "30", name, timeout=60)
        code = json.loads(images.run("inspect", name).stdout)[0]["State"]["ExitCode"]
        assert code == 0, logs()
    finally:
        images.run("rm", "-f", name, check=False)


def test_the_operator_needs_no_passwd_entry_for_its_user(images: Images) -> None:
    """kopf's default peering identity asks the passwd database for the user's name; the image
    has no entry for 65532 (or for OpenShift's random UIDs): the identity must not need one."""
    code = ("import getpass, sys\n"
            "try:\n    getpass.getuser(); sys.exit('the user has a passwd entry: this test proves nothing')\n"
            "except KeyError:\n    pass\n"
            "from railyard.commands.operator import peering_identity\n"
            "print(peering_identity())")
    for uid in ("65532", "1000770000"):
        out = images.run("run", "--rm", "--user", f"{uid}:0", "--read-only", "--entrypoint", "python",
                         images.operator, "-c", code)
        assert out.stdout.startswith(f"uid{uid}@"), out.stdout + out.stderr


def test_the_operator_image_agrees_with_the_chart(images: Images) -> None:
    """User, entry point, port and what the image must not carry: checked on the built image."""
    objects = render_objects({})
    pod = find(objects, "Deployment")["spec"]["template"]["spec"]
    [container] = pod["containers"]
    config = json.loads(images.run("image", "inspect", images.operator).stdout)[0]["Config"]
    uid, _, gid = config["User"].partition(":")
    assert (int(uid), int(gid)) == (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"])
    assert int(uid) != 0
    # the chart gives args only: the image's ENTRYPOINT (exec form, no shell) must be railyard
    assert "command" not in container and config["Entrypoint"] == ["railyard"]
    assert f"{container['ports'][0]['containerPort']}/tcp" in (config.get("ExposedPorts") or {})
    # no torch; nothing the operator writes at run time lies outside the chart's writable mounts
    # (the smoke test above runs with a read-only root filesystem)
    probe = images.run("run", "--rm", "--entrypoint", "python", images.operator, "-c",
                       "import importlib.util as u, json; print(json.dumps({m: bool(u.find_spec(m)) for m in "
                       "('torch', 'numpy', 'kopf', 'railyard')}))")
    found = json.loads(probe.stdout)
    assert found == {"torch": False, "numpy": False, "kopf": True, "railyard": True}, found
    assert [m["mountPath"] for m in container["volumeMounts"]] == ["/tmp"]


def test_the_operator_image_does_not_carry_the_local_cluster(images: Images) -> None:
    """The local cluster (railyard-local, local_cluster/) is a tool next to the product: the
    operator image has neither its package nor its dependencies (issue 36)."""
    imported = images.run("run", "--rm", "--entrypoint", "python", images.operator, "-c", "import railyard_local", check=False)
    assert imported.returncode != 0 and "No module named 'railyard_local'" in imported.stderr, imported.stdout + imported.stderr
    for dist in ("cryptography", "kubernetes", "railyard-local"):
        shown = images.run("run", "--rm", "--entrypoint", "python", images.operator, "-m", "pip", "show", dist, check=False)
        assert shown.returncode != 0 and not shown.stdout.strip(), f"pip show {dist}: {shown.stdout}{shown.stderr}"
    # the operator itself still starts without them
    assert images.run("run", "--rm", images.operator, "operator", "--help").returncode == 0
