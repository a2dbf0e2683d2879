"""Benchmark: a 1,000-pod gang on the local cluster, from creation to bound and Running.

Starts an embedded LocalCluster with 128 simulated nodes x 8 GPUs (spine=4,leaf=8), creates
1,000 one-GPU pods from one asyncio client (kwok-style simulated pods: the agent reports them
Running without starting processes, so the number measures API + scheduler + agent, not
process start-up on a 2-core machine), and measures: create rate, end-to-end binding throughput
(pods bound / time since the first create), and time until all pods are Running.
Target (TARGETS.md, gang start): > 300 pods/s. On a shared, loaded machine the wall-clock rates
mostly measure waiting for a CPU; "pods per control-plane CPU-second" (API server + runtime CPU
time for the whole gang) is the machine-independent capacity figure.

    python bench/local_scheduler.py [--pods 1000] [--nodes 128]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from provenance import write_results
from railyard.api.corev1 import compute_pod_requests
from railyard_local.agent import SIMULATE_ANNOTATION
from railyard_local.cluster import LocalCluster
from railyard_local.kube import KubeClient
from railyard_local.scheduling import DecisionCache, build_node_info, decide_node
from railyard_local.topology import ClusterShape, build_nodes, parse_topology_spec

#: The code this bench measures (bench/provenance.py: a result is stale once it changed for a round).
MEASURES = (
    "local_cluster/railyard_local/scheduler.py",
    "local_cluster/railyard_local/scheduling.py",
    "local_cluster/railyard_local/topology.py",
)


TARGET_PODS_PER_S = 300.0


def pod(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"gang-{i}", "labels": {"bench": "gang"}, "annotations": {SIMULATE_ANNOTATION: "true"}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "none", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
    }


async def measure(kubeconfig: Path, n: int) -> dict[str, float]:
    client = KubeClient.from_kubeconfig(str(kubeconfig))
    bound: dict[str, float] = {}
    running: dict[str, float] = {}
    all_bound, all_running = asyncio.Event(), asyncio.Event()
    listing = await client.get("/api/v1/namespaces/default/pods")
    rv = str(listing["metadata"]["resourceVersion"])

    async def watch() -> None:
        nonlocal rv
        while not all_running.is_set():
            async for ev in client.watch("/api/v1/namespaces/default/pods", rv, timeout_seconds=120):
                obj = ev.get("object") or {}
                rv = str((obj.get("metadata") or {}).get("resourceVersion", rv))
                name = (obj.get("metadata") or {}).get("name", "")
                if not name.startswith("gang-"):
                    continue
                now = time.perf_counter()
                if (obj.get("spec") or {}).get("nodeName"):
                    bound.setdefault(name, now)
                if (obj.get("status") or {}).get("phase") == "Running":
                    running.setdefault(name, now)
                if len(bound) >= n:
                    all_bound.set()
                if len(running) >= n:
                    all_running.set()
                    return

    watcher = asyncio.get_running_loop().create_task(watch())
    await asyncio.sleep(0.2)
    sem = asyncio.Semaphore(32)

    async def create(i: int) -> None:
        async with sem:
            await client.create("/api/v1/namespaces/default/pods", pod(i))

    t0 = time.perf_counter()
    await asyncio.gather(*(create(i) for i in range(n)))
    t_created = time.perf_counter()
    await asyncio.wait_for(all_bound.wait(), 300)
    t_bound = max(bound.values())
    await asyncio.wait_for(all_running.wait(), 300)
    t_running = max(running.values())
    watcher.cancel()
    await client.close()
    return {
        "create_rate": n / (t_created - t0),
        "bind_throughput": n / (t_bound - t0),
        "all_running_s": t_running - t0,
        "running_throughput": n / (t_running - t0),
    }


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def decision_rate(nodes: int, pods: int, *, cached: bool = True) -> float:
    """Pure scheduler decisions per second (filter + score over the nodes), no API; ``cached``:
    with the DecisionCache the scheduler keeps (same answers, unchanged nodes not re-scored)."""
    infos = {}
    for spec in build_nodes(ClusterShape(nodes=nodes, gpus_per_node=8, levels=parse_topology_spec("spine=8,leaf=16"))):
        node = {"metadata": {"name": spec.name, "labels": spec.labels}, "spec": {},
                "status": {"allocatable": spec.capacity(), "conditions": [{"type": "Ready", "status": "True"}]}}
        infos[spec.name] = build_node_info(node)
    cache = DecisionCache() if cached else None
    t0 = time.perf_counter()
    for i in range(pods):
        p = pod(i)
        req = compute_pod_requests(p)
        decision = decide_node(p, infos, req, start=i + 1, cache=cache)
        assert decision.node is not None
        infos[decision.node].add(req)
    return pods / (time.perf_counter() - t0)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=128)
    parser.add_argument("--decision-nodes", type=int, default=4096, help="nodes of the pure decision-rate measurement")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "local_scheduler.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster(Path(tmp), nodes=args.nodes, gpus_per_node=8, topology="spine=4,leaf=8", lease_interval=30)
        t0 = time.perf_counter()
        kubeconfig = cluster.start(timeout=180)
        startup = time.perf_counter() - t0
        try:
            pids = {name: proc.pid for name, proc in cluster._procs.items()}
            before = {name: cpu_seconds(pid) for name, pid in pids.items()}
            m = asyncio.run(measure(kubeconfig, args.pods))
            used = {name: cpu_seconds(pid) - before[name] for name, pid in pids.items()}
        finally:
            cluster.stop()
    rows = [
        (f"scheduler decisions, {args.decision_nodes:,} nodes", decision_rate(args.decision_nodes, 300), "pods/s", TARGET_PODS_PER_S),
        ("  same, without the decision cache", decision_rate(args.decision_nodes, 300, cached=False), "pods/s", None),
        ("cluster start-up", startup, "s", None),
        ("pod create rate (1 client)", m["create_rate"], "pods/s", TARGET_PODS_PER_S),
        ("create -> bound, end to end", m["bind_throughput"], "pods/s", TARGET_PODS_PER_S),
        ("create -> Running, end to end", m["running_throughput"], "pods/s", None),
        (f"all {args.pods} pods Running after", m["all_running_s"], "s", None),
        ("API server CPU for the gang", used.get("apiserver", 0.0), "s", None),
        ("runtime CPU (scheduler+agent)", used.get("runtime", 0.0), "s", None),
        # machine-noise-free capacity: pods per second of control-plane CPU (both processes)
        ("pods per control-plane CPU-second", args.pods / max(1e-9, sum(used.values())), "pods/s", TARGET_PODS_PER_S),
    ]
    results = []
    print(f"{'metric':<34}{'value':>10}  {'unit':<8}{'target':>8}  meets")
    for metric, value, unit, target in rows:
        meets = None if target is None else value >= target
        print(f"{metric:<34}{value:>10.1f}  {unit:<8}{'' if target is None else f'>={target:.0f}':>8}  {'' if meets is None else meets}")
        results.append({"metric": metric, "value": round(value, 2), "unit": unit, "target": target, "meets": meets})
    out = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0]
    print(f"(1-minute load average during the run: {load:.1f} on {os.cpu_count()} CPUs)")
    write_results(out, {"bench": "local_scheduler", "pods": args.pods, "nodes": args.nodes,
                               "load_average_1m": round(load, 1), "cpus": os.cpu_count(), "results": results}, MEASURES, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
