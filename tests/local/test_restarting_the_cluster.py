"""``down`` then ``up`` keeps every object and each node's failure state (embedded mode)."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from tests.clusters import own_shape
from tests.waiting import wait_until

from railyard_local.cluster import LocalCluster, LocalClusterError

from .builders import make_pod
from .conftest import wait_phase

pytestmark = pytest.mark.cluster


def test_down_then_up_keeps_objects_and_failed_nodes(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "state", nodes=2, topology="spine=1,leaf=1", mode="embedded")
    kubeconfig = cluster.start()
    try:
        api = k8s_config.new_client_from_config(config_file=str(kubeconfig))
        core = k8s.CoreV1Api(api)
        core.create_namespaced_config_map("default", {"metadata": {"name": "keep"}, "data": {"k": "v"}})
        core.create_namespaced_pod("default", make_pod("sleeper").command("sleep", "300").obj())
        wait_phase(core, "default", "sleeper", ("Running",))
        core.patch_node("node-1", {"metadata": {"annotations": {"local.railyard.dev/fail": "true"}}})
        wait_until(lambda: any(c.type == "Ready" and c.status == "False" for c in core.read_node("node-1").status.conditions), timeout=60, message="condition")
        api.close()
    finally:
        cluster.stop()

    again = LocalCluster(tmp_path / "state")  # everything comes from the state dir
    assert [n.name for n in again.node_specs] == ["node-0", "node-1"]
    assert again.start() == kubeconfig
    try:
        api = k8s_config.new_client_from_config(config_file=str(kubeconfig))
        core = k8s.CoreV1Api(api)
        assert core.read_namespaced_config_map("keep", "default").data == {"k": "v"}
        assert any(c.type == "Ready" and c.status == "False" for c in core.read_node("node-1").status.conditions)
        assert any(c.type == "Ready" and c.status == "True" for c in core.read_node("node-0").status.conditions)
        # the pod's processes died with the old runtime: reported, not silently re-run
        lost = wait_phase(core, "default", "sleeper", ("Failed",), timeout=60)
        assert lost.status.reason in ("NodeShutdown", "NodeRestart")
        assert lost.status.container_statuses[0].state.terminated.exit_code in (137, 143)
        api.close()
    finally:
        again.stop()


def test_cli_up_detach_status_and_down(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    state = tmp_path / "cli"
    base = [sys.executable, "-m", "railyard.cli", "local", "--state-dir", str(state)]
    up = subprocess.run([*base, "up", "--nodes", "2", "--detach"], capture_output=True, text=True, timeout=120)
    try:
        assert up.returncode == 0, up.stderr
        assert f"export KUBECONFIG={state / 'kubeconfig'}" in up.stdout
        again = subprocess.run([*base, "up", "--detach"], capture_output=True, text=True, timeout=60)
        assert again.returncode == 1 and "already running" in again.stderr
        status = subprocess.run([*base, "status", "-o", "json"], capture_output=True, text=True, timeout=60)
        info = json.loads(status.stdout)
        assert info["running"] and [n["name"] for n in info["nodes"]] == ["node-0", "node-1"]
    finally:
        down = subprocess.run([*base, "down"], capture_output=True, text=True, timeout=90)
    assert down.returncode == 0 and "down" in down.stdout
    assert not (state / "up.pid").exists()
    stopped = subprocess.run([*base, "status", "-o", "json"], capture_output=True, text=True, timeout=60)
    assert json.loads(stopped.stdout)["running"] is False


def test_existing_mode_adds_nodes_and_an_agent_to_a_running_cluster(local_cluster, core, namespace, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """kwok-style: a second runtime joins the session's cluster with its own nodes."""
    edge = LocalCluster(tmp_path / "edge", kubeconfig=local_cluster.kubeconfig,
                        **own_shape(nodes=1, node_prefix="edge-", node_ip_offset=100))
    assert edge.mode == "existing" and not edge.config["scheduler"]
    (edge_node,) = edge.node_specs
    assert edge_node.ip == str(ipaddress.IPv4Address(local_cluster.node_specs[0].ip) + 100)
    edge.start()
    try:
        node = core.read_node(edge_node.name)
        assert node.status.addresses[0].address == edge_node.ip
        core.create_namespaced_pod(namespace, make_pod("on-edge").command("true").on_node(edge_node.name).obj())
        done = wait_phase(core, namespace, "on-edge", ("Succeeded", "Failed"))
        assert done.status.phase == "Succeeded" and done.status.pod_ip == edge_node.ip
    finally:
        edge.stop()
        edge.remove_nodes()
    assert not core.list_node(field_selector=f"metadata.name={edge_node.name}").items, "removed with its cluster"
    assert core.read_node(local_cluster.node_specs[0].name), "and only its own nodes"


def test_existing_mode_never_takes_over_a_node_of_another_cluster(local_cluster, core, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A node of one of its names that is not its own (a real one, or another local cluster's)
    is left alone: start refuses, naming the node and the fix; nothing is relabelled or deleted."""
    taken = local_cluster.node_specs[0].name
    before = core.read_node(taken).metadata.labels
    intruder = LocalCluster(tmp_path / "intruder", kubeconfig=local_cluster.kubeconfig, nodes=1,
                            node_prefix=taken[:-1], node_ip_offset=120)
    with pytest.raises(LocalClusterError, match=f"already has nodes named {taken} .*node_prefix"):
        intruder.start()
    intruder.remove_nodes()
    assert core.read_node(taken).metadata.labels == before


def test_restarting_with_fewer_nodes_removes_the_extra_ones(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "s", nodes=3, topology="spine=1,leaf=1") as cluster:
        pass
    with LocalCluster(tmp_path / "s", nodes=2) as cluster:
        api = k8s_config.new_client_from_config(config_file=str(cluster.kubeconfig))
        names = [n.metadata.name for n in k8s.CoreV1Api(api).list_node().items]
        api.close()
    assert names == ["node-0", "node-1"]
