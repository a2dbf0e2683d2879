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
from tests.waiting import wait_until

from railyard_local.agent import RESOLVER_SOURCE, Agent
from railyard_local.nodes import NodeControl
from railyard_local.podenv import ContainerConfigError, PodContext
from railyard_local.podworker import PodWorker
from railyard_local.topology import ClusterShape, build_nodes

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
        wait_until(lambda: cpu_seconds(busy.pid) > before, timeout=60, interval=0.05,
                   message="the process to run again after the duty cycle ended")
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


async def test_the_kubelet_endpoint_serves_container_logs_to_the_api_servers_certificate(tmp_path: Path) -> None:
    """What kube-apiserver reads for `kubectl logs`: /containerLogs on the pod's node's address,
    with its kubelet client certificate; nobody without a certificate of that CA gets in."""
    import ssl

    import aiohttp

    from railyard_local.apiserver.pki import ensure_certs, issue_cert
    from railyard_local.kubelet import KubeletEndpoint, server_context

    ca = ensure_certs(tmp_path / "cluster-ca").ca_cert
    cert, key = issue_cert(tmp_path / "cluster-ca", "apiserver-kubelet-client", common_name="kube-apiserver", client=True)
    ensure_certs(tmp_path / "other-ca")
    other = issue_cert(tmp_path / "other-ca", "client", common_name="someone", client=True)
    nodes = build_nodes(ClusterShape(nodes=2, ip_offset=150))
    agent = Agent(None, tmp_path, nodes, log_dir=tmp_path / "logs")  # type: ignore[arg-type]
    pod: Any = make_pod("p").obj()
    pod["metadata"].update(namespace="ns", uid="u1")
    pod["spec"]["nodeName"] = "node-0"
    pods = {"ns/p": pod}
    log = agent.log_path("ns", "p", "main")
    log.parent.mkdir(parents=True)
    log.write_bytes(b"one\ntwo\nthree\n")
    agent.log_path("ns", "p", "main", previous=True).write_bytes(b"before the restart\n")
    endpoint = KubeletEndpoint(nodes, pods.get, agent.log_path,
                               ssl_context=server_context(tmp_path / "kubelet-pki", tuple(n.ip for n in nodes), ca))
    port = await endpoint.start()

    def client_ssl(cert_key: tuple[Path, Path] | None) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(tmp_path / "kubelet-pki" / "ca.crt"))  # the serving cert names the node IPs
        if cert_key is not None:
            ctx.load_cert_chain(*cert_key)
        return ctx

    async def get(node: int, path: str, cert_key: tuple[Path, Path] | None = (cert, key)) -> tuple[int, str]:
        async with aiohttp.ClientSession() as http, http.get(f"https://{nodes[node].ip}:{port}{path}", ssl=client_ssl(cert_key)) as resp:
            return resp.status, await resp.text()

    try:
        assert await get(0, "/containerLogs/ns/p/main") == (200, "one\ntwo\nthree\n")
        assert await get(0, "/containerLogs/ns/p/main?tailLines=1&timestamps=true") == (200, "three\n")
        assert await get(0, "/containerLogs/ns/p/main?limitBytes=3") == (200, "one")
        assert await get(0, "/containerLogs/ns/p/main?previous=true") == (200, "before the restart\n")
        assert (await get(0, "/containerLogs/ns/p/main?tailLines=x"))[0] == 400
        assert (await get(0, "/containerLogs/ns/p/other"))[0] == 404
        assert (await get(0, "/containerLogs/ns/nope/main"))[0] == 404
        assert (await get(1, "/containerLogs/ns/p/main"))[0] == 404, "only the pod's own node answers for it"
        for stranger in (None, other):
            with pytest.raises(aiohttp.ClientError):  # the TLS handshake fails: no certificate of the CA
                await get(0, "/containerLogs/ns/p/main", cert_key=stranger)

        # follow: what is appended arrives, and the stream ends when the container does
        async with aiohttp.ClientSession() as http, \
                http.get(f"https://{nodes[0].ip}:{port}/containerLogs/ns/p/main?follow=true&tailLines=1", ssl=client_ssl((cert, key))) as resp:
            assert resp.status == 200
            got = b""
            while got != b"three\n":
                got += await asyncio.wait_for(resp.content.readany(), 30)
            with log.open("ab") as f:
                f.write(b"four\n")
            while got != b"three\nfour\n":
                got += await asyncio.wait_for(resp.content.readany(), 30)
            pods["ns/p"] = {**pod, "status": {"containerStatuses": [{"name": "main", "state": {"terminated": {"exitCode": 0}}}]}}
            assert await asyncio.wait_for(resp.content.read(), 30) == b""
    finally:
        await endpoint.stop()


def test_the_hosts_file_names_pods_with_a_subdomain_and_is_rewritten_only_when_it_changes(tmp_path: Path) -> None:
    nodes = build_nodes(ClusterShape(nodes=2))
    agent = Agent(None, tmp_path, nodes, log_dir=tmp_path / "logs")  # type: ignore[arg-type]

    def start(name: str, node: int, subdomain: str | None) -> PodWorker:
        pod = make_pod(name, "ns").obj()
        pod["metadata"]["uid"] = f"uid-{name}"
        if subdomain:
            pod["spec"]["subdomain"] = subdomain
        worker = PodWorker(agent, pod, nodes[node])
        agent.workers[worker.uid] = worker
        return worker

    start("w-1", 1, "w")
    start("w-0", 0, "w")
    plain = start("gang-0", 0, None)  # no subdomain: no name in the file
    agent._write_hosts()
    ip0, ip1 = nodes[0].ip, nodes[1].ip
    assert agent.hosts_file.read_text().splitlines()[2:] == [
        f"{ip0} w-0.w.ns.svc.cluster.local w-0.w.ns.svc w-0.w.ns w-0.w",
        f"{ip1} w-1.w.ns.svc.cluster.local w-1.w.ns.svc w-1.w.ns w-1.w",
    ]
    written = agent.hosts_file.stat().st_ino
    agent.forget(plain)
    start("gang-1", 1, None)
    agent._write_hosts()
    assert agent.hosts_file.stat().st_ino == written, "the same text is not written again"
    agent.forget(agent.workers["uid-w-0"])
    agent._write_hosts()
    assert agent.hosts_file.stat().st_ino != written
    assert [line.split()[1] for line in agent.hosts_file.read_text().splitlines()[2:]] == [
        "w-1.w.ns.svc.cluster.local"
    ]
