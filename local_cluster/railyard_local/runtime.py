"""The node-side process of the local cluster: simulated nodes, scheduler and node agent.

Started by :class:`railyard_local.cluster.LocalCluster` as ``python -m railyard_local.runtime``
against any API server (embedded, envtest or an existing cluster). One asyncio loop, one shared
list+watch per kind (nodes, pods, services). SIGTERM/SIGINT stop it; every pod process is
killed before it exits. Its loops run under a :class:`~railyard_local.tasks.Supervisor`: one
that dies is logged and restarted, one that keeps dying stops the process with exit code 1 and
a message naming it; a watch that goes quiet is re-established (``--watch-inactivity``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from pathlib import Path

from railyard.gcpolicy import settle_after_start
from railyard.kubeclient import load_connection
from railyard_local.agent import DEFAULT_SHARED_HOST_PATHS, Agent
from railyard_local.devices import RESOURCE_API
from railyard_local.kube import DEFAULT_WATCH_INACTIVITY_S, Informer, KubeClient
from railyard_local.kubelet import KubeletEndpoint, server_context
from railyard_local.nodes import HEARTBEAT_REQUESTS, NodeManager
from railyard_local.scheduler import PODGROUPS, Scheduler, serves_dra, serves_podgroups
from railyard_local.tasks import Supervisor
from railyard_local.topology import NodeSpec

log = logging.getLogger("railyard_local.runtime")


def load_specs(config_path: Path) -> list[NodeSpec]:
    data = json.loads(config_path.read_text())
    return [NodeSpec.from_dict(n) for n in data["nodeSpecs"]]


def load_shared_host_paths(config_path: Path) -> tuple[str, ...]:
    data = json.loads(config_path.read_text())
    return tuple(str(p) for p in data.get("sharedHostPaths", DEFAULT_SHARED_HOST_PATHS))


async def run_runtime(
    *,
    kubeconfig: str,
    state_dir: Path,
    specs: list[NodeSpec],
    log_dir: Path,
    scheduler: bool,
    ready_file: Path | None,
    lease_interval: float = 10.0,
    shared_host_paths: tuple[str, ...] = DEFAULT_SHARED_HOST_PATHS,
    watch_inactivity_s: float = DEFAULT_WATCH_INACTIVITY_S,
    kubelet_client_ca: Path | None = None,
) -> str | None:
    """Run until SIGTERM/SIGINT (returns None) or until a loop of the runtime keeps dying
    (returns why: the process must then exit non-zero rather than sit there looking alive)."""
    client = KubeClient.from_kubeconfig(kubeconfig)
    # the nodes' heartbeats on a session of their own, as every kubelet has its connection: never
    # queued behind the scheduler's bindings and the pods' status writes
    heartbeats = KubeClient.for_connection(load_connection(kubeconfig), limit=HEARTBEAT_REQUESTS)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    agent = Agent(client, state_dir, specs, log_dir=log_dir, shared_host_paths=shared_host_paths, kubeconfig=kubeconfig)
    supervisor = Supervisor()
    endpoint: KubeletEndpoint | None = None
    try:
        kubelet_port = 0
        if kubelet_client_ca is not None:
            try:
                ctx = server_context(state_dir / "kubelet-pki", tuple(s.ip for s in specs), kubelet_client_ca)
                endpoint = KubeletEndpoint(specs, agent.cached_pod, agent.log_path, ssl_context=ctx)
                kubelet_port = await endpoint.start()
            except OSError as exc:  # an unreadable CA (ssl.SSLError is one); too few descriptors for thousands of nodes
                log.warning("kubelet endpoint not started (%s): kubectl logs through the API server will fail", exc)
                if endpoint is not None:
                    await endpoint.stop()
                endpoint = None
        else:
            log.info("no kubelet client CA: container logs are not served to the API server (kubectl logs)")
        manager = NodeManager(client, specs, lease_interval=lease_interval, on_control=agent.on_control,
                              kubelet_port=kubelet_port, heartbeat_client=heartbeats)
        # registration and the Leases in one loop: each node's Lease renewed from the moment it is
        # registered, as a kubelet's (renewals that waited for the last of 2,048 nodes, or for the
        # informers to sync, came after the grace period on a loaded machine: issue 46)
        supervisor.start("node heartbeats", manager.run)
        if not await _until(manager.registered, supervisor, stop):
            return supervisor.fatal
        agent.apply_controls(manager.controls)

        def informer(path: str, name: str) -> Informer:
            return Informer(client, path, name, inactivity_timeout=watch_inactivity_s)

        nodes = informer("/api/v1/nodes", "nodes")
        pods = informer("/api/v1/pods", "pods")
        services = informer("/api/v1/services", "services")
        nodes.add_handler(manager.on_node_event)
        sched: Scheduler | None = None
        podgroups: Informer | None = None
        dra: list[Informer] = []  # resource.k8s.io/v1: slices, classes, claims
        if scheduler:
            if await serves_podgroups(client):
                podgroups = informer(f"{PODGROUPS}/podgroups", "podgroups")
            if await serves_dra(client):
                dra = [
                    informer(f"{RESOURCE_API}/{plural}", plural)
                    for plural in ("resourceslices", "deviceclasses", "resourceclaims")
                ]
            sched = Scheduler(client, pods.cache, podgroups=podgroups.cache if podgroups else None,
                              slices=dra[0].cache if dra else None, device_classes=dra[1].cache if dra else None,
                              claims=dra[2].cache if dra else None)
            nodes.add_handler(sched.on_node)
            pods.add_handler(sched.on_pod)
            if podgroups is not None:
                podgroups.add_handler(sched.on_podgroup)
            if dra:
                dra[0].add_handler(sched.on_slice)
                dra[1].add_handler(sched.on_device_class)
                dra[2].add_handler(sched.on_claim)
        pods.add_handler(agent.on_pod)
        agent.pods = pods
        services.add_handler(agent.on_service)
        agent.services = services.cache
        supervisor.start("nodes informer", nodes.run)
        if podgroups is not None:  # before the pods: a gang's pods find their group
            supervisor.start("podgroups informer", podgroups.run)
        for inf in dra:  # before the pods too: a pod's claims and the nodes' devices are known
            supervisor.start(f"{inf.name} informer", inf.run)
        if await _until(nodes.synced, supervisor, stop):
            supervisor.start("pods informer", pods.run)
            supervisor.start("services informer", services.run)
        if await _until(pods.synced, supervisor, stop):
            supervisor.start("hosts writer", agent.run_hosts_writer)
            if sched is not None:
                supervisor.start("scheduler", sched.run)
            if ready_file is not None:
                tmp = ready_file.with_suffix(".tmp")
                tmp.write_text(json.dumps({"pid": os.getpid(), "nodes": [s.name for s in specs]}))
                os.replace(tmp, ready_file)
            log.info("runtime ready: %d nodes, scheduler=%s", len(specs), scheduler)
            await supervisor.wait(stop)
        return supervisor.fatal
    finally:
        if endpoint is not None:
            await endpoint.stop()
        await agent.stop()
        await supervisor.cancel_all()
        await client.close()
        await heartbeats.close()


async def _until(event: asyncio.Event, supervisor: Supervisor, stop: asyncio.Event) -> bool:
    """Wait for ``event``; False when the runtime is stopped or failing first."""
    waiter = asyncio.get_running_loop().create_task(event.wait())
    ender = asyncio.get_running_loop().create_task(supervisor.wait(stop))
    try:
        await asyncio.wait([waiter, ender], return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        ender.cancel()
    return event.is_set() and not stop.is_set() and supervisor.fatal is None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m railyard_local.runtime")
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--state-dir", required=True, type=Path)
    parser.add_argument("--config", required=True, type=Path, help="cluster.json with nodeSpecs")
    parser.add_argument("--log-dir", required=True, type=Path)
    parser.add_argument("--scheduler", action="store_true")
    parser.add_argument("--ready-file", type=Path)
    parser.add_argument("--lease-interval", type=float, default=10.0)
    parser.add_argument(
        "--watch-inactivity", type=float, default=DEFAULT_WATCH_INACTIVITY_S,
        help="re-establish a watch that delivers nothing, not even a bookmark, for this many seconds",
    )
    parser.add_argument(
        "--kubelet-client-ca", type=Path,
        help="serve container logs to the API server (kubectl logs) to clients with a certificate of this CA",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=os.environ.get("RAILYARD_LOCAL_LOG", "INFO"),
        format="%(asctime)s runtime %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    settle_after_start()
    fatal = asyncio.run(
        run_runtime(
            kubeconfig=args.kubeconfig,
            state_dir=args.state_dir,
            specs=load_specs(args.config),
            log_dir=args.log_dir,
            scheduler=args.scheduler,
            ready_file=args.ready_file,
            lease_interval=args.lease_interval,
            shared_host_paths=load_shared_host_paths(args.config),
            watch_inactivity_s=args.watch_inactivity,
            kubelet_client_ca=args.kubelet_client_ca,
        )
    )
    if fatal is not None:
        print(f"railyard local runtime: {fatal}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
