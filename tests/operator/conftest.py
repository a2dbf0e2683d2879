"""Fixtures for the operator's integration tests: the local cluster (or a real API server via
RAILYARD_TEST_KUBECONFIG), the CRD, the operator as a subprocess, and a controllable workload.

The workload is a tiny Python program (spec.command) that records that it started (with its pod
contract environment) and exits with whatever code the test writes into its control folder:
``exit`` (every pod, every attempt), ``exit-<attempt>`` or ``exit-<attempt>-<podindex>``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.clusters import given_kubeconfig, own_namespace
from tests.waiting import wait_until

from railyard.protocol.ports import free_port as _free_port

ROOT = Path(__file__).resolve().parents[2]
GROUP, VERSION, PLURAL = "railyard.dev", "v1alpha1", "trainingjobs"
#: The namespace of the module-scoped ``operator``; this run's own on a given API server, where
#: another run's operator may watch the same name beside it.
MAIN_NS = own_namespace("railyard-optest")

WORKLOAD = r"""
import json, os, pathlib, sys, time
d = pathlib.Path(sys.argv[1])
att, idx = os.environ["RAILYARD_ATTEMPT"], os.environ["RAILYARD_POD_INDEX"]
keys = [k for k in os.environ if k.startswith(("RAILYARD_", "MASTER_", "NCCL_"))]
for var in ("RAILYARD_CHECKPOINT_MEMORY_DIR", "RAILYARD_CHECKPOINT_SHARED_DIR"):
    if os.environ.get(var):
        p = pathlib.Path(os.environ[var]) / os.environ["RAILYARD_JOB"]
        p.mkdir(parents=True, exist_ok=True)
        (p / f"marker-{idx}").write_text("checkpoint stand-in")
(d / f"started-{att}-{idx}.json").write_text(json.dumps({"t": time.time(), "env": {k: os.environ[k] for k in keys}}))
while True:
    for name in (f"exit-{att}-{idx}", f"exit-{att}", "exit"):
        f = d / name
        if f.exists():
            sys.exit(int(f.read_text().strip() or 0))
    time.sleep(0.05)
