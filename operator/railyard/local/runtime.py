"""The node-side process of the local cluster: simulated nodes, scheduler and node agent.

Started by :class:`railyard.local.cluster.LocalCluster` as ``python -m railyard.local.runtime``
against any API server (embedded, envtest or an existing cluster). One asyncio loop, one shared
list+watch per kind (nodes, pods, services). SIGTERM/SIGINT stop it; every pod process is
killed before it exits.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from railyard.local.agent import DEFAULT_SHARED_HOST_PATHS, Agent
from railyard.local.kube import Informer, KubeClient
from railyard.local.nodes import NodeManager
from railyard.local.scheduler import Scheduler
from railyard.local.topology import NodeSpec

log = logging.getLogger("railyard.local.runtime")


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
) -> None:
    client = KubeClient.from_kubeconfig(kubeconfig)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    agent = Agent(client, state_dir, specs, log_dir=log_dir, shared_host_paths=shared_host_paths, kubeconfig=kubeconfig)
    manager = NodeManager(client, specs, lease_interval=lease_interval, on_control=agent.on_control)
    tasks: list[asyncio.Task[Any]] = []
    try:
        await manager.register()
        agent.apply_controls(manager.controls)
        nodes = Informer(client, "/api/v1/nodes", "nodes")
        pods = Informer(client, "/api/v1/pods", "pods")
        services = Informer(client, "/api/v1/services", "services")
        nodes.add_handler(manager.on_node_event)
        sched: Scheduler | None = None
        if scheduler:
            sched = Scheduler(client, pods.cache)
            nodes.add_handler(sched.on_node)
            pods.add_handler(sched.on_pod)
        pods.add_handler(agent.on_pod)
        agent.pods = pods
        services.add_handler(agent.on_service)
        agent.services = services.cache
        tasks.append(loop.create_task(nodes.run()))
        await nodes.synced.wait()
        tasks += [loop.create_task(pods.run()), loop.create_task(services.run())]
        await pods.synced.wait()
        tasks += [loop.create_task(manager.run()), loop.create_task(agent.run_hosts_writer())]
        if sched is not None:
            tasks.append(loop.create_task(sched.run()))
        if ready_file is not None:
            tmp = ready_file.with_suffix(".tmp")
            tmp.write_text(json.dumps({"pid": os.getpid(), "nodes": [s.name for s in specs]}))
            os.replace(tmp, ready_file)
        log.info("runtime ready: %d nodes, scheduler=%s", len(specs), scheduler)
        waiter = loop.create_task(stop.wait())
        done, _ = await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task is not waiter and task.exception() is not None:
                log.error("runtime task failed", exc_info=task.exception())
        waiter.cancel()
    finally:
        await agent.stop()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m railyard.local.runtime")
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--state-dir", required=True, type=Path)
    parser.add_argument("--config", required=True, type=Path, help="cluster.json with nodeSpecs")
    parser.add_argument("--log-dir", required=True, type=Path)
    parser.add_argument("--scheduler", action="store_true")
    parser.add_argument("--ready-file", type=Path)
    parser.add_argument("--lease-interval", type=float, default=10.0)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=os.environ.get("RAILYARD_LOCAL_LOG", "INFO"),
        format="%(asctime)s runtime %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    asyncio.run(
        run_runtime(
            kubeconfig=args.kubeconfig,
            state_dir=args.state_dir,
            specs=load_specs(args.config),
            log_dir=args.log_dir,
            scheduler=args.scheduler,
            ready_file=args.ready_file,
            lease_interval=args.lease_interval,
            shared_host_paths=load_shared_host_paths(args.config),
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
