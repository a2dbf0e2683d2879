"""Agent pieces that need processes but no API server: the resolver, slow-node duty cycling,
and volume folders."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from railyard.local.agent import RESOLVER_SOURCE, Agent
from railyard.local.nodes import NodeControl
from railyard.local.podenv import ContainerConfigError, PodContext
from railyard.local.topology import ClusterShape, build_nodes

from .builders import make_pod


def test_resolver_answers_from_the_hosts_file_first(tmp_path: Path) -> None:
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(RESOLVER_SOURCE.read_text())
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.11 w-0.w.ns.svc w-0.w\n127.0.0.12 svc.ns.svc\n127.0.0.13 svc.ns.svc\n")
    code = (
        "import socket; print(socket.gethostbyname('w-0.w.ns.svc'));"
        "print(sorted({a[4][0] for a in socket.getaddrinfo('svc.ns.svc', 80)}));"
        "print(socket.gethostbyname('localhost'))"
    )
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "site"), RAILYARD_HOSTS_FILE=str(hosts))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30, check=True)
    assert out.stdout.splitlines() == ["127.0.0.11", "['127.0.0.12', '127.0.0.13']", "127.0.0.1"]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_slow_factor_duty_cycles_a_busy_process(tmp_path: Path) -> None:
    nodes = build_nodes(ClusterShape(nodes=1))
    agent = Agent(None, tmp_path, nodes, log_dir=tmp_path / "logs")  # type: ignore[arg-type]
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
    try:
        agent.pgids_on = lambda node: [busy.pid]  # type: ignore[method-assign]

        async def measure(factor: float) -> float:
            agent.controls["node-0"] = NodeControl(slow_factor=factor)
            task = asyncio.get_running_loop().create_task(agent._duty_cycle("node-0"))
            before, t0 = cpu_seconds(busy.pid), time.monotonic()
            await asyncio.sleep(2.0)
            share = (cpu_seconds(busy.pid) - before) / (time.monotonic() - t0)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return share

        share = asyncio.run(measure(4.0))
        # a quarter of the time running (a shared 2-core machine can only make it less)
        assert 0.02 < share < 0.25 + 0.1
        # after the cycle stops the process runs again (SIGCONT on exit)
        before = cpu_seconds(busy.pid)
        deadline = time.monotonic() + 60  # only catches a process left stopped
        while cpu_seconds(busy.pid) <= before:
            assert time.monotonic() < deadline, "the process stayed stopped after the duty cycle ended"
            time.sleep(0.05)
    finally:
        busy.kill()
        busy.wait()


def test_volumes_live_in_per_node_folders_and_host_paths_outlive_pods(tmp_path: Path) -> None:
    nodes = build_nodes(ClusterShape(nodes=2))
    agent = Agent(None, tmp_path, nodes, log_dir=tmp_path / "logs")  # type: ignore[arg-type]
    pod: Any = make_pod("p").obj()
    pod["spec"]["volumes"] = [
        {"name": "shm", "hostPath": {"path": "/dev/shm/ckpt"}},
        {"name": "scratch", "emptyDir": {}},
        {"name": "cfg", "configMap": {"name": "c", "items": [{"key": "a", "path": "sub/a.txt"}]}},
    ]
    ctx = PodContext(pod=pod, pod_ip=nodes[1].ip, host_ip=nodes[1].ip, configmaps={"c": {"data": {"a": "x", "b": "y"}}})
    pod_dir = agent.node_dir("node-1") / "pods" / "p"
    dirs = agent.materialise_volumes(pod, nodes[1], pod_dir, ctx)
    assert dirs["shm"] == str(tmp_path / "nodes" / "node-1" / "hostpath" / "dev" / "shm" / "ckpt")
    assert Path(dirs["scratch"]).is_dir() and Path(dirs["scratch"]).is_relative_to(pod_dir)
    assert (Path(dirs["cfg"]) / "sub" / "a.txt").read_text() == "x"
    assert not (Path(dirs["cfg"]) / "b").exists()


def test_a_simulated_pods_volumes_resolve_and_fail_alike_but_touch_no_disk(tmp_path: Path) -> None:
    # create=False is the simulated (kwok-style) pod: same paths, same config errors, no files
    nodes = build_nodes(ClusterShape(nodes=1))
    agent = Agent(None, tmp_path / "state", nodes, log_dir=tmp_path / "logs")  # type: ignore[arg-type]
    pod: Any = make_pod("p").obj()
    pod["spec"]["volumes"] = [
        {"name": "shm", "hostPath": {"path": "/dev/shm/ckpt"}},
        {"name": "scratch", "emptyDir": {}},
        {"name": "cfg", "configMap": {"name": "c", "items": [{"key": "a", "path": "a.txt"}]}},
        {"name": "info", "downwardAPI": {"items": [{"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]}},
    ]
    ctx = PodContext(pod=pod, pod_ip=nodes[0].ip, host_ip=nodes[0].ip, configmaps={"c": {"data": {"a": "x"}}})
    pod_dir = agent.node_dir("node-0") / "pods" / "p"
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    simulated = agent.materialise_volumes(pod, nodes[0], pod_dir, ctx, create=False)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert simulated == agent.materialise_volumes(pod, nodes[0], pod_dir, ctx)  # the paths a real pod gets
    pod["spec"]["volumes"][2]["configMap"]["items"][0]["key"] = "missing"
    with pytest.raises(ContainerConfigError, match=r"volumes\[cfg\].items: key 'missing'"):
        agent.materialise_volumes(pod, nodes[0], pod_dir, ctx, create=False)


def test_host_paths_under_mnt_and_claims_are_shared_by_all_nodes(tmp_path: Path) -> None:
    nodes = build_nodes(ClusterShape(nodes=2))
    agent = Agent(None, tmp_path, nodes, log_dir=tmp_path / "logs")  # type: ignore[arg-type]
    pod: Any = make_pod("p", "ns").obj()
    pod["spec"]["volumes"] = [
        {"name": "shared", "hostPath": {"path": "/mnt/railyard-shared/job"}},
        {"name": "local", "hostPath": {"path": "/var/lib/ckpt"}},
        {"name": "claim", "persistentVolumeClaim": {"claimName": "data"}},
    ]
    seen = []
    for node in nodes:
        ctx = PodContext(pod=pod, pod_ip=node.ip, host_ip=node.ip)
        seen.append(agent.materialise_volumes(pod, node, agent.node_dir(node.name) / "pods" / "p", ctx))
    assert seen[0]["shared"] == seen[1]["shared"] == str(tmp_path / "shared" / "mnt" / "railyard-shared" / "job")
    assert seen[0]["claim"] == seen[1]["claim"] == str(tmp_path / "shared" / "pvc" / "ns" / "data")
    assert seen[0]["local"] != seen[1]["local"]
