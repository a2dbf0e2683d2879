"""A tiny kopf operator reconciles a Widget end to end against the server, with no workaround in
the operator: create -> child ConfigMap (ownerReference) -> status patched -> finalizer added ->
delete -> delete handler runs -> object gone -> child garbage-collected."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from tests.waiting import wait_until

from .conftest import CRD_GROUP, Cluster, gone, widget

OPERATOR = textwrap.dedent('''
    import kopf
    import kubernetes

    @kopf.on.startup()
    def configure(settings: kopf.OperatorSettings, **_):
        kubernetes.config.load_kube_config()
        settings.watching.server_timeout = 30
        settings.persistence.finalizer = "conformance.railyard.io/kopf"

    @kopf.on.create("CRD_GROUP", "v1", "widgets")
    def on_create(spec, name, namespace, patch, **_):
        child = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-child"},
                 "data": {"replicas": str(spec["replicas"])}}
        kopf.adopt(child)
        kubernetes.client.CoreV1Api().create_namespaced_config_map(namespace, child)
        patch.status["phase"] = "Ready"

    @kopf.on.delete("CRD_GROUP", "v1", "widgets")
    def on_delete(name, namespace, **_):
        kubernetes.client.CoreV1Api().create_namespaced_config_map(
            namespace, {"metadata": {"name": f"{name}-deleted"}})
''')


def test_kopf_operator_reconciles_a_widget_end_to_end(cluster: Cluster, needs_controllers: None,
                                                      custom: client.CustomObjectsApi, core: client.CoreV1Api,
                                                      widgets: dict[str, str], ns: str, tmp_path: Path) -> None:
    script = tmp_path / "widget_operator.py"
    script.write_text(OPERATOR.replace('"CRD_GROUP"', repr(CRD_GROUP)))
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    log = (tmp_path / "kopf.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "kopf", "run", "--standalone", "--namespace", ns, str(script)],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        custom.create_namespaced_custom_object(CRD_GROUP, "v1", ns, "widgets", widget("k1", replicas=2))
        w: dict[str, Any] = {}

        def reconciled() -> bool:
            nonlocal w
            w = custom.get_namespaced_custom_object(CRD_GROUP, "v1", ns, "widgets", "k1")
            return (w.get("status") or {}).get("phase") == "Ready"

        wait_until(reconciled, timeout=60, message="kopf to patch the Widget status", interval=0.2)
        assert "conformance.railyard.io/kopf" in w["metadata"].get("finalizers", [])
        child = core.read_namespaced_config_map("k1-child", ns)
        assert child.data == {"replicas": "2"}
        refs = child.metadata.owner_references
        assert len(refs) == 1 and refs[0].uid == w["metadata"]["uid"] and refs[0].kind == "Widget"
        custom.delete_namespaced_custom_object(CRD_GROUP, "v1", ns, "widgets", "k1")
        wait_until(lambda: gone(lambda: custom.get_namespaced_custom_object(CRD_GROUP, "v1", ns, "widgets", "k1")),
                   timeout=60,
                   message="the Widget to be finalized and removed",
                   interval=0.2)
        core.read_namespaced_config_map("k1-deleted", ns)  # the delete handler ran
        wait_until(lambda: gone(lambda: core.read_namespaced_config_map("k1-child", ns)),
                   timeout=30,
                   message="the child ConfigMap to be garbage-collected",
                   interval=0.05)
    except (AssertionError, ApiException, pytest.fail.Exception):
        log.flush()
        print((tmp_path / "kopf.log").read_text()[-4000:])
        raise
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