"""


def _die_with_parent() -> None:
    """In the child before exec: PR_SET_PDEATHSIG, SIGTERM."""
    import ctypes
    import signal

    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


class Api:
    """Thin synchronous helpers over the generated client."""

    def __init__(self, kubeconfig: Path, node_selector: dict[str, str] | None = None) -> None:
        from kubernetes import client, config

        self.kubeconfig = kubeconfig
        #: the session cluster's nodes (LocalCluster.node_selector): on a given API server they
        #: are not all its nodes, and a test uses and reads only its own
        self.node_selector = dict(node_selector or {})
        self.client = config.new_client_from_config(config_file=str(kubeconfig))
        self.core = client.CoreV1Api(self.client)
        self.custom = client.CustomObjectsApi(self.client)
        self.ext = client.ApiextensionsV1Api(self.client)

    def ensure_namespace(self, ns: str) -> None:
        from kubernetes.client.rest import ApiException

        try:
            self.core.create_namespace({"metadata": {"name": ns}})
        except ApiException as exc:
            if exc.status != 409:
                raise

    def job(self, ns: str, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)  # type: ignore[no-any-return]

    def status(self, ns: str, name: str) -> dict[str, Any]:
        return self.job(ns, name).get("status") or {}

    def condition(self, ns: str, name: str, ctype: str) -> dict[str, Any] | None:
        return next((c for c in self.status(ns, name).get("conditions") or [] if c["type"] == ctype), None)

    def create_job(self, ns: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainingJob", "metadata": {"name": name}, "spec": spec}
        return self.custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)  # type: ignore[no-any-return]

    def patch_spec(self, ns: str, name: str, spec: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name, {"spec": spec})

    def delete_job(self, ns: str, name: str) -> None:
        from kubernetes.client.rest import ApiException

        with contextlib.suppress(ApiException):
            self.custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)

    def pods(self, ns: str, job: str) -> list[Any]:
        return list(self.core.list_namespaced_pod(ns, label_selector=f"railyard.dev/job={job}").items)

    def events(self, ns: str, job: str) -> list[Any]:
        evs = self.core.list_namespaced_event(ns).items
        return [e for e in evs if e.involved_object.name == job and e.involved_object.kind == "TrainingJob"]

    def own_nodes(self) -> list[Any]:
        """The session cluster's nodes, never all the server's."""
        selector = ",".join(f"{k}={v}" for k, v in self.node_selector.items())
        return list(self.core.list_node(label_selector=selector).items)

    def node(self, name: str) -> Any:
        return self.core.read_node(name)

    def annotate_node(self, name: str, annotations: dict[str, str | None]) -> None:
        self.core.patch_node(name, {"metadata": {"annotations": annotations}})


@pytest.fixture(scope="session")
def api(local_cluster: Any) -> Iterator[Api]:
    a = Api(Path(local_cluster.kubeconfig), local_cluster.node_selector)
    crd = yaml.safe_load((ROOT / "crds" / "trainingjob.yaml").read_text())
    asyncio.run(_apply_crd(a.kubeconfig, crd))
    wait_until(lambda: a.custom.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL) is not None, timeout=30, message="the TrainingJob CRD to serve", retry_on=(Exception,))
    a.ensure_namespace(MAIN_NS)
    yield a
    if given_kubeconfig():  # a given server is left with the namespaces it had
        with contextlib.suppress(Exception):
            a.core.delete_namespace(MAIN_NS)


async def _apply_crd(kubeconfig: Path, crd: dict[str, Any]) -> None:
    from railyard.k8s.client import Kube

    kube = Kube.from_config(str(kubeconfig))
    try:
        await kube.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    finally:
        await kube.close()


class OperatorProcess:
    def __init__(self, kubeconfig: Path, log_path: Path, namespaces: list[str]) -> None:
        self.port = _free_port()
        self.log_path = log_path
        argv = [sys.executable, "-m", "railyard", "operator", "run", "--standalone",
                "--metrics-host", "127.0.0.1", "--metrics-port", str(self.port),
                "--heartbeat-advertise-url", f"http://127.0.0.1:{self.port}", "--not-ready-grace", "0.5",
                # the just-in-time save or the replica groups' leave before a planned move or a stop
                # comes a few steps after the order; on a loaded machine steps are slow, and the
                # default 60 s would make the verdict depend on the load (CI once moved a group
                # "as it was" after 60 s): here the bound only catches a hang
                "--save-before-stop-seconds", "240",
                "--kubeconfig", str(kubeconfig)] + (["-v"] if os.environ.get("RAILYARD_TEST_OPERATOR_VERBOSE") else [])
        for ns in namespaces:
            argv += ["--namespace", ns]
        # dies with this process even when pytest is killed (no operator left behind to load
        # the machine or act on a later run's cluster)
        self.proc = subprocess.Popen(argv, stdout=log_path.open("ab"), stderr=subprocess.STDOUT, cwd=ROOT,
                                     preexec_fn=_die_with_parent)
        wait_until(self.healthy, timeout=60, message="the operator's /healthz", retry_on=(Exception,))

    def healthy(self) -> bool:
        import urllib.request

        if self.proc.poll() is not None:
            raise AssertionError(f"operator exited {self.proc.returncode}:\n{self.log_tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def metrics_text(self) -> str:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            return str(r.read().decode())

    def log_tail(self, n: int = 60) -> str:
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture(scope="module")
def operator(api: Api, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    op = OperatorProcess(api.kubeconfig, log, [MAIN_NS])
    try:
        yield op
    finally:
        op.stop()


class Workload:
    """The control folder of one job's stand-in workload, and the nodes its job may use (the
    session cluster's ``nodeSelector``: ``base_spec`` puts it in the job)."""

    def __init__(self, folder: Path, node_selector: dict[str, str] | None = None) -> None:
        self.dir = folder
        self.dir.mkdir(parents=True, exist_ok=True)
        self.node_selector = dict(node_selector or {})

    @property
    def command(self) -> list[str]:
        return [sys.executable, "-c", WORKLOAD, str(self.dir)]

    def exit(self, code: int, attempt: int | None = None, pod: int | None = None) -> None:
        name = "exit" if attempt is None else f"exit-{attempt}" if pod is None else f"exit-{attempt}-{pod}"
        (self.dir / name).write_text(str(code))

    def started(self, attempt: int) -> dict[int, dict[str, Any]]:
        out = {}
        for f in self.dir.glob(f"started-{attempt}-*.json"):
            out[int(f.stem.rsplit("-", 1)[1])] = json.loads(f.read_text())
        return out


@pytest.fixture
def workload(tmp_path: Path, api: Api) -> Workload:
    return Workload(tmp_path / "control", api.node_selector)


@pytest.fixture
def job_name(request: pytest.FixtureRequest) -> str:
    base = request.node.name.removeprefix("test_").replace("_", "-")[:30].strip("-")
    return f"{base}-{uuid.uuid4().hex[:4]}"


def base_spec(workload: Workload, nodes: int = 2, **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodes": nodes,
        "procsPerNode": 1,
        "command": workload.command,
        "trainer": {"batchSize": 8},
        "gang": {"scheduleTimeoutSeconds": 60},
        "checkpoint": {
            "memory": {"hostPath": str(workload.dir / "ckpt-memory")},
            "local": {"hostPath": str(workload.dir / "ckpt-local")},
            "shared": {"hostPath": str(workload.dir / "ckpt-shared")},
        },
        "restartPolicy": {"application": {"limit": 3, "backoffSeconds": 0}},
    }
    if workload.node_selector:  # the session cluster's nodes only: on a given server others are beside them
        spec["nodeSelector"] = dict(workload.node_selector)
    spec.update(extra)
    return spec


def on_exit_dump(api: Api, ns: str, job: str, op: OperatorProcess) -> str:
    with contextlib.suppress(Exception):
        return json.dumps(api.status(ns, job), indent=1)[:4000] + "\n--- operator log ---\n" + op.log_tail()
    return op.log_tail()

